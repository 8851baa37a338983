"""What every exporter shares: the entry point, atomic output directories, optional imports."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import TransduceError

logger = logging.getLogger(__name__)

FORMATS = ("hf", "ctranslate2", "onnx")
QUANTIZATIONS = ("int8",)


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


def require(module: str, extra: str = "export") -> Any:
    """Import an optional dependency or raise a one-line ExportError saying how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ExportError(f"this needs the optional package {module!r} ({e}); "
                          f"install it with: pip install 'transduce[{extra}]'") from None


@contextlib.contextmanager
def staging_dir(out: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``out`` that is renamed to ``out`` if the block succeeds.

    On any exception the temporary directory is removed and ``out`` is left untouched.
    """
    out = Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out}: already exists (pass --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the export is an ordinary directory
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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
    from ..data.tokenizer import Tokenizer
    from ..model import load_model

    model = load_model(model_dir).float().eval()
    if Tokenizer.exists(model_dir):
        return model, Tokenizer.load(model_dir)
    if need_tokenizer:
        raise ExportError(f"{model_dir}: no tokenizer here (tokenizer.yaml + spm model); "
                          "this format ships the tokenizer, so the model directory must hold one")
    return model, None


def export_model(model_dir: str | os.PathLike, fmt: str, out: str | os.PathLike,
                 quantization: str | None = None, force: bool = False) -> ExportReport:
    """Export the model directory ``model_dir`` to format ``fmt`` in ``out``, verified.

    Args:
        model_dir: a directory written by ``save_model`` (+ tokenizer files).
        fmt: "hf" (MarianMTModel directory), "ctranslate2" or "onnx".
        out: destination directory (must not exist unless ``force``).
        quantization: None or "int8" (CTranslate2 only).
        force: replace an existing ``out``.

    Returns:
        An :class:`ExportReport` with the verification measurements.

    Raises:
        ExportError: unsupported format/option, missing package, or a failed verification.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format: must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if quantization is not None and (fmt != "ctranslate2" or quantization not in QUANTIZATIONS):
        raise ExportError(f"--quantization {quantization}: only 'int8' with --format ctranslate2 is supported")
    with staging_dir(out, force) as tmp, torch_threads(1):
        if fmt == "hf":
            from .hf import export_hf
            checks = export_hf(model_dir, tmp)
        elif fmt == "ctranslate2":
            from .ct2 import export_ctranslate2
            checks = export_ctranslate2(model_dir, tmp, quantization)
        else:
            from .onnx_export import export_onnx
            checks = export_onnx(model_dir, tmp)
    report = ExportReport(fmt, Path(out), checks)
    logger.debug(report.summary())
    return report
