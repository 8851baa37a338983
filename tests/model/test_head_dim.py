"""``model.head_dim``: heads of a width other than d_model / n_heads (the paper's Table 3 row (B),
T5 1.1's ``d_kv``): attention against a hand-written reference, the cache, every attention kind,
save and load, and the config's checks."""

import math

import pytest
import torch

from transduce.config import ModelConfig
from transduce.errors import ConfigError
from transduce.model import Transformer, build_model, load_model, save_model
from transduce.model.attention import MultiHeadAttention
from transduce.model.masks import padding_mask
from attention_helpers import decode_step_by_step

D, H, DH, V = 24, 4, 10, 40  # H * DH = 40 != D


def reference_attention(attn: MultiHeadAttention, x, kv, key_mask=None, causal=False, scale=None):
    """Eq. 1 and MultiHead (Sec. 3.2.2) written out: heads of width Dh from W^Q, W^K, W^V (D -> H*Dh),
    concatenated and projected by W^O (H*Dh -> D). -> output (B, Tq, D), weights (B, H, Tq, Tk)."""
    b, t_q, _ = x.shape
    t_k = kv.shape[1]

    def heads(y, proj, t):
        return proj(y).view(b, t, attn.n_heads, attn.head_dim).transpose(1, 2)   # (B, H, T, Dh)

    q, k, v = heads(x, attn.q_proj, t_q), heads(kv, attn.k_proj, t_k), heads(kv, attn.v_proj, t_k)
    scale = 1 / math.sqrt(attn.head_dim) if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale                     # (B, H, Tq, Tk)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool).tril().logical_not(), float("-inf"))
    weights = scores.softmax(-1)
    out = torch.einsum("bhqk,bhkd->bqhd", weights, v).reshape(b, t_q, -1)      # (B, Tq, H*Dh)
    return attn.out_proj(out), weights


def _attention(scale=None) -> MultiHeadAttention:
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, head_dim=DH, scale=scale).double().eval()
    for p in attn.parameters():  # non-zero biases so that they are compared too
        torch.nn.init.normal_(p, std=0.2)
    return attn


def test_projections_have_the_head_width():
    attn = MultiHeadAttention(D, H, head_dim=DH)
    assert attn.q_proj.weight.shape == attn.k_proj.weight.shape == attn.v_proj.weight.shape == (H * DH, D)
    assert attn.out_proj.weight.shape == (D, H * DH)
    assert MultiHeadAttention(D, H).q_proj.weight.shape == (D, D)  # unset: d_model / n_heads, as before


@pytest.mark.parametrize("cross,masked,causal,scale", [(False, False, False, None), (False, True, True, None),
                                                        (True, True, False, None), (True, False, False, 1.0)])
def test_matches_a_hand_written_reference_forward_and_backward(cross, masked, causal, scale):
    """Float64 on both sides: the SDPA path differs only in rounding far below the tolerance; the
    path with weights takes its softmax in float32 (for half-precision inputs), so float32's."""
    attn = _attention(scale)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, D, dtype=torch.float64, generator=g, requires_grad=True)
    kv = torch.randn(2, 7, D, dtype=torch.float64, generator=g, requires_grad=True) if cross else x
    ids = torch.ones(2, kv.shape[1], dtype=torch.long)
    ids[1, -2:] = 0
    mask = padding_mask(ids, 0) if masked else None
    ref, ref_w = reference_attention(attn, x, kv, mask, causal, scale)
    for need_weights, tol in ((False, 1e-10), (True, 1e-6)):  # SDPA path and the explicit math path
        out, w = attn(x, kv, mask, is_causal=causal, need_weights=need_weights)
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
        if need_weights:
            torch.testing.assert_close(w, ref_w, atol=tol, rtol=tol)
    upstream = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    inputs = [x] + ([kv] if cross else []) + list(attn.parameters())
    want = torch.autograd.grad((ref * upstream).sum(), inputs)
    got = torch.autograd.grad((attn(x, kv, mask, is_causal=causal)[0] * upstream).sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def _cfg(**kw) -> ModelConfig:
    base = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_heads=H, head_dim=DH, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=32, dropout=0.0, max_positions=64,
                attention={"linformer_k": 8, "block": 4, **kw.pop("attention", {})})
    return ModelConfig(**{**base, **kw})


def _batch(b=3, s=9, t=7):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, V, (b, s), generator=g)
    src[1, 6:] = 0
    tgt = torch.randint(3, V, (b, t), generator=g)
    tgt[:, 0] = 1
    return src, tgt


@pytest.mark.parametrize("kw", [dict(), dict(positions="rope"), dict(norm="pre", activation="swiglu"),
                                dict(positions="relative", norm="pre", norm_kind="rms", bias=False,
                                     scale_attention=False, scale_embeddings=False, scale_output=True),
                                dict(attention=dict(kind="local", window=2, cross="local")),
                                dict(attention=dict(kind="lsh",
                                                               lsh_buckets=4)), dict(attention=dict(kind="linformer")),
                                dict(attention=dict(kind="bigbird", random_blocks=1))])
def test_the_cache_equals_the_full_forward(kw):
    """Every attention kind follows head_dim: decoding with the KV cache (one token at a time, and
    a chunk) gives the logits of one full forward pass."""
    torch.manual_seed(0)
    model = Transformer(_cfg(**kw)).eval()
    assert model.decoder_layers[0].self_attn.head_dim == DH
    src, tgt = _batch()
    with torch.no_grad():
        full = model(src, tgt)
        steps, chunks, _ = decode_step_by_step(model, src, tgt, chunk=3)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunks, full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_save_and_load_round_trip(tmp_path, arch):
    torch.manual_seed(0)
    model = build_model(_cfg(arch=arch)).eval()
    loaded = load_model(save_model(model, tmp_path / "m"))
    assert loaded.config == model.config and loaded.config.head_dim == DH
    src, tgt = _batch()
    with torch.no_grad():
        want, got = (m(src, tgt) if arch == "encoder_decoder" else m(src) for m in (model, loaded))
    assert torch.equal(getattr(want, "logits", want), getattr(got, "logits", got))


def test_unset_head_dim_is_todays_model():
    """head_dim unset or equal to d_model / n_heads: the same parameters, the same outputs."""
    torch.manual_seed(0)
    a = Transformer(_cfg(head_dim=None)).eval()
    torch.manual_seed(0)
    b = Transformer(_cfg(head_dim=D // H)).eval()
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    src, tgt = _batch()
    with torch.no_grad():
        assert torch.equal(a(src, tgt), b(src, tgt))


@pytest.mark.parametrize("value,match", [(0, "model.head_dim: must be positive"),
                                         (-4, "model.head_dim: must be positive"),
                                         ("wide", "model.head_dim: must be int"),
                                         (2.5, "model.head_dim: must be int")])
def test_bad_head_dim_is_a_one_line_error(value, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(head_dim=value)


def test_head_dim_frees_d_model_from_dividing_by_the_heads():
    assert _cfg(d_model=30, n_heads=4, head_dim=8).attention_width == 32
    with pytest.raises(ConfigError, match="model.d_model: 30 is not divisible by model.n_heads=4"):
        _cfg(d_model=30, n_heads=4, head_dim=None)
    with pytest.raises(ConfigError, match="rope needs an even head dimension; got 5"):
        _cfg(head_dim=5, positions="rope")
