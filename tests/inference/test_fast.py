"""Decoding speed-ups (inference.fast): each equal to the plain model's math."""

import pytest
import torch
from torch import nn

from inference_helpers import random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import beam_search, greedy_search
from transduce.inference.cpu import OneDNNLinear
from transduce.inference.fast import (CACHE_CHUNK, PooledKVCache, PooledLayerCache, fast_attention, is_prepared,
                                      prepare_for_decoding, restore)
from transduce.model.attention import LayerCache, MultiHeadAttention, scaled_dot_product_attention
from attention_helpers import B, D, DH, H, T, _key_mask, _qkv


@pytest.mark.parametrize("t_q", [1, 3])
def test_few_query_path_matches_sdpa(t_q):
    q, k, v = _qkv(t_q=t_q)
    mask = _key_mask()
    out, _ = fast_attention(q, k, v, mask)
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("reorder_every", [1, 7, 0])  # beam search; rows leaving now and then; sampling
def test_pooled_cache_equals_the_plain_one(reorder_every):
    """Appends (a prompt of several positions, then one at a time) and lazy reorders of the
    pooled cache give the plain cache's keys and values, past several CACHE_CHUNKs (the pools
    grow): gathered into the other pool after a reorder, written in place without one."""
    g = torch.Generator().manual_seed(0)
    plain, pooled = LayerCache(), PooledLayerCache()
    rows = 6
    for step in range(3 * CACHE_CHUNK):
        n = 5 if step == 0 else 1
        k, v = torch.randn(rows, 2, n, 3, generator=g), torch.randn(rows, 2, n, 3, generator=g)
        want, got = plain.append(k, v), pooled.append(k, v)
        for w, x in zip(want, got):
            assert torch.equal(w, x)
        if reorder_every and step % reorder_every == reorder_every - 1:
            index = torch.randperm(rows, generator=g)[:rows - (reorder_every > 1)]  # finished rows leave
            rows = len(index)
            plain, pooled = plain.reorder(index), pooled.reorder(index)


def test_prepare_and_restore_keep_parameters_and_results():
    plain, fast = tiny_transformer(seed=5), tiny_transformer(seed=5)
    names = [n for n, _ in fast.named_parameters()]
    prepare_for_decoding(fast, onednn=True)
    assert is_prepared(fast) and fast.output_proj.weight is fast.src_embed.tokens.weight  # the tie survives
    assert [n for n, _ in fast.named_parameters()] == names
    src = random_sources([5, 2, 7], seed=5)
    with torch.inference_mode():
        a = beam_search(plain, src, DecodeConfig(beam=3, nbest=3, max_len_b=6))
        b = beam_search(fast, src, DecodeConfig(beam=3, nbest=3, max_len_b=6))
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=1e-5)
    kept = [m for m in fast.modules() if "_packed" in m.__dict__ or "_fused_layers" in m.__dict__]
    assert kept  # search left packed weights and fused Q/K/V layers behind
    restore(fast)
    assert not is_prepared(fast) and not any(isinstance(m, OneDNNLinear) for m in fast.modules())
    assert not any("_packed" in m.__dict__ or "_fused_layers" in m.__dict__ for m in fast.modules())
    assert {type(m) for m in fast.modules()} == {type(m) for m in plain.modules()}


def test_search_prepares_a_plain_model_only_for_its_duration():
    model = tiny_transformer(seed=2)
    src = random_sources([4, 2], seed=2)
    greedy_search(model, src, DecodeConfig(max_len_b=4))
    assert not is_prepared(model) and not any("_fused_layers" in m.__dict__ for m in model.modules())


def test_int8_preparation_quantises_the_linear_layers():
    model = prepare_for_decoding(tiny_transformer(seed=1), int8=True)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert is_prepared(model)
    out = greedy_search(model, random_sources([3, 5]), DecodeConfig(max_len_b=4))
    assert out.tokens.shape[0] == 2


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
    assert attn.__dict__.get("_fused_layers")
    assert "_fused_layers" not in copy.deepcopy(attn).__dict__
    assert set(attn.state_dict()) == {f"{n}.{p}" for n in ("q_proj", "k_proj", "v_proj", "out_proj")
                                      for p in ("weight", "bias")}


def test_cache_reorder_selects_cross_rows_separately():
    cache = PooledKVCache.empty(1)
    layer = cache.layers[0]
    layer.self_k = layer.self_v = torch.arange(6.0).view(6, 1, 1, 1)
    layer.cross_k = layer.cross_v = torch.arange(3.0).view(3, 1, 1, 1)
    rows, sentences = torch.tensor([4, 5, 0, 1]), torch.tensor([2, 0])
    out = cache.reorder(rows, cross=sentences).layers[0]
    assert out.pending.tolist() == [4, 5, 0, 1] and out.cross_k.flatten().tolist() == [2, 0]
    assert out.reorder(torch.tensor([1, 0, 3, 2]), cross=False).cross_k.flatten().tolist() == [2, 0]
    one = PooledKVCache([PooledLayerCache(cross_k=layer.cross_k, cross_v=layer.cross_v)])
    assert one.reorder(torch.tensor([1]), cross=True).layers[0].cross_k.flatten().tolist() == [1]
