"""Attention for long inputs: local (sliding window + global tokens) and Linformer, against full
attention under the explicit mask and against their formulas written out."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce.config import AttentionConfig, ModelConfig
from transduce.errors import ConfigError
from transduce.model import DecoderOnlyLM, MultiHeadAttention, Transformer
from transduce.model.local_attention import local_attention
from transduce.model.masks import causal_mask, combine, local_mask
from attention_helpers import B, D, DH, H, _key_mask, decode_step_by_step

V = 40
L = 13  # long enough for several blocks at the small windows below


def _qkv(t_q, t_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, t, DH, generator=g, requires_grad=True) for t in (t_q, t_k, t_k))


def _band_reference(q, k, v, mask, window, n_global, causal, start):
    """Full attention (F.scaled_dot_product_attention) under the explicit band + global mask
    (non-causal queries past the last key stand at the last key)."""
    q_pos = torch.arange(start, start + q.shape[-2])
    q_pos = q_pos if causal else q_pos.clamp(max=k.shape[-2] - 1)
    band = local_mask(q_pos, torch.arange(k.shape[-2]), window, n_global, causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=combine(mask, band))


def _grads(out, tensors):
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), tensors)


def test_local_mask_is_the_band_plus_global_rows_and_columns():
    m = local_mask(torch.arange(6), torch.arange(6), window=1, n_global=1)[0, 0]
    want = torch.tensor([[1, 1, 1, 1, 1, 1],
                         [1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0],
                         [1, 0, 1, 1, 1, 0],
                         [1, 0, 0, 1, 1, 1],
                         [1, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, want)
    causal = local_mask(torch.arange(6), torch.arange(6), window=1, n_global=1, causal=True)
    assert torch.equal(causal, want & causal_mask(6))
    assert torch.equal(local_mask(torch.arange(6), torch.arange(6), window=6), torch.ones(1, 1, 6, 6, dtype=torch.bool))


@pytest.mark.parametrize("window", [1, 2, 4])
@pytest.mark.parametrize("n_global", [0, 1, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_local_equals_full_under_the_band_mask(window, n_global, causal, padded):
    q, k, v = _qkv(L, L)
    mask = _key_mask(L) if padded else None
    ours = local_attention(q, k, v, mask, window, n_global, causal)
    ref = _band_reference(q, k, v, mask, window, n_global, causal, 0)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    for g, r in zip(_grads(ours, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("start,t_q,t_k,causal", [(4, 3, 7, True), (6, 1, 7, True), (5, 2, 11, False), (0, 6, 9, False),
                                                  (0, 12, 5, False), (9, 1, 5, False)])
def test_local_with_offset_queries(start, t_q, t_k, causal):
    """The last queries of a cached prefix (causal) and target positions over a source (cross)."""
    q, k, v = _qkv(t_q, t_k)
    mask = _key_mask(t_k)
    ours = local_attention(q, k, v, mask, 2, 1, causal, start)
    torch.testing.assert_close(ours, _band_reference(q, k, v, mask, 2, 1, causal, start), atol=1e-6, rtol=1e-5)


def _pair(seed=0, **kw):
    """A full-attention Transformer and one with ``kw``, sharing every weight."""
    base = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_heads=H, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=48, dropout=0.0, max_positions=32)
    torch.manual_seed(seed)
    full = Transformer(ModelConfig(**base)).eval()
    other = Transformer(ModelConfig(**{**base, **kw})).eval()
    missing, _ = other.load_state_dict(full.state_dict(), strict=False)
    assert all("e_proj" in n or "f_proj" in n for n in missing)
    return full, other


def _batch(seed=0, b=3, s=L, t=L - 2):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, s), generator=g)
    src[1, s - 4:] = 0
    src[2, 3:] = 0
    tgt = torch.randint(3, V, (b, t), generator=g)
    tgt[:, 0] = 1
    return src, tgt


@pytest.mark.parametrize("n_global", [0, 2])
def test_local_with_a_window_over_the_whole_length_is_full_attention(n_global):
    full, local = _pair(attention=AttentionConfig("local", cross="local", window=L, global_tokens=n_global))
    src, tgt = _batch()
    a, b = full(src, tgt), local(src, tgt)
    grads = zip(torch.autograd.grad(a.square().sum(), list(full.parameters())),
                torch.autograd.grad(b.square().sum(), list(local.parameters())))
    if n_global == 0:  # one block holding every query and key: the same kernel call, bit for bit
        assert torch.equal(b, a)
        assert all(torch.equal(q, p) for p, q in grads)
    else:  # the global rows are their own block: the same math, summed in another order
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        for p, q in grads:
            torch.testing.assert_close(q, p, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cross", ["full", "local"])
@pytest.mark.parametrize("n_global", [0, 2])
def test_cached_local_decoding_equals_uncached(cross, n_global):
    _, model = _pair(attention=AttentionConfig("local", cross=cross, window=2, global_tokens=n_global))
    src, tgt = _batch()
    with torch.no_grad():
        whole = model(src, tgt)
        steps, chunks, _ = decode_step_by_step(model, src, tgt, chunk=3)
        full = _pair()[0](src, tgt)
    torch.testing.assert_close(steps, whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunks, whole, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(whole, full, atol=1e-3)  # the window does cut the context


def test_cached_local_lm_equals_uncached():
    torch.manual_seed(0)
    lm = DecoderOnlyLM(ModelConfig(arch="decoder_only", src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_heads=H,
                                   n_decoder_layers=2, d_ff=48, attention=AttentionConfig("local", window=3,
                                                                                          global_tokens=1))).eval()
    ids = _batch()[1]
    with torch.no_grad():
        whole = lm(ids)
        cache, steps = lm.new_cache(), []
        for t in range(ids.shape[1]):
            out = lm.decode(ids[:, t:t + 1], cache)
            cache = out.cache
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=1e-4)


def test_linformer_equals_its_formula():
    """head_i = softmax(Q W_i^Q (E K W_i^K)^T / sqrt(d_k)) F V W_i^V (Linformer Eq. 7), with E and
    F cut to the S columns in use and padded keys/values zeroed."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, pattern=AttentionConfig("linformer", linformer_k=4), max_len=10).eval()
    x = torch.randn(B, 7, D)
    mask = _key_mask(7)
    ours, _ = attn(x, x, mask)
    keep = mask[:, 0, 0, :, None].float()                                  # (B, S, 1)
    e, f = attn.e_proj.weight[:, :7], attn.f_proj.weight[:, :7]            # (k, S)
    heads = []
    for i in range(H):
        cols = slice(i * DH, (i + 1) * DH)
        q = x @ attn.q_proj.weight[cols].T + attn.q_proj.bias[cols]         # (B, S, Dh)
        k = (x @ attn.k_proj.weight[cols].T + attn.k_proj.bias[cols]) * keep
        v = (x @ attn.v_proj.weight[cols].T + attn.v_proj.bias[cols]) * keep
        weights = torch.softmax(q @ (e @ k).transpose(1, 2) / math.sqrt(DH), dim=-1)  # (B, S, k)
        heads.append(weights @ (f @ v))
    ref = torch.cat(heads, -1) @ attn.out_proj.weight.T + attn.out_proj.bias
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="model.max_positions: linformer attention spans 10 positions; got 11"):
        attn(torch.randn(1, 11, D), torch.randn(1, 11, D))


