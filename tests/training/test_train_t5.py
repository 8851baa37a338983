"""A T5 trained with the existing trainer and CLI (configs/t5_tiny.yaml), then translated, saved
and exported to Hugging Face's T5 as any model is."""

from __future__ import annotations

from pathlib import Path

import pytest

from transduce.cli import main
from transduce.model import load_model
from extra_helpers import need_extra

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "t5_tiny.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("t5") / "run"
    assert main(["train", str(CONFIG), "--out", str(out), "--set", "train.max_steps=8", "--set", "train.eval_every=8",
                 "--set", "train.save_every=8", "--set", "train.num_threads=1", "--set", "data.toy_train_size=400",
                 "--set", "data.toy_valid_size=20", "--set", "data.toy_test_size=20"]) == 0
    return out / "model"


def test_trains_and_translates(trained, tmp_path):
    cfg = load_model(trained).config
    assert (cfg.positions, cfg.norm_kind, cfg.activation, cfg.scale_attention) == ("relative", "rms", "geglu", False)
    (tmp_path / "in.txt").write_text("the dog sees the ball\na woman reads\n", encoding="utf-8")
    assert main(["translate", str(trained), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 2


def test_exports_to_t5_for_conditional_generation(trained, tmp_path):
    transformers = need_extra("export", "transformers")
    assert main(["export", str(trained), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")("the dog")["input_ids"][-1] == 2
