"""Progress bars (tqdm): on standard error, only on a terminal or with TRANSDUCE_PROGRESS=1,
never with --quiet, and never in standard output, which carries translations."""

import io
import logging
import sys

import pytest

import transduce.progress as progress
from transduce.cli import main
from transduce.interop import export_model
from transduce.progress import FORCE_ENV, progress_bar
from extra_helpers import need_extra

FAST = ["--beam", "2", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _not_quiet(monkeypatch):
    monkeypatch.setattr(progress, "QUIET", False)  # main(["--quiet", ...]) sets it; restored after each test
    monkeypatch.delenv(FORCE_ENV, raising=False)


@pytest.mark.parametrize("terminal, quiet, env, drawn", [
    (True, False, None, True),
    (False, False, None, False),   # piped or redirected: nothing
    (True, True, None, False),     # --quiet
    (False, False, "1", True),     # forced on
    (True, True, "1", False),      # --quiet wins
    (True, False, "0", False),     # forced off
])
def test_a_bar_is_drawn_on_a_terminal_or_when_forced_and_never_when_quiet(monkeypatch, terminal, quiet, env, drawn):
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(progress, "QUIET", quiet)
    if env is not None:
        monkeypatch.setenv(FORCE_ENV, env)
    with progress_bar(10, unit="steps") as bar:
        bar.update(4)
        assert bar.disable is not drawn
    assert ("4/10" in stderr.getvalue()) is drawn
    assert (stderr.getvalue() == "") is not drawn


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_a_terminal_that_does_not_know_its_size_still_gets_a_bar(monkeypatch):
    """A fresh pseudo-terminal is 0x0 (``script``, ``docker exec -t``): tqdm alone draws nothing."""
    import os
    import pty
    import select

    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        assert min(os.get_terminal_size(slave)) == 0
        with progress_bar(10, unit="steps") as bar:
            bar.update(4)
        terminal.flush()
        drawn = b""
        while select.select([master], [], [], 0.5)[0]:  # all the terminal holds (one read may get a part)
            drawn += os.read(master, 4096)
    os.close(master)
    assert "4/10" in drawn.decode()


def test_a_rank_that_is_not_the_first_draws_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress_bar(10, unit="steps", enabled=False) as bar:
        bar.update(4)
    assert sys.stderr.getvalue() == ""


def test_log_lines_go_above_an_open_bar(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    handler = logging.StreamHandler(terminal)  # the CLI's console handler (logging.basicConfig)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", logging.INFO)
    # (earlier tests' libraries may have disabled loggers or logging as a whole: undo it here)
    logger = logging.getLogger("transduce.training")
    monkeypatch.setattr(logging.root.manager, "disable", 0)
    for name in ("transduce", "transduce.training"):
        for attr, value in (("disabled", False), ("level", logging.NOTSET), ("propagate", True)):
            monkeypatch.setattr(logging.getLogger(name), attr, value)
    logging.root.manager._clear_cache()
    with progress_bar(10, unit="steps") as bar:
        bar.update(3)
        logger.info("step 3: val_loss 1.5")
    assert "\nstep 3: val_loss 1.5\n" in terminal.getvalue().replace("\r", "\n")
    assert root.handlers == [handler]  # the console handler is back once the bar closes


def test_translate_stdout_carries_only_translations_while_a_bar_is_drawn(model_dir, tmp_path, capsys, monkeypatch):
    source = tmp_path / "in.txt"
    source.write_text("the cat sat on the mat\n\na dog runs in the park\n")
    assert main(["translate", str(model_dir), "--input", str(source), *FAST]) == 0
    plain = capsys.readouterr()
    assert plain.err.count("/3") == 0  # not a terminal: no bar
    monkeypatch.setenv(FORCE_ENV, "1")
    assert main(["translate", str(model_dir), "--input", str(source), *FAST]) == 0
    barred = capsys.readouterr()
    assert "3/3" in barred.err and "sentence" in barred.err  # the bar, on standard error
    assert barred.out == plain.out and len(barred.out.splitlines()) == 3  # standard output: the translations only


def test_no_bar_between_translations_written_to_a_terminal(model_dir, tmp_path, monkeypatch):
    """Translations shown on the terminal the bar would be drawn on: no bar in between them."""
    from transduce.inference import Translator, translate_file

    (tmp_path / "in.txt").write_text("the red dog\na cat\n")
    monkeypatch.setenv(FORCE_ENV, "1")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    screen = Terminal()
    assert translate_file(Translator.load(model_dir), tmp_path / "in.txt", None, stdout=screen) == 2
    assert len(screen.getvalue().splitlines()) == 2 and sys.stderr.getvalue() == ""
    translate_file(Translator.load(model_dir), tmp_path / "in.txt", tmp_path / "out.txt")  # to a file: a bar
    assert "2/2" in sys.stderr.getvalue()


def test_cli_quiet_draws_no_bar_even_when_forced(model_dir, tmp_path, capsys, monkeypatch):
    (tmp_path / "in.txt").write_text("the red dog\n")
    monkeypatch.setenv(FORCE_ENV, "1")
    assert main(["--quiet", "translate", str(model_dir), "--input", str(tmp_path / "in.txt"), *FAST]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 and captured.err == ""


def test_prepare_reports_sentences_on_a_terminal(tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["prepare", "--set", "data.toy_train_size=300", "--set", "data.toy_valid_size=20",
                 "--set", "data.toy_test_size=20", "--set", "data.vocab_size=100", "--out", str(tmp_path / "p")]) == 0
    assert "300 sentences" in terminal.getvalue()


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_export_verification_draws_a_bar_of_checks(trained_dir, tmp_path, capsys, monkeypatch, fmt):
    need_extra("export", "transformers", "onnx", "onnxruntime")
    monkeypatch.setenv(FORCE_ENV, "1")
    export_model(trained_dir, fmt, tmp_path / "out")
    checks = {"hf": 3, "onnx": 2}[fmt]
    err = capsys.readouterr().err
    assert "verifying: 100%" in err and f"{checks}/{checks} [" in err
