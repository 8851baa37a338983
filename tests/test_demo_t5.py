"""``transduce demo --task t5`` end to end on a cut-down toy pair, with a handful of steps."""

import json

import pytest

from transduce import demo_t5
from transduce.cli import main
from transduce.data.corpus import read_tsv_chunks
from transduce.data.tokenizer import Tokenizer
from transduce.model import load_model


@pytest.mark.slow  # four training steps and two prepares: tens of seconds, as the other demos' tests
def test_t5_demo_pretrains_fine_tunes_and_scores_each_task(tmp_path, capsys, monkeypatch, one_thread):
    monkeypatch.setattr(demo_t5, "TOY_SPLITS", {"n_train": 300, "n_valid": 10, "n_test": 10})
    monkeypatch.setattr(demo_t5, "TENSE_SENTENCES", 100)
    assert main(["demo", "--task", "t5", "--steps", "2", "--out", str(tmp_path / "t5")]) == 0
    out = capsys.readouterr().out
    assert "span-corruption pretraining" in out and "translate English to German:" in out and "accuracy" in out
    summary = json.loads((tmp_path / "t5" / "demo.json").read_text())
    assert summary["steps"] == {"pretrain": 2, "finetune": 2} and summary["pretrain_val_ppl"] > 1
    assert summary["test"]["translate English to German"]["n"] == summary["test"]["classify tense"]["n"] == 10
    assert 0 <= summary["test"]["translate English to German"]["bleu"] <= 100
    assert 0 <= summary["test"]["classify tense"]["acc"] <= 1
    # the pretraining is span corruption with T5's sentinels; the fine-tuned model starts from it
    pre = json.loads((tmp_path / "t5" / "pretrain" / "metrics.jsonl").read_text().splitlines()[0])
    assert pre["step"] >= 1
    tok = Tokenizer.load(tmp_path / "t5" / "finetune" / "model")
    assert tok.pieces([tok.src_vocab_size - 1]) == ["<extra_id_0>"]
    assert load_model(tmp_path / "t5" / "finetune" / "model").config.positions == "relative"
    train = [line for src, _ in read_tsv_chunks(tmp_path / "t5" / "data" / "train.tsv") for line in src]
    assert len(train) == 400 and sum(line.startswith(b"classify tense: ") for line in train) == 100
    assert (tmp_path / "t5" / "data" / "train.txt").read_text().count("\n") == 600  # English and German
