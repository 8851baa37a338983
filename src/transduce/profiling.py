"""``transduce profile``: a few training steps or decoding batches under ``torch.profiler``.

Writes, under the output directory::

    OUT/trace.json        Chrome/Perfetto trace (open in https://ui.perfetto.dev or chrome://tracing)
    OUT/tensorboard/      the same trace for TensorBoard's profiler plugin (torch-tb-profiler)

and returns the top operators table and the time split: the share of the profiled wall time
spent in attention, the feed-forward blocks, the softmax (decoding) or the loss (training, with
the output projection), the data (batches, tokenization), the optimizer and the backward pass;
"other" is the rest (embeddings, norms, the search's bookkeeping, Python).

Attention and feed-forward time is scoped by hooks on those modules, installed for the profile
only; the softmax, loss and data scopes are :func:`transduce.tracing.scope` in their one code path.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .atomic import atomic_path
from .config import load_run_config
from .data.corpus import read_lines
from .device import resolve_device
from .errors import ConfigError
from .inference import load
from .model.attention import MultiHeadAttention
from .model.io import saved_model_settings
from .model.layers import FeedForward
from .tracing import ATTENTION, DATA, FFN, LOSS, SOFTMAX
from .training.distributed import DistInfo
from .training.loop import Trainer, run_data

logger = logging.getLogger(__name__)

OPTIMIZER, BACKWARD, OTHER = "optimizer", "backward", "other"
CATEGORIES = (ATTENTION, FFN, SOFTMAX, LOSS, DATA, OPTIMIZER, BACKWARD, OTHER)


@dataclass
class Profile:
    """What a profile found: where the trace went, the operators table and the time split."""

    trace: Path
    tensorboard: Path
    table: str
    wall_ms: float
    split_ms: dict[str, float] = field(default_factory=dict)

    def report(self) -> str:
        """The table, then one line per category: milliseconds and share of the wall time."""
        lines = [self.table, f"time split of {self.wall_ms:.1f} ms (wall):"]
        for name, ms in self.split_ms.items():
            lines.append(f"  {name:<10} {ms:10.1f} ms  {100 * ms / max(self.wall_ms, 1e-9):5.1f}%")
        lines.append(f"trace: {self.trace}  (TensorBoard: tensorboard --logdir {self.tensorboard})")
        return "\n".join(lines)


def category(name: str) -> str | None:
    """The split's category of a profiler event name, or None (counted in "other")."""
    if name in (ATTENTION, FFN, SOFTMAX, LOSS, DATA):
        return name
    if name.startswith("Optimizer."):  # torch's own scopes: Optimizer.step#Adam.step, Optimizer.zero_grad#...
        return OPTIMIZER
    if name.startswith("autograd::engine::evaluate_function"):
        return BACKWARD
    return None


def time_split(events, wall_us: float) -> dict[str, float]:
    """Milliseconds per category: each event of a category counted unless an enclosing event
    is of the same one (so nested scopes are not counted twice); "other" is the wall time left."""
    us = dict.fromkeys(CATEGORIES, 0.0)
    for e in events:
        cat = category(e.name)
        if cat is None:
            continue
        parent = e.cpu_parent
        while parent is not None and category(parent.name) != cat:
            parent = parent.cpu_parent
        if parent is None:
            us[cat] += e.cpu_time_total
    us[OTHER] = max(wall_us - sum(us.values()), 0.0)
    return {k: v / 1000 for k, v in us.items()}


def scope_hooks(model: nn.Module) -> Callable[[], None]:
    """Open a ``record_function`` scope around every attention and feed-forward module's forward
    (a pre-hook enters it, a hook leaves it); returns the function that removes the hooks."""
    handles = []
    for module in model.modules():
        name = ATTENTION if isinstance(module, MultiHeadAttention) else FFN if isinstance(module, FeedForward) else None
        if name is None:
            continue
        stack: list = []

        def enter(_m, _args, name=name, stack=stack):
            stack.append(torch.profiler.record_function(name).__enter__())

        def leave(_m, _args, _out, stack=stack):
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return lambda: [h.remove() for h in handles]


def record(work: Callable[[], None], steps: int, out: Path, model: nn.Module, device: torch.device,
           rows: int = 15) -> Profile:
    """Run ``work`` once to warm up, then ``steps`` times under the profiler; write the traces."""
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler
    work()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out.mkdir(parents=True, exist_ok=True)
    tensorboard = out / "tensorboard"
    remove = scope_hooks(model)
    try:
        with profile(activities=activities, on_trace_ready=tensorboard_trace_handler(str(tensorboard))) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                work()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            wall_us = (time.perf_counter() - t0) * 1e6
    finally:
        remove()
    trace = out / "trace.json"
    written = max(tensorboard.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime)  # a trace saves once
    with atomic_path(trace, suffix=".json") as tmp:
        shutil.copyfile(written, tmp)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=rows)
    return Profile(trace, tensorboard, table, wall_us / 1000, time_split(prof.events(), wall_us))


def profile_training(config: str | None, overrides: list[str], steps: int, out: Path, rows: int = 15) -> Profile:
    """``steps`` optimizer steps of the run config's model on its data (prepared into
    ``OUT/run`` unless ``data.prepared`` names a directory), after one warm-up step."""
    cfg = load_run_config(config, overrides, saved_model_settings).with_init_tokenizer()
    cfg = replace(cfg, train=replace(cfg.train, max_steps=steps + 1))
    device = resolve_device(cfg.train.device, "train.device")
    run_dir = out / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, run_dir, run_data(cfg, run_dir), DistInfo(), device)
    return record(trainer.train_step, steps, out, trainer.model, device, rows)


def profile_decoding(model_dir: str, input_path: str, steps: int, batch_size: int, out: Path,
                     overrides: dict, rows: int = 15) -> Profile:
    """``steps`` batches of ``batch_size`` lines of ``input_path`` translated with the model's
    decoding settings (``overrides`` of them: beam, ...), after one warm-up batch."""
    lines = [line for line in read_lines(input_path) if line.strip()][: batch_size]
    if not lines:
        raise ConfigError(f"--input: {input_path} has no non-empty line to translate")
    with load(model_dir) as translator:
        def work() -> None:
            translator.translate(lines, **overrides)
        return record(work, steps, out, translator.model, translator.device, rows)
