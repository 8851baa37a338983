"""The graphed training step, run eagerly on a CPU: the same as the usual step, dummy rows
inert, non-finite steps skipped on the device.
(Capture and replay: bench/gpu_checks.py, ``train_checks``.)"""

import math
import sys
from pathlib import Path

import pytest
import torch

from transduce.data.epoch_batches import round_up, token_budget_batches
from transduce.training.cuda_graphs import GraphedStep

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cuda_graph_setup import random_batch, tiny_setup  # noqa: E402
from transduce.training.step import forward_backward

CPU = torch.device("cpu")


def _float64_setup():
    """:func:`tiny_setup` in float64, for comparing two steps that are equal in exact arithmetic.

    Adam's first update of a weight is lr * g / (|g| + eps): a change dg in its gradient moves it
    by up to lr / (4 eps) * dg = 2.5e5 * dg. In fp32 the gradients' rounding (~1e-7 of their
    terms) depends on the summation order, which differs between CPU kernels (AVX2, AVX-512,
    oneDNN or not) and between batch shapes; an element with |g| near eps, and every key bias
    (its exact gradient is 0: softmax ignores a shift of all scores), then moves by anything up
    to lr. In float64 the rounding is ~1e-16 of the terms, so two such steps agree to ~1e-10
    whatever the order: the tolerances below hold on any CPU.
    """
    model, opt, cfg, pad_id = tiny_setup(CPU)
    return model.double(), opt, cfg, pad_id  # the same Parameter objects: the optimizer keeps them


def test_graphed_step_equals_the_usual_step():
    model, opt, cfg, pad_id = _float64_setup()
    ref, ref_opt, _, _ = _float64_setup()  # fused Adam, as the Trainer's usual step on CUDA
    step = GraphedStep(model, opt, cfg, pad_id, CPU)
    assert not step.graphs  # a CPU runs it eagerly
    for i in range(5):
        batch = random_batch(64, (16, 24)[i % 2], 50, 300, seed=i)
        got = step(batch, 1e-3, batch.n_tgt_tokens).tolist()
        for g in ref_opt.param_groups:
            g["lr"] = step.lr.item()  # 1e-3 as the step's float32 tensor holds it, not 1e-3 itself
        want = forward_backward(ref, [batch], cfg.label_smoothing, pad_id, batch.n_tgt_tokens, cfg.precision, CPU)
        norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.clip_norm)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert got[3] == 1.0
        # (the metrics are float32: float64 values ~1e-15 apart round at most one ulp apart)
        assert got[:3] == pytest.approx(want.tolist() + [norm.item()], rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-9, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dummy_rows_leave_the_step_unchanged(dtype):
    """50 real rows, alone and padded to 64 with dummy rows: the same step. In float64 the
    parameters agree (see :func:`_float64_setup`); in fp32 the loss sums agree to the rounding of
    a sum of at most 64 * 16 positive terms in another order (relative n * 2**-24 < 1e-4)."""
    runs = []
    for rows in (50, 64):
        model, opt, cfg, pad_id = _float64_setup() if dtype == torch.float64 else tiny_setup(CPU)
        batch = random_batch(rows, 16, 50, 300, seed=3)
        metrics = GraphedStep(model, opt, cfg, pad_id, CPU)(batch, 1e-3, batch.n_tgt_tokens).tolist()
        runs.append((metrics, [p.detach().clone() for p in model.parameters()]))
    (short, short_params), (padded, padded_params) = runs
    assert short[3] == padded[3] == 1.0
    assert padded[:2] == pytest.approx(short[:2], rel=1e-4 if dtype == torch.float32 else 1e-6)
    if dtype == torch.float64:
        for p, q in zip(short_params, padded_params):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-9)


def test_non_finite_step_is_skipped_on_the_device():
    model, opt, cfg, pad_id = tiny_setup(CPU)
    step = GraphedStep(model, opt, cfg, pad_id, CPU)
    batch = random_batch(64, 16, 60, 300, seed=0)
    step(batch, 1e-3, batch.n_tgt_tokens)
    before = [p.detach().clone() for p in model.parameters()]
    moments = [s["exp_avg"].clone() for s in opt.state.values()]
    metrics = step(batch, 1e-3, math.nan).tolist()
    assert metrics[3] == 0.0 and not math.isfinite(metrics[2])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(opt.state.values(), moments))
    assert all(s["step"].item() == 1 for s in opt.state.values())
    assert step(batch, 1e-3, batch.n_tgt_tokens).tolist()[3] == 1.0  # and the next one goes on


def test_square_buckets_fit_the_budget():
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(1, 60, (3000,), generator=g).numpy(), torch.randint(1, 60, (3000,), generator=g).numpy()
    plan = token_budget_batches(src, tgt, 1024, seed=0, epoch=0, multiple=8)
    shapes = set()
    for b in plan.batches:
        width = round_up(int(max(src[b].max(), tgt[b].max())) + 1, 8)
        assert len(b) <= 1024 // width
        shapes.add(width)
    assert len(shapes) <= 8 and sum(map(len, plan.batches)) == 3000
    default = token_budget_batches(src, tgt, 1024, 0, 0).batches
    assert token_budget_batches(src, tgt, 1024, 0, 0, multiple=1).batches == default


def test_a_failed_capture_falls_back_to_the_eager_step_after_a_warm_up_that_changed_nothing(monkeypatch, caplog):
    """The capture path with CUDA's stream and graph calls stubbed out, the capture failing as
    one does on a host sync: the warm-up steps (updates skipped) must leave no trace, and the
    step runs eagerly, with a warning."""
    import contextlib
    import logging

    class Stream:
        def __init__(self, *args):
            pass

        def wait_stream(self, other):
            pass

    def failing_capture(graph):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", failing_capture)
    model, opt, cfg, pad_id = tiny_setup(CPU)
    ref, ref_opt, _, _ = tiny_setup(CPU)
    step = GraphedStep(model, opt, cfg, pad_id, CPU)
    step.graphs = True  # as on a GPU
    batch = random_batch(64, 16, 50, 300, seed=0)
    with caplog.at_level(logging.WARNING, logger="transduce.training"):
        got = step(batch, 1e-3, batch.n_tgt_tokens)
    assert "running it eagerly" in caplog.text and not step.graphs and not step.captured
    want = GraphedStep(ref, ref_opt, cfg, pad_id, CPU)(batch, 1e-3, batch.n_tgt_tokens)
    assert torch.equal(got, want) and got[3] == 1.0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    assert all(s["step"].item() == 1 for s in opt.state.values())
