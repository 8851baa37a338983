"""transduce profile: the traces parse, the time split has its categories and adds up, bad
arguments are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference_helpers import SENTENCES
from transduce.cli import main
from transduce.profiling import CATEGORIES, profile_decoding, profile_training

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "data.toy_train_size=200", "data.toy_valid_size=10", "data.toy_test_size=10",
        "data.vocab_size=100", "data.max_tokens=256", "train.eval_bleu=false"]


def _check(profile, scoped: tuple[str, ...]) -> set[str]:
    events = json.loads(profile.trace.read_text(encoding="utf-8"))["traceEvents"]
    assert list(profile.tensorboard.glob("*.pt.trace.json"))
    assert set(profile.split_ms) == set(CATEGORIES)
    assert all(ms >= 0 for ms in profile.split_ms.values())
    # the categories are disjoint parts of the wall time, "other" the rest
    assert sum(profile.split_ms.values()) == pytest.approx(profile.wall_ms, rel=0.05)
    for name in scoped:
        assert profile.split_ms[name] > 0, name
    assert "aten::" in profile.table
    return {e.get("name") for e in events}


def test_profile_decoding(model_dir, tmp_path, one_thread):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    for beam in (1, 3):
        profile = profile_decoding(str(model_dir), str(src), 2, 4, tmp_path / f"b{beam}",
                                   {"beam": beam, "max_len_a": 0.0, "max_len_b": 6})
        names = _check(profile, ("attention", "ffn", "softmax", "data"))
        assert {"attention", "ffn", "softmax"} <= names
    assert "time split" in profile.report()


def test_profile_training(tmp_path, one_thread):
    profile = profile_training(str(REPO / "configs" / "tiny.yaml"), TINY, 2, tmp_path / "p")
    names = _check(profile, ("attention", "ffn", "loss", "optimizer", "backward"))
    assert {"attention", "loss"} <= names


@pytest.mark.parametrize("args,key", [
    (["--steps", "0"], "--steps"),
    (["--beam", "2"], "--input/--beam"),
    (["--input", "x.txt"], "--input/--beam"),
])
def test_profile_bad_arguments_for_a_config(tmp_path, capsys, args, key):
    assert main(["profile", str(REPO / "configs" / "tiny.yaml"), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]


def test_profile_bad_arguments_for_a_model(model_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    for args, key in ((["--input", str(empty)], "--input"), ([], "--input"),
                      (["--input", str(empty), "--set", "train.max_steps=3"], "--set")):
        assert main(["profile", str(model_dir), "--out", str(tmp_path / "o"), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and key in err[0], err
    assert main(["profile", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "MODEL_DIR_OR_CONFIG" in capsys.readouterr().err
