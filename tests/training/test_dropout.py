"""The trainer's CPU dropout (training/dropout.py): nn.Dropout's contract with a cheaper mask."""

import math

import pytest
import torch
from torch import nn

from transduce.config import ModelConfig
from transduce.model import Transformer
from transduce.training.dropout import LEVELS, CpuDropout, keep_mask, use_cpu_dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_lane_keeps_one_minus_p_and_the_mask_is_unbiased(p):
    torch.manual_seed(0)
    n = 1 << 20
    mask = keep_mask(torch.ones(n), p)
    threshold = round(p * LEVELS)
    keep = (LEVELS - threshold) / LEVELS
    values = mask.unique()
    assert len(values) == 2 and values[0] == 0 and values[1].item() == pytest.approx(1 / keep, rel=1e-6)
    # each of the four 16-bit lanes of a 64-bit draw keeps 1 - p of its elements (5 sigma)
    for lane in range(4):
        kept = (mask[lane::4] > 0).double().mean().item()
        assert abs(kept - keep) < 5 * math.sqrt(keep * (1 - keep) / (n // 4))
    assert abs(mask.double().mean().item() - 1.0) < 5 * math.sqrt((1 - keep) / keep / n)
    # neighbours (the same draw's lanes) are independent: P(both kept) = keep^2
    both = ((mask[0::2] > 0) & (mask[1::2] > 0)).double().mean().item()
    assert abs(both - keep ** 2) < 5 * math.sqrt(keep ** 2 * (1 - keep ** 2) / (n // 2))


def test_forward_and_backward_use_one_mask_and_the_seed_repeats_it():
    x = torch.randn(7, 13, 5, requires_grad=True)  # a numel not a multiple of four
    drop = CpuDropout(0.3).train()
    torch.manual_seed(1)
    y = drop(x)
    y.backward(torch.ones_like(y))
    mask = x.grad
    assert torch.equal(y, x.detach() * mask)
    assert ((mask == 0) | torch.isclose(mask, torch.tensor(LEVELS / (LEVELS - round(0.3 * LEVELS))))).all()
    torch.manual_seed(1)
    assert torch.equal(drop(x), y)
    assert not torch.equal(drop(x), y)  # the generator moved on


def test_eval_p0_and_p1_behave_as_nn_dropout():
    x = torch.randn(4, 6)
    assert CpuDropout(0.3).eval()(x) is x
    assert CpuDropout(0.0).train()(x) is x
    assert torch.equal(CpuDropout(1.0).train()(x), nn.Dropout(1.0).train()(x))


def test_use_cpu_dropout_replaces_every_dropout_and_keeps_the_model():
    cfg = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=2, n_encoder_layers=2,
                      n_decoder_layers=2, d_ff=32, dropout=0.2, activation_dropout=0.1)
    torch.manual_seed(0)
    model = Transformer(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 5))
    expected = model.eval()(src, tgt)
    n_dropouts = sum(type(m) is nn.Dropout for m in model.modules())
    assert n_dropouts > 0
    use_cpu_dropout(model.train())
    assert sum(type(m) is nn.Dropout for m in model.modules()) == 0
    swapped = [m for m in model.modules() if isinstance(m, CpuDropout)]
    assert len(swapped) == n_dropouts and {m.p for m in swapped} == {0.2, 0.1}
    assert all(m.training for m in swapped)
    assert model.state_dict().keys() == before.keys()
    assert torch.equal(model.eval()(src, tgt), expected)
