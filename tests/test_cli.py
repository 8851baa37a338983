"""``transduce translate / evaluate / attention`` through ``transduce.cli.main``."""

from __future__ import annotations

import io
import json
import sys

import pytest
import sacrebleu

from transduce.cli import main
from extra_helpers import need_extra


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield

LINES = ["the cat sat on the mat", "", "a dog runs in the park",
         " ".join(["the old man drinks tea"] * 220),  # > 1022 tokens: truncated
         "", "tea"]
FAST = ["--beam", "2", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu"]


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_translate_stdin_to_stdout_keeps_line_count_and_order(model_dir, monkeypatch, capsys, caplog):
    _stdin(monkeypatch, ("\n".join(LINES) + "\n").encode())
    assert main(["translate", str(model_dir), *FAST, "--batch-tokens", "16"]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(LINES)
    assert out[1] == "" and out[4] == ""
    assert "truncated" in caplog.text
    # the same lines one at a time give the same outputs (batching restores input order)
    for i in (0, 2, 5):
        _stdin(monkeypatch, (LINES[i] + "\n").encode())
        assert main(["translate", str(model_dir), *FAST]) == 0
        assert capsys.readouterr().out == out[i] + "\n"


def test_translate_files_nbest_format(model_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES[:3]) + "\n", encoding="utf-8")
    dst = tmp_path / "out.txt"
    assert main(["translate", str(model_dir), "--input", str(src), "--output", str(dst), "--nbest", "3",
                 "--beam", "3", "--max-len-b", "3"]) == 0
    rows = dst.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(rows) == 3 * 3
    for group in (rows[0:3], rows[6:9]):
        scores = [float(r.split("\t", 1)[0]) for r in group]
        assert scores == sorted(scores, reverse=True)
    assert [r.split("\t", 1)[1] for r in rows[3:6]] == ["", "", ""]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temp left


@pytest.mark.parametrize("case", ["missing_model", "missing_input", "bad_utf8", "bad_nbest"])
def test_user_errors_exit_2_with_one_line(model_dir, tmp_path, capsys, case):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nbroken \xff\xfe line\n")
    out = tmp_path / "out.txt"
    argv = {
        "missing_model": ["translate", str(tmp_path / "nope"), "--input", str(bad)],
        "missing_input": ["translate", str(model_dir), "--input", str(tmp_path / "none.txt")],
        "bad_utf8": ["translate", str(model_dir), "--input", str(bad), "--output", str(out), *FAST],
        "bad_nbest": ["translate", str(model_dir), "--input", str(bad), "--nbest", "5", "--beam", "2"],
    }[case]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("transduce translate: error: ")
    expected = {"missing_model": "not found", "missing_input": "no such file",
                "bad_utf8": "bad.txt:2: invalid UTF-8", "bad_nbest": "decode.nbest"}[case]
    assert expected in err
    assert not out.exists() and not list(tmp_path.glob(".out.txt.*"))


def test_evaluate_reports_sacrebleus_own_scores(model_dir, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the cat sat on the mat\na dog runs\n\ntea\n", encoding="utf-8")
    refs = ["THE CAT SAT ON THE MAT", "A DOG RUNS", "", "TEA"]
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    assert main(["translate", str(model_dir), "--input", str(src), "--output", str(hyp), *FAST]) == 0
    hyps = hyp.read_text(encoding="utf-8").split("\n")[:-1]
    capsys.readouterr()
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert report["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert report["bleu_lowercase"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score)
    assert report["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "chrF2" in report["chrf_signature"] or "nc:6" in report["chrf_signature"]
    assert report["sentences"] == 4 and report["sentences_per_s"] > 0 and report["tokens_per_s"] > 0


def test_evaluate_reranks_the_nbest_as_translate_does(model_dir, tmp_path, capsys):
    """evaluate --nbest K --rerank mbr scores the hypotheses translate --nbest K --rerank mbr writes."""
    src, ref, hyp = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "hyp.txt"
    src.write_text("the cat sat on the mat\na dog runs\ntea\n", encoding="utf-8")
    refs = ["THE CAT SAT ON THE MAT", "A DOG RUNS", "TEA"]
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    mbr = ["--beam", "3", "--nbest", "3", "--rerank", "mbr", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu"]
    assert main(["translate", str(model_dir), "--input", str(src), "--output", str(hyp), *mbr]) == 0
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 3  # reranked: one line per input, not K
    capsys.readouterr()
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), *mbr]) == 0
    assert json.loads(capsys.readouterr().out)["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--nbest", "1", "--rerank", "mbr",
                 "--device", "cpu"]) == 2  # one line: reranking needs the n-best (or samples)
    assert "decode.rerank" in capsys.readouterr().err


def test_evaluate_rejects_misaligned_files(model_dir, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref)]) == 2
    assert "has 2 lines" in capsys.readouterr().err


