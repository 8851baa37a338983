"""sha256 checksums of the small files of a model or checkpoint directory.

``checksums.sha256`` lists ``config.yaml``, the tokenizer files and a checkpoint's
``state.json``, one ``HEX  NAME`` line each: the format of ``sha256sum``, so ``sha256sum -c
checksums.sha256`` checks a directory by hand too. Each writer records the files it wrote
(:func:`record`); each reader checks the file it reads (:func:`verify`), so a flipped byte is a
one-line :class:`~transduce.errors.CheckpointError` naming the file, never a silently different
tokenizer or config. The weights (``model.safetensors``) and ``trainer.pt`` carry their own
checksums (see :mod:`transduce.model.io`, :mod:`transduce.training.checkpoint`). A directory
saved before this file existed has none and loads unchecked.

``config.yaml`` is text that users may edit on purpose (decoding settings, say): after such an
edit, ``transduce rehash DIR`` records its new checksum.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .atomic import atomic_write_text
from .errors import CheckpointError

MANIFEST = "checksums.sha256"
EDITABLE = "config.yaml"  # the one file a mismatch may mean an intentional edit of


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a file, read in blocks (never mapped into this process)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def recorded(directory: str | os.PathLike) -> dict[str, str]:
    """File name -> sha256 as recorded in ``directory`` (empty if it has no manifest)."""
    path = Path(directory) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__})") from None
    sums = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name or "/" in name:
            raise CheckpointError(f"{path}: corrupt: not 'SHA256  NAME' lines")
        sums[name] = digest
    return sums


def record(directory: str | os.PathLike, names: list[str]) -> None:
    """Record the sha256 of the files ``names`` in ``directory`` (others already there are kept)."""
    directory = Path(directory)
    sums = {**recorded(directory), **{name: sha256_file(directory / name) for name in names}}
    atomic_write_text(directory / MANIFEST, "".join(f"{sums[n]}  {n}\n" for n in sorted(sums)))


def verify(directory: str | os.PathLike, name: str) -> None:
    """Check file ``name`` of ``directory`` against its recorded sha256 (if one is recorded)."""
    directory = Path(directory)
    want = recorded(directory).get(name)
    if want is None or not (directory / name).is_file() or sha256_file(directory / name) == want:
        return
    if name == EDITABLE:
        raise CheckpointError(f"{directory / name}: does not match the checksum it was saved with; if you edited "
                              f"it on purpose, accept the edit with: transduce rehash {directory}")
    raise CheckpointError(f"{directory / name}: corrupt: it does not match the checksum it was saved with "
                          "(a damaged disk or copy; restore it from a good copy)")


def verify_all(directory: str | os.PathLike) -> None:
    """Check every file recorded in ``directory``."""
    for name in recorded(directory):
        verify(directory, name)
