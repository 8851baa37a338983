"""The fast banded kernel of local attention against the blockwise reference and against Eq. 1
under the explicit band mask (float64, so the tolerance is the arithmetic's), and the choice of
attention kernel, made once when a module is built."""

import copy

import pytest
import torch
import torch.nn.functional as F

from transduce.config import AttentionConfig, ModelConfig
from transduce.errors import ConfigError
from transduce.model import MultiHeadAttention, Transformer, full_attention_only
from transduce.model.attention import FullAttention
from transduce.model.linformer import LinformerAttention
from transduce.model.local_attention import (LocalAttention, banded_local_attention, blockwise_local_attention,
                                             local_attention)
from transduce.model.masks import combine, local_mask

H, DH, W = 2, 8, 4
TOL = dict(atol=1e-12, rtol=1e-10)


def _inputs(b, t_q, t_k, padded):
    g = torch.Generator().manual_seed(100 * t_q + t_k)
    q, k, v = (torch.randn(b, H, t, DH, generator=g, dtype=torch.float64, requires_grad=True)
               for t in (t_q, t_k, t_k))
    lengths = torch.tensor([t_k, t_k - 5, t_k - 2][:b]) if padded == "padded" else torch.full((b,), t_k)
    mask = None if padded == "none" else (torch.arange(t_k) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)
    return q, k, v, mask


def _dense(q, k, v, mask, n_global, causal, start):
    """Eq. 1 over every key under the (Tq x Tk) band + global mask."""
    band = local_mask(torch.arange(start, start + q.shape[-2]), torch.arange(k.shape[-2]), W, n_global, causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=combine(mask, band))


def _grads(out, tensors):
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum(),
                               tensors)


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("padded", ["none", "all_true", "padded"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_global", [0, 3])
@pytest.mark.parametrize("start,t_q,t_k", [(0, 17, 30), (0, 32, 32), (3, 29, 32), (5, 19, 24), (3, 9, 40),
                                           (4, 8, 12)])
def test_banded_kernel_equals_the_blockwise_reference(b, padded, causal, n_global, start, t_q, t_k):
    """Forward and gradients: one sentence or several, no mask, a mask hiding nothing (the shared
    band mask) or padding, causal or not, global keys or not, queries from 0 or after a cache."""
    start = max(start, n_global)  # (the kernel's queries are never global ones, nor past the last key)
    t_k = start + t_q if causal else max(t_k, start + t_q)
    q, k, v, mask = _inputs(b, t_q, t_k, padded)
    fast = banded_local_attention(q, k, v, mask, W, n_global, causal, start)
    ref = blockwise_local_attention(q, k, v, mask, W, n_global, causal, start)
    dense = _dense(q, k, v, mask, n_global, causal, start)
    torch.testing.assert_close(fast, ref, **TOL)
    torch.testing.assert_close(ref, dense, **TOL)
    for f, r in zip(_grads(fast, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(f, r, **TOL)


@pytest.mark.parametrize("n_global", [0, 2])
def test_local_attention_runs_the_global_rows_and_the_band_apart(n_global):
    """The dispatcher: the global queries' whole rows, then the band, equal the reference loop."""
    q, k, v, mask = _inputs(2, 30, 30, "padded")
    ours = local_attention(q, k, v, mask, W, n_global)
    torch.testing.assert_close(ours, blockwise_local_attention(q, k, v, mask, W, n_global), **TOL)
    torch.testing.assert_close(ours, _dense(q, k, v, mask, n_global, False, 0), **TOL)


@pytest.mark.parametrize("pattern, kernel", [
    (AttentionConfig(), FullAttention),
    (AttentionConfig("local", window=3, global_tokens=1), LocalAttention),
    (AttentionConfig("linformer", linformer_k=4), LinformerAttention),
])
def test_a_module_chooses_its_kernel_once(pattern, kernel):
    attn = MultiHeadAttention(16, 2, pattern=pattern, max_len=10).eval()
    assert isinstance(attn.kernel, kernel)
    assert attn.is_full == (kernel is FullAttention)
    x = torch.randn(2, 6, 16)
    if kernel is not FullAttention:
        with pytest.raises(ConfigError, match=f"attention maps need full attention; this model has {pattern.kind}"):
            attn(x, x, need_weights=True)
    if kernel is LinformerAttention:  # E and F stay the module's parameters, under their names
        assert {"e_proj.weight", "f_proj.weight"} <= set(attn.state_dict())
        twin = copy.deepcopy(attn)  # (as int8 quantisation does): the copy's kernel holds the copy's E and F
        assert twin.kernel.e_proj is twin.e_proj and twin.kernel.f_proj is twin.f_proj
        torch.testing.assert_close(twin(x, x)[0], attn(x, x)[0])


@pytest.mark.parametrize("kw, full", [
    (dict(), True),
    (dict(attention=AttentionConfig("local")), False),
    (dict(attention=AttentionConfig(cross="local")), False),
    (dict(attention=AttentionConfig("linformer", linformer_k=8)), False),
])
def test_full_attention_only(kw, full):
    cfg = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=1,
                      n_decoder_layers=1, d_ff=32, max_positions=32, **kw)
    assert full_attention_only(Transformer(cfg)) == full


def test_the_banded_kernel_refuses_what_only_the_reference_takes():
    q, k, v, _ = _inputs(1, 12, 12, "none")
    with pytest.raises(ValueError, match="use local_attention"):
        banded_local_attention(q, k, v, None, W, n_global=2)  # queries 0 and 1 are global
