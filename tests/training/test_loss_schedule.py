"""The loss and the learning-rate schedules against their formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce.config import TrainConfig
from transduce.training.loss import label_smoothed_loss
from transduce.training.schedule import learning_rate


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_equals_torch_cross_entropy(eps):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[1, 3:] = 0  # pad
    out = label_smoothed_loss(logits, target, eps, pad_id=0)
    ref = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), label_smoothing=eps, ignore_index=0,
                          reduction="sum")
    nll = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(out.nll, nll)
    assert out.n_tokens == 13


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_gradient_equals_autograd_of_torch_cross_entropy(eps):
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 13, dtype=torch.float64)
    target = torch.randint(1, 13, (4, 6))
    target[2, 2:] = 0
    target[0, 5] = 0
    mine, ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    out = label_smoothed_loss(mine, target, eps, pad_id=0)
    (out.loss * 0.7).backward()
    (F.cross_entropy(ref.reshape(-1, 13), target.reshape(-1), label_smoothing=eps, ignore_index=0,
                     reduction="sum") * 0.7).backward()
    torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-10, atol=1e-12)
    assert bool((mine.grad[2, 2:] == 0).all())  # pad positions get no gradient
    # both outputs differentiated (the nll is returned detached, but the Function supports it)
    from transduce.training.loss import _SmoothedCrossEntropy
    rows, tgt = logits.reshape(-1, 13), target.reshape(-1)
    weight = (tgt != 0).double()
    assert torch.autograd.gradcheck(lambda z: _SmoothedCrossEntropy.apply(z, tgt, weight, eps, None),
                                    (rows.clone().requires_grad_(),))



@pytest.mark.parametrize("chunk", [1, 5, 512])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_projected_loss_equals_projection_then_loss(chunk, eps, with_bias):
    """Output projection and loss fused, by blocks of rows: value and gradients (hidden states,
    the projection weight and its bias, model.output_bias) equal F.linear then F.cross_entropy."""
    from transduce.training.loss import projected_label_smoothed_loss
    torch.manual_seed(2)
    hidden = torch.randn(3, 7, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    bias = torch.randn(50, dtype=torch.float64) if with_bias else None
    target = torch.randint(1, 50, (3, 7))
    target[1, 4:] = 0
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    b1, b2 = (None, None) if bias is None else (bias.clone().requires_grad_(), bias.clone().requires_grad_())
    out = projected_label_smoothed_loss(h1, w1, target, eps, pad_id=0, chunk=chunk, bias=b1)
    (out.loss * 0.37).backward()
    ref = F.cross_entropy(F.linear(h2, w2, b2).reshape(-1, 50), target.reshape(-1), label_smoothing=eps,
                          ignore_index=0, reduction="sum")
    (ref * 0.37).backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=1e-12)
    assert out.n_tokens == 18
    torch.testing.assert_close(out.nll, F.cross_entropy(F.linear(hidden, weight, bias).reshape(-1, 50),
                                                        target.reshape(-1), ignore_index=0, reduction="sum"))
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-10, atol=1e-12)
    if with_bias:
        torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-10, atol=1e-12)
    assert bool((h1.grad[1, 4:] == 0).all())  # pad positions get no gradient
    with torch.no_grad():  # evaluation: no gradient work, same value
        torch.testing.assert_close(projected_label_smoothed_loss(hidden, weight, target, eps, 0, bias=bias).loss,
                                   ref.detach())

def _without_class(logits, target, excluded):
    """The logits (..., V) with class ``excluded``'s column removed and the targets renumbered."""
    keep = torch.arange(logits.shape[-1]) != excluded
    return logits[..., keep], target - (target > excluded).long()


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("path", ["plain", "projected", "projected-bf16"])
def test_an_excluded_class_is_no_class(eps, path):
    """model.bos_in_softmax false (an imported T5): the loss with class ``excluded`` left out is
    F.cross_entropy over the logits with that column removed, smoothing over V - 1 classes; the
    gradients equal that reference's, and nothing flows into the excluded class's row."""
    from transduce.training.loss import projected_label_smoothed_loss
    torch.manual_seed(4)
    v, excluded = 40, 1
    dtype = torch.float32 if path == "projected-bf16" else torch.float64
    hidden, weight = torch.randn(3, 6, 16, dtype=dtype), torch.randn(v, 16, dtype=dtype) * 0.3
    target = torch.randint(2, v, (3, 6))
    target[0, 4:] = 0
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    if path == "plain":
        out = label_smoothed_loss(F.linear(h1, w1), target, eps, pad_id=0, excluded=excluded)
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=path == "projected-bf16"):
            out = projected_label_smoothed_loss(h1, w1, target, eps, pad_id=0, chunk=5, excluded=excluded)
    out.loss.backward()
    logits, tgt = _without_class(F.linear(h2, w2), target, excluded)
    ref = F.cross_entropy(logits.reshape(-1, v - 1), tgt.reshape(-1), label_smoothing=eps, ignore_index=0,
                          reduction="sum")
    ref.backward()
    nll = F.cross_entropy(logits.reshape(-1, v - 1), tgt.reshape(-1), ignore_index=0, reduction="sum")
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-2, atol=2e-2 * ref.item())
    torch.testing.assert_close(out.loss.double(), ref.detach(), **tol)
    torch.testing.assert_close(out.nll.double(), nll.detach(), **tol)
    for mine, truth in ((h1.grad, h2.grad), (w1.grad, w2.grad)):  # bf16: within its precision
        limit = 1e-10 if dtype == torch.float64 else 0.02 * truth.abs().max().item()
        assert (mine.double() - truth).abs().max().item() <= limit
    assert bool((w1.grad[excluded] == 0).all())

