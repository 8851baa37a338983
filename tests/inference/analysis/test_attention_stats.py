"""Attention health (issue 58): the per-query figures against a loop over a hand-made padded map;
the trained toy model against a freshly initialised one of the same shape and against itself
with one head forced uniform and one forced to collapse onto EOS; batching, AER and
monotonicity against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from toy_model import toy_pairs
from transduce.data.tokenizer import load_tokenizer
from transduce.errors import ConfigError
from transduce.inference import HealthLimits, Translator, attention_stats
from transduce.inference.text.alignment import hard_alignment
from transduce.inference.analysis.attention_stats import CLASSES, OFFSETS, HeadTally, query_figures
from transduce.model import Transformer, load_model

PAIRS = toy_pairs(60, seed=11)
SOURCES, TARGETS = [s for s, _ in PAIRS], [t for _, t in PAIRS]
DIAGONAL = [[(i, i) for i in range(len(s.split()))] for s in SOURCES]  # word-for-word: word i to word i


def _hand_made(causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B=3, H=2, 5, 5) softmax weights over each row's real keys (padding, and in the causal
    case later keys, exactly 0); row 0 head 1 uniform, row 1 head 1 one-hot on EOS."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 2])
    scores = torch.randn(3, 2, 5, 5, generator=g) * 2
    keys = torch.arange(5)[None, None, :] < lengths[:, None, None]                      # (B, 1, Tk)
    allowed = keys & (torch.arange(5)[None, :, None] >= torch.arange(5)[None, None, :]) if causal else keys
    scores[0, 1] = 0.0
    scores[1, 1] = -30.0
    scores[1, 1, :, 2] = 30.0  # row 1's EOS is key 2 (length 3)
    w = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
    return w.nan_to_num(0.0), lengths, lengths


def _loop_figures(w, q_len, k_len, causal, classes):
    """The same figures, one query at a time in plain Python (math.log, no torch reductions)."""
    out = {}
    for b in range(w.shape[0]):
        for h in range(w.shape[1]):
            for q in range(int(q_len[b])):
                n = min(q + 1, int(k_len[b])) if causal else int(k_len[b])
                if n < 2:
                    continue
                p = [float(x) for x in w[b, h, q, :n]]
                top = max(p)
                row = {"entropy": -sum(x * math.log(x) for x in p if x > 0) / math.log(n), "max_weight": top}
                for name in classes:
                    pos = 0 if name == "bos" else int(k_len[b]) - 1 if name == "eos" else q + OFFSETS[name]
                    ok = 0 <= pos < n
                    row[f"weight:{name}"] = p[pos] if ok else 0.0
                    row[f"argmax:{name}"] = float(ok and p[pos] == top and sum(x >= top - 1e-6 for x in p) == 1)
                out[(b, h, q)] = row
    return out


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_query_figures_match_a_loop_over_a_padded_map(kind):
    causal = kind == "decoder"
    w, q_len, k_len = _hand_made(causal)
    used, figures = query_figures(w, q_len, k_len, causal, CLASSES[kind])
    want = _loop_figures(w, q_len, k_len, causal, CLASSES[kind])
    assert {k[::2] for k in want} == {tuple(i) for i in used.nonzero().tolist()}  # (b, q) counted
    for (b, h, q), row in want.items():
        for name, value in row.items():
            assert float(figures[name][b, h, q]) == pytest.approx(value, abs=1e-6), (b, h, q, name)
    if not causal:  # the uniform head scores 1.0, the one-hot head 0.0 and collapses onto EOS
        assert torch.allclose(figures["entropy"][0, 1, :5], torch.ones(5), atol=1e-6)
        assert torch.allclose(figures["entropy"][1, 1, :3], torch.zeros(3), atol=1e-6)
        assert figures["argmax:eos"][1, 1, :3].tolist() == [1.0, 1.0, 1.0]
        assert figures["argmax:same"][0, 1].sum() == 0  # a tie has no argmax class


def test_tally_means_and_flags():
    w, q_len, k_len = _hand_made(False)
    tally = HeadTally("encoder", 1, 2)
    tally.add(0, w, q_len, k_len, HealthLimits())
    want = _loop_figures(w, q_len, k_len, False, CLASSES["encoder"])
    uniform = tally.heads(HealthLimits())[1]
    rows = [r for (b, h, _), r in want.items() if h == 1]
    assert uniform.queries == len(rows) == 5 + 3 + 2  # every query of a row has all its keys
    assert uniform.entropy == pytest.approx(sum(r["entropy"] for r in rows) / len(rows), abs=1e-6)
    assert uniform.flags == []  # row 0 uniform, row 1 collapsed onto EOS: neither reaches share=0.9
    loose = tally.heads(HealthLimits(share=0.5))[1]
    assert loose.flags == ["uniform"]


def test_limits_are_checked():
    with pytest.raises(ConfigError, match="share"):
        HealthLimits(share=0.0)
    with pytest.raises(ConfigError, match="uniform"):
        HealthLimits(uniform=1.5)


@pytest.fixture(scope="module")
def toy(trained_dir):
    return load_tokenizer(trained_dir), load_model(trained_dir)


def _stats(model, tokenizer, **kwargs):
    with Translator(model, tokenizer) as translator:
        return attention_stats(translator, SOURCES, TARGETS, **kwargs)


def _forced(model: Transformer) -> Transformer:
    """Decoder layer 1 head 2: zero queries, so constant scores: exactly uniform. Encoder
    layer 0 head 1: a constant query against a key that reads the EOS embedding's direction:
    every query collapses onto EOS."""
    cfg = model.config
    dh = cfg.d_model // cfg.n_heads
    with torch.no_grad():
        a = model.decoder_layers[1].self_attn
        a.q_proj.weight[2 * dh:3 * dh] = 0.0
        a.q_proj.bias[2 * dh:3 * dh] = 0.0
        e = model.encoder_layers[0].self_attn
        eos = model.src_embed.tokens.weight[cfg.eos_id]
        for proj in (e.q_proj, e.k_proj):
            proj.weight[dh:2 * dh] = 0.0
            proj.bias[dh:2 * dh] = 0.0
        e.q_proj.bias[dh] = 30.0
        e.k_proj.weight[dh] = eos / eos.norm()
    return model


def test_trained_untrained_and_forced_heads(toy):
    tokenizer, trained = toy
    cfg = trained.config
    got = _stats(trained, tokenizer)
    assert got.sentences == len(SOURCES) and len(got.heads) == cfg.n_heads * (cfg.n_encoder_layers
                                                                              + 2 * cfg.n_decoder_layers)
    assert got.flagged("uniform") == [] and got.flagged("collapsed") == []
    last = {"encoder": cfg.n_encoder_layers - 1, "decoder": cfg.n_decoder_layers - 1, "cross": cfg.n_decoder_layers - 1}
    top = [h for h in got.heads if h.layer == last[h.kind]]
    assert max(h.uniform_share for h in top) < 0.5  # far from the flag, not just under it
    torch.manual_seed(0)
    fresh = _stats(Transformer(cfg).eval(), tokenizer)
    trained_mean = sum(h.entropy for h in got.heads) / len(got.heads)
    fresh_mean = sum(h.entropy for h in fresh.heads) / len(fresh.heads)
    # Observed on 200 toy pairs (seeds 0-2): untrained 0.84-0.86 mean, per head encoder 0.66-0.83,
    # decoder self 0.69-0.95, cross 0.81-0.94; trained 0.54 mean, decoder layer 0 about 0.3. A
    # post-LN model's first layer attends from unnormalised embeddings * sqrt(D), so random
    # projections already give scores of about unit spread: close to uniform, not at it.
    assert fresh_mean > trained_mean + 0.2
    assert min(h.entropy for h in fresh.heads if h.kind == "cross") > 0.8
    assert min(h.entropy for h in fresh.heads) > 0.55
    forced = _stats(_forced(_copy(trained)), tokenizer)
    assert forced.flagged("uniform") == [("decoder", 1, 2)]
    head = next(h for h in forced.heads if (h.kind, h.layer, h.head) == ("decoder", 1, 2))
    assert head.entropy == pytest.approx(1.0, abs=1e-5) and head.uniform_share == 1.0
    assert forced.flagged("collapsed") == [("encoder", 0, 1)]
    collapsed = next(h for h in forced.heads if h.flags and h.kind == "encoder")
    assert collapsed.flags == ["collapsed:eos"] and collapsed.argmax["eos"] > 0.99


def _copy(model: Transformer) -> Transformer:
    copy = Transformer(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return copy


def test_batching_aer_and_monotonicity_against_one_sentence_at_a_time(toy):
    tokenizer, model = toy
    small = _stats(model, tokenizer, alignments=DIAGONAL, batch_tokens=24)
    large = _stats(model, tokenizer, alignments=DIAGONAL, batch_tokens=4096)
    for a, b in zip(small.heads, large.heads):  # padding changes nothing
        assert (a.queries, a.flags) == (b.queries, b.flags)
        assert a.entropy == pytest.approx(b.entropy, abs=1e-5) and a.aer == pytest.approx(b.aer, abs=1e-9)
    from transduce.evaluation.metrics import alignment_error_rate
    layer, head = 1, 3
    links, xs, ys = [], [], []
    for source, target in PAIRS:
        src = torch.tensor([tokenizer.encode(source, side="src") + [2]])
        tgt_ids = tokenizer.encode(target, side="tgt")
        with torch.inference_mode():
            cross = model.decode(torch.tensor([[1] + tgt_ids]), model.encode(src, need_weights=True),
                                 need_weights=True).cross_attentions[layer][0, head]        # (T, S)
        s_pieces, t_pieces = tokenizer.pieces(src[0, :-1].tolist(), side="src"), tokenizer.pieces(tgt_ids, side="tgt")
        links.append(hard_alignment(cross, s_pieces, t_pieces))
        n_s, n_t = len(s_pieces), len(t_pieces)
        if n_s >= 2 and n_t >= 2:
            xs += [i / (n_t - 1) for i in range(n_t)]
            ys += [j / (n_s - 1) for j in cross[:n_t, :n_s].argmax(-1).tolist()]
    got = next(h for h in small.heads if (h.kind, h.layer, h.head) == ("cross", layer, head))
    assert got.aer == pytest.approx(alignment_error_rate(links, DIAGONAL), abs=1e-9)
    assert got.monotonicity == pytest.approx(float(np.corrcoef(xs, ys)[0, 1]), abs=1e-6)
    assert got.monotonicity > 0.5 and got.aer < 0.5  # the trained toy model reads word for word


def test_bad_inputs(toy):
    tokenizer, model = toy
    with Translator(model, tokenizer) as translator:
        with pytest.raises(ConfigError, match="non-empty source"):
            attention_stats(translator, ["", " "])
        with pytest.raises(ConfigError, match="targets"):
            attention_stats(translator, ["a"], alignments=[[]])
        with pytest.raises(ConfigError, match="2 sources for 1 targets"):
            attention_stats(translator, ["a", "b"], ["x"])
