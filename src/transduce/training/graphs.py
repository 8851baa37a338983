"""The whole training step as one CUDA graph per batch shape (``train.cuda_graphs``).

A small model's step is a few hundred kernel launches of a few microseconds each: the GPU
waits on Python. Captured once per shape, the forward, backward, gradient clipping, the
non-finite check and the fused Adam update replay as one launch. What changes from step to
step lives in fixed device buffers the graph reads: the batch (copied into static inputs), the
learning rate (a 0-dim tensor in the optimizer's param groups) and the loss normaliser. The
non-finite skip is decided on the device (``found_inf``, see :func:`step.clip_and_step`).

Shapes: with ``cuda_graphs`` the Trainer plans batches with widths rounded up to
``pad_multiple`` (``token_budget_batches(multiple=...)``) and pads each to a square
``(max_tokens // L, L)`` for its bucket ``L`` (``Batch.padded``: dummy rows with a lone EOS as
source and all-PAD labels), so there is one graph per bucket: ``max_len / pad_multiple`` at most.

Restrictions (one-line ConfigErrors): one process, ``grad_accum`` 1, fp32 or bf16. A capture
that fails falls back to the same step run eagerly, with a warning. On a CPU the step always
runs eagerly (the tests compare it with the Trainer's usual step there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import TrainConfig
from ..data.batch import Batch
from .step import build_optimizer, clip_and_step, forward_backward, is_fused

logger = logging.getLogger("transduce.training")

WARMUP_STEPS = 2  # eager runs (with the update skipped) before a capture: lazy state, cuBLAS handles


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Batch          # the static inputs the graph reads
    metrics: Tensor        # (4,) the static output: loss sum, NLL sum, gradient norm, applied


def _shape(batch: Batch) -> tuple[int, int, int]:
    """(B, S, T): what a graph is captured for."""
    return len(batch), batch.src.size(1), batch.tgt_in.size(1)


class GraphedStep:
    """One training step of ``model`` on one batch: graphed per shape on CUDA, else eager.

    Args:
        model: the model (plain, or compiled for an eager comparison).
        optimizer: a fused Adam/AdamW (:func:`step.build_optimizer` on CUDA, or ``fused=True``);
            its learning rate becomes :attr:`lr`, a device tensor.
        cfg: the training recipe (label_smoothing, precision, clip_norm).
        pad_id: the padding id (labels equal to it are not counted).
        graphs: capture CUDA graphs (on a CUDA device); False runs every step eagerly.

    Examples:
        >>> step = GraphedStep(model, build_optimizer(model, cfg), cfg, pad_id, device)
        >>> loss_sum, nll_sum, grad_norm, applied = step(batch, lr=1e-3, normalizer=batch.n_tgt_tokens).tolist()
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, pad_id: int,
                 device: torch.device, graphs: bool = True):
        if not is_fused(optimizer):
            raise ValueError("GraphedStep needs a fused optimizer (it skips non-finite steps on the device)")
        self.model, self.optimizer, self.cfg, self.pad_id, self.device = model, optimizer, cfg, pad_id, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.lr = torch.zeros((), device=device)
        self.normalizer = torch.ones((), device=device)
        self.found_inf = torch.zeros((), device=device)
        self.allow = torch.ones((), dtype=torch.bool, device=device)  # False while warming up: no update
        self.graphs = graphs and device.type == "cuda"
        if graphs and not self.graphs:
            logger.info("CUDA graphs need a CUDA device; the training step runs eagerly on %s", device)
        self.captured: dict[tuple[int, int, int], _Captured] = {}
        self.reset()

    def reset(self) -> None:
        """Point every param group at :attr:`lr` and drop the graphs captured so far (call it after
        ``optimizer.load_state_dict``, which replaces the state tensors the graphs update and the
        groups' settings with those of the saved run)."""
        for g in self.optimizer.param_groups:
            g["lr"], g["capturable"] = self.lr, True
        self.captured.clear()

    def __call__(self, batch: Batch, lr: float, normalizer: float) -> Tensor:
        """One step on ``batch`` (on the device); returns a (4,) float32 device tensor: loss sum,
        NLL sum, gradient norm, 1.0 if the update was applied (0.0: skipped as non-finite).
        With graphs it is the graph's output buffer: read it before the next call."""
        self.lr.fill_(lr)
        self.normalizer.fill_(normalizer)
        if not self.graphs:
            return self._step(batch)
        captured = self.captured.get(_shape(batch)) or self._capture(batch)
        if captured is None:
            return self._step(batch)
        for static, new in zip((captured.inputs.src, captured.inputs.tgt_in, captured.inputs.tgt_out),
                               (batch.src, batch.tgt_in, batch.tgt_out)):
            static.copy_(new, non_blocking=True)
        captured.graph.replay()
        return captured.metrics

    def _step(self, batch: Batch) -> Tensor:
        """The step itself, as run eagerly and as captured."""
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)  # backward writes fresh gradients (in a graph: its own)
        sums = forward_backward(self.model, [batch], cfg.label_smoothing, self.pad_id, self.normalizer,
                                cfg.precision, self.device, autocast_cache=not self.graphs)
        loss_sum = torch.where(self.allow, sums[0], torch.full_like(sums[0], float("nan")))
        norm, ok = clip_and_step(self.optimizer, self.params, loss_sum, cfg.clip_norm, self.found_inf)
        return torch.stack([sums[0], sums[1], norm.float(), ok.float()])

    def _capture(self, batch: Batch) -> _Captured | None:
        """Warm up (updates skipped) and capture the step for ``batch``'s shape; None if it failed."""
        inputs = Batch(batch.src.clone(), batch.tgt_in.clone(), batch.tgt_out.clone(),
                       batch.n_src_tokens, batch.n_tgt_tokens)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.allow.fill_(False)
                for _ in range(WARMUP_STEPS):
                    self._step(inputs)
                self.allow.fill_(True)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                metrics = self._step(inputs)
        except Exception as e:  # noqa: BLE001 - training goes on without graphs
            logger.warning("capturing the training step as a CUDA graph failed (%s); running it eagerly",
                           (str(e).splitlines() or [type(e).__name__])[0])
            self.graphs = False
            self.allow.fill_(True)
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.captured[_shape(batch)] = captured = _Captured(graph, inputs, metrics)
        logger.info("captured the training step for batches of shape %s (%d graphs)",
                    tuple(batch.src.shape), len(self.captured))
        return captured


