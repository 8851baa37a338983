"""What every exporter shares: its error, report, atomic output directory and probe settings."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..atomic import atomic_dir
from ..errors import TransduceError
from ..data.tokenizer import load_tokenizer, tokenizer_exists
from ..model import full_attention_only, load_model

logger = logging.getLogger(__name__)

class ExportError(TransduceError):
    """An export that cannot be done (unsupported option, missing package) or failed its check."""


@dataclass
class ExportReport:
    """What an export wrote and how closely it matched the eager model.

    Attributes:
        format: "hf", "ctranslate2" or "onnx".
        out: the directory written.
        checks: named measurements from the verification, e.g. ``max_logit_diff``.
    """

    format: str
    out: Path
    checks: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        parts = [f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in self.checks.items()]
        return f"exported {self.format} model to {self.out} (verified: {', '.join(parts)})"


def head_width_problems(cfg, family: str) -> list[str]:
    """``[phrase]`` when ``cfg``'s heads are not d_model / n_heads wide (``model.head_dim``), which
    ``family``'s config cannot express (it has no head width of its own); else []."""
    if cfg.attention_width == cfg.d_model:
        return []
    return [f"model.head_dim={cfg.head_dim} ({family}'s heads are d_model / n_heads = "
            f"{cfg.d_model / cfg.n_heads:g} wide)"]


@contextlib.contextmanager
def staging_dir(out: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``out`` that becomes ``out`` if the block succeeds
    (:func:`~transduce.atomic.atomic_dir`); an existing ``out`` needs ``force``."""
    out = Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out}: already exists (pass force=True to replace it)")
    if out.exists() and not out.is_dir():
        out.unlink()
    with atomic_dir(out) as tmp:
        yield tmp


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch CPU threads: exports trace and verify on tiny probe
    batches, where extra threads only add OpenMP spin-waiting (badly so on a busy machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def quiet_loggers(*names: str, level: int = logging.WARNING) -> Iterator[None]:
    """Raise the level of third-party loggers (e.g. the ONNX optimizer's) for the block."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, lvl in zip(loggers, before):
            lg.setLevel(lvl)


def load_for_export(model_dir: str | os.PathLike, need_tokenizer: bool):
    """The eager model (eval, CPU, float32) and its tokenizer (None if absent and not needed)."""

    model = load_model(model_dir).float().eval()
    if not full_attention_only(model):
        cfg = model.config
        raise ExportError(f"cannot export this model (model.attention.kind={cfg.attention.kind}, model.attention.cross="
                          f"{cfg.attention.cross}): the exported formats run full attention only")
    if tokenizer_exists(model_dir):
        return model, load_tokenizer(model_dir)
    if need_tokenizer:
        raise ExportError(f"{model_dir}: no tokenizer here (tokenizer.yaml + spm model); "
                          "this format ships the tokenizer, so the model directory must hold one")
    return model, None


@contextlib.contextmanager
def no_progress_bars(transformers) -> Iterator[None]:
    """transformers draws progress bars when saving and loading; an export has its own report."""
    hf_logging = transformers.utils.logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
