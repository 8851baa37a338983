"""The pooled search cache (inference.speed.cache): equal to the model's own KV cache."""

import pytest
import torch

from transduce.inference.speed.cache import CACHE_CHUNK, PooledKVCache, PooledLayerCache
from transduce.model.attention import LayerCache


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
