"""Translator: text in, text out, in input order, with n-best, attention and precision options."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from transduce.errors import CheckpointError, ConfigError, TransduceError
from transduce.config import DecodeConfig
from transduce.inference import AttentionChoice, Runtime, Translator, attention_maps
from transduce.viz.attention_heatmaps import plot_attention
from extra_helpers import need_extra

TEXTS = ["the cat sat on the mat", "", "a dog runs", "we walk to the river with a child today",
         "tea", "", "the bird sings a song"]


@pytest.fixture(scope="module")
def translator(model_dir) -> Translator:
    return Translator.load(model_dir)


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_keeps_input_order_count_and_empty_lines(translator, beam):
    out = translator.translate(TEXTS, beam=beam, max_len_b=6, batch_tokens=12)  # several batches
    assert len(out) == len(TEXTS)
    assert out[1] == "" and out[5] == ""
    alone = [translator.translate([t], beam=beam, max_len_b=6)[0] for t in TEXTS]
    assert out == alone
    assert all(isinstance(t, str) and "\n" not in t for t in out)


def test_translate_detailed_nbest_scores_pieces_and_attention(translator):
    results = translator.translate_detailed(TEXTS[:3], attention=AttentionChoice(), beam=4, nbest=3, max_len_b=5)
    first = results[0]
    assert len(first.hypotheses) == 3
    scores = [h.score for h in first.hypotheses]
    assert scores == sorted(scores, reverse=True)
    for h in first.hypotheses:
        assert len(h.pieces) == len(h.tokens)
        assert h.text == translator.tokenizer.decode(h.tokens)
        assert h.attention.shape == (len(h.tokens) + int(h.ended), len(first.source_tokens) + 1)
        torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[0]))
    assert first.source_pieces == translator.tokenizer.pieces(first.source_tokens, side="src")
    empty = results[1]
    assert empty.source_tokens == [] and empty.best.text == "" and empty.best.score == 0.0


def test_closing_hands_the_model_back_plain_and_translation_still_works(model_dir):
    """A Translator switches the model's layers and keeps weight copies; leaving the ``with``
    block undoes both, and translating after close gives the same output."""
    from transduce.data.tokenizer import Tokenizer
    from transduce.inference.speed.cpu import OneDNNLinear
    from transduce.inference.speed import is_prepared
    from transduce.model import load_model

    model = load_model(model_dir, "cpu")
    with Translator(model, Tokenizer.load(model_dir)) as tr:
        before = tr.translate(TEXTS, beam=3, max_len_b=6)
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules()) and not is_prepared(model)
    assert not any("_packed" in m.__dict__ or "_fused_layers" in m.__dict__ for m in model.modules())
    assert tr.translate(TEXTS, beam=3, max_len_b=6) == before
    tr.close()


def test_overlong_input_is_truncated_with_a_warning(model_dir, caplog):
    short = Translator.load(model_dir)
    with caplog.at_level(logging.WARNING, logger="transduce.inference.translation"):
        result = short.translate_detailed(["the cat sat on the mat", "tea"], beam=2, max_len_b=3, max_input_len=4)
    assert result[0].truncated and len(result[0].source_tokens) == 4
    assert not result[1].truncated
    assert "truncated" in caplog.text
    full = Translator.load(model_dir)
    cut = short.tokenizer.decode(result[0].source_tokens, side="src")
    assert result[0].best.tokens == full.translate_detailed([cut], beam=2, max_len_b=3)[0].best.tokens


def test_bf16_autocast_runs_on_cpu(model_dir):
    out = Translator.load(model_dir, Runtime(precision="bf16")).translate(TEXTS[:3], beam=2, max_len_b=4)
    assert len(out) == 3 and out[1] == ""


def test_sampling_through_the_translator_is_seeded(translator):
    a = translator.sample(TEXTS, temperature=1.2, top_p=0.9, seed=3, max_len_b=5)
    b = translator.sample(TEXTS, temperature=1.2, top_p=0.9, seed=3, max_len_b=5)
    assert [t.best.text for t in a] == [t.best.text for t in b]
    assert len(a) == len(TEXTS)


def test_user_errors_are_one_line_transduce_errors(model_dir, tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        Translator.load(tmp_path / "missing")
    with pytest.raises(ConfigError, match="runtime.precision"):
        Translator.load(model_dir, Runtime(precision="fp8"))
    tr = Translator.load(model_dir)
    with pytest.raises(ConfigError, match="decode.nbest"):
        tr.translate_detailed(["a"], beam=2, nbest=3)
    with pytest.raises(ConfigError, match="attention head"):
        tr.translate_detailed(["a"], attention=AttentionChoice(head=99))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA"):
            Translator.load(model_dir, Runtime(device="cuda"))


def test_attention_maps_and_png(translator, tmp_path):
    maps = attention_maps(translator, "the cat sat", layer=0, head=1, decode=DecodeConfig(beam=2))
    s, t = len(maps.source_pieces), len(maps.target_pieces)
    assert maps.encoder.shape == (s, s) and maps.decoder.shape == (t, t) and maps.cross.shape == (t, s)
    assert torch.all(maps.decoder.triu(1) == 0)  # causal
    need_extra("plot", "matplotlib")
    path = plot_attention(maps, tmp_path / "attn.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.png"))  # no temporary file left behind


def test_attention_plot_without_matplotlib_is_a_clear_error(translator, tmp_path, monkeypatch):
    maps = attention_maps(translator, "tea", decode=DecodeConfig(beam=1))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(TransduceError, match="matplotlib"):
        plot_attention(maps, tmp_path / "x.png")
    with pytest.raises(TransduceError, match="empty"):
        attention_maps(translator, "")


def test_an_encoder_only_model_is_refused_in_one_line():
    from transduce.config import ModelConfig
    from transduce.model import EncoderOnly

    model = EncoderOnly(ModelConfig(arch="encoder_only", src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                    n_encoder_layers=1, d_ff=32))
    with pytest.raises(ConfigError, match="^translate: needs an encoder_decoder model; this one is encoder_only$"):
        Translator(model, None)
