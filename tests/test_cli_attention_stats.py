"""``transduce attention MODEL --stats --src FILE`` (issue 58): the table, JSON, the grid plot,
and one-line errors for bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from extra_helpers import need_extra
from toy_model import toy_pairs
from transduce.cli import main

PAIRS = toy_pairs(30, seed=5)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


@pytest.fixture
def files(tmp_path):
    src, tgt, align = tmp_path / "src.txt", tmp_path / "tgt.txt", tmp_path / "align.txt"
    src.write_text("".join(f"{s}\n" for s, _ in PAIRS), encoding="utf-8")
    tgt.write_text("".join(f"{t}\n" for _, t in PAIRS), encoding="utf-8")
    align.write_text("".join(" ".join(f"{i}-{i}" for i in range(len(s.split()))) + "\n" for s, _ in PAIRS),
                     encoding="utf-8")
    return src, tgt, align


def test_stats_table_json_and_plot(trained_dir, files, tmp_path, capsys):
    src, tgt, align = files
    assert main(["attention", str(trained_dir), "--stats", "--src", str(src), "--device", "cpu"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith(f"attention health over {len(PAIRS)} sentences (translations)")
    assert table[1].split()[:4] == ["kind", "layer", "head", "entropy"]
    assert len(table) == 2 + 4 * (1 + 2 + 2)  # 4 heads; 1 encoder layer, 2 decoder layers (self, cross)
    assert all(row.split()[-1] == "-" for row in table[2:])  # no flags on the trained model
    assert main(["attention", str(trained_dir), "--stats", "--src", str(src), "--tgt", str(tgt), "--align",
                 str(align), "--json", "--device", "cpu", "--share", "0.8"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["targets"] == "references" and got["limits"]["share"] == 0.8
    cross = [h for h in got["heads"] if h["kind"] == "cross"]
    assert all(0.0 <= h["aer"] <= 1.0 and h["monotonicity"] is not None for h in cross)
    assert all(h["aer"] is None for h in got["heads"] if h["kind"] != "cross")
    need_extra("plot", "matplotlib")
    png = tmp_path / "grid.png"
    assert main(["attention", str(trained_dir), "--stats", "--src", str(src), "--plot", str(png), "--device",
                 "cpu"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().out.splitlines()[-1] == str(png)


@pytest.mark.parametrize("args, message", [
    (["--stats"], "--stats: needs --src"),
    (["hello", "--stats", "--src", "SRC"], "no SENTENCE"),
    (["--src", "SRC"], "--src: is for --stats"),
    (["--stats", "--src", "SRC", "--align", "SRC"], "--align: the links are between --src and --tgt"),
    (["--stats", "--src", "SRC", "--uniform", "0"], "uniform must be in (0, 1]"),
])
def test_option_errors(trained_dir, files, capsys, args, message):
    src = str(files[0])
    assert main(["attention", str(trained_dir), *[src if a == "SRC" else a for a in args]]) == 2
    assert message in capsys.readouterr().err


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transduce", "attention", *args, "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)


def test_bad_input_is_one_line(trained_dir, files, tmp_path):
    src = files[0]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(trained_dir, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"junk")
    empty, invalid = tmp_path / "empty.txt", tmp_path / "invalid.txt"
    empty.write_bytes(b"")
    invalid.write_bytes(b"the dog\n\xff\xfe runs\n")
    cases = [((str(corrupt), "--stats", "--src", str(src)), "model.safetensors"),
             ((str(trained_dir), "--stats", "--src", str(tmp_path / "missing.txt")), "missing.txt"),
             ((str(trained_dir), "--stats", "--src", str(empty)), "no sentences"),
             ((str(trained_dir), "--stats", "--src", str(invalid)), "invalid.txt:2: invalid UTF-8")]
    for args, message in cases:
        done = _run(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
        assert "Traceback" not in done.stderr
