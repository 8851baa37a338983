"""The decoder-only language model: causality, cached vs uncached logits, save/load by arch."""

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig
from transduce.errors import ConfigError
from transduce.model import DecoderOnlyLM, Transformer, build_model, load_model, save_model
from transduce.model.layers import FeedForward

V = 40


def _cfg(**kw):
    base = dict(arch="decoder_only", src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4,
                n_encoder_layers=0, n_decoder_layers=2, d_ff=64, dropout=0.0, max_positions=64)
    return ModelConfig(**{**base, **kw})


def _gpt2_like(**kw):
    return _cfg(norm="pre", positions="learned", activation="gelu_tanh", scale_embeddings=False, **kw)


def test_gelu_tanh_is_gpt2s_activation():
    cfg = _cfg(activation="gelu_tanh")
    ffn = FeedForward(cfg)
    x = torch.randn(3, 5, 32)
    want = ffn.fc2(F.gelu(ffn.fc1(x), approximate="tanh"))
    torch.testing.assert_close(ffn(x), want)
    assert not torch.allclose(ffn(x), ffn.fc2(F.gelu(ffn.fc1(x))))  # not the exact erf GELU


def test_arch_is_validated():
    with pytest.raises(ConfigError, match="model.arch"):
        _cfg(arch="seq2seq")


def test_lm_has_no_encoder_or_cross_attention():
    lm = DecoderOnlyLM(_gpt2_like())
    names = [n for n, _ in lm.named_parameters()]
    assert not any("cross_attn" in n or "encoder" in n or "norm2" in n for n in names)
    assert lm.output_proj.weight is lm.tgt_embed.tokens.weight  # tied


@pytest.mark.parametrize("kw", [{}, dict(norm="pre", positions="learned", activation="gelu_tanh"),
                                dict(positions="rope")])
def test_lm_is_causal(kw):
    torch.manual_seed(0)
    lm = DecoderOnlyLM(_cfg(**kw)).eval()
    ids = torch.randint(3, V, (2, 9))
    changed = ids.clone()
    changed[:, 5:] = torch.randint(3, V, (2, 4))
    a, b = lm(ids), lm(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("kw", [{}, dict(norm="pre", positions="learned", activation="gelu_tanh"),
                                dict(positions="rope")])
def test_cached_decoding_matches_full_forward(kw):
    torch.manual_seed(0)
    lm = DecoderOnlyLM(_cfg(**kw)).eval()
    ids = torch.randint(3, V, (3, 10))
    full = lm(ids)
    cache = lm.new_cache()
    steps = [lm.decode(ids[:, :4], cache).logits]  # a prompt at once, then one token at a time
    for t in range(4, 10):
        steps.append(lm.decode(ids[:, t:t + 1], cache).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 10


def test_project_false_gives_states():
    lm = DecoderOnlyLM(_gpt2_like()).eval()
    ids = torch.randint(3, V, (2, 6))
    states = lm(ids, project=False)
    torch.testing.assert_close(lm.output_proj(states), lm(ids))


def test_build_model_by_arch():
    assert isinstance(build_model(_cfg()), DecoderOnlyLM)
    assert isinstance(build_model(_cfg(arch="encoder_decoder", n_encoder_layers=1)), Transformer)


def test_save_load_returns_the_lm(tmp_path):
    torch.manual_seed(0)
    lm = DecoderOnlyLM(_gpt2_like()).eval()
    save_model(lm, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, DecoderOnlyLM)
    ids = torch.randint(3, V, (2, 7))
    torch.testing.assert_close(loaded(ids), lm(ids))
