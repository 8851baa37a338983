"""``transduce demo --task lm`` and ``--task mlm`` end to end, with a handful of steps (what CI runs)."""

import json

import pytest

from transduce.cli import main


@pytest.mark.slow
def test_lm_demo_runs_and_reports_perplexity_and_samples(tmp_path, capsys):
    assert main(["demo", "--task", "lm", "--steps", "3", "--out", str(tmp_path / "lm")]) == 0
    out = capsys.readouterr().out
    assert "validation perplexity" in out and "transduce generate" in out
    summary = json.loads((tmp_path / "lm" / "demo.json").read_text())
    assert summary["steps"] == 3 and summary["val_ppl"] > 1


@pytest.mark.slow
def test_mlm_demo_runs_and_reports_perplexity_and_guesses(tmp_path, capsys):
    assert main(["demo", "--task", "mlm", "--steps", "3", "--out", str(tmp_path / "mlm")]) == 0
    out = capsys.readouterr().out
    assert "validation perplexity" in out and out.count("[MASK]") == 4 and "guessed" in out
    summary = json.loads((tmp_path / "mlm" / "demo.json").read_text())
    assert summary["steps"] == 3 and summary["val_ppl"] > 1
