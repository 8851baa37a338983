"""Attention against PyTorch's reference operations."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transduce.model.attention import MultiHeadAttention, scaled_dot_product_attention
from transduce.model.masks import causal_mask, combine, padding_mask
from attention_helpers import B, D, H, S, T, _key_mask, _qkv


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_sdpa_matches_torch(masked, need_weights):
    q, k, v = _qkv()
    mask = _key_mask() if masked else None
    ours, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
        if masked:
            assert torch.all(w[1, :, :, S - 3:] == 0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_with_longer_keys_is_bottom_right_aligned(need_weights):
    """The last Tq queries of a Tk-long sequence (cache case) see keys up to their own position."""
    q, k, v = _qkv(t_q=3, t_k=S)
    ours, _ = scaled_dot_product_attention(q, k, v, None, is_causal=True, need_weights=need_weights)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(3, S))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # the last query sees everything: equal to unmasked attention
    full = F.scaled_dot_product_attention(q[:, :, -1:], k, v)
    torch.testing.assert_close(ours[:, :, -1:], full, atol=1e-5, rtol=1e-5)


def test_causal_and_padding_mask_combined():
    q, k, v = _qkv(t_q=S, t_k=S)
    key_mask = _key_mask()
    ours, _ = scaled_dot_product_attention(q, k, v, key_mask, is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=combine(key_mask, causal_mask(S)))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def _copy_to_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_multihead_matches_torch(masked, cross):
    torch.manual_seed(0)
    ours = MultiHeadAttention(D, H).eval()
    for p in ours.parameters():  # non-zero biases so that they are compared too
        nn.init.normal_(p, std=0.1)
    ref = _copy_to_torch_mha(ours)
    x = torch.randn(B, T, D)
    kv = torch.randn(B, S, D) if cross else x
    t_k = kv.shape[1]
    ids = torch.ones(B, t_k, dtype=torch.long)
    if masked:
        ids[1, t_k - 2:] = 0
    mask = padding_mask(ids, 0) if masked else None
    out, w = ours(x, kv, mask, need_weights=True)
    ref_out, ref_w = ref(x, kv, kv, key_padding_mask=(ids == 0) if masked else None,
                         need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=1e-5)
    fast, _ = ours(x, kv, mask)  # the SDPA path gives the same output
    torch.testing.assert_close(fast, ref_out, atol=1e-5, rtol=1e-5)


def test_masks_convention():
    ids = torch.tensor([[5, 6, 0]])
    assert padding_mask(ids, 0).tolist() == [[[[True, True, False]]]]
    assert causal_mask(3)[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(1, 3)[0, 0].tolist() == [[True, True, True]]
    assert combine(None, None) is None