def _tiny_setup(device: torch.device, precision: str = "fp32", seed: int = 0):
    """A small model, its fused optimizer and a recipe, for :func:`gpu_checks` and the tests."""
    from ..config import ModelConfig
    from ..model.transformer import Transformer
    torch.manual_seed(seed)
    model_cfg = ModelConfig(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128, dropout=0.0,
                            src_vocab_size=300, tgt_vocab_size=300, max_positions=128)
    model = Transformer(model_cfg).to(device)
    cfg = TrainConfig(precision=precision, clip_norm=1.0, warmup_steps=0, schedule="constant", lr=1e-3,
                      cuda_graphs=True)
    return model, build_optimizer(model, cfg), cfg, model_cfg.pad_id


def random_batch(rows: int, length: int, real_rows: int, vocab: int, seed: int) -> Batch:
    """A ``(rows, length)`` square batch of random pairs, ``real_rows`` of them real and shorter
    than ``length``, the rest dummy rows (what ``train.cuda_graphs`` trains on)."""
    from ..data.batch import collate
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(real_rows):
        s, t = torch.randint(1, length - 1, (2,), generator=g).tolist()
        pairs.append((torch.randint(4, vocab, (s,), generator=g).tolist(),
                      torch.randint(4, vocab, (t,), generator=g).tolist()))
    return collate(pairs).padded(rows, length, length)


