"""Text-to-text data (data.corpus tsv): the input<TAB>target reader's one-line errors, preparing
such a file, and a T5 fine-tuned on two tasks whose validation scores each task."""

import json
from dataclasses import replace

import pytest

from transduce.cli import main
from transduce.config import DataConfig, RunConfig
from transduce.data.corpus import read_tsv_chunks
from transduce.data.prepare import check_matches, prepare_dataset
from transduce.errors import ConfigError, DataError
from transduce.evaluation.text2text import task_scores

LINES = ["translate English to German: the dog\tder Hund", "classify: the dog runs\tpresent",
         "translate English to German: a cat\teine Katze", "classify: the dog ran\tpast"]


def _tsv(path, lines, raw: bytes = b""):
    path.write_bytes("".join(f"{line}\n" for line in lines).encode() + raw)
    return path


def test_reader_gives_aligned_inputs_and_targets(tmp_path):
    chunks = list(read_tsv_chunks(_tsv(tmp_path / "t.tsv", LINES * 3), size=5))
    assert [len(s) for s, _ in chunks] == [5, 5, 2]
    src, tgt = chunks[0]
    assert src[1] == b"classify: the dog runs\n" and tgt[1] == b"present\n"


@pytest.mark.parametrize("bad, why", [
    (b"no tab here\n", "expected input<TAB>target \\(one TAB\\); got 0 TABs"),
    (b"a\tb\tc\n", "got 2 TABs"),
    (b"classify: x\t  \n", "the target is empty"),
    (b"\tder Hund\n", "the input is empty"),
    (b"classify: \xff\xfe\tpast\n", "invalid UTF-8"),
])
def test_bad_lines_are_one_line_errors_naming_file_and_line(tmp_path, bad, why):
    path = _tsv(tmp_path / "t.tsv", LINES, bad)
    with pytest.raises(DataError, match=f"^{path}:5: .*{why}") as err:
        list(read_tsv_chunks(path, size=2))
    assert "\n" not in str(err.value)


def test_config_reads_tsv_from_the_src_files():
    with pytest.raises(ConfigError, match="data.train_src: is required when data.corpus=tsv"):
        DataConfig(corpus="tsv")
    with pytest.raises(ConfigError, match="data.train_tgt"):
        DataConfig(corpus="tsv", train_src="a.tsv", train_tgt="b.txt")
    with pytest.raises(ConfigError, match="data.reverse"):
        DataConfig(corpus="tsv", train_src="a.tsv", reverse=True)
    assert RunConfig.from_dict({"data": {"corpus": "tsv", "train_src": "a.tsv"}}).task == "translation"


def test_prepare_keeps_short_targets_and_stops_at_a_bad_line(tmp_path):
    train = _tsv(tmp_path / "train.tsv", LINES * 20)
    data = prepare_dataset(DataConfig(corpus="tsv", train_src=str(train), valid_src=str(train), vocab_size=40,
                                      tokenizer_algorithm="unigram"), tmp_path / "prep", workers=1)
    assert len(data.split("train")) == 80  # max_ratio does not apply: "past" is 1 token for 5 in the input
    assert data.texts("valid")[1] == ("classify: the dog runs", "present")
    bad = _tsv(tmp_path / "bad.tsv", LINES, b"classify: x\n")
    assert main(["prepare", "--set", "data.corpus=tsv", "--set", f"data.train_src={bad}",
                 "--out", str(tmp_path / "bad")]) != 0
    assert not (tmp_path / "bad").exists()


