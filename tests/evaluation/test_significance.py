"""Paired significance (``transduce evaluate --compare``): sacrebleu's own paired bootstrap and
approximate randomization, the same numbers as calling sacrebleu directly."""

from __future__ import annotations

import json
import random

import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from transduce.cli import main
from transduce.errors import DataError
from transduce.evaluation.significance import compare, paired_test

WORDS = "the a dog cat runs sleeps over under red blue house tree river old young man woman".split()


def _systems(n: int = 60, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """References, a good system (one word in six dropped) and a worse one (one in two)."""
    rng = random.Random(seed)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(n)]

    def damaged(rate: float) -> list[str]:
        return [" ".join(w for w in r.split() if rng.random() > rate) for r in refs]
    return refs, damaged(1 / 6), damaged(1 / 2)


@pytest.mark.parametrize("test,kind", [("paired_bootstrap", "bs"), ("approximate_randomization", "ar")])
def test_paired_test_is_sacrebleus(test, kind):
    refs, good, bad = _systems()
    got = paired_test(good, bad, refs, test, n_samples=300)
    want = PairedTest([("other", bad), ("model", good)], {"BLEU": BLEU(), "chrF": CHRF()}, [refs],
                      test_type=kind, n_samples=300, n_ar_confidence=0 if kind == "ar" else -1)()[1]
    for name, key in (("bleu", "BLEU"), ("chrf", "chrF2")):
        base, ours = want[key]
        assert got[name]["score"] == pytest.approx(ours.score) and got[name]["other_score"] == pytest.approx(base.score)
        assert got[name]["p_value"] == pytest.approx(ours.p_value)
        assert got[name]["ci95"] == pytest.approx([ours.mean - ours.ci, ours.mean + ours.ci])
        assert got[name]["other_ci95"] == pytest.approx([base.mean - base.ci, base.mean + base.ci])
        assert got[name]["ci95"][0] < got[name]["score"] < got[name]["ci95"][1]
        assert got[name]["p_value"] < 0.05  # dropping half the words is a real difference
        assert got[name]["score"] > got[name]["other_score"]


def test_identical_systems_are_not_significant():
    refs, good, _ = _systems(30)
    result = compare(good, good, refs, n_samples=200)
    for name in ("bleu", "chrf"):
        for test in ("approximate_randomization", "paired_bootstrap"):
            got = result[test][name]
            assert got["score"] == got["other_score"]  # (intervals: separate resamples)


def test_misaligned_systems_are_a_user_error():
    with pytest.raises(DataError, match="--compare"):
        compare(["a", "b"], ["a"], ["a", "b"])


def test_evaluate_compare_with_a_file_and_with_a_model(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    src, ref, other = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "other.txt"
    src.write_text("the cat sat on the mat\na dog runs\ntea\n", encoding="utf-8")
    refs = ["THE CAT SAT ON THE MAT", "A DOG RUNS", "TEA"]
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    other.write_text("THE CAT SAT\nA DOG\nTEA\n", encoding="utf-8")
    fast = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu"]
    hyp = tmp_path / "hyp.txt"
    assert main(["translate", str(model_dir), "--input", str(src), "--output", str(hyp), *fast]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--compare", str(other), *fast]) == 0
    report = json.loads(capsys.readouterr().out)["compare"]
    want = compare(hyp.read_text(encoding="utf-8").splitlines(), other.read_text().splitlines(), refs)
    assert report == json.loads(json.dumps(want))
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--compare", str(model_dir),
                 *fast]) == 0
    same = json.loads(capsys.readouterr().out)["compare"]["paired_bootstrap"]
    assert same["bleu"]["score"] == same["bleu"]["other_score"] and same["bleu"]["ci95"] == same["bleu"]["other_ci95"]
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--compare",
                 str(tmp_path / "missing.txt"), *fast]) == 2
    assert "compare:" in capsys.readouterr().err
