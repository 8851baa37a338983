"""The decoding controls through ``transduce.cli.main``: ``score``, the repetition options,
constraints and reranking."""

from __future__ import annotations

import json
import math

import pytest

from transduce.cli import main


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


FAST = ["--max-len-a", "0", "--max-len-b", "6", "--device", "cpu"]
SOURCES = ["the cat sat on the mat", "a dog runs in the park", "", "tea"]


def _write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


TOY = ["the red dog runs", "a small cat sleeps under the tree", "the bird sings today", "old house"]


def test_score_equals_the_beam_scores_of_its_outputs(trained_dir, tmp_path, capsys):
    """Through text: the trained toy model's outputs end with EOS and re-tokenize to themselves."""
    src = _write(tmp_path / "src.txt", TOY)
    hyp = tmp_path / "hyp.txt"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(hyp), "--nbest", "2",
                 "--device", "cpu"]) == 0
    best = [line.split("\t") for line in hyp.read_text(encoding="utf-8").splitlines()][::2]
    tgt = _write(tmp_path / "tgt.txt", [text for _, text in best])
    capsys.readouterr()
    assert main(["score", str(trained_dir), "--src", str(src), "--tgt", str(tgt), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(TOY)
    for (score, _), line in zip(best, lines):
        assert abs(float(line.split("\t")[1]) - float(score)) < 1e-4


def test_score_jsonl_and_empty_target(model_dir, tmp_path, capsys):
    src = _write(tmp_path / "src.txt", ["the cat", "tea"])
    tgt = _write(tmp_path / "tgt.txt", ["THE CAT", ""])
    assert main(["score", str(model_dir), "--src", str(src), "--tgt", str(tgt), "--output-format", "jsonl",
                 "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1]["pieces"] == ["</s>"] and rows[1]["log_prob"] < 0  # the empty translation: EOS alone
    for row in rows:
        assert len(row["pieces"]) == len(row["token_log_probs"])
        assert abs(sum(row["token_log_probs"]) - row["log_prob"]) < 1e-4


def test_score_rejects_misaligned_files(model_dir, tmp_path, capsys):
    src = _write(tmp_path / "src.txt", ["a", "b"])
    tgt = _write(tmp_path / "tgt.txt", ["A"])
    assert main(["score", str(model_dir), "--src", str(src), "--tgt", str(tgt)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "1 lines" in err


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def test_translate_with_repetition_options(model_dir, tmp_path):
    """The untrained model repeats itself (12 pieces of one or two kinds); --no-repeat-ngram-size N
    leaves no n-gram of N pieces twice, and a strong --repetition-penalty no piece twice."""
    src = _write(tmp_path / "src.txt", SOURCES)
    out = tmp_path / "out.jsonl"

    def pieces(*flags: str) -> list[list[str]]:
        assert main(["translate", str(model_dir), "--input", str(src), "--output", str(out), "--beam", "3",
                     "--max-len-a", "0", "--max-len-b", "12", "--device", "cpu", "--output-format", "jsonl",
                     *flags]) == 0
        rows = [json.loads(line)["pieces"] for line in out.read_text(encoding="utf-8").splitlines()]
        assert len(rows) == len(SOURCES) and rows[2] == ["</s>"]  # the empty source: EOS alone
        return [[p for p in row if p != "</s>"] for row in rows]

    def repeats(row: list[str], n: int) -> bool:
        return len(set(_ngrams(row, n))) < len(_ngrams(row, n))

    plain = pieces()
    for n in (1, 2, 3):
        assert all(repeats(row, n) for row in plain if row)
        assert not any(repeats(row, n) for row in pieces("--no-repeat-ngram-size", str(n))), n
    assert not any(repeats(row, 1) for row in pieces("--repetition-penalty", "5"))
    assert main(["translate", str(model_dir), "--input", str(src), "--repetition-penalty", "0"]) == 2


def test_translate_with_constraints_and_a_glossary(trained_dir, tmp_path):
    src = _write(tmp_path / "src.txt", ["the red dog runs\tKatze", "a small cat sleeps\tVogel\tHaus", "old house", ""])
    glossary = _write(tmp_path / "glossary.tsv", ["house\tBaum"])
    out = tmp_path / "out.txt"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(out), "--constraints",
                 "--glossary", str(glossary), "--device", "cpu"]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4 and lines[3] == ""  # an empty source: an empty translation, constraints or not
    assert "Katze" in lines[0] and "Vogel" in lines[1] and "Haus" in lines[1] and "Baum" in lines[2]


@pytest.mark.parametrize("case", ["too_long", "bad_glossary"])
def test_constraint_errors_are_one_line(trained_dir, tmp_path, capsys, case):
    src = _write(tmp_path / "src.txt", ["the dog\t" + " ".join(["Hund"] * 40)])
    glossary = _write(tmp_path / "glossary.tsv", ["dog Hund"])
    args = ["--constraints"] if case == "too_long" else ["--glossary", str(glossary)]
    assert main(["translate", str(trained_dir), "--input", str(src), "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert ("output limit" in err) if case == "too_long" else ("glossary.tsv:1" in err)


def test_translate_nbest_with_mbr_writes_its_choice(trained_dir, tmp_path):
    """MBR writes, of the 4-best, the one of highest expected utility (sentence BLEU or chrF, by
    sacrebleu) against them all, each weighted by its probability renormalised over the list:
    here computed again from the 4-best's texts and log-probabilities."""
    import sacrebleu

    src = _write(tmp_path / "src.txt", TOY)
    nbest, out = tmp_path / "nbest.jsonl", tmp_path / "out.txt"
    common = ["translate", str(trained_dir), "--input", str(src), "--nbest", "4", "--device", "cpu"]
    assert main([*common, "--output", str(nbest), "--output-format", "jsonl"]) == 0
    lists = [json.loads(line)["hypotheses"] for line in nbest.read_text(encoding="utf-8").splitlines()]
    assert [len(hyps) for hyps in lists] == [4] * len(TOY)
    metric = {"bleu": sacrebleu.sentence_bleu, "chrf": sacrebleu.sentence_chrf}
    for utility in ("bleu", "chrf"):
        assert main([*common, "--output", str(out), "--rerank", "mbr", "--mbr-utility", utility]) == 0
        lines = out.read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(TOY) and all("\t" not in line for line in lines)  # one choice per input
        want = []
        for hyps in lists:
            top = max(h["log_prob"] for h in hyps)
            weights = [math.exp(h["log_prob"] - top) for h in hyps]
            expected = [sum(w * metric[utility](h["translation"], [r["translation"]]).score
                            for w, r in zip(weights, hyps)) / sum(weights) for h in hyps]
            want.append(hyps[expected.index(max(expected))]["translation"])
        assert lines == want, utility
        if utility == "bleu":  # on some input the consensus is not the most probable translation
            assert lines != [hyps[0]["translation"] for hyps in lists]
    assert main(["translate", str(trained_dir), "--input", str(src), "--rerank", "mbr", "--device", "cpu"]) == 2


def test_translate_jsonl_has_token_log_probs_that_sum_to_the_log_prob(trained_dir, tmp_path):
    src = _write(tmp_path / "src.txt", TOY + [""])
    out = tmp_path / "out.jsonl"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(out), "--nbest", "2",
                 "--output-format", "jsonl", "--no-repeat-ngram-size", "3", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(TOY) + 1 and rows[-1]["translation"] == "" and rows[-1]["token_log_probs"] == []
    for row in rows[:-1]:
        assert len(row["pieces"]) == len(row["token_log_probs"]) and row["pieces"][-1] == "</s>"
        assert abs(sum(row["token_log_probs"]) - row["log_prob"]) < 1e-4
        assert len(row["hypotheses"]) == 2 and row["hypotheses"][0]["translation"] == row["translation"]


def test_reverse_reranking_adds_the_reverse_models_score(trained_dir, tmp_path):
    """The toy model stands in for its own reverse: the plumbing and the arithmetic, not the gain."""
    from transduce.inference import Translator

    tr = Translator.load(trained_dir)
    tr.reverse = Translator.load(trained_dir)
    out = tr.translate_detailed(TOY[:2] + [""], beam=3, nbest=3, rerank="reverse", reverse_weight=0.5)
    for t in out[:2]:
        utilities = [h.utility for h in t.hypotheses]
        assert utilities == sorted(utilities, reverse=True)
        for h in t.hypotheses:
            back = tr.reverse.score([h.text], [t.source])[0].score
            assert abs(h.utility - (h.score + 0.5 * back)) < 1e-4
    assert out[2].best.text == ""
    src = _write(tmp_path / "src.txt", TOY)
    dst = tmp_path / "out.txt"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(dst), "--nbest", "3",
                 "--rerank", f"reverse:{trained_dir}", "--reverse-weight", "0.3", "--device", "cpu"]) == 0
    assert len(dst.read_text(encoding="utf-8").splitlines()) == len(TOY)
    with pytest.raises(Exception, match="reverse needs a target->source model"):
        Translator.load(trained_dir).translate(TOY[:1], nbest=2, rerank="reverse")
