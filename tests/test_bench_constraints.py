"""bench/constraints.py on the toy model: it runs, its constraint rule is seeded and favours
what the plain beam misses, and constrained decoding meets every constraint exactly once."""

import importlib.util
import json
from pathlib import Path

import toy_model

_PATH = Path(__file__).resolve().parents[1] / "bench" / "constraints.py"
_spec = importlib.util.spec_from_file_location("bench_constraints", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_reference_constraints_are_seeded_rare_once_and_missed_first():
    refs = ["der Hund sieht der Katze", "ein Baum steht am Fluss", "ein Vogel singt"]
    plain = ["der Hund sieht die Katze", "ein Baum am Fluss", "ein Vogel singt"]
    a = bench.reference_constraints(refs, plain, 2, 3, 1, seed=3)
    assert a == bench.reference_constraints(refs, plain, 2, 3, 1, seed=3)
    for ref, hyp, words in zip(refs, plain, a):
        assert 1 <= len(words) <= 2 and len(set(words)) == len(words)
        assert all(ref.split().count(w) == 1 and w != "ein" for w in words)  # once in it; "ein" the most common
    assert "steht" in a[1]  # the one word the plain output misses goes first
    assert bench.occurrences("a b c a b", "a b") == 2 and bench.occurrences("ab c", "a") == 0


def test_the_benchmark_runs_on_a_model_directory(trained_dir, tmp_path, capsys):
    pairs = toy_model.toy_pairs(6, seed=5)
    src, ref, out = tmp_path / "test.en", tmp_path / "test.de", tmp_path / "result.json"
    src.write_text("".join(s + "\n" for s, _ in pairs))
    ref.write_text("".join(t + "\n" for _, t in pairs))
    assert bench.main([str(trained_dir), "--src", str(src), "--ref", str(ref), "--limit", "4", "--runs", "1",
                       "--common", "0", "--mbr-nbest", "2", "--mbr-samples", "2", "--threads", "1",
                       "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == result and result["sentences"] == 4 and result["constraints"] >= 4
    assert set(result["systems"]) == {"plain", "constrained", "mbr_nbest", "mbr_samples"}
    assert result["systems"]["constrained"]["constraints_met"] == 1.0
    assert result["systems"]["constrained"]["constraints_repeated"] == 0.0
    assert set(result["vs_plain"]) == {"constrained", "mbr_nbest", "mbr_samples"}
