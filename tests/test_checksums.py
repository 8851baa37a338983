"""checksums.sha256: every small file of a model or checkpoint directory is checked when read."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch
import yaml

from transduce.checksums import MANIFEST, recorded
from transduce.cli import main
from transduce.data.tokenizer import Tokenizer
from transduce.errors import CheckpointError
from transduce.model import load_model
from transduce.model.io import load_decode_config
from transduce.training.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint


def _copy(model_dir, tmp_path, name="m"):
    return shutil.copytree(model_dir, tmp_path / name)


def _flip(path, where=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x01
    path.write_bytes(bytes(data))


def _translate(directory, tmp_path, capsys):
    """``transduce translate``'s exit status, first output line and stderr."""
    (tmp_path / "in.txt").write_text("the cat sat\n", encoding="utf-8")
    status = main(["translate", str(directory), "--input", str(tmp_path / "in.txt"), "--output",
                   str(tmp_path / "out.txt"), "--max-len-b", "4"])
    out = (tmp_path / "out.txt").read_text(encoding="utf-8") if status == 0 else None
    return status, out, capsys.readouterr().err


def test_a_model_directory_records_its_files_as_sha256sum_does(model_dir):
    sums = recorded(model_dir)
    assert set(sums) == {"config.yaml", "tokenizer.yaml", "spm.model"}
    for name, digest in sums.items():
        assert hashlib.sha256((model_dir / name).read_bytes()).hexdigest() == digest
    assert (model_dir / MANIFEST).read_text().splitlines()[0] == f"{sums['config.yaml']}  config.yaml"


@pytest.mark.parametrize("name", ["spm.model", "tokenizer.yaml"])
def test_a_flipped_byte_in_a_tokenizer_file_is_a_one_line_error(model_dir, tmp_path, capsys, name):
    d = _copy(model_dir, tmp_path)
    _flip(d / name)
    status, _, err = _translate(d, tmp_path, capsys)
    assert status == 2 and err.count("\n") == 1
    assert f"{d / name}: corrupt: it does not match the checksum it was saved with" in err
    with pytest.raises(CheckpointError, match=name):
        Tokenizer.load(d)


def test_an_edited_config_is_refused_until_rehash_accepts_it(model_dir, tmp_path, capsys):
    """config.yaml is text a user may edit on purpose: the error names the file and the command
    that accepts the edit; ``transduce rehash`` records it, and the edit takes effect."""
    d = _copy(model_dir, tmp_path)
    status, want, _ = _translate(d, tmp_path, capsys)
    assert status == 0
    config = yaml.safe_load((d / "config.yaml").read_text())
    config["decode"] = {"max_len_b": 1}
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    status, _, err = _translate(d, tmp_path, capsys)
    assert status == 2 and err.count("\n") == 1
    assert f"{d / 'config.yaml'}: does not match the checksum it was saved with" in err
    assert f"accept the edit with: transduce rehash {d}" in err
    with pytest.raises(CheckpointError, match="config.yaml"):
        load_model(d)
    assert main(["rehash", str(d)]) == 0
    assert "recorded the sha256" in capsys.readouterr().out
    assert load_model(d) is not None
    assert load_decode_config(d).max_len_b == 1  # the edit takes effect
    assert _translate(d, tmp_path, capsys)[:2] == (0, want)
    (d / "config.yaml").write_text("model: {d_model: 15}\n")  # an edit that breaks it: rehash says so
    assert main(["rehash", str(d)]) == 2
    assert "model.d_model" in capsys.readouterr().err


def test_a_directory_saved_before_checksums_still_loads(model_dir, tmp_path, capsys):
    d = _copy(model_dir, tmp_path)
    status, want, _ = _translate(model_dir, tmp_path, capsys)
    (d / MANIFEST).unlink()
    assert _translate(d, tmp_path, capsys)[:2] == (0, want)
    (d / MANIFEST).write_text("not a checksum list\n")  # a damaged list is an error too, not ignored
    status, _, err = _translate(d, tmp_path, capsys)
    assert status == 2 and f"{d / MANIFEST}: corrupt" in err


@pytest.mark.parametrize("name", ["state.json", "spm.model", "config.yaml"])
def test_a_checkpoint_checks_every_file_and_average_records_its_output(model_dir, tmp_path, name):
    model = load_model(model_dir)
    tokenizer = Tokenizer.load(model_dir)
    trainer_state = {"rng_cpu": torch.get_rng_state()}
    path = save_checkpoint(tmp_path / "ckpt", 7, model, tokenizer, trainer_state,
                           {"train_state": {"step": 7}}, keep_last=2)
    assert set(recorded(path)) == {"config.yaml", "tokenizer.yaml", "spm.model", "state.json"}
    assert load_checkpoint(path)[2] == {"train_state": {"step": 7}}
    out = average_checkpoints([path], tmp_path / "avg")
    assert set(recorded(out)) == {"config.yaml", "tokenizer.yaml", "spm.model"}
    averaged = load_model(out).state_dict()
    assert all(torch.equal(averaged[k], v) for k, v in model.state_dict().items())
    _flip(path / name)
    with pytest.raises(CheckpointError, match=f"{name}: (corrupt|does not match)"):
        load_checkpoint(path)
