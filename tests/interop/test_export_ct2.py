"""CTranslate2 export: translate_batch gives our greedy and beam output; int8 stays close."""

from __future__ import annotations

import pytest
import torch

from transduce.config import ModelConfig
from transduce.data.tokenizer import Tokenizer
from transduce.interop import ExportError, export_model
from transduce.interop.ct2 import INT8_LOGPROB_TOL, ct2_translate_ids, verify_ctranslate2
from transduce.interop.verify import search_ids
from transduce.inference.translator import Translator
from transduce.model import Transformer, load_model, save_model
from toy_model import toy_pairs
from extra_helpers import need_extra
from verify_helpers import MAX_LEN, assert_each_difference_fails, corrupted, many_probes, near_tie_export

ctranslate2 = need_extra("export", "ctranslate2")

SOURCES = [s for s, _ in toy_pairs(24, seed=7)]


@pytest.fixture(scope="module")
def ct2_dirs(trained_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ct2")
    reports = {q: export_model(trained_dir, "ctranslate2", root / str(q), quantization=q) for q in (None, "int8")}
    return {q: r.out for q, r in reports.items()}, reports


def _ct2_translate(model_dir, tok: Tokenizer, texts, beam: int) -> list[str]:
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    pieces = [tok._side("src").encode(t, out_type=str) for t in texts]
    results = translator.translate_batch(pieces, beam_size=beam, length_penalty=0.0, max_decoding_length=30,
                                         min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]])
    return [tok._side("tgt").decode(r.hypotheses[0]) for r in results]


def test_same_greedy_translations(ct2_dirs, trained_dir):
    dirs, _ = ct2_dirs
    tr = Translator.load(trained_dir)
    want = tr.translate(SOURCES, beam=1, max_len_a=0.0, max_len_b=30)
    assert _ct2_translate(dirs[None], tr.tokenizer, SOURCES, 1) == want


def test_beam_translations_equal_ours_with_the_best_finished_rule(ct2_dirs, trained_dir):
    """Beam 4 at length penalty 0: CTranslate2 ends a sentence once its best extension ended,
    which is our ``stop="best_finished"``; the outputs must be identical, sentence by sentence."""
    dirs, reports = ct2_dirs
    tr = Translator.load(trained_dir)
    want = tr.translate(SOURCES, beam=4, lenpen=0.0, max_len_a=0.0, max_len_b=30, stop="best_finished")
    got = _ct2_translate(dirs[None], tr.tokenizer, SOURCES, 4)
    assert got == want
    assert reports[None].checks["beam_differences"] == 0


def test_int8_is_smaller_and_close(ct2_dirs, trained_dir):
    dirs, reports = ct2_dirs
    assert (dirs["int8"] / "model.bin").stat().st_size < 0.6 * (dirs[None] / "model.bin").stat().st_size
    tr = Translator.load(trained_dir)
    want = tr.translate(SOURCES, beam=1, max_len_a=0.0, max_len_b=30)
    got = _ct2_translate(dirs["int8"], tr.tokenizer, SOURCES, 1)
    agreement = sum(g == w for g, w in zip(got, want)) / len(want)
    assert agreement >= 0.75, list(zip(got, want))
    # int8 rounding moves each token's log-prob by an amount that depends on the CPU's int8
    # kernels, and a sequence's by the sum over its tokens: the bound is per token (the export's
    # own check, 12 tokens at most here), not one fixed figure tuned on one machine
    assert reports["int8"].checks["max_logprob_diff"] <= INT8_LOGPROB_TOL * 12


@pytest.mark.parametrize("beam", [1, 4])
def test_a_corrupted_eager_model_fails_verification(ct2_dirs, trained_dir, beam):
    """The export against the trained model with one output row times 1.5: the verification
    fails (at the log-probs), and so does each probe whose translate_batch output differs."""
    dirs, _ = ct2_dirs
    model, tok = load_model(trained_dir).eval(), Tokenizer.load(trained_dir)
    src = many_probes(model)
    broken = corrupted(model, src)
    with pytest.raises(ExportError, match="verification failed"):
        verify_ctranslate2(broken, tok, dirs[None], None)
    translator = ctranslate2.Translator(str(dirs[None]), device="cpu", intra_threads=1)
    want = search_ids(broken, src, beam, MAX_LEN, stop="best_finished")
    got = ct2_translate_ids(translator, tok, src, beam, MAX_LEN)
    assert_each_difference_fails("CTranslate2", broken, src, want, got, beam=beam > 1, renormalized=True)


def test_a_near_tie_broken_the_other_way_verifies(tmp_path, trained_dir):
    """Exported with two tokens' tie broken one way, verified against the model with it broken the
    other: greedy and beam outputs differ, by ties, and verification passes."""
    eager, out = near_tie_export(tmp_path, trained_dir, "ctranslate2")
    checks = verify_ctranslate2(eager, Tokenizer.load(trained_dir), out, None)
    assert checks["greedy_differences"] >= 1 and checks["beam_differences"] >= 1


@pytest.mark.parametrize("options", [
    dict(norm="pre", positions="rope", bias=False, layer_norm_eps=1e-6),
    dict(activation="swiglu", positions="learned", share_embeddings=False, tie_output=False, scale_embeddings=False),
    dict(activation="gelu", n_encoder_layers=3, n_heads=4),
    dict(activation="gelu_tanh"),
    dict(activation="silu", output_bias=True),
    dict(head_dim=12, norm="pre", positions="rope"),  # heads wider than d_model / n_heads (HF T5's d_kv)
    dict(positions="relative", relative_buckets=8, relative_max_distance=12),  # the paper's, with T5's bias
    dict(positions="relative", norm="pre", norm_kind="rms", bias=False, scale_embeddings=False,  # T5 1.1
         scale_attention=False, activation="geglu", share_embeddings=True, tie_output=False, head_dim=4),
    dict(positions="relative", norm="pre", norm_kind="rms", bias=False, scale_embeddings=False,  # T5 1.0
         scale_attention=False, scale_output=True, layer_norm_eps=1e-6),
])
def test_options_beyond_marian(tmp_path, trained_dir, options):
    """CTranslate2's spec covers every transduce option; the export verifies each of them."""
    tok = Tokenizer.load(trained_dir)
    base = dict(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=16, n_heads=2,
                n_encoder_layers=1, n_decoder_layers=2, d_ff=32)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**base, **options}))
    if model.output_proj.bias is not None:  # zero at initialisation: make it matter
        torch.nn.init.normal_(model.output_proj.bias)
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    report = export_model(tmp_path / "m", "ctranslate2", tmp_path / "out")
    assert report.checks["max_logprob_diff"] < 1e-3


def test_zero_layers_refused(tmp_path, trained_dir):
    tok = Tokenizer.load(trained_dir)
    cfg = ModelConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=16, n_heads=2,
                      n_encoder_layers=0, n_decoder_layers=1, d_ff=32)
    save_model(Transformer(cfg), tmp_path / "m")
    tok.save(tmp_path / "m")
    with pytest.raises(ExportError, match=r"model\.n_encoder_layers=0"):
        export_model(tmp_path / "m", "ctranslate2", tmp_path / "out")
    assert not (tmp_path / "out").exists()
