"""BENCHMARKS.md describes code in this history, measured by scripts that exist (issue 56): every
commit a table's ``commit`` column names is an ancestor of HEAD, and every ``bench/*.py`` the file
names is in bench/."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HASH = re.compile(r"\b[0-9a-f]{7,40}\b")


def table_commits(text: str) -> list[tuple[int, str]]:
    """(line, hash) of each commit named in the ``commit`` column of a Markdown table in ``text``."""
    found, header = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
        elif "commit" in header and len(cells) == len(header) and not set(cells[0]) <= set("-: "):
            found += [(number, h) for h in HASH.findall(cells[header.index("commit")])]
    return found


def test_table_commits_are_read_from_the_commit_column_only():
    text = "| a | commit |\n| --- | --- |\n| deadbee | 1234abc, and 5678def |\n\n| x |\n| --- |\n| cafe123 |\n"
    assert table_commits(text) == [(3, "1234abc"), (3, "5678def")]


def test_every_commit_in_a_table_is_in_this_history():
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout (an sdist or a copy): no history to check against")
    outside = [f"BENCHMARKS.md:{line} {h}" for line, h in table_commits((REPO / "BENCHMARKS.md").read_text("utf-8"))
               if subprocess.run(["git", "merge-base", "--is-ancestor", h, "HEAD"], cwd=REPO,
                                 capture_output=True).returncode != 0]
    assert not outside, f"commits that are not ancestors of HEAD (re-measure, or say what the row describes): {outside}"


def test_every_bench_script_named_exists():
    named = set(re.findall(r"bench/([\w-]+\.py)", (REPO / "BENCHMARKS.md").read_text("utf-8")))
    assert named, "BENCHMARKS.md names no bench/ script: the pattern is wrong"
    assert sorted(n for n in named if not (REPO / "bench" / n).is_file()) == []
