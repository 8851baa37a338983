"""oneDNN linear layers: same parameters, same outputs, F.linear whenever gradients are on."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import random_sources, tiny_transformer
from transduce.inference import beam_search
from transduce.inference.cpu import OneDNNLinear, drop_inference_state, use_onednn_linears


def test_switch_keeps_parameters_and_outputs():
    plain, fast = tiny_transformer(seed=5), tiny_transformer(seed=5)
    names = [n for n, _ in fast.named_parameters()]
    n = use_onednn_linears(fast)
    if n == 0:
        pytest.skip("oneDNN is not available in this PyTorch build")
    assert all(type(m) is not torch.nn.Linear for m in fast.modules())
    assert isinstance(fast.output_proj, OneDNNLinear)
    assert fast.output_proj.weight is fast.src_embed.tokens.weight  # the tie survives
    assert [n for n, _ in fast.named_parameters()] == names
    src = random_sources([5, 2, 7], seed=5)
    with torch.inference_mode():
        a = beam_search(plain, src, beam=3, max_len_b=6)
        b = beam_search(fast, src, beam=3, max_len_b=6)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=1e-5)


def test_training_still_gets_gradients():
    layer = torch.nn.Linear(4, 3)
    use_onednn_linears(layer)
    x = torch.randn(2, 4, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_translator_leaves_the_global_rng_alone():
    import torch

    from transduce.inference.cpu import _onednn_ok, use_onednn_linears
    model = tiny_transformer()
    _onednn_ok.cache_clear()  # the check itself must not draw from the global generator
    state = torch.get_rng_state()
    use_onednn_linears(model)
    assert torch.equal(torch.get_rng_state(), state)


def test_packed_weight_gives_f_linear_and_follows_updates():
    import copy
    import torch.nn.functional as F
    layer = torch.nn.Linear(32, 48)
    if use_onednn_linears(layer) == 0:
        pytest.skip("oneDNN is not available in this PyTorch build")
    x = torch.randn(5, 7, 32)
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


def test_drop_inference_state_undoes_the_switch_and_the_kept_copies():
    """What the trainer does after each validation: plain layers again, no weight copies kept."""
    model = tiny_transformer(seed=3)
    if use_onednn_linears(model) == 0:
        pytest.skip("oneDNN is not available in this PyTorch build")
    src = random_sources([5, 2, 7], seed=3)
    with torch.no_grad():
        before = beam_search(model, src, beam=3, max_len_b=6)
    kept = [m for m in model.modules() if "_packed" in m.__dict__ or "_fused_layers" in m.__dict__]
    assert kept  # search left packed weights and fused Q/K/V layers behind
    drop_inference_state(model)
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules())
    assert not any("_packed" in m.__dict__ or "_fused_layers" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        after = beam_search(model, src, beam=3, max_len_b=6)
    assert torch.equal(before.tokens, after.tokens)
