"""Corpus cleaning (data/clean.py, clean_rules.py, dedup.py; ``transduce clean``, ``data.clean``):
each rule drops what it targets and keeps clean pairs, removed.jsonl + kept = input, one-line
errors, atomic output."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from extra_helpers import need_extra
from transduce.cli import main
from transduce.config import DataConfig
from transduce.config.clean import CleanConfig
from transduce.data import clean as clean_module
from transduce.data.clean import clean_files
from transduce.data.dedup import KeyMemory
from transduce.errors import ConfigError, DataError

NO_LANG = CleanConfig(rules=("-lang",))
CLEAN = [("A man is riding a bike.", "Ein Mann fährt Fahrrad."),
         ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
         ("A woman in a red coat waits for 2 buses.", "Eine Frau in einem roten Mantel wartet auf 2 Busse."),
         ("Is the child laughing?", "Lacht das Kind?")]
# Each rule's catch: (source, target) pairs that rule (and no earlier one) drops.
DIRTY = {
    "empty": ("A cat sleeps.", "   "),
    "debris": ("A <b>bold</b> cat sleeps.", "Eine fette Katze schläft."),
    "long_token": ("See https://example.com/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa now.", "Siehe jetzt."),
    "too_long": (" ".join(["word"] * 300), " ".join(["Wort"] * 300)),
    "ratio": ("A group of people stand in front of an igloo in the snow.", "Eine Gruppe"),
    "copy": ("A little girl climbs into a wooden playhouse.", "A little girl climbs into a wooden playhouse."),
    "script": ("A boy jumps into the water.", "Мальчик прыгает в воду."),
    "numbers": ("Three people sit at table 12.", "Drei Leute sitzen an Tisch 21."),
    "punctuation": ("Where is the dog?", "Wo ist der Hund."),
}


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _corpus(tmp_path: Path, pairs: list[tuple[str, str]], gz: bool = False) -> tuple[Path, Path]:
    suffix = ".gz" if gz else ""
    return (_write(tmp_path / f"in.en{suffix}", [s for s, _ in pairs], gz),
            _write(tmp_path / f"in.de{suffix}", [t for _, t in pairs], gz))


def _removed(out: Path) -> dict[int, str]:
    return {r["line"]: r["rule"] for r in map(json.loads, (out / "removed.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("rule", list(DIRTY))
def test_each_rule_drops_its_pair_and_keeps_the_clean_ones(tmp_path, rule):
    pairs = [CLEAN[0], CLEAN[1], DIRTY[rule], CLEAN[2], CLEAN[3]]
    report = clean_files(*_corpus(tmp_path, pairs), tmp_path / "out", NO_LANG, "en", "de")
    assert _removed(tmp_path / "out") == {3: rule}
    assert (tmp_path / "out" / "kept.en").read_text().splitlines() == [s for s, _ in CLEAN]
    assert report.kept == 4 and report.removed[rule] == 1


@pytest.mark.parametrize("rule", [r for r in DIRTY if r != "empty"])  # empty pairs are always dropped
def test_a_rule_switched_off_keeps_its_pair(tmp_path, rule):
    cfg = CleanConfig(rules=("-lang", f"-{rule}"))
    clean_files(*_corpus(tmp_path, [CLEAN[0], DIRTY[rule]]), tmp_path / "out", cfg, "en", "de")
    assert _removed(tmp_path / "out").get(2) != rule


def test_duplicates_after_normalisation_are_dropped_the_first_kept(tmp_path):
    pairs = [CLEAN[0], CLEAN[1], ("a man is riding a bike", "ein Mann  fährt Fahrrad ,"), CLEAN[2], CLEAN[1]]
    clean_files(*_corpus(tmp_path, pairs), tmp_path / "out", NO_LANG, "en", "de")
    assert _removed(tmp_path / "out") == {3: "duplicate", 5: "duplicate"}


def test_duplicates_are_found_across_chunks_and_worker_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(clean_module, "CHUNK", 3)
    pairs = [*CLEAN, CLEAN[0], ("A cat.", "Eine Katze."), CLEAN[3]]
    clean_files(*_corpus(tmp_path, pairs), tmp_path / "out", NO_LANG, "en", "de", workers=2)
    assert _removed(tmp_path / "out") == {5: "duplicate", 7: "duplicate"}


def test_near_duplicates_by_minhash(tmp_path):
    base = ("A man in a blue shirt is standing on a ladder cleaning a large window of the old house.",
            "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt ein großes Fenster des alten Hauses.")
    near = (base[0].replace("blue", "navy"), base[1])
    pairs = [base, CLEAN[0], near]
    clean_files(*_corpus(tmp_path, pairs), tmp_path / "out", CleanConfig(rules=("-lang", "+near_duplicate"),
                                                                         minhash_bands=8, minhash_rows=4), "en", "de")
    assert _removed(tmp_path / "out") == {3: "near_duplicate"}
    clean_files(*_corpus(tmp_path, pairs), tmp_path / "off", NO_LANG, "en", "de")
    assert _removed(tmp_path / "off") == {}


def test_the_key_memory_is_bounded_and_remembers_the_last_keys():
    memory = KeyMemory(1)  # 1 MB: two tables of 65,536 slots, 32,768 keys each
    keys = np.arange(1, 100_001, dtype=np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
    seen = np.concatenate([memory.seen(keys[i:i + 1000]) for i in range(0, 100_000, 1000)])
    assert not seen.any() and memory.forgets >= 2
    recent = keys[-memory.capacity:]
    assert memory.seen(recent).all()
    assert sum(t.nbytes for t in memory.tables) == 2**20


def test_language_identification_drops_the_wrong_language(tmp_path):
    need_extra("clean", "py3langid")
    pairs = [*CLEAN[:3], ("A dog runs on the beach.", "Un chien court sur la plage."),
             ("A boy plays football in the park.", "Chlapec hraje fotbal v parku.")]
    clean_files(*_corpus(tmp_path, pairs), tmp_path / "out", CleanConfig(), "en", "de")
    assert _removed(tmp_path / "out") == {4: "lang", 5: "lang"}


def test_removed_and_kept_make_the_input_again_from_gzip(tmp_path):
    pairs = [CLEAN[0], *DIRTY.values(), CLEAN[1], CLEAN[0], CLEAN[2]]
    clean_files(*_corpus(tmp_path, pairs, gz=True), tmp_path / "out", NO_LANG, "en", "de")
    out = tmp_path / "out"
    rows = map(json.loads, (out / "removed.jsonl").read_text().splitlines())
    removed = {r["line"]: (r["src"], r["tgt"]) for r in rows}
    kept = iter(zip((out / "kept.en").read_text().splitlines(), (out / "kept.de").read_text().splitlines()))
    rebuilt = [removed[i] if i in removed else next(kept) for i in range(1, len(pairs) + 1)]
    assert rebuilt == [(s, t.rstrip("\n")) for s, t in pairs] and next(kept, None) is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pairs"] == len(pairs) and summary["kept"] == 3 and sum(summary["removed"].values()) == 10


def test_an_error_midway_leaves_no_output(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("interrupted")
    monkeypatch.setattr(clean_module, "_write", broken)
    with pytest.raises(RuntimeError):
        clean_files(*_corpus(tmp_path, CLEAN), tmp_path / "out", NO_LANG, "en", "de")
    assert [p.name for p in tmp_path.iterdir()] and not any(p.name.startswith((".out", "out"))
                                                            for p in tmp_path.iterdir())


@pytest.mark.parametrize("case", ["misaligned", "utf8", "lang", "exists"])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case):
    src, tgt = _corpus(tmp_path, CLEAN)
    langs = ("en", "xx") if case == "lang" else ("en", "de")
    if case == "misaligned":
        _write(tgt, [t for _, t in CLEAN[:3]])
    if case == "utf8":
        tgt.write_bytes(tgt.read_bytes() + b"Ein \xff Fehler.\n")
        _write(src, [s for s, _ in CLEAN] + ["An error."])
    out = tmp_path / "out"
    if case == "exists":
        out.mkdir()
    with pytest.raises(ConfigError if case == "lang" else DataError) as err:
        clean_files(src, tgt, out, NO_LANG, *langs)
    assert "\n" not in str(err.value)
    assert {"misaligned": "line counts differ", "utf8": "in.de:5: invalid UTF-8", "lang": "unknown language code 'xx'",
            "exists": "already exists"}[case] in str(err.value)
    assert (out.exists() and not any(out.iterdir())) if case == "exists" else not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_data_clean_is_checked_and_filled_in():
    cfg = DataConfig(clean={"rules": ["-lang"], "lang_candidates": ["fr"]})
    assert "lang" not in cfg.clean["rules"] and "duplicate" in cfg.clean["rules"]
    assert cfg.clean["lang_candidates"] == ["fr"]
    for bad, key in (({"nope": 1}, "data.clean: unknown key(s) nope"),
                     ({"copy_overlap": 2.0}, "data.clean.copy_overlap"),
                     ({"lang_candidates": ["zz"]}, "data.clean.lang_candidates"),
                     ({"rules": ["lang", "nope"]}, "data.clean.rules: unknown rule 'nope'"),
                     ({"rules": ["lang", "-copy"]}, "data.clean.rules: either name")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            DataConfig(clean=bad)
    with pytest.raises(ConfigError, match="data.tgt_lang: unknown language code"):
        DataConfig(clean={}, tgt_lang="klingon")


def test_prepare_cleans_the_training_pairs(tmp_path):
    from transduce.data.prepare import prepare_dataset
    src, tgt = _corpus(tmp_path, [*CLEAN, CLEAN[0], DIRTY["copy"], *CLEAN[1:]] * 3)
    (tmp_path / "v").mkdir()
    valid = _corpus(tmp_path / "v", CLEAN)
    cfg = DataConfig(corpus="files", train_src=str(src), train_tgt=str(tgt), valid_src=str(valid[0]),
                     valid_tgt=str(valid[1]), vocab_size=60, clean={"rules": ["-lang"]})
    data = prepare_dataset(cfg, tmp_path / "prepared", workers=1)
    train = data.manifest["splits"]["train"]
    assert train["pairs"] == 4 and train["clean"]["removed"] == {**dict.fromkeys(train["clean"]["removed"], 0),
                                                                  "duplicate": 20, "copy": 3}
    assert data.manifest["splits"]["valid"]["pairs"] == 4  # only the training split is cleaned


def test_cli_clean_end_to_end(tmp_path, capsys):
    src, tgt = _corpus(tmp_path, [*CLEAN, DIRTY["copy"], CLEAN[0]])
    assert main(["clean", str(src), str(tgt), "--out", str(tmp_path / "out"), "--set", "data.clean={rules: [-lang]}",
                 "--workers", "1"]) == 0
    assert "kept 4 of 6 pairs (copy 1, duplicate 1)" in capsys.readouterr().out
    assert _removed(tmp_path / "out") == {5: "copy", 6: "duplicate"}
    assert main(["clean", str(src), str(tgt), "--out", str(tmp_path / "o2"), "--tgt-lang", "qq"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "transduce clean: error: --tgt-lang: unknown language code 'qq'" in err