def gpu_checks(device: str | torch.device = "cuda", n_steps: int = 6) -> dict[str, object]:
    """The checks that need a GPU: graphed steps against eager ones, the device-side skip, and
    one compile for many shapes. Returns pass/fail and the max differences, for ``bench/gpu.py``
    (``device="cpu"`` dry-runs the code: nothing is captured there, so the graph checks fail).

    Two copies of a small model (dropout 0) take ``n_steps`` steps on the same batches of two
    bucket shapes (fp32 and bf16), one through CUDA graphs, one eagerly; then a step whose loss is
    NaN must leave the graphed model's parameters as they were.
    """
    dev = torch.device(device)
    out: dict[str, object] = {}
    for precision in ("fp32", "bf16"):
        runs = {}
        for graphs in (True, False):
            model, opt, cfg, pad_id = _tiny_setup(dev, precision)
            step = GraphedStep(model, opt, cfg, pad_id, dev, graphs=graphs)
            losses = []
            for i in range(n_steps):
                length = (16, 24)[i % 2]
                batch = _on(random_batch(2048 // length, length, 2048 // length - 3, 300, seed=i), dev)
                losses.append(step(batch, 1e-3, batch.n_tgt_tokens).tolist())
            runs[graphs] = (model, step, losses)
        (gm, gstep, gl), (em, _, el) = runs[True], runs[False]
        tol = 1e-4 if precision == "fp32" else 2e-2
        out.update({f"{precision}_{k}": v for k, v in _compare(gm, em, gl, el, tol).items()})
        out[f"{precision}_graphs_captured"] = len(gstep.captured)
        out[f"{precision}_graphed_matches_eager"] = gstep.graphs and len(gstep.captured) == 2 \
            and out[f"{precision}_losses_match"] and out[f"{precision}_params_match"]
        before = [p.detach().clone() for p in gm.parameters()]
        batch = _on(random_batch(128, 16, 100, 300, seed=99), dev)
        metrics = gstep(batch, 1e-3, float("nan")).tolist()  # a NaN normaliser: NaN loss and gradients
        unchanged = all(torch.equal(p, q) for p, q in zip(gm.parameters(), before))
        out[f"{precision}_nan_step_skipped"] = metrics[3] == 0.0 and unchanged
    out.update(_compile_check(dev))
    out["all_passed"] = all(v for k, v in out.items() if k.endswith(("_matches_eager", "_skipped", "_once")))
    return out


def _on(batch: Batch, device: torch.device) -> Batch:
    """``batch`` on ``device``, through pinned memory on CUDA (as the Trainer copies it)."""
    return (batch.pin_memory() if device.type == "cuda" else batch).to(device)


def _compare(graphed: torch.nn.Module, eager: torch.nn.Module, graphed_losses: list, eager_losses: list,
             tol: float) -> dict[str, object]:
    """Loss and parameter differences of two runs. Key biases are reported apart: their gradient
    is zero in exact arithmetic (softmax ignores a shift of all scores), so Adam turns rounding
    noise into steps of size lr whose signs any change of kernel order can flip."""
    loss_diff = max(abs(a[0] - b[0]) / max(abs(b[0]), 1e-9) for a, b in zip(graphed_losses, eager_losses))
    diffs = {name: (p - q).abs().max().item() for (name, p), q in zip(graphed.named_parameters(), eager.parameters())}
    param_diff = max(d for n, d in diffs.items() if not n.endswith("k_proj.bias"))
    return {"loss_rel_diff": loss_diff, "param_max_diff": param_diff, "losses_match": loss_diff < tol,
            "params_match": param_diff < tol * 10,
            "k_bias_max_diff": max(d for n, d in diffs.items() if n.endswith("k_proj.bias"))}


def _compile_check(device: torch.device) -> dict[str, object]:
    """The compiled model on four batch shapes: how many graphs dynamo compiled (inductor on
    CUDA; on a CPU dry run the graphs are only counted, not compiled)."""
    from torch._inductor.compile_fx import compile_fx

    from .step import compile_model
    graphs = []

    def counting_inductor(gm, example_inputs):
        graphs.append(len(example_inputs))
        return compile_fx(gm, example_inputs) if device.type == "cuda" else gm.forward

    model, _, _, pad_id = _tiny_setup(device)
    torch._dynamo.reset()
    compiled = compile_model(model, backend=counting_inductor)
    precision = "bf16" if device.type == "cuda" else "fp32"
    after_first = 0
    for i, length in enumerate((16, 24, 32, 40)):
        batch = _on(random_batch(64, length, 60, 300, seed=i), device)
        forward_backward(compiled, [batch], 0.1, pad_id, batch.n_tgt_tokens, precision, device)
        after_first = after_first or len(graphs)
    # (a graph break compiles a model as more than one graph; what matters is that none is added per shape)
    return {"compile_graphs_first_shape": after_first, "compile_graphs_4_shapes": len(graphs),
            "compile_once": len(graphs) == after_first}
