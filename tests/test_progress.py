"""Progress bars: count, rate and ETA on a terminal; nothing when piped or with --quiet."""

import io
import logging
import sys

import pytest

import transduce.progress as progress
from transduce.cli import main
from transduce.inference import Translator, translate_file
from transduce.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _not_quiet(monkeypatch):
    monkeypatch.setattr(progress, "QUIET", False)


def test_a_terminal_gets_count_rate_and_eta(monkeypatch):
    clock = iter([0.0, 2.0, 4.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = Terminal()
    bar = Progress(100, unit="sentences", stream=out)
    bar.update(20)        # t=0: where this run starts (a resumed run starts late)
    bar.advance(10)       # t=2: 5 sentences/s, 70 left
    bar.update(50, {"loss": 2.5})
    bar.close()
    lines = out.getvalue().split("\r\x1b[K")
    assert lines[1] == "sentences 20/100"
    assert lines[2] == "sentences 30/100 5 sentences/s ETA 14s"
    assert lines[3] == "sentences 50/100 loss 2.5 7.5 sentences/s ETA 6s"
    assert lines[4] == lines[3] + "\n"  # closing draws the last state, then ends the line


def test_piped_output_gets_log_lines_only_when_forced(caplog):
    out = io.StringIO()
    bar = Progress(10, stream=out)
    with caplog.at_level(logging.INFO, logger="transduce"):
        bar.update(3)
        bar.update(5, {"loss": 1.0}, force=True)
    assert out.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == ["step 5/10 loss 1"]


def test_quiet_shows_nothing(monkeypatch):
    monkeypatch.setattr(progress, "QUIET", True)
    out = Terminal()
    bar = Progress(10, stream=out)
    bar.update(5, force=True)
    bar.close()
    assert out.getvalue() == ""


def test_translate_file_reports_sentences_on_a_terminal(trained_dir, tmp_path, monkeypatch):
    (tmp_path / "in.txt").write_text("the red dog\n\na big cat sleeps\n")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    translate_file(Translator.load(trained_dir), tmp_path / "in.txt", tmp_path / "out.txt")
    assert "sentences 3/3" in terminal.getvalue()
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 3


def test_cli_quiet(trained_dir, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the red dog\n")
    assert main(["--quiet", "translate", str(trained_dir), "--input", str(tmp_path / "in.txt")]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and captured.err == ""


def test_prepare_reports_sentences_on_a_terminal(tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["prepare", "--set", "data.toy_train_size=300", "--set", "data.toy_valid_size=20",
                 "--set", "data.toy_test_size=20", "--set", "data.vocab_size=100", "--out", str(tmp_path / "p")]) == 0
    assert "sentences 300" in terminal.getvalue()
