"""``transduce demo --task classify --init-from IMPORTED``: the classify demo fine-tunes an imported
BERT or RoBERTa (random tiny ones, with WordPiece and byte-level BPE tokenizers) in the starting
model's shape and with its tokenizer (an imported classifier of other classes with a new last layer,
said in one warning line), and the classifier exports as a transformers
BertForSequenceClassification (RoBERTa's too: there is no RobertaForSequenceClassification export)
that gives the same logits on the same text."""

from __future__ import annotations

import json

import pytest
import torch

from transduce.cli import main
from transduce.data.batch import pad
from transduce.data.tokenizer import load_tokenizer
from transduce.interop import export_model
from transduce.interop import import_hf
from transduce.inference.classify import Classifier
from transduce.model import load_model
from bert_fixtures import bert_tokenizer_dirs, build_hf
from extra_helpers import need_extra
from toy_model import toy_pairs

transformers = need_extra("export", "transformers")
need_extra("pretrained", "tokenizers")


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    return bert_tokenizer_dirs(tmp_path_factory.mktemp("tokenizers"))


@pytest.mark.slow  # a whole demo (as tests/test_demo.py's are): two short runs on 2,000 labelled sentences
# WordPiece + NSP; byte-level BPE; a classifier of 3 classes (the demo's 4 get a new last layer)
@pytest.mark.parametrize("case", ["BertForPreTraining", "RobertaForMaskedLM", "BertForSequenceClassification"])
def test_classify_demo_fine_tunes_an_import_in_its_shape(tmp_path, tokenizer_dirs, case, caplog):
    build_hf(tmp_path / "hf", case, tokenizer_dirs)
    import_hf(tmp_path / "hf", tmp_path / "imported")
    with caplog.at_level("WARNING", logger="transduce.training"):
        assert main(["demo", "--task", "classify", "--init-from", str(tmp_path / "imported"), "--steps", "3",
                     "--out", str(tmp_path / "demo")]) == 0
    warned = [r.getMessage() for r in caplog.records if "classifier of" in r.getMessage()]
    assert warned == ([f"train.init_from: {tmp_path / 'imported'} is a classifier of 3 classes (neg, neu, pos); "
                       "this run's 4 classes (future, modal, perfect, present) get a new classification layer "
                       "(the encoder and pooler kept)"] if case.endswith("Classification") else [])
    summary = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert set(summary["test_accuracy"]) == {"pretrained", "scratch"}
    assert all(0.0 <= a <= 1.0 for a in summary["test_accuracy"].values())
    start = load_model(tmp_path / "imported").config
    tuned = load_model(tmp_path / "demo" / "pretrained" / "best").config
    assert (tuned.d_model, tuned.n_encoder_layers, tuned.max_positions, tuned.n_classes) == \
        (start.d_model, start.n_encoder_layers, start.max_positions, 4)
    for run in ("pretrained", "scratch"):  # both read text with the import's own tokenizer
        assert load_tokenizer(tmp_path / "demo" / run / "best").digest() == \
            load_tokenizer(tmp_path / "imported").digest()

    report = export_model(tmp_path / "demo" / "pretrained" / "best", "hf", tmp_path / "back")
    assert report.checks["max_class_logit_diff"] < 1e-4 and report.checks["tokenizer_differences"] == 0
    back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()
    # the export writes BERT's layout: a RoBERTa-based classifier too (its positions already shifted
    # on import), in the original checkpoint's ids (the tuned model's tokenizer keeps where its ids
    # came from), with the same logits on the same text
    assert type(back).__name__ == "BertForSequenceClassification"
    texts = [en for en, _ in toy_pairs(20, 5)] + ["Café 👍🏽 東京", "  two  spaces "]
    with torch.no_grad(), Classifier.load(tmp_path / "demo" / "pretrained" / "best") as classifier:
        enc = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")(texts, padding=True, return_tensors="pt")
        want = back(**enc).logits                                                       # (B, K)
        assert classifier.classify(texts) == [back.config.id2label[int(k)] for k in want.argmax(-1)]
        assert enc["input_ids"].tolist() == transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(
            texts, padding=True)["input_ids"]                                           # the original's ids
        model, tok = classifier.model, classifier.tokenizer
        ids = pad([tok.encode(t) for t in texts], 0, bos=True, eos=True)  # what classify feeds the model
        got = model.classify(model(ids, torch.zeros_like(ids) if model.config.type_vocab_size else None))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
