"""Checkpoints that survive a kill at any moment, and checkpoint averaging.

A checkpoint is a directory ``checkpoints/step_00001000/`` that is also a loadable model
directory (``config.yaml``, ``model.safetensors``, tokenizer files) plus the training state:
``trainer.pt`` (optimizer, RNG and grad-scaler state; read with ``weights_only=True``) and
``state.json`` (step, data position, counters) and, with ``train.ema_decay``, ``ema.safetensors``
(the moving average of the weights, a full weights file), with the sha256 of its files in ``checksums.sha256``
(see :mod:`transduce.checksums`). It is written under a temporary name and
renamed into place, then ``checkpoints/latest`` is atomically pointed at it: a kill during a
save leaves the previous checkpoint, and the pointer to it, intact.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ..atomic import atomic_dir, atomic_write_text
from ..checksums import record, sha256_file, verify_all
from ..config import DecodeConfig
from ..errors import CheckpointError, one_line
from ..config.quantize import QAT_FILE
from ..model.io import WEIGHTS, load_model_config, read_weights, save_model, save_weights
from ..model.transformer import Transformer

CKPT_RE = re.compile(r"^step_(\d{8})$")
TRAINER_DIGEST = "trainer_sha256"  # state.json: sha256 of trainer.pt as written


def write_dir_atomically(final: Path, fill: Callable[[Path], None]) -> Path:
    """Create ``final`` by filling a temporary sibling directory and renaming it into place
    (see :func:`~transduce.atomic.atomic_dir`)."""
    with atomic_dir(final) as tmp:
        fill(tmp)
    return Path(final)


def save_model_dir(model: Transformer, tokenizer: Any, directory: Path, decode: DecodeConfig | None = None,
                   extra_weights: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """A complete model directory (weights, config and decoding settings, tokenizer), written
    atomically; ``extra_weights``: more safetensors files (file name -> tensors) beside them."""
    def fill(tmp: Path) -> None:
        save_model(model, tmp, decode)
        tokenizer.save(tmp)
        for name, tensors in (extra_weights or {}).items():
            save_weights(tensors, tmp / name)
    return write_dir_atomically(Path(directory), fill)


def save_checkpoint(ckpt_root: Path, step: int, model: Transformer, tokenizer: Any,
                    trainer_state: dict[str, Any], info: dict[str, Any], keep_last: int,
                    decode: DecodeConfig | None = None, extra_weights: dict[str, dict[str, torch.Tensor]] | None = None
                    ) -> Path:
    """Write ``step_XXXXXXXX`` under ``ckpt_root``, point ``latest`` at it, prune old ones;
    ``extra_weights``: more safetensors files (file name -> tensors), e.g. the weights' average."""
    ckpt_root.mkdir(parents=True, exist_ok=True)

    def fill(tmp: Path) -> None:
        save_model(model, tmp, decode)
        tokenizer.save(tmp)
        for name, tensors in (extra_weights or {}).items():
            save_weights(tensors, tmp / name)
        torch.save(trainer_state, tmp / "trainer.pt")
        digest = sha256_file(tmp / "trainer.pt")
        (tmp / "state.json").write_text(json.dumps({**info, TRAINER_DIGEST: digest}, indent=1))
        record(tmp, ["state.json"])

    path = write_dir_atomically(ckpt_root / f"step_{step:08d}", fill)
    atomic_write_text(ckpt_root / "latest", path.name + "\n")
    for old in list_checkpoints(ckpt_root)[:-keep_last]:
        remove_dir_atomically(old)
    return path


def remove_dir_atomically(path: Path) -> None:
    """Rename aside first (atomic), then delete: a kill never leaves a half-deleted checkpoint
    under a name that :func:`list_checkpoints` would offer."""
    trash = path.parent / f".{path.name}.deleting"
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary leftovers of a killed save are ignored)."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and CKPT_RE.match(p.name))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        path = ckpt_root / pointer.read_text().strip()
        if path.is_dir():
            return path
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """Weights, trainer state (optimizer, RNG...) and info of a checkpoint directory, every file
    checked against its checksum (CheckpointError naming a damaged one)."""
    verify_all(path)  # config.yaml, tokenizer files, state.json (see transduce.checksums)
    weights = read_weights(path / "model.safetensors")
    try:
        info = json.loads((path / "state.json").read_text())
        digest = info.pop(TRAINER_DIGEST, None)  # checkpoints before it have none
        if digest is not None and sha256_file(path / "trainer.pt") != digest:
            raise CheckpointError(f"{path / 'trainer.pt'}: corrupt: it does not match the checksum it was "
                                  "written with (resume from an earlier checkpoint)")
        trainer_state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path}: unreadable training state ({one_line(e)})") from None
    return weights, trainer_state, info


def average_checkpoints(paths: list[Path], out: Path, weights: str = WEIGHTS) -> Path:
    """Average the weights of several model/checkpoint directories of one config (Sec. 6.1:
    "averaging the last 5 checkpoints"). Writes a model directory with the first's tokenizer.
    ``weights``: the file averaged in each (``ema.safetensors``: the checkpoints' moving averages)."""
    if not paths:
        raise CheckpointError("average: no checkpoints given")
    config = load_model_config(paths[0])
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        if load_model_config(p) != config:
            raise CheckpointError(f"{p}: model config differs from {paths[0]}; cannot average")
        state = read_weights(Path(p) / weights)
        if total and set(state) != set(total):
            raise CheckpointError(f"{p}: tensor names differ from {paths[0]}")
        for k, v in state.items():
            total[k] = total[k] + v.double() if k in total else v.double()
    dtypes = {k: v.dtype for k, v in read_weights(Path(paths[0]) / weights).items()}
    averaged = {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}

    def fill(tmp: Path) -> None:
        verify_all(paths[0])
        copied = []
        for f in Path(paths[0]).iterdir():  # config and tokenizer files
            if f.is_file() and f.suffix in (".yaml", ".model", ".json") and f.name != "state.json":
                shutil.copy2(f, tmp / f.name)
                copied.append(f.name)
        record(tmp, copied)
        save_weights(averaged, tmp / WEIGHTS)
        if all((Path(p) / QAT_FILE).is_file() for p in paths):  # train.qat's observers: averaged too
            scales = [read_weights(Path(p) / QAT_FILE) for p in paths]
            if all(set(s) == set(scales[0]) for s in scales):
                save_weights({k: sum(s[k] for s in scales) / len(scales) for k in scales[0]}, tmp / QAT_FILE)
    return write_dir_atomically(Path(out), fill)
