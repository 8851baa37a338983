"""Atomic file writes: write beside the target, rename over it only when complete.

A kill or an error at any moment leaves either the old file or the new one, never a partial
file (the temporary is removed on failure; a hard kill can leave a hidden ``.NAME.*`` file).
Directories the same way (:func:`atomic_dir`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; it replaces ``path`` if the block succeeds.

    The directory must exist. ``suffix`` lets writers that infer a format from the name (e.g.
    matplotlib's ``savefig``) see the right extension. The file gets the mode of the one it
    replaces, or a new file's (0666 less the umask), not the temporary's private 0600.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _mode_for(path: Path) -> int:
    """The permission bits a file written at ``path`` should have."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """UTF-8, ``\\n`` line endings, flushed to disk before the rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory of ``final``; if the block succeeds it becomes
    ``final`` (mode 0755, an ordinary directory), replacing one that exists (renamed aside
    first, removed after). On any exception the temporary directory is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private
        yield tmp
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
