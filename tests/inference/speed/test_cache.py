"""The search caches (inference.speed.cache): equal to the model's own KV cache."""

import pytest
import torch

from inference_helpers import random_sources, tiny_transformer
from transduce.inference.speed import prepare_for_decoding
from transduce.inference.speed.cache import CACHE_CHUNK, PooledKVCache, PooledLayerCache, StaticKVCache
from transduce.model.attention import LayerCache
from transduce.model.transformer import EncoderOutput


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


def _loaded_static_cache(model, enc, rows: int, t_cap: int, s_cap: int) -> StaticKVCache:
    """A static cache of ``rows`` rows over ``enc``'s sentences, its cross entries loaded."""
    cfg = model.config
    h, dh = cfg.n_heads, cfg.d_model // cfg.n_heads
    b = enc.mask.shape[0]
    cache = StaticKVCache.empty(len(model.decoder_layers), (rows, h, t_cap, dh), (b, h, s_cap, dh), torch.float32,
                                torch.device("cpu"))
    cache.load([layer.cross_attn.project_kv(enc.memory) for layer in model.decoder_layers])
    return cache


@pytest.mark.parametrize("positions,norm", [("sinusoidal", "post"), ("learned", "pre"), ("rope", "pre")])
@pytest.mark.parametrize("beam", [1, 2])
def test_static_cache_gives_the_kv_cache_logits(positions, norm, beam):
    """``model.decode`` step by step (teacher forcing) on a static cache, with room past the
    target, sources padded past their length, K beams sharing a sentence's cross row and a
    beam reorder midway: the logits of the model's own KV cache."""
    model = prepare_for_decoding(tiny_transformer(seed=5, positions=positions, norm=norm, max_positions=64))
    src = random_sources([4, 8, 2], seed=5)
    b, s = src.shape
    tgt = torch.randint(4, 40, (b * beam, 7), generator=torch.Generator().manual_seed(5))
    tgt[:, 0] = model.config.bos_id
    # beams swap within each sentence (rows 2i, 2i+1) after step 3
    swap = torch.arange(b * beam).view(b, beam).flip(1).reshape(-1)
    with torch.inference_mode():
        enc = model.encode(src)
        static = _loaded_static_cache(model, enc, b * beam, 16, s + 5)
        padded = EncoderOutput(enc.memory, torch.nn.functional.pad(enc.mask, (0, 5)))  # (B, 1, 1, S + 5)
        expanded = enc.index_select(torch.arange(b).repeat_interleave(beam))
        cache = model.new_cache()
        for t in range(tgt.shape[1]):
            expected = model.decode(tgt[:, t:t + 1], expanded, cache).logits[:, 0]       # (N, V)
            length = static.length
            got = model.decode(tgt[:, t:t + 1], padded, static).logits[:, 0]
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert static.length is length and int(static.length) == t + 1 == cache.length  # advanced in place
            if t == 3:
                cache, static = cache.reorder(swap), static.reorder(swap)


def test_static_cache_takes_one_position_per_step():
    cache = StaticKVCache.empty(1, (2, 1, 8, 3), (2, 1, 4, 3), torch.float32, torch.device("cpu"))
    layer = cache.layers[0]
    k = torch.randn(2, 1, 1, 3)
    full_k, _ = layer.append(k, k)
    assert full_k is layer.self_k and torch.equal(full_k[:, :, 0:1], k)
    assert layer.key_mask.flatten().tolist() == [True] + [False] * 7
    with pytest.raises(ValueError, match="one new position"):
        layer.append(torch.randn(2, 1, 2, 3), torch.randn(2, 1, 2, 3))


def test_a_static_cache_window_attends_the_first_positions():
    cache = StaticKVCache.empty(2, (2, 1, 8, 3), (2, 1, 4, 3), torch.float32, torch.device("cpu"))
    cache.attend_first(4)
    assert cache.key_length(1) == 4
    k = torch.randn(2, 1, 1, 3)
    for layer in cache.layers:
        keys, values = layer.append(k, 2 * k)
        assert keys.shape == values.shape == (2, 1, 4, 3) and keys.data_ptr() == layer.self_k.data_ptr()
        assert torch.equal(keys[:, :, 0:1], k) and torch.equal(values[:, :, 0:1], 2 * k)
        assert layer.key_mask.flatten().tolist() == [True, False, False, False]
    cache.attend_first(None)
    assert cache.key_length(1) == 8 and cache.layers[0].append(k, k)[0] is cache.layers[0].self_k
