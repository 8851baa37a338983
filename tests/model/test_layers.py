"""Encoder and decoder layers against torch.nn.TransformerEncoderLayer / DecoderLayer."""

import pytest
import torch
from torch import nn

from transduce.config import ModelConfig
from transduce.model.layers import DecoderLayer, EncoderLayer
from transduce.model.masks import padding_mask

D, H, FF, B, S, T = 32, 4, 64, 3, 7, 6


def _cfg(norm, activation="relu"):
    return ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=D, n_heads=H, d_ff=FF,
                       dropout=0.1, norm=norm, activation=activation)


def _copy_attn(ours, ref: nn.MultiheadAttention):
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_common(ours, ref, norms):
    with torch.no_grad():
        ref.linear1.weight.copy_(ours.ffn.fc1.weight)
        ref.linear1.bias.copy_(ours.ffn.fc1.bias)
        ref.linear2.weight.copy_(ours.ffn.fc2.weight)
        ref.linear2.bias.copy_(ours.ffn.fc2.bias)
        for name in norms:
            getattr(ref, name).weight.copy_(getattr(ours, name).weight)
            getattr(ref, name).bias.copy_(getattr(ours, name).bias)


def _randomise(module):
    torch.manual_seed(1)
    for p in module.parameters():
        nn.init.normal_(p, std=0.2)


def _src_ids():
    ids = torch.ones(B, S, dtype=torch.long)
    ids[1, 4:] = 0
    ids[2, 6:] = 0
    return ids


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm, activation):
    ours = EncoderLayer(_cfg(norm, activation)).eval()
    _randomise(ours)
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, activation=activation, batch_first=True,
                                     norm_first=(norm == "pre")).eval()
    _copy_attn(ours.self_attn, ref.self_attn)
    _copy_common(ours, ref, ["norm1", "norm2"])
    x, ids = torch.randn(B, S, D), _src_ids()
    out, _ = ours(x, padding_mask(ids, 0))
    with torch.inference_mode():  # also exercises torch's fused fast path
        expected = ref(x, src_key_padding_mask=(ids == 0))
    real = ids != 0
    torch.testing.assert_close(out[real], expected[real], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_matches_torch(norm, activation):
    ours = DecoderLayer(_cfg(norm, activation)).eval()
    _randomise(ours)
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.1, activation=activation, batch_first=True,
                                     norm_first=(norm == "pre")).eval()
    _copy_attn(ours.self_attn, ref.self_attn)
    _copy_attn(ours.cross_attn, ref.multihead_attn)
    _copy_common(ours, ref, ["norm1", "norm2", "norm3"])
    x, memory, ids = torch.randn(B, T, D), torch.randn(B, S, D), _src_ids()
    out, _, _ = ours(x, memory, padding_mask(ids, 0))
    expected = ref(x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
                   memory_key_padding_mask=(ids == 0), tgt_is_causal=True)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_dropout_active_only_in_training():
    layer = EncoderLayer(_cfg("post"))
    x = torch.randn(B, S, D)
    layer.train()
    a, _ = layer(x, None)
    b, _ = layer(x, None)
    assert not torch.allclose(a, b)
    layer.eval()
    torch.testing.assert_close(layer(x, None)[0], layer(x, None)[0])