@pytest.mark.parametrize("kw", [dict(attention=AttentionConfig("local", window=2, global_tokens=1)),
                                dict(attention=AttentionConfig("linformer", linformer_k=5))])
def test_source_padding_is_inert(kw):
    """Extra padding changes nothing at the real positions (local: masked keys; Linformer: zeroed)."""
    _, model = _pair(**kw)
    src, tgt = _batch()
    padded = torch.cat([src, torch.zeros(src.shape[0], 5, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", [dict(attention=AttentionConfig("local", cross="local", window=2, global_tokens=1)),
                                dict(attention=AttentionConfig("linformer", linformer_k=4))])
def test_training_reduces_loss(kw):
    _, model = _pair(**kw)
    model.train()
    src, tgt = _batch()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(src, tgt[:, :-1]).reshape(-1, V), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_attention_maps_need_full_attention():
    _, model = _pair(attention=AttentionConfig("local", window=2))
    with pytest.raises(ConfigError, match="attention maps need full attention"):
        model.encode(_batch()[0], need_weights=True)


@pytest.mark.parametrize("kw, message", [
    (dict(attention=dict(kind="sparse")), "model.attention.kind: must be one of full, local, linformer"),
    (dict(attention=dict(cross="linformer")),
     "model.attention.cross: linformer applies to encoder self-attention only"),
    (dict(attention=dict(window=0)), "model.attention.window: must be >= 1"),
    (dict(attention=dict(global_tokens=-1)), "model.attention.global_tokens: must be >= 0"),
    (dict(attention=dict(kind="linformer", linformer_k=2048)),
     r"model.attention.linformer_k: must be in \[1, model.max_positions=1024\]"),
    (dict(attention=dict(kind="linformer"), arch="decoder_only"),
     "model.attention.kind: linformer applies to encoder self-attention"),
])
def test_bad_attention_options_are_one_line_errors(kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        ModelConfig(**{**dict(src_vocab_size=V, tgt_vocab_size=V), **kw})
    assert "\n" not in str(e.value)


def _qkv_b(b, t_q, t_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, H, t, DH, generator=g, requires_grad=True) for t in (t_q, t_k, t_k))


@pytest.mark.parametrize("b,padded", [(1, False), (1, True), (3, False), (3, True)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("start,t_q,t_k", [(0, 29, 29), (0, 32, 32), (0, 8, 8), (5, 19, 24), (0, 17, 30), (3, 9, 40)])
def test_fused_blocks_equal_the_band_mask_forward_and_gradients(b, padded, causal, start, t_q, t_k):
    """The 4-D blocked path (one sequence: a mask shared by the inner blocks, separate edge blocks;
    several: a mask per block) against full attention under the explicit band mask."""
    if causal and start + t_q != t_k:
        t_k = start + t_q  # (causal queries are the last of the keys)
    q, k, v = _qkv_b(b, t_q, t_k, seed=t_q + t_k)
    mask = None
    if padded:
        mask = (torch.arange(t_k) < torch.tensor([t_k, t_k - 5, t_k - 2][:b])[:, None])[:, None, None, :]
    ours = local_attention(q, k, v, mask, 4, 0, causal, start)
    ref = _band_reference(q, k, v, mask, 4, 0, causal, start)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(_grads(ours, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_global", [0, 3])
def test_local_attention_takes_the_fused_kernel(causal, n_global):
    """Restricted to SDPA's flash kernel, which only takes 4-D inputs, local attention still
    runs (the 5-D batched version needed the math kernel) and still equals the band mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv_b(1, 40, 40)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ours = local_attention(q, k, v, None, 8, n_global, causal)
        grads = _grads(ours, (q, k, v))
    ref = _band_reference(q, k, v, None, 8, n_global, causal, 0)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, _grads(ref, (q, k, v))):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key_mask", [False, True])
def test_local_attention_keeps_o_of_t_for_the_backward_pass(causal, key_mask):
    """What autograd keeps is the q, k, v buffers, the output, the log-sum-exp and a few (W x
    span) masks: no weights per block and (one sequence, no padding) no mask per block."""
    t, w = 512, 16
    q, k, v = _qkv_b(1, t, t)
    storages = {}

    def pack(x):
        storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        mask = torch.ones(1, 1, 1, t, dtype=torch.bool) if key_mask else None  # nothing padded
        local_attention(q, k, v, mask, w, 0, causal)
    for x in (q, k, v):
        storages.pop(x.untyped_storage().data_ptr(), None)
    if key_mask:
        storages.pop(mask.untyped_storage().data_ptr(), None)
    span, floats = (2 if causal else 3) * w, 4
    budget = 4 * (t + 2 * w) * H * DH + 3 * w * span + (t + 2 * w) * H   # buffers + out, masks, lse
    assert sum(storages.values()) <= budget * floats
