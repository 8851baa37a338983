"""T5's options of the one Transformer: relative position bias, RMSNorm, unscaled attention, GEGLU,
the tied output's rescale. Equivalences (cached vs full decoding, a tensor start, padding) and
the relative buckets against Mesh TensorFlow's arithmetic in float64."""

import math

import pytest
import torch

from transduce.config import ModelConfig, model_preset
from transduce.errors import ConfigError
from transduce.model import KVCache, Transformer
from transduce.model.embeddings import relative_buckets
from attention_helpers import decode_step_by_step

V = 40
T5 = dict(norm="pre", norm_kind="rms", positions="relative", relative_buckets=8, relative_max_distance=12,
          bias=False, scale_embeddings=False, scale_attention=False, layer_norm_eps=1e-6)
KINDS = [dict(activation="relu", tie_output=True, scale_output=True),           # T5 1.0
         dict(activation="geglu", tie_output=False, scale_output=False)]        # T5 1.1, mT5
# relative positions as an option of the paper's model (post-LN, LayerNorm, scaled, biases)
PAPER_RELATIVE = dict(norm="post", norm_kind="layer", scale_attention=True, bias=True, scale_embeddings=True,
                      layer_norm_eps=1e-5)


def _model(seed=0, **kw) -> Transformer:
    torch.manual_seed(seed)
    base = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=48, dropout=0.1, max_positions=64)
    return Transformer(ModelConfig(**{**base, **T5, **kw})).eval()


def _batch(seed=0, b=3, s=17, t=15):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, s), generator=g)
    src[1, 11:] = 0
    src[2, 3:] = 0
    tgt = torch.randint(3, V, (b, t), generator=g)
    tgt[:, 0] = 1
    return src, tgt


def _reference_bucket(relative: int, bidirectional: bool, n_buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's _relative_position_bucket for one int, in float64."""
    bucket = 0
    if bidirectional:
        n_buckets //= 2
        bucket += n_buckets if relative > 0 else 0
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    exact = n_buckets // 2
    if distance < exact:
        return bucket + distance
    far = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (n_buckets - exact))
    return bucket + min(far, n_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("n_buckets,max_distance", [(32, 128), (8, 12), (6, 4)])
def test_relative_buckets_match_the_reference(bidirectional, n_buckets, max_distance):
    relative = torch.arange(-300, 301)
    got = relative_buckets(relative, bidirectional, n_buckets, max_distance).tolist()
    want = [_reference_bucket(r, bidirectional, n_buckets, max_distance) for r in relative.tolist()]
    # float32 vs float64 may differ where the log lands on an integer; none does on this range
    assert got == want
    assert max(got) == n_buckets - 1 and min(got) == 0


@pytest.mark.parametrize("kind", KINDS + [PAPER_RELATIVE])
def test_incremental_decoding_equals_full_forward(kind):
    model = _model(**kind)
    src, tgt = _batch()
    with torch.no_grad():
        full = model(src, tgt)
        steps, chunks, cache = decode_step_by_step(model, src, tgt, chunk=2)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunks, full, atol=1e-5, rtol=1e-4)


def test_decode_at_a_tensor_length_is_the_int_one():
    model = _model()
    src, tgt = _batch()
    with torch.no_grad():
        enc = model.encode(src)
        ints, tensors = model.new_cache(), KVCache.empty(len(model.decoder_layers))
        tensors.length = torch.tensor(0)
        for t in range(tgt.shape[1]):
            want = model.decode(tgt[:, t:t + 1], enc, ints).logits
            torch.testing.assert_close(model.decode(tgt[:, t:t + 1], enc, tensors).logits, want, atol=1e-6, rtol=0)


def test_causal_bias_hides_the_future_and_padding_is_inert():
    model = _model()
    src, tgt = _batch()
    with torch.no_grad():
        base = model(src, tgt)
        changed = tgt.clone()
        changed[:, 5:] = (changed[:, 5:] + 7) % (V - 3) + 3
        torch.testing.assert_close(model(src, changed)[:, :5], base[:, :5], atol=1e-5, rtol=1e-4)
        padded = torch.cat([src, torch.zeros(src.shape[0], 4, dtype=torch.long)], dim=1)
        torch.testing.assert_close(model(padded, tgt), base, atol=1e-5, rtol=1e-4)


def test_position_bias_makes_order_matter():
    """Without absolute positions, only the relative bias tells a reordered source apart."""
    model = _model()
    src = torch.tensor([[5, 6, 7, 8, 2]])
    tgt = torch.tensor([[1, 9, 10]])
    with torch.no_grad():
        straight, swapped = model(src, tgt), model(src[:, [1, 0, 2, 3, 4]], tgt)
        model.encoder_bias.weight.zero_()
        assert torch.allclose(model(src, tgt), model(src[:, [1, 0, 2, 3, 4]], tgt), atol=1e-5)
    assert not torch.allclose(straight, swapped, atol=1e-3)


def test_t5_parameters_and_output_rescale():
    model = _model(**KINDS[0])
    names = dict(model.named_parameters())
    assert "encoder_bias.weight" in names and "decoder_bias.weight" in names
    assert names["encoder_bias.weight"].shape == (8, 4)
    assert not any(n.endswith(".bias") for n in names)
    assert isinstance(model.encoder_layers[0].norm1, torch.nn.RMSNorm)
    assert model.encoder_layers[0].ffn.fc_gate is None and _model(**KINDS[1]).encoder_layers[0].ffn.fc_gate is not None
    assert model.output_proj.weight is model.tgt_embed.tokens.weight
    model.double()  # float64: the reference below differs only by rounding, far below the tolerance
    src, tgt = _batch()
    residual = []  # the last decoder layer's output: the residual stream the final RMSNorm takes
    model.decoder_layers[-1].register_forward_hook(lambda m, args, out: residual.append(out[0]))
    with torch.no_grad():
        out = model.decode(tgt, model.encode(src))
        x = residual[0]                                                  # (B, T, D)
        # T5's RMSNorm (no mean subtracted, no bias), then d_model^-0.5 (32^-0.5) before the tied projection
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + T5["layer_norm_eps"])
        want = x * rms * model.decoder_norm.weight * 32 ** -0.5
        torch.testing.assert_close(out.states, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.logits, want @ model.tgt_embed.tokens.weight.T, rtol=1e-10, atol=1e-12)


def test_t5_small_preset_has_the_published_shape():
    model = Transformer(model_preset("t5-small", src_vocab_size=32128, tgt_vocab_size=32128))
    assert abs(model.num_parameters() - 60_506_624) < 1e4  # t5-small's count (HF, 32128 ids)


@pytest.mark.parametrize("kw, key", [
    (dict(relative_buckets=16), "model.relative_buckets"),                 # without positions=relative
    (dict(positions="relative", relative_buckets=7), "model.relative_buckets"),
    (dict(positions="relative", relative_buckets=32, relative_max_distance=16), "model.relative_max_distance"),
    (dict(positions="relative", attention=dict(kind="local")), "model.positions"),
    (dict(positions="relative", arch="decoder_only"), "model.positions"),
    (dict(scale_output=True, tie_output=False, share_embeddings=False), "model.scale_output"),
    (dict(scale_attention=False, attention=dict(kind="linformer")), "model.scale_attention"),
    (dict(norm_kind="batch"), "model.norm_kind"),
])
def test_inconsistent_settings_are_one_line_errors(kw, key):
    with pytest.raises(ConfigError) as err:
        ModelConfig(src_vocab_size=V, tgt_vocab_size=V, **kw)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
