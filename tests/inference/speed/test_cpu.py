"""oneDNN linear layers: same parameters, same outputs, F.linear whenever gradients are on."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import tiny_transformer
from transduce.inference.speed.cpu import ONEDNN_MIN_MACS, OneDNNLinear, onednn_available
from transduce.inference.speed import prepare_for_decoding


def _switch(module: torch.nn.Module) -> torch.nn.Module:
    if not onednn_available():
        pytest.skip("oneDNN is not available in this PyTorch build")
    return prepare_for_decoding(module, onednn=True)


def test_switch_reaches_every_linear_layer():
    fast = _switch(tiny_transformer(seed=5))
    assert all(type(m) is not torch.nn.Linear for m in fast.modules())
    assert isinstance(fast.output_proj, OneDNNLinear)


def test_training_still_gets_gradients():
    layer = _switch(torch.nn.Linear(4, 3))
    x = torch.randn(2, 4, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_translator_leaves_the_global_rng_alone():
    model = tiny_transformer()
    onednn_available.cache_clear()  # the check itself must not draw from the global generator
    state = torch.get_rng_state()
    prepare_for_decoding(model, onednn=True)
    assert torch.equal(torch.get_rng_state(), state)


def test_packed_weight_gives_f_linear_and_follows_updates():
    import copy
    import torch.nn.functional as F
    layer = _switch(torch.nn.Linear(32, 48))
    x = torch.randn(64, 7, 32)  # (a product above ONEDNN_MIN_MACS: oneDNN's path)
    assert x.numel() * 48 >= ONEDNN_MIN_MACS
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.forward_relu(x), F.relu(F.linear(x, layer.weight, layer.bias)),
                                   atol=1e-5, rtol=1e-5)
        layer.weight.add_(1.0)  # in place: the packed copy must be rebuilt
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-4, rtol=1e-5)
        layer.weight = torch.nn.Parameter(torch.randn(48, 32))  # a new tensor
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-4, rtol=1e-5)
    assert "_packed" in layer.__dict__
    clone = copy.deepcopy(layer)  # the packed (opaque) weight cannot be copied; it is left behind
    assert "_packed" not in clone.__dict__
    with torch.no_grad():
        torch.testing.assert_close(clone(x), layer(x))


def test_small_products_take_f_linear():
    """Below ONEDNN_MIN_MACS (a few rows) a call is F.linear itself: the same values, no packed copy."""
    import torch.nn.functional as F
    layer = _switch(torch.nn.Linear(32, 48))
    x = torch.randn(2, 1, 32)
    assert x.numel() * 48 < ONEDNN_MIN_MACS
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        assert torch.equal(layer.forward_relu(x), F.relu(F.linear(x, layer.weight, layer.bias)))
    assert "_packed" not in layer.__dict__
