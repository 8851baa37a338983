"""What the cache interface lets another cache do (the static search's, inference.speed.cache):
decode at a position held in a 0-dim tensor, and mask cached keys."""

import pytest
import torch

from transduce.config import ModelConfig
from transduce.model import Transformer
from transduce.model.attention import KVCache, LayerCache
from transduce.model.embeddings import LearnedPositions, SinusoidalPositions
from transduce.model.layers import DecoderLayer

V, D = 40, 32


def _model(positions: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_heads=4, n_encoder_layers=1,
                                   n_decoder_layers=2, d_ff=48, dropout=0.0, max_positions=64,
                                   positions=positions)).eval()


@pytest.mark.parametrize("table", [SinusoidalPositions(D, 16), LearnedPositions(D, 16)])
def test_positions_at_a_tensor_start_are_the_int_ones(table):
    for start, length in ((0, 1), (5, 3), (15, 1)):
        assert torch.equal(table(torch.tensor(start), length), table(start, length))


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope"])
def test_decode_at_a_tensor_length_advances_it_in_place(positions):
    model = _model(positions)
    src = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        enc = model.encode(src)
        ints, tensors = model.new_cache(), KVCache.empty(len(model.decoder_layers))
        length = tensors.length = torch.tensor(0)
        for t in range(tgt.shape[1]):
            want = model.decode(tgt[:, t:t + 1], enc, ints).logits
            got = model.decode(tgt[:, t:t + 1], enc, tensors).logits
            assert torch.equal(got, want)
        assert tensors.length is length and int(length) == tgt.shape[1]


class _MaskedCache(LayerCache):
    """A layer cache whose newest position sees only itself (its key mask hides the others)."""

    @property
    def key_mask(self) -> torch.Tensor:
        t = self.self_k.shape[2]
        return (torch.arange(t) == t - 1).view(1, 1, 1, t)                # (1, 1, 1, Tk)


def test_self_attention_applies_the_cache_key_mask():
    """Hiding every cached key but the newest one is decoding that position with no history."""
    layer = DecoderLayer(ModelConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_heads=4, d_ff=48,
                                     dropout=0.0)).eval()
    g = torch.Generator().manual_seed(3)
    history, new, memory = torch.randn(2, 4, D, generator=g), torch.randn(2, 1, D, generator=g), \
        torch.randn(2, 5, D, generator=g)
    masked = _MaskedCache()
    with torch.no_grad():
        for t in range(4):
            layer(history[:, t:t + 1], memory, None, masked, t)
        alone, _, _ = layer(new, memory, None, LayerCache(), 0)
        seen, _, _ = layer(new, memory, None, masked, 4)
    assert masked.self_k.shape[2] == 5
    torch.testing.assert_close(seen, alone, rtol=1e-6, atol=1e-6)
