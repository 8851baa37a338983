"""Kept low-precision weights (inference.speed.cast) and refreshing every kept copy in place
(inference.speed.refresh): autocast's values, at addresses that never change."""

import copy

import pytest
import torch
from torch import nn

from inference_helpers import random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import greedy_search
from transduce.inference.speed import prepare_for_decoding, refresh, restore
from transduce.inference.speed.cast import CastLinear

BF16 = torch.bfloat16


def _pair(seed: int = 0) -> tuple[nn.Linear, CastLinear]:
    torch.manual_seed(seed)
    plain = nn.Linear(16, 8)
    return plain, prepare_for_decoding(copy.deepcopy(plain), cast=BF16)


def test_cast_linear_under_autocast_equals_autocast_and_recasts_in_place():
    plain, cast = _pair()
    assert isinstance(cast, CastLinear)
    x = torch.randn(5, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        assert torch.equal(cast(x), plain(x))
    w, b = cast.__dict__["_cast"][1]
    assert w.dtype == b.dtype == BF16
    address = w.data_ptr()
    with torch.no_grad():
        for layer in (plain, cast):
            layer.weight.mul_(1.5)              # e.g. an optimizer step, in place
            layer.bias.add_(0.25)
    # (a new autocast block: autocast's own cache would still hold the old weight's cast)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        assert torch.equal(cast(x), plain(x))
    assert cast.__dict__["_cast"][1][0].data_ptr() == address  # rewritten, not replaced
    assert torch.equal(w, cast.weight.to(BF16)) and torch.equal(b, cast.bias.to(BF16))


def test_cast_linear_is_plain_outside_its_autocast_and_with_gradients():
    plain, cast = _pair(1)
    x = torch.randn(5, 16)
    assert torch.equal(cast(x), plain(x))               # no autocast: float32
    with torch.autocast("cpu", dtype=torch.float16):    # another dtype: autocast's own cast
        assert torch.equal(cast(x), plain(x))
    with torch.autocast("cpu", dtype=BF16):
        cast(x).float().sum().backward()                # gradients reach the parameters
        plain(x).float().sum().backward()
    assert torch.equal(cast.weight.grad, plain.weight.grad)
    assert "_cast" not in cast.__dict__                 # nothing kept: every call cast the weight
    restore(cast)
    assert type(cast) is nn.Linear and "cast_dtype" not in cast.__dict__


@pytest.mark.parametrize("cast", [None, BF16])
def test_refresh_rewrites_every_kept_copy_in_place(cast):
    """After a search under autocast the model keeps fused projections (and casts); weights
    changed in place are brought into them by ``refresh`` at the same addresses."""
    model = prepare_for_decoding(tiny_transformer(seed=3), cast=cast)
    src = random_sources([4, 6], seed=3)
    with torch.inference_mode(), torch.autocast("cpu", dtype=BF16):
        greedy_search(model, src, DecodeConfig(max_len_b=4))

    def kept() -> list[torch.Tensor]:
        fused = [f for m in model.modules() for _, f in m.__dict__.get("_fused_layers", {}).values()]
        casts = [t for m in list(model.modules()) + fused for t in m.__dict__.get("_cast", (None, ()))[1]
                 if t is not None]
        return [t for f in fused for t in (f.weight, f.bias)] + casts

    before = kept()
    assert len(before) > (0 if cast is None else 30)
    addresses = [t.data_ptr() for t in before]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.25)
    refresh(model)
    after = kept()
    assert [t.data_ptr() for t in after] == addresses
    attn = model.decoder_layers[0].self_attn
    _, fused = attn.__dict__["_fused_layers"][("q_proj", "k_proj", "v_proj")]
    assert torch.equal(fused.weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    if cast is not None:
        assert torch.equal(fused.__dict__["_cast"][1][0], fused.weight.to(BF16))
        assert torch.equal(model.output_proj.__dict__["_cast"][1][0], model.output_proj.weight.to(BF16))
