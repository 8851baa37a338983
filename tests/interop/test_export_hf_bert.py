"""Hugging Face BERT export: an encoder_only model with BERT's options gives BertForMaskedLM's
(or BertForSequenceClassification's) logits."""

from __future__ import annotations

import re

import pytest
import torch

from transduce.cli import main
from transduce.config import ModelConfig
from transduce.data.batch import pad, token_types
from transduce.interop import ExportError, export_model
from transduce.model import EncoderOnly, save_model
from extra_helpers import need_extra

transformers = need_extra("export", "transformers")

V = 60
BERT = dict(arch="encoder_only", src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=2,
            d_ff=64, positions="learned", max_positions=40, activation="gelu", embed_norm=True, type_vocab_size=2,
            scale_embeddings=False, layer_norm_eps=1e-12)


def _model_dir(tmp_path, **options):
    """A random BERT-shaped model; LayerNorms and biases perturbed so that none is the identity."""
    torch.manual_seed(0)
    model = EncoderOnly(ModelConfig(**{**BERT, **options}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return save_model(model.eval(), tmp_path / "m"), model.eval()


def _inputs(types: bool, width: int = 12):
    """Right-padded rows starting with BOS, some tokens [MASK], random token types."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, V, (4, width), generator=g)
    ids[:, 0] = 1
    for row, n in enumerate((width, 7, 3, width - 2)):
        ids[row, n - 1] = 2
        ids[row, n:] = 0
    return ids, (torch.randint(2, ids.shape, generator=g) if types else None)


@pytest.mark.parametrize("options", [{}, dict(type_vocab_size=0), dict(tie_output=False, share_embeddings=False),
                                     dict(layer_norm_eps=1e-5, max_positions=8)])
@torch.no_grad()
def test_masked_lm_logits_equal_berts(tmp_path, options):
    model_dir, model = _model_dir(tmp_path, **options)
    report = export_model(model_dir, "hf", tmp_path / "hf")
    assert report.checks["max_logit_diff"] < 1e-4
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    ids, types = _inputs(bool(model.config.type_vocab_size), min(12, model.config.max_positions))
    got = hf(input_ids=ids, attention_mask=(ids != 0).long(), token_type_ids=types).logits
    torch.testing.assert_close(got, model.mlm_logits(model(ids, types)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("labels,names", [(("past", "present", "future"), ("past", "present", "future")),
                                           ((), ("LABEL_0", "LABEL_1", "LABEL_2"))])
@torch.no_grad()
def test_classification_logits_and_label_names_equal_berts(tmp_path, labels, names):
    model_dir, model = _model_dir(tmp_path, n_classes=3, labels=labels)
    report = export_model(model_dir, "hf", tmp_path / "hf")
    assert report.checks["max_class_logit_diff"] < 1e-4
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForSequenceClassification"
    assert hf.config.num_labels == 3 and hf.config.id2label == dict(enumerate(names))
    assert hf.config.label2id == {name: i for i, name in enumerate(names)}  # model.labels, in id order
    pairs = pad([[5, 6, 2, 7, 8], [9, 2, 10], [11, 12, 13]], bos=True, eos=True)  # BOS a EOS b EOS, and one text
    types = token_types(pairs)
    assert types.sum() > 0
    got = hf(input_ids=pairs, attention_mask=(pairs != 0).long(), token_type_ids=types).logits
    torch.testing.assert_close(got, model.classify(model(pairs, types)), rtol=0, atol=1e-4)
    ids, types = _inputs(True)
    got = hf(input_ids=ids, attention_mask=(ids != 0).long(), token_type_ids=types).logits
    torch.testing.assert_close(got, model.classify(model(ids, types)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("options,named", [
    (dict(norm="pre"), "model.norm=pre"),
    (dict(scale_embeddings=True), "model.scale_embeddings=True"),
    (dict(embed_norm=False, positions="sinusoidal"), "model.positions=sinusoidal (BERT has positions=learned); "
                                                     "model.embed_norm=False"),
    (dict(head_dim=4), "model.head_dim=4 (BERT's heads are d_model / n_heads = 8 wide)"),
])
def test_options_bert_lacks_are_refused(tmp_path, options, named):
    model_dir, _ = _model_dir(tmp_path, **options)
    with pytest.raises(ExportError, match=rf"^cannot export to Hugging Face BERT: .*{re.escape(named)}"):
        export_model(model_dir, "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_triton_refuses_an_encoder(tmp_path):  # onnx and ctranslate2 take it: test_export_family_formats.py
    model_dir, _ = _model_dir(tmp_path)
    with pytest.raises(ExportError, match="exports encoder_decoder models; this one is encoder_only"):
        export_model(model_dir, "triton", tmp_path / "out")


def test_cli(tmp_path, capsys):
    model_dir, _ = _model_dir(tmp_path)
    assert main(["export", str(model_dir), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert "max_logit_diff" in capsys.readouterr().out
    model_dir, _ = _model_dir(tmp_path / "pre", norm="pre")
    assert main(["export", str(model_dir), "--format", "hf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transduce export: error: cannot export to Hugging Face BERT: model.norm=pre")
    assert len(err.splitlines()) == 1


@torch.no_grad()
def test_next_sentence_model_exports_as_bert_for_pretraining(tmp_path):
    model_dir, model = _model_dir(tmp_path, nsp=True)
    report = export_model(model_dir, "hf", tmp_path / "hf")
    assert report.checks["max_logit_diff"] < 1e-4 and report.checks["max_nsp_logit_diff"] < 1e-4
    hf = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForPreTraining"
    ids, types = _inputs(True)
    out = hf(input_ids=ids, attention_mask=(ids != 0).long(), token_type_ids=types)
    states = model(ids, types)
    torch.testing.assert_close(out.prediction_logits, model.mlm_logits(states), rtol=0, atol=1e-4)
    torch.testing.assert_close(out.seq_relationship_logits, model.next_sentence_logits(states), rtol=0, atol=1e-4)
