"""Decode-time attention (inference.speed.fast_layers): each equal to the plain model's math."""

import pytest
import torch
from torch import nn

from transduce.inference.speed import prepare_for_decoding
from transduce.inference.speed.fast_layers import fast_attention
from transduce.model.attention import MultiHeadAttention, scaled_dot_product_attention
from attention_helpers import B, D, DH, H, T, _key_mask, _qkv


@pytest.mark.parametrize("t_q", [1, 3])
def test_few_query_path_matches_sdpa(t_q):
    q, k, v = _qkv(t_q=t_q)
    mask = _key_mask()
    out, _ = fast_attention(q, k, v, mask)
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("t_q", [1, 3])
@pytest.mark.parametrize("need_weights", [False, True])
def test_key_value_rows_shared_by_groups_of_queries(t_q, need_weights):
    """Beams of a sentence share its encoder keys: B*g query rows over B key/value rows give
    what repeating each key/value row g times gives (grouped fast path for one query per row)."""
    g = 3
    q, k, v = _qkv(t_q=t_q)
    q = torch.randn(B * g, H, t_q, DH, generator=torch.Generator().manual_seed(1))
    mask = _key_mask()
    out, w = fast_attention(q, k, v, mask, need_weights=need_weights)

    def rep(t):
        return t.repeat_interleave(g, dim=0)
    ref, ref_w = scaled_dot_product_attention(q, rep(k), rep(v), rep(mask), need_weights=True)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="cannot share"):
        fast_attention(q[:-1], k, v, mask)

def test_fused_qkv_projection_equals_separate_ones_with_gradients():
    torch.manual_seed(0)
    attn = prepare_for_decoding(MultiHeadAttention(D, H))
    for p in attn.parameters():
        nn.init.normal_(p, std=0.1)
    x = torch.randn(B, T, D)
    q, k, v = attn.project_qkv(x)
    for ours, proj in zip((q, k, v), (attn.q_proj, attn.k_proj, attn.v_proj)):
        torch.testing.assert_close(ours, attn.split_heads(proj(x)), atol=1e-6, rtol=1e-6)
    (q.square().sum() + 2 * k.sum() + 3 * v.sum()).backward()
    projected = [p for m in (attn.q_proj, attn.k_proj, attn.v_proj) for p in m.parameters()]
    fused_grads = [p.grad.clone() for p in projected]
    attn.zero_grad()
    sep = [attn.split_heads(m(x)) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
    (sep[0].square().sum() + 2 * sep[1].sum() + 3 * sep[2].sum()).backward()
    for a, b in zip(fused_grads, (p.grad for p in projected)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

def test_kept_fused_weights_follow_in_place_updates_and_stay_out_of_copies():
    import copy
    torch.manual_seed(0)
    attn = prepare_for_decoding(MultiHeadAttention(D, H).eval())
    x = torch.randn(B, T, D)
    with torch.no_grad():
        attn(x, x)                                          # builds and keeps the fused layer
        attn.k_proj.weight.mul_(2.0)                        # e.g. an optimizer step, in place
        out, _ = attn(x, x)
        q, k, v = (attn.split_heads(m(x)) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        ref, _ = attn.attend(q, k, v)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
        attn.v_proj.bias = torch.nn.Parameter(torch.randn(D))  # a new tensor, not an update
        out, _ = attn(x, x)
        q, k, v = (attn.split_heads(m(x)) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        ref, _ = attn.attend(q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert attn.__dict__.get("_fused_layers")
    assert "_fused_layers" not in copy.deepcopy(attn).__dict__
    assert set(attn.state_dict()) == {f"{n}.{p}" for n in ("q_proj", "k_proj", "v_proj", "out_proj")
                                      for p in ("weight", "bias")}


@pytest.mark.parametrize("t_q", [1, 3])
def test_few_query_path_boolean_mask_equals_its_additive_form_exactly(t_q):
    """The few-query path applies a boolean mask as one ``where``: the same numbers as adding its
    additive form (0 where allowed, -inf where hidden), bit for bit (same kernels)."""
    q, k, v = _qkv(t_q=t_q)
    mask = _key_mask()
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    out, _ = fast_attention(q, k, v, mask)
    ref, _ = fast_attention(q, k, v, additive)
    assert torch.equal(out, ref)