def test_task_scores_are_bleu_for_translate_prefixes_and_accuracy_else():
    inputs = ["translate English to German: the dog", "classify: a", "classify: b", "classify: c",
              "translate English to German: a cat", "summarize: long text", "no prefix at all"]
    refs = ["der alte Hund sieht den Ball .", "past", "present", "past", "eine Katze liest das Buch .", "short", "x"]
    hyps = [refs[0], "past", "past", " past ", refs[4], "short text", "x"]
    scores = task_scores(inputs, hyps, refs)
    assert list(scores) == ["(no prefix)", "classify", "summarize", "translate English to German"]
    assert scores["classify"] == {"acc": pytest.approx(2 / 3), "n": 3}  # exact match, spaces collapsed
    assert scores["summarize"] == {"acc": 0.0, "n": 1} and scores["(no prefix)"] == {"acc": 1.0, "n": 1}
    assert scores["translate English to German"] == {"bleu": pytest.approx(100.0), "n": 2}
    worse = task_scores(inputs, ["der alte Hund sieht die Katze ."] + hyps[1:4] + ["eine Katze ."] + hyps[5:], refs)
    assert worse["translate English to German"]["bleu"] < 50 and worse["classify"] == scores["classify"]
    with pytest.raises(DataError, match="as many of each"):
        task_scores(inputs, hyps[:-1], refs)


def test_fine_tuning_validates_each_task(tmp_path, one_thread, monkeypatch):
    """Validation scores each task over its own lines. The model still decodes, but its outputs are
    then set (four steps' would score 0 whatever they were scored against): one German sentence
    and "present" for every line, each right in part."""
    from sacrebleu.metrics import BLEU
    from transduce.inference import Translator

    decoded = Translator.translate
    valid_lines = ["translate English to German: the old dog sees the ball\tder alte Hund sieht den Ball",
                   "classify: the dog runs\tpresent", "classify: the dog ran\tpast",
                   "translate English to German: a cat reads the book\teine Katze liest das Buch",
                   "classify: the dog sits\tpresent"] * 2
    inputs, targets = zip(*(line.split("\t") for line in valid_lines))
    outputs = {s: "present" if s.startswith("classify") else "der alte Hund sieht das Buch" for s in inputs}
    asked = []

    def set_outputs(self, sources, **kw):
        assert len(decoded(self, sources, **kw)) == len(sources)
        asked.append(list(sources))
        return [outputs[s] for s in sources]

    monkeypatch.setattr(Translator, "translate", set_outputs)
    train, valid = _tsv(tmp_path / "train.tsv", LINES * 30), _tsv(tmp_path / "valid.tsv", valid_lines)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--set", "model.preset=tiny", "--set", "data.corpus=tsv",
                 "--set", f"data.train_src={train}", "--set", f"data.valid_src={valid}",
                 "--set", "data.vocab_size=60", "--set", "data.tokenizer_algorithm=unigram",
                 "--set", "data.max_tokens=300",
                 "--set", "train.max_steps=4", "--set", "train.eval_every=4", "--set", "train.save_every=4",
                 "--set", "train.warmup_steps=2", "--set", "train.num_threads=1"]) == 0
    record = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "val_loss" in line][-1]
    assert asked == [list(inputs)]  # the validation file's inputs, once (one validation, at step 4)
    pairs = [(outputs[s], t) for s, t in zip(inputs, targets) if s.startswith("translate")]
    bleu = BLEU().corpus_score([h for h, _ in pairs], [[t for _, t in pairs]]).score
    assert 0 < bleu < 100 and record["val_bleu/translate English to German"] == pytest.approx(bleu)
    assert record["val_acc/classify"] == pytest.approx(2 / 3)  # "present" is right on two classify lines of three
    assert "val_bleu" not in record


def test_data_prepared_before_a_setting_existed_matches_its_default(tmp_path):
    cfg = DataConfig(corpus="tsv", train_src=str(_tsv(tmp_path / "train.tsv", LINES * 5)), vocab_size=40,
                     tokenizer_algorithm="unigram")
    prepare_dataset(cfg, tmp_path / "prep", workers=1)
    manifest = json.loads((tmp_path / "prep" / "manifest.json").read_text())
    del manifest["data"]["sentinels"]  # as data prepared before data.sentinels was written
    (tmp_path / "prep" / "manifest.json").chmod(0o644)
    (tmp_path / "prep" / "manifest.json").write_text(json.dumps(manifest))
    check_matches(tmp_path / "prep", cfg)
    with pytest.raises(DataError, match="data.sentinels is 4"):
        check_matches(tmp_path / "prep", replace(cfg, sentinels=4))