@pytest.mark.parametrize("chunk", [4, 1000])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_projected_loss_under_bf16_autocast_matches_autocast_projection_then_loss(chunk, eps, with_bias):
    """Under bf16 autocast (the training path on GPUs) the fused loss equals what autocast gives
    F.linear then the loss, within bf16 precision, and both are near the float64 truth; pad
    rows get no gradient, the nll has no host sync (a device tensor), and a block's gradient
    is computed in float32 before it is rounded."""
    from transduce.training.loss import _low_precision_block, projected_label_smoothed_loss
    torch.manual_seed(3)
    hidden = torch.randn(4, 9, 32)
    weight = torch.randn(300, 32) * 0.2
    target = torch.randint(1, 300, (4, 9))
    target[2, 5:] = 0
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h3, w3 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    bias = torch.randn(300) if with_bias else None
    b1, b2, b3 = (None,) * 3 if bias is None else (bias.clone().requires_grad_(), bias.clone().requires_grad_(),
                                                    bias.double().requires_grad_())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = projected_label_smoothed_loss(h1, w1, target, eps, pad_id=0, chunk=chunk, bias=b1)
        ref = label_smoothed_loss(F.linear(h2, w2, b2), target, eps, pad_id=0)
    (out.loss * 0.5).backward()
    (ref.loss * 0.5).backward()
    (label_smoothed_loss(F.linear(h3, w3, b3), target, eps, pad_id=0).loss * 0.5).backward()
    assert out.loss.dtype == torch.float32 and h1.grad.dtype == w1.grad.dtype == torch.float32
    assert int(out.n_tokens) == 32
    torch.testing.assert_close(out.loss, ref.loss, rtol=2e-3, atol=1e-2)
    torch.testing.assert_close(out.nll, ref.nll, rtol=2e-3, atol=1e-2)
    pairs = [(h1.grad, h2.grad, h3.grad), (w1.grad, w2.grad, w3.grad)] + ([(b1.grad, b2.grad, b3.grad)] if with_bias
                                                                         else [])
    for mine, theirs, truth in pairs:
        scale = truth.abs().max().item()
        assert (mine - theirs).abs().max().item() < 0.02 * scale
        assert (mine.double() - truth).abs().max().item() < 0.02 * scale
    assert bool((h1.grad[2, 5:] == 0).all())
    # the block function alone, in float32 on bf16-exact logits, is the closed form exactly
    logits = torch.randn(6, 40).bfloat16()
    t = torch.randint(0, 40, (6,))
    nll, smooth, g = _low_precision_block(logits, t, eps, None)
    logp = torch.log_softmax(logits.float(), -1)
    torch.testing.assert_close(nll, -logp.gather(1, t[:, None]).squeeze(1))
    torch.testing.assert_close(smooth, -logp.mean(-1))
    expected = logp.exp() - eps / 40 - (1 - eps) * F.one_hot(t, 40)
    assert g.dtype == torch.bfloat16
    torch.testing.assert_close(g.float(), expected.bfloat16().float())


def test_noam_schedule_is_equation_3():
    cfg = TrainConfig(warmup_steps=4000)
    for step in (1, 100, 3999, 4000, 4001, 100000):
        expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
        assert learning_rate(step, cfg, 512) == pytest.approx(expected)
    peak = learning_rate(4000, cfg, 512)
    assert peak > learning_rate(3000, cfg, 512) and peak > learning_rate(5000, cfg, 512)
    assert learning_rate(4000, TrainConfig(lr_scale=2.0), 512) == pytest.approx(2 * peak)


def test_peak_lr_schedules():
    inv = TrainConfig(schedule="inverse_sqrt", lr=1e-3, warmup_steps=100)
    assert learning_rate(50, inv, 512) == pytest.approx(5e-4)
    assert learning_rate(100, inv, 512) == pytest.approx(1e-3)
    assert learning_rate(400, inv, 512) == pytest.approx(5e-4)
    cos = TrainConfig(schedule="cosine", lr=1e-3, warmup_steps=10, max_steps=110, min_lr=1e-5)
    assert learning_rate(10, cos, 512) == pytest.approx(1e-3)
    assert learning_rate(60, cos, 512) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)
    assert learning_rate(110, cos, 512) == pytest.approx(1e-5)
    lin = TrainConfig(schedule="linear", lr=1e-3, warmup_steps=0, max_steps=100)
    assert learning_rate(50, lin, 512) == pytest.approx(5e-4)
    assert learning_rate(100, lin, 512, total_steps=200) == pytest.approx(5e-4)
    assert math.isclose(learning_rate(1000, lin, 512), 0.0, abs_tol=1e-12)
