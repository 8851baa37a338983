"""``transduce demo --task lm`` and ``--task mlm`` end to end, with a handful of steps (what CI runs)."""

import json

import pytest

from transduce.cli import main
from transduce.data.toy import make_tense_splits
from transduce.demo import nsp_documents
from transduce.model import load_model


@pytest.mark.slow
def test_lm_demo_runs_and_reports_perplexity_and_samples(tmp_path, capsys):
    assert main(["demo", "--task", "lm", "--steps", "3", "--out", str(tmp_path / "lm")]) == 0
    out = capsys.readouterr().out
    assert "validation perplexity" in out and "transduce generate" in out
    summary = json.loads((tmp_path / "lm" / "demo.json").read_text())
    assert summary["steps"] == 3 and summary["val_ppl"] > 1


@pytest.mark.slow
def test_mlm_demo_with_nsp_runs_and_reports_perplexity_guesses_and_nsp_accuracy(tmp_path, capsys):
    # the plain masked-LM demo runs inside the classify demo's test below
    assert main(["demo", "--task", "mlm", "--nsp", "--steps", "3", "--out", str(tmp_path / "mlm")]) == 0
    out = capsys.readouterr().out
    assert "validation perplexity" in out and out.count("[MASK]") == 4 and "guessed" in out
    assert "next-sentence prediction on the test documents" in out
    summary = json.loads((tmp_path / "mlm" / "demo.json").read_text())
    assert summary["steps"] == 3 and summary["val_ppl"] > 1 and 0 <= summary["nsp_test_accuracy"] <= 1
    assert load_model(tmp_path / "mlm" / "model").config.nsp


def test_nsp_documents_group_the_toy_sentences_by_tense(tmp_path):
    files = nsp_documents(tmp_path)
    lines = (tmp_path / "data" / "valid.txt").read_text().splitlines()
    splits = make_tense_splits(0, 20000, 500, 500)
    assert sorted(lines) == sorted(text for text, _ in splits["valid"]) and files["valid_tgt"].endswith("valid.txt")
    tense = dict(splits["valid"])
    changes = sum(tense[a] != tense[b] for a, b in zip(lines, lines[1:]))
    assert changes == len(set(tense.values())) - 1  # one document per tense
    assert main(["demo", "--task", "lm", "--nsp"]) == 2  # an option of the masked-LM demo only


@pytest.mark.slow
def test_classify_demo_fine_tunes_and_trains_from_scratch_and_reports_both_accuracies(tmp_path, capsys):
    assert main(["demo", "--task", "classify", "--steps", "2", "--out", str(tmp_path / "cls")]) == 0
    out = capsys.readouterr().out
    assert "fine-tuned from the masked LM" in out and "trained from scratch" in out and "transduce classify" in out
    summary = json.loads((tmp_path / "cls" / "demo.json").read_text())
    assert summary["steps"] == 2 and summary["labelled_sentences"] == 2000 and summary["test_sentences"] == 500
    assert set(summary["test_accuracy"]) == {"pretrained", "scratch"}
    assert all(0 <= a <= 1 for a in summary["test_accuracy"].values())
    assert 0.4 < summary["baselines"]["majority"] < summary["baselines"]["position"] < 0.9
    for run in ("mlm", "pretrained", "scratch"):  # the masked LM trained, both classifiers for the same steps
        log = (tmp_path / "cls" / run / "metrics.jsonl").read_text().splitlines()
        assert max(json.loads(line)["step"] for line in log) == 2
    rows = (tmp_path / "cls" / "data" / "test.tsv").read_text().splitlines()
    assert len(rows) == 500 and all(r.rsplit("\t", 1)[1] in {"present", "perfect", "future", "modal"} for r in rows)
    # an existing masked LM is reused rather than trained again
    assert main(["demo", "--task", "classify", "--steps", "2", "--out", str(tmp_path / "again"),
                 "--init-from", str(tmp_path / "cls" / "mlm" / "model")]) == 0
    assert not (tmp_path / "again" / "mlm").exists() and (tmp_path / "again" / "demo.json").is_file()
    assert main(["demo", "--task", "lm", "--init-from", str(tmp_path / "cls" / "mlm" / "model")]) == 2
