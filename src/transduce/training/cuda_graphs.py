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
from .step import clip_and_step, forward_backward, is_fused

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
