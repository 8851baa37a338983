"""Searches over models with local, Linformer, BigBird or LSH attention: the prepared (fast) decoding paths,
beams sharing the encoder keys, equal the plain model's teacher-forced math."""

import pytest
import torch

from inference_helpers import BOS, PAD, assert_same_search, random_sources, tiny_transformer
from transduce.config import AttentionConfig, DecodeConfig
from transduce.inference import beam_search, greedy_search
from transduce.errors import ConfigError
from transduce.inference import SearchSpec

LONG = dict(attention=AttentionConfig("local", cross="local", window=2, global_tokens=1))


def _teacher_forced_log_probs(model, src, tokens, lengths):
    """Sum of log p(token) of each hypothesis (B, K, T) under one forward pass of the model."""
    b, k, t = tokens.shape
    rows = src.repeat_interleave(k, 0)
    out = tokens.reshape(b * k, t)
    tgt_in = torch.cat([torch.full((b * k, 1), BOS), out[:, :-1]], 1)
    with torch.no_grad():
        logp = model(rows, tgt_in).log_softmax(-1).gather(-1, out[..., None]).squeeze(-1)   # (BK, T)
    keep = torch.arange(t)[None] < lengths.reshape(-1, 1)
    return (logp * keep).sum(-1).view(b, k)


@pytest.mark.parametrize("kw", [LONG, dict(attention=AttentionConfig("linformer", linformer_k=4)),
                                dict(attention=AttentionConfig("bigbird", block=2, random_blocks=1)),
                                dict(attention=AttentionConfig("lsh", block=2, lsh_buckets=4))])
def test_greedy_with_and_without_the_cache_agree(kw):
    model = tiny_transformer(seed=3, **kw)
    src = random_sources([9, 4, 12], seed=3)
    decode = DecodeConfig(max_len_b=10)
    a, b = greedy_search(model, src, decode), greedy_search(model, src, decode, use_cache=False)
    assert_same_search(b, a, log_probs=(1e-5, 1e-4))


def test_beam_scores_are_the_models_log_probs():
    """Beams read their sentence's encoder keys once (shared rows) through local cross-attention."""
    model = tiny_transformer(seed=4, **LONG)
    src = random_sources([10, 5], seed=4)
    out = beam_search(model, src, DecodeConfig(beam=3, nbest=3, max_len_b=8, lenpen=0.0))
    assert out.tokens.shape[:2] == (2, 3) and (out.tokens[..., 0] != PAD).all()
    torch.testing.assert_close(out.log_probs, _teacher_forced_log_probs(model, src, out.tokens, out.lengths),
                               atol=1e-4, rtol=1e-4)


def test_static_decoding_refuses_local_attention():
    model = tiny_transformer(**LONG)
    src = random_sources([3])
    assert not SearchSpec().uses_static(model, src)
    with pytest.raises(ConfigError, match="static decoding runs full attention only"):
        SearchSpec(static=True).run(model, src)
