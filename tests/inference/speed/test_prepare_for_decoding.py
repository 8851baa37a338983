"""Preparing a model for decoding (inference.speed) and undoing it."""

import torch
from torch import nn

from inference_helpers import assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import beam_search, greedy_search
from transduce.inference.speed.cpu import OneDNNLinear
from transduce.inference.speed import is_prepared, prepare_for_decoding, restore


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
    assert_same_search(a, b, scores=(0, 1e-5))
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
