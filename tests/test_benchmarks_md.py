"""BENCHMARKS.md describes code in this history, measured by scripts that exist (issue 56): every
commit a table's ``commit`` column names is an ancestor of HEAD, and every ``bench/*.py`` the file
names is in bench/. Its goals are current: a goal row names the date and commit of its figure, or
is "to re-measure" (or "not measured") with the command that measures it; the history section's
rows (figures measured on older code) each name a date and a commit, and its goals are exactly
those to re-measure."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HASH = re.compile(r"\b[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
COMMAND = re.compile(r"`([^`]*(?:bench/|transduce |pytest )[^`]*)`")
GOALS = "## Goals and their status"
HISTORY = "## History: figures measured on older code"
UNMEASURED = ("to re-measure", "not measured")


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_rows(lines: list[str], first: int = 1):
    """(line number, lower-cased header, cells) of each body row of the Markdown tables in
    ``lines`` (numbered from ``first``); a line that is not a table row ends a table."""
    header = None
    for number, line in enumerate(lines, first):
        if not line.startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = [c.lower() for c in row]
        elif not set(row[0]) <= set("-: "):
            yield number, header, row


def table_commits(text: str) -> list[tuple[int, str]]:
    """(line, hash) of each commit named in the ``commit`` column of a Markdown table in ``text``."""
    return [(number, h) for number, header, row in table_rows(text.splitlines())
            if "commit" in header and len(row) == len(header) for h in HASH.findall(row[header.index("commit")])]


def section_rows(text: str, heading: str) -> list[tuple[int, dict[str, str]]]:
    """(line, {column: cell}) of every table row under ``heading`` (to the next heading of its level)."""
    lines = text.splitlines()
    if heading not in lines:
        return []
    level = heading.split(" ")[0] + " "
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(level)), len(lines))
    return [(number, dict(zip(header, row)) if len(row) == len(header) else {})
            for number, header, row in table_rows(lines[start:end], start + 1)]


def goal_problems(text: str) -> list[str]:
    """Goal rows with neither a date and commit nor, when unmeasured, a command; history rows with
    no date or commit; history goals that are not the goals to re-measure, or the other way round."""
    problems, stale = [], set()
    for line, row in section_rows(text, GOALS):
        status, command = row.get("status", ""), row.get("command", "")
        if not row:
            problems.append(f"{line}: not as many cells as the header")
        elif status.startswith(UNMEASURED):
            stale |= {row["goal (issue)"]} if status.startswith("to re-measure") else set()
            if not COMMAND.search(command):
                problems.append(f"{line}: {status!r} without a command (bench/, transduce or pytest)")
        elif re.search(r"pytest (tests/\S+\.py)", command):  # a test: current at every commit CI runs
            if not (REPO / re.search(r"pytest (tests/\S+\.py)", command).group(1)).is_file():
                problems.append(f"{line}: the test it names is not in tests/")
        elif not (DATE.search(row.get("date", "")) and HASH.search(row.get("commit", ""))):
            problems.append(f"{line}: {status!r} names no date and commit")
    history = set()
    for line, row in section_rows(text, HISTORY):
        if not (row and DATE.search(row.get("date", "")) and HASH.search(row.get("commit", ""))):
            problems.append(f"{line}: a history row without a date and commit")
        elif "goal (issue)" in row:
            history.add(row["goal (issue)"])
    problems += [f"to re-measure, but no history row: {g}" for g in sorted(stale - history)]
    problems += [f"a history row for a goal not to re-measure: {g}" for g in sorted(history - stale)]
    return problems


def outside_history(text: str) -> list[str]:
    """``line hash`` of each table commit that is not an ancestor of HEAD."""
    return [f"{line} {h}" for line, h in table_commits(text)
            if subprocess.run(["git", "merge-base", "--is-ancestor", h, "HEAD"], cwd=REPO,
                              capture_output=True).returncode != 0]


def benchmarks() -> str:
    return (REPO / "BENCHMARKS.md").read_text("utf-8")


def need_git() -> None:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout (an sdist or a copy): no history to check against")


def test_table_commits_are_read_from_the_commit_column_only():
    text = "| a | commit |\n| --- | --- |\n| deadbee | 1234abc, and 5678def |\n\n| x |\n| --- |\n| cafe123 |\n"
    assert table_commits(text) == [(3, "1234abc"), (3, "5678def")]


def test_every_commit_in_a_table_is_in_this_history():
    need_git()
    outside = outside_history(benchmarks())
    assert not outside, f"commits that are not ancestors of HEAD (re-measure, or say what the row describes): {outside}"


def test_a_commit_outside_this_history_is_found():
    need_git()
    text = benchmarks()
    row = next(line for line in text.splitlines() if line.startswith("| Multi30k en→de 41.0"))
    planted = text.replace(row, row.replace("| 47a2436 |", "| 0123abc |"))
    assert outside_history(text) == []
    assert [entry.split()[1] for entry in outside_history(planted)] == ["0123abc"]


def test_every_bench_script_named_exists():
    named = set(re.findall(r"bench/([\w-]+\.py)", benchmarks()))
    assert named, "BENCHMARKS.md names no bench/ script: the pattern is wrong"
    assert sorted(n for n in named if not (REPO / "bench" / n).is_file()) == []


def test_goals_are_current_or_to_re_measure_with_a_command():
    text = benchmarks()
    assert len(section_rows(text, GOALS)) >= 20 and len(section_rows(text, HISTORY)) >= 1, "the sections were not read"
    assert goal_problems(text) == []


@pytest.mark.parametrize("plant, problem", [
    (lambda row: row.replace("| 2026-12-06 | 47a2436 |", "| | |"), "names no date and commit"),
    (lambda row: row.replace("| met (one run) |", "| to re-measure |")
     .replace("`TRANSDUCE_MULTI30K=DATA python bench/multi30k.py --pair en-de --out RUN`", "the hour's"),
     "without a command"),
])
def test_a_goal_row_without_its_commit_or_command_fails(plant, problem):
    text = benchmarks()
    row = next(line for line in text.splitlines() if line.startswith("| Multi30k en→de 41.0"))
    found = goal_problems(text.replace(row, plant(row)))
    assert any(problem in p for p in found), found


def test_history_rows_need_a_date_and_commit_and_match_the_goals_to_re_measure():
    text = benchmarks()
    row = next(line for line in text.splitlines() if line.startswith("| decoding, beam 4,") and "2026-11-30" in line)
    undated = text.replace(row, row.replace("| 2026-11-30 |", "| |"))
    assert any("without a date and commit" in p for p in goal_problems(undated))
    assert any("no history row" in p for p in goal_problems(text.replace(row + "\n", "")))
