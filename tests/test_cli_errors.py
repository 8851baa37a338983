"""User errors reach the terminal as one line and exit status 2, never a traceback."""

import subprocess
import sys

import pytest


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transduce", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize("setting,key", [
    ("model.d_model=100", "model.d_model"),
    ("model.dropout=-1", "model.dropout"),
    ("model.activation=tanh", "model.activation"),
    ("train.precision=fp8", "train.precision"),
    ("data.corpus=wiki", "data.corpus"),
    ("data.corpus=files", "data.train_src"),
])
def test_bad_config_values(tmp_path, setting, key):
    done = _run("train", "--out", str(tmp_path / "r"), "--set", setting)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in done.stderr


def test_unreadable_data(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes(b"hello\nworld\n")
    tgt.write_bytes(b"hallo\n\xff\xfe bad\n")
    done = _run("train", "--out", str(tmp_path / "r"), "--set", "data.corpus=files",
                "--set", f"data.train_src={src}", "--set", f"data.train_tgt={tgt}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "a.de:2" in done.stderr.strip().splitlines()[-1]
    missing = _run("train", "--out", str(tmp_path / "r2"), "--set", "data.corpus=files",
                   "--set", f"data.train_src={tmp_path / 'nope'}", "--set", f"data.train_tgt={tgt}")
    assert missing.returncode == 2 and "nope" in missing.stderr and "Traceback" not in missing.stderr


def test_missing_config_file(tmp_path):
    done = _run("train", str(tmp_path / "none.yaml"))
    assert done.returncode == 2 and "not found" in done.stderr


def test_average_rejects_foreign_dir(tmp_path):
    done = _run("average", str(tmp_path), "--out", str(tmp_path / "avg"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert not (tmp_path / "avg").exists()


@pytest.mark.parametrize("args, key", [(("--grpc-port", "9001"), "--grpc-port"),
                                       (("--engine", "triton", "--max-per-client", "2"), "--max-per-client")])
def test_serve_options_of_the_other_engine(tmp_path, args, key):
    done = _run("serve", str(tmp_path), *args)
    assert done.returncode == 2 and key in done.stderr and "Traceback" not in done.stderr


def test_library_errors_name_settings_and_the_cli_prints_the_flag(tmp_path):
    # the library names the setting; the CLI, printing it, names the flag the user typed
    from transduce.cli.parser import flag_names
    from transduce.errors import TransduceError
    from transduce.interop import export_model

    with pytest.raises(TransduceError, match=r"^export.format: must be one of"):
        export_model(tmp_path, "nope", tmp_path / "out")
    assert flag_names("export.precision/export.max_batch: are for export.format tensorrt") == \
        "--precision/--max-batch: are for --format tensorrt"
    untouched = "decode.beam: must be >= 1 (not my.export.format, export.formats)"  # config keys stay keys
    assert flag_names(untouched) == untouched


def test_training_into_a_run_with_checkpoints_names_the_resume_flag(tmp_path):
    # the library says resume=True; the CLI prints the flag, and nothing of the old run is touched
    (tmp_path / "r" / "checkpoints" / "step_00000010").mkdir(parents=True)
    done = _run("train", "--out", str(tmp_path / "r"), "--set", "train.max_steps=1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "already holds checkpoints; --resume continues that run" in line and "resume=True" not in line
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["checkpoints"]
