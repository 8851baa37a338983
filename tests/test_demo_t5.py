"""``transduce demo --task t5`` end to end on a cut-down toy pair, with a handful of steps."""

import json

import pytest
from sacrebleu.metrics import BLEU

from transduce import demo_t5
from transduce.cli import main
from transduce.data.corpus import read_tsv_chunks
from transduce.data.tokenizer import Tokenizer
from transduce.inference import Translator
from transduce.model import load_model


@pytest.mark.slow  # four training steps and two prepares: tens of seconds, as the other demos' tests
def test_t5_demo_pretrains_fine_tunes_and_scores_each_task(tmp_path, capsys, monkeypatch, one_thread):
    monkeypatch.setattr(demo_t5, "TOY_SPLITS", {"n_train": 300, "n_valid": 10, "n_test": 10})
    monkeypatch.setattr(demo_t5, "TENSE_SENTENCES", 100)
    decoded, calls = Translator.translate, []

    def half_right(self, sources, **kw):
        """The model's outputs, but the targets of every other test line of each task (the tasks
        alternate): scores neither 0 (two steps' outputs alone) nor 100, so a wrong pairing shows."""
        lines = (tmp_path / "t5" / "data" / "test.tsv").read_text(encoding="utf-8").splitlines()
        targets = dict(line.split("\t") for line in lines)
        hyps = decoded(self, sources, **kw)
        hyps = [targets.get(s, h) if i % 4 < 2 else h for i, (s, h) in enumerate(zip(sources, hyps))]
        calls.append((list(sources), hyps))
        return hyps

    monkeypatch.setattr(Translator, "translate", half_right)
    assert main(["demo", "--task", "t5", "--steps", "2", "--out", str(tmp_path / "t5")]) == 0
    out = capsys.readouterr().out
    assert "span-corruption pretraining" in out and "translate English to German:" in out and "accuracy" in out
    summary = json.loads((tmp_path / "t5" / "demo.json").read_text())
    assert summary["steps"] == {"pretrain": 2, "finetune": 2} and summary["pretrain_val_ppl"] > 1
    assert summary["test"]["translate English to German"]["n"] == summary["test"]["classify tense"]["n"] == 10
    # each task's score recomputed from the outputs the demo was given and the test file's targets
    inputs, targets = zip(*(line.split("\t") for line in
                            (tmp_path / "t5" / "data" / "test.tsv").read_text(encoding="utf-8").splitlines()))
    sources, hyps = calls[-1]
    assert sources == list(inputs)
    translate = [(h, t) for s, h, t in zip(inputs, hyps, targets) if s.startswith(demo_t5.TRANSLATE)]
    tense = [(h, t) for s, h, t in zip(inputs, hyps, targets) if s.startswith(demo_t5.TENSE)]
    assert len(translate) == len(tense) == 10
    bleu = BLEU().corpus_score([h for h, _ in translate], [[t for _, t in translate]]).score
    assert 0 < bleu < 100 and summary["test"]["translate English to German"]["bleu"] == pytest.approx(bleu)
    acc = sum(h.split() == t.split() for h, t in tense) / len(tense)
    assert acc >= 1 / 2 and summary["test"]["classify tense"]["acc"] == pytest.approx(acc)
    # the pretraining is span corruption with T5's sentinels; the fine-tuned model starts from it
    pre = json.loads((tmp_path / "t5" / "pretrain" / "metrics.jsonl").read_text().splitlines()[0])
    assert pre["step"] >= 1
    tok = Tokenizer.load(tmp_path / "t5" / "finetune" / "model")
    assert tok.pieces([tok.src_vocab_size - 1]) == ["<extra_id_0>"]
    assert load_model(tmp_path / "t5" / "finetune" / "model").config.positions == "relative"
    train = [line for src, _ in read_tsv_chunks(tmp_path / "t5" / "data" / "train.tsv") for line in src]
    assert len(train) == 400 and sum(line.startswith(b"classify tense: ") for line in train) == 100
    assert (tmp_path / "t5" / "data" / "train.txt").read_text().count("\n") == 600  # English and German
