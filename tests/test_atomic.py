"""Atomic writes leave ordinary files: a new file's mode follows the umask, a replaced file's
mode is kept (not the private 0600 of the temporary file written first)."""

from __future__ import annotations

import os
import stat

from transduce.atomic import atomic_path, atomic_write_text


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_the_umask_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "out.txt", "one\n")
        assert _mode(tmp_path / "out.txt") == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.txt", "two\n")
        assert _mode(tmp_path / "private.txt") == 0o600
        os.chmod(tmp_path / "out.txt", 0o640)
        with atomic_path(tmp_path / "out.txt") as tmp:  # written by another library, e.g. a plot
            tmp.write_text("three\n")
        assert _mode(tmp_path / "out.txt") == 0o640 and (tmp_path / "out.txt").read_text() == "three\n"
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "private.txt"]  # no temporaries left