def test_attention_command_writes_a_png(model_dir, tmp_path, capsys):
    need_extra("plot", "matplotlib")
    png = tmp_path / "attn.png"
    assert main(["attention", str(model_dir), "the cat sat", "--out", str(png), "--layer", "1",
                 "--head", "0", "--beam", "1"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["attention", str(model_dir), "tea", "--out", str(png), "--layer", "7"]) == 2
    assert "layer: must be in" in capsys.readouterr().err


def test_evaluate_with_tokenized_references(model_dir, tmp_path, capsys):
    need_extra("moses", "sacremoses")
    from transduce.evaluation.moses import moses_lc_tokenize
    src, ref, tok = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "ref.tok"
    src.write_text("the cat sat on the mat\na dog runs\n", encoding="utf-8")
    ref.write_text("The cat's mat.\nA dog, running.\n", encoding="utf-8")
    tok.write_text("\n".join(moses_lc_tokenize(["The cat's mat.", "A dog, running."], "en")) + "\n", encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    assert main(["translate", str(model_dir), "--input", str(src), "--output", str(hyp), *FAST]) == 0
    hyps = hyp.read_text(encoding="utf-8").split("\n")[:-1]
    capsys.readouterr()
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--tok-ref", str(tok),
                 "--lang", "en", *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = sacrebleu.corpus_bleu(moses_lc_tokenize(hyps, "en"), [tok.read_text().split("\n")[:-1]],
                                     tokenize="none", force=True).score
    assert report["bleu_moses_lc"] == pytest.approx(expected)
    assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--tok-ref", str(tok),
                 *FAST]) == 2
    assert "--lang" in capsys.readouterr().err


def test_evaluate_hyp_tokenized_reaches_the_metric(model_dir, tmp_path, capsys, monkeypatch):
    """--hyp-tokenized: the output is scored as it is (the metric itself: tests/evaluation)."""
    from transduce.evaluation import moses
    seen = []
    monkeypatch.setattr(moses, "moses_lc_bleu", lambda hyps, refs, lang, tokenized=False:
                        seen.append(tokenized) or {"bleu_moses_lc": 0.0})
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the cat sat\n", encoding="utf-8")
    ref.write_text("the cat sat\n", encoding="utf-8")
    for flag in ([], ["--hyp-tokenized"]):
        assert main(["evaluate", str(model_dir), "--src", str(src), "--ref", str(ref), "--tok-ref", str(ref),
                     "--lang", "en", *flag, *FAST]) == 0
    assert seen == [False, True]


def test_translate_and_evaluate_with_a_draft(trained_dir, tmp_path, capsys, caplog, model_dir):
    from inference_helpers import layer_prefix_draft

    draft = layer_prefix_draft(trained_dir, tmp_path / "draft")
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the red dog runs\n\na small bird sings today\n", encoding="utf-8")
    ref.write_text("der rot Hund läuft\n\nein klein Vogel singt heute\n", encoding="utf-8")
    plain, fast = tmp_path / "plain.txt", tmp_path / "fast.txt"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(plain), "--beam", "1"]) == 0
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(fast), "--draft", str(draft),
                 "--draft-tokens", "3"]) == 0
    assert fast.read_text(encoding="utf-8") == plain.read_text(encoding="utf-8")
    assert "of proposed tokens accepted" in capsys.readouterr().err
    assert "pays one sentence at a time" in caplog.text  # batched: said once, not silently slow
    caplog.clear()
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(fast), "--draft", str(draft),
                 "--batch-tokens", "1", "--draft-threshold", "0.5"]) == 0
    assert fast.read_text(encoding="utf-8") == plain.read_text(encoding="utf-8")
    assert "pays one sentence" not in caplog.text
    assert main(["evaluate", str(trained_dir), "--src", str(src), "--ref", str(ref), "--draft", str(draft)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["draft"]["draft_tokens"] == 4 and 0 < report["draft"]["acceptance"] <= 1
    for argv, message in (
            (["--beam", "4"], "--draft: speculative decoding is greedy; got --beam 4"),
            (["--draft-tokens", "0"], "decode.draft_tokens: must be positive"),
    ):
        assert main(["translate", str(trained_dir), "--input", str(src), "--draft", str(draft), *argv]) == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert main(["translate", str(trained_dir), "--input", str(src), "--draft", str(model_dir)]) == 2
    assert "has another tokenizer than" in capsys.readouterr().err


def test_the_command_line_starts_without_torch_or_tqdm():
    # `transduce --help` and argument errors come before any heavy import: torch (seconds) and
    # tqdm (70 ms with its logging helper) are imported by the commands that use them
    import subprocess

    code = "import sys, transduce.cli; print(sorted(m for m in ('torch', 'tqdm', 'sacrebleu') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
