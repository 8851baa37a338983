"""The step's pieces: bucket padding changes nothing, one compile for many shapes, the fused
optimizer's device-side skip."""

import math

import pytest
import torch

from transduce.config import ModelConfig, TrainConfig
from transduce.data.batch import collate
from transduce.errors import ConfigError
from transduce.model import Transformer
from transduce.training.step import (FUSED_CPU, build_optimizer, clip_and_step, compile_model, forward_backward,
                                    is_fused, load_optimizer_state)

CPU = torch.device("cpu")


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                   dropout=0.0, src_vocab_size=60, tgt_vocab_size=60, max_positions=128))


def _batch(rows: int, src_len: int, tgt_len: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return collate([(torch.randint(4, 60, (int(torch.randint(1, src_len, (1,), generator=g)),), generator=g).tolist(),
                     torch.randint(4, 60, (int(torch.randint(1, tgt_len, (1,), generator=g)),), generator=g).tolist())
                    for _ in range(rows)])


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_padding_to_a_bucket_and_dummy_rows_change_neither_loss_nor_gradients(precision):
    batch = _batch(6, 11, 9, seed=1)
    model = _model()
    plain = forward_backward(model, [batch], 0.1, 0, batch.n_tgt_tokens, precision, CPU)
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    big = batch.padded(len(batch) + 5, 16, 24)
    assert big.src.shape == (11, 16) and big.tgt_in.shape == (11, 24)
    assert (big.src[6:, 0] == 2).all() and (big.tgt_out[6:] == 0).all()  # dummies: a lone EOS, no labels
    padded = forward_backward(model, [big], 0.1, 0, batch.n_tgt_tokens, precision, CPU)
    tol = 1e-5 if precision == "fp32" else 2e-2  # bf16: other shapes, other roundings (one ulp is 0.4%)
    torch.testing.assert_close(padded, plain, rtol=tol, atol=tol)
    got, want = torch.cat([g.flatten() for g in _grads(model)]), torch.cat([w.flatten() for w in want])
    assert torch.isfinite(got).all()
    assert (got - want).norm() <= tol * want.norm()  # all gradients together: some nearly cancel to 0


def test_an_output_bias_is_trained_through_the_fused_loss():
    """model.output_bias (imported Marian models): the step's loss is F.cross_entropy with label
    smoothing over the biased logits (the fused projection + loss), and the bias gets its gradient."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                    dropout=0.0, src_vocab_size=60, tgt_vocab_size=60, output_bias=True))
    torch.nn.init.normal_(model.output_proj.bias)
    batch = _batch(5, 9, 7, seed=3)
    sums = forward_backward(model, [batch], 0.1, 0, 1.0, "fp32", CPU)
    logits = model(batch.src, batch.tgt_in)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0,
                                             label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(sums[0], want.detach(), rtol=1e-5, atol=1e-5)
    grad = model.output_proj.bias.grad.clone()
    model.zero_grad(set_to_none=True)
    want.backward()
    torch.testing.assert_close(grad, model.output_proj.bias.grad, rtol=1e-5, atol=1e-6)


def test_padded_refuses_to_shrink():
    with pytest.raises(ValueError, match="smaller than the batch"):
        _batch(4, 9, 9, seed=0).padded(3, 16, 16)


def test_compiled_once_for_many_shapes_and_equal_to_eager():
    from torch._dynamo.utils import counters
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(len(example_inputs))
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    eager, model = _model(), _model()
    compiled = compile_model(model, backend=counting_backend)
    first = 0
    for i, (rows, s, t) in enumerate([(4, 9, 7), (6, 17, 12), (3, 25, 30), (8, 13, 40), (5, 8, 16)]):
        batch = _batch(rows, s, t, seed=i)
        want = forward_backward(eager, [batch], 0.1, 0, batch.n_tgt_tokens, "fp32", CPU)
        got = forward_backward(compiled, [batch], 0.1, 0, batch.n_tgt_tokens, "fp32", CPU)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        first = first or len(compiles)
    assert len(compiles) == first <= 2, f"{len(compiles)} graphs compiled for 5 shapes ({first} for the first)"
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    torch._dynamo.reset()


def test_fused_cpu_adam_equals_foreach_over_steps():
    """The trainer's CPU Adam is torch's fused kernel (2-3x faster): its updates equal the
    foreach implementation's within float rounding over several steps, for Adam and AdamW."""
    if not FUSED_CPU:
        pytest.skip("torch < 2.4 has no fused CPU Adam")
    for optimizer in ("adam", "adamw"):
        a, b = _model(), _model()
        b.load_state_dict(a.state_dict())
        cfg = TrainConfig(optimizer=optimizer, weight_decay=0.01)
        fused, plain = build_optimizer(a, cfg, 1e-2), build_optimizer(b, cfg, 1e-2)
        assert is_fused(fused)
        twin = dict(zip(map(id, a.parameters()), b.parameters()))
        groups = [{"params": [twin[id(p)] for p in g["params"]], "weight_decay": g["weight_decay"]}
                  for g in fused.param_groups]
        kind = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
        plain = kind(groups, lr=1e-2, betas=cfg.betas, eps=cfg.eps, foreach=True)
        gen = torch.Generator().manual_seed(0)
        for _ in range(5):
            for p, q in zip(a.parameters(), b.parameters()):
                p.grad = torch.randn(p.shape, generator=gen)
                q.grad = p.grad.clone()
            fused.step()
            plain.step()
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        start = _model()
        assert all(not torch.equal(p, q) for p, q in zip(a.parameters(), start.parameters()) if p.dim() >= 2)


def test_fused_optimizer_for_cuda_graphs_and_its_device_side_skip():
    model = _model()
    assert is_fused(build_optimizer(model, TrainConfig())) == FUSED_CPU  # CPU: fused from torch 2.4
    opt = build_optimizer(model, TrainConfig(cuda_graphs=True))
    assert is_fused(opt)
    for g in opt.param_groups:
        g["lr"] = 1e-2
    params, found_inf = list(model.parameters()), torch.zeros(())
    before = [p.detach().clone() for p in params]
    batch = _batch(4, 9, 9, seed=0)
    sums = forward_backward(model, [batch], 0.1, 0, math.nan, "fp32", CPU)  # NaN gradients
    norm, ok = clip_and_step(opt, params, sums[0], 1.0, found_inf)
    assert not bool(ok) and found_inf.item() == 1.0 and not math.isfinite(norm.item())
    assert all(torch.equal(p, q) for p, q in zip(params, before))
    assert all(s["step"].item() == 0 for s in opt.state.values())  # the skipped step is not counted
    opt.zero_grad(set_to_none=True)
    sums = forward_backward(model, [batch], 0.1, 0, batch.n_tgt_tokens, "fp32", CPU)
    norm, ok = clip_and_step(opt, params, sums[0], 1.0, found_inf)
    assert bool(ok) and not any(torch.equal(p, q) for p, q in zip(params, before))


def test_a_checkpoint_of_another_optimizer_implementation_resumes():
    """A foreach (CPU) run's optimizer state loaded into a fused one (as on a GPU) keeps the fused
    step, which alone can skip a step on the device."""
    batch = _batch(4, 9, 9, seed=0)
    saved_model = _model()
    saved = build_optimizer(saved_model, TrainConfig())
    forward_backward(saved_model, [batch], 0.1, 0, batch.n_tgt_tokens, "fp32", CPU)
    saved.step()
    model = _model()
    opt = build_optimizer(model, TrainConfig(cuda_graphs=True))
    load_optimizer_state(opt, saved.state_dict())
    assert all(g["fused"] and not g["foreach"] and g["capturable"] for g in opt.param_groups)
    forward_backward(model, [batch], 0.1, 0, batch.n_tgt_tokens, "fp32", CPU)
    norm, ok = clip_and_step(opt, list(model.parameters()), torch.tensor(1.0), None, torch.zeros(()))
    assert bool(ok) and all(s["step"].item() == 2 for s in opt.state.values())


@pytest.mark.parametrize("train, match", [
    ({"pad_multiple": 0}, "train.pad_multiple"),
    ({"cuda_graphs": True, "grad_accum": 2}, "train.cuda_graphs: needs train.grad_accum 1"),
    ({"cuda_graphs": True, "precision": "fp16"}, "train.cuda_graphs: needs train.precision"),
    ({"cuda_graphs": True, "compile": True}, "train.cuda_graphs: cannot be combined with train.compile"),
    ({"fsdp": True, "cuda_graphs": True}, "train.fsdp: cannot be combined with train.cuda_graphs"),
    ({"fsdp": True, "compile": True}, "train.fsdp: cannot be combined with train.compile"),
    ({"fsdp": True, "precision": "fp16"}, "train.fsdp: needs train.precision fp32 or bf16"),
])
def test_config_errors(train, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**train)
