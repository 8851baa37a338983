"""Prepared data: encode once in worker processes, open memory-mapped, and refuse anything stale."""

import errno
import gzip
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from transduce.config import DataConfig
from transduce.data import prepare as prep
from transduce.data import prepared
from transduce.checksums import sha256_file
from transduce.data.corpus import encode_chunk
from transduce.data.prepare import check_matches, prepare_dataset, prepared_for_run, split_texts
from transduce.data.prepared import PreparedData
from transduce.data.tokenizer import Tokenizer
from transduce.data.toy import generate_pairs
from transduce.errors import DataError
from extra_helpers import need_extra
from hf_tokenizer_fixtures import byte_bpe_dir


def _files(root: Path, pairs, name="train", gz=False) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, lang in enumerate(("en", "de")):
        data = "".join(p[k] + "\n" for p in pairs).encode()
        path = root / f"{name}.{lang}{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(data) if gz else data)
        paths.append(path)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A files corpus (train gzipped) and a tokenizer trained on it."""
    root = tmp_path_factory.mktemp("corpus")
    pairs = generate_pairs(1300, seed=3)
    train = _files(root, pairs[:1200], gz=True)
    valid = _files(root, pairs[1200:], "valid")
    tok = root / "tok"
    Tokenizer.train([s for s, _ in pairs], [t for _, t in pairs], tok, vocab_size=300)
    cfg = DataConfig(corpus="files", train_src=str(train[0]), train_tgt=str(train[1]), valid_src=str(valid[0]),
                     valid_tgt=str(valid[1]), tokenizer=str(tok), max_len=40, max_ratio=2.0)
    return cfg, pairs


def _digests(root: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(root.iterdir())
            if p.is_file() and p.name != "manifest.json"}


def test_workers_and_chunks_do_not_change_the_data(corpus, tmp_path, monkeypatch):
    cfg, pairs = corpus
    one = prepare_dataset(cfg, tmp_path / "one", workers=1)
    monkeypatch.setattr(prep, "CHUNK", 97)  # many chunks, spread over two spawned workers
    two = prepare_dataset(cfg, tmp_path / "two", workers=2)
    assert _digests(one.root) == _digests(two.root)
    assert one.manifest["splits"] == two.manifest["splits"]


def test_workers_encode_with_a_pretrained_tokenizer(corpus, tmp_path, monkeypatch):
    """An imported model's byte-level BPE tokenizer (``tokenizers``) reaches spawned workers too."""
    need_extra("pretrained", "tokenizers")
    from transduce.data.hf_tokenizer import HFTokenizer

    cfg, pairs = corpus
    hf = byte_bpe_dir(tmp_path / "hf", [s for s, _ in pairs], vocab_size=300)
    HFTokenizer.from_hf_dir(hf).save(tmp_path / "tok")
    cfg = replace(cfg, tokenizer=str(tmp_path / "tok"))
    one = prepare_dataset(cfg, tmp_path / "one", workers=1)
    monkeypatch.setattr(prep, "CHUNK", 301)
    two = prepare_dataset(cfg, tmp_path / "two", workers=2)
    assert _digests(one.root) == _digests(two.root)
    assert isinstance(two.tokenizer, HFTokenizer) and one.manifest["splits"] == two.manifest["splits"]


def test_ids_and_filter_are_the_tokenizers(corpus, tmp_path):
    cfg, pairs = corpus
    data = prepare_dataset(cfg, tmp_path / "d", workers=1)
    tok = data.tokenizer
    chunk = encode_chunk([s.encode() for s, _ in pairs[:1200]], [t.encode() for _, t in pairs[:1200]], 1,
                         ("s", "t"), tok, cfg.max_len, cfg.max_ratio, "<u2")
    train = data.split("train")
    entry = data.manifest["splits"]["train"]
    assert entry["filter"] == vars(chunk.stats) and 0 < entry["pairs"] < 1200  # max_ratio 2 drops some
    kept = [p for p, k in zip(pairs[:1200], chunk.kept) if k]
    for i in (0, 1, len(kept) - 1):
        src, tgt = train.pair(i)
        assert src.tolist() == tok.encode(kept[i][0], "src") and tgt.tolist() == tok.encode(kept[i][1], "tgt")
    assert train.src_lens.dtype == np.uint16 and train.tokens[0].dtype == np.uint16
    assert data.texts("valid") == pairs[1200:]  # every validation pair read, for BLEU
    assert data.manifest["inputs"][0]["sha256"] == sha256_file(cfg.train_src)
    assert oct(data.root.stat().st_mode & 0o777) == "0o755"
    batch = train.batch([0, 1])
    assert batch.src.shape[0] == 2 and batch.n_tgt_tokens == int(train.tgt_lens[:2].sum()) + 2


def test_tokenizer_sample_is_bounded_seeded_and_in_corpus_order():
    pairs = [(f"s{i}", f"t{i}") for i in range(1000)]
    src, tgt, n = prep._sample(iter(pairs), 50, seed=4)
    assert n == 1000 and len(src) == len(tgt) == 50
    assert src == sorted(src, key=lambda s: int(s[1:]))
    assert (src, tgt) == prep._sample(iter(pairs), 50, seed=4)[:2]
    assert prep._sample(iter(pairs), 5000, seed=4)[0] == [s for s, _ in pairs]  # small corpora: every line


def test_train_without_a_tokenizer_trains_one_on_the_sample(corpus, tmp_path):
    cfg, _ = corpus
    data = prepare_dataset(replace(cfg, tokenizer=None, vocab_size=200, tokenizer_sentences=300), tmp_path / "d",
                           workers=1)
    assert data.tokenizer.src_vocab_size == 200
    assert Tokenizer.load(data.root / "tokenizer").digest() == data.manifest["tokenizer"]["digest"]


# ---- refusing stale or damaged data ------------------------------------------------------------

@pytest.fixture()
def ready(corpus, tmp_path):
    cfg, _ = corpus
    return cfg, prepare_dataset(cfg, tmp_path / "d", workers=1).root


@pytest.mark.parametrize("damage", ["truncate", "flip", "index", "lengths", "delete", "manifest"])
def test_damaged_files_are_one_line_errors(ready, damage):
    _, root = ready
    path = {"truncate": "train.src.bin", "flip": "train.tgt.bin", "index": "train.offsets.npy",
            "lengths": "train.lengths.npy", "delete": "valid.src.bin", "manifest": "manifest.json"}[damage]
    target = root / path
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(data[:-2])
    elif damage == "delete":
        target.unlink()
    elif damage == "manifest":
        target.write_text("{not json")
    else:
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    with pytest.raises(DataError) as err:
        PreparedData.open(root)
    assert str(target) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["flip", "index"])
def test_background_verification_opens_at_once_and_fails_before_anything_is_saved(ready, damage):
    """``verify="background"`` (what training uses): sizes are checked at open, the sha256 in a
    thread; a flipped byte is the same one-line error, from :meth:`PreparedData.verified`."""
    _, root = ready
    target = root / {"flip": "train.tgt.bin", "index": "train.offsets.npy"}[damage]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    opened = PreparedData.open(root, verify="background")  # no error yet: the contents are read meanwhile
    with pytest.raises(DataError) as err:
        opened.verified()
    assert str(target) in str(err.value) and "sha256" in str(err.value) and "\n" not in str(err.value)
    target.write_bytes(data[:-2])  # a truncation is still caught at open
    with pytest.raises(DataError, match="bytes but the manifest says"):
        PreparedData.open(root, verify="background")


def test_an_intact_directory_verifies_in_the_background(ready):
    _, root = ready
    opened = PreparedData.open(root, verify="background")
    opened.verified()
    assert not opened._check.thread.is_alive() and opened._check.error is None


def test_valid_max_sentences_is_taken_at_train_time_from_the_prepared_split(corpus, tmp_path):
    """One prepared directory, any validation size: changing ``data.valid_max_sentences`` needs
    no new prepare, and the run validates on the first N prepared pairs."""
    import torch

    from transduce.config import RunConfig
    from transduce.training.distributed import DistInfo
    from transduce.training.loop import Trainer

    cfg, pairs = corpus
    root = prepare_dataset(replace(cfg, valid_max_sentences=7), tmp_path / "d", workers=1).root
    assert len(PreparedData.open(root).texts("valid")) == 100  # every validation pair read is kept
    check_matches(root, replace(cfg, valid_max_sentences=3))  # not a content setting: no mismatch
    run = RunConfig.from_dict({"model": {"d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1,
                                         "d_ff": 32},
                               "data": {"prepared": str(root), "valid_max_sentences": 3}})
    trainer = Trainer(run, tmp_path / "run", PreparedData.open(root), DistInfo(), torch.device("cpu"))
    assert len(trainer.valid_pairs) == 3 and trainer.valid_texts == pairs[1200:1203]
    full = PreparedData.open(root).split("valid")
    for i in range(3):
        assert all((a == b).all() for a, b in zip(trainer.valid_pairs.pair(i), full.pair(i)))


def test_manifest_input_paths_are_relative_beside_and_absolute_elsewhere(corpus, tmp_path):
    """Inputs under the prepared directory's parent are recorded relative to it (a project moved
    whole still matches); inputs elsewhere absolute."""
    import shutil

    cfg, pairs = corpus
    src, tgt = _files(tmp_path / "project" / "raw", pairs[:300])
    beside = prepare_dataset(replace(cfg, train_src=str(src), train_tgt=str(tgt)), tmp_path / "project" / "d",
                             workers=1)
    paths = {i["path"] for i in beside.manifest["inputs"]}
    assert {"../raw/train.en", "../raw/train.de"} <= paths
    assert str(Path(cfg.valid_src).resolve()) in paths  # the fixture's corpus lies elsewhere: absolute
    shutil.move(tmp_path / "project", tmp_path / "moved")
    moved = replace(cfg, train_src=str(tmp_path / "moved" / "raw" / "train.en"),
                    train_tgt=str(tmp_path / "moved" / "raw" / "train.de"))
    check_matches(tmp_path / "moved" / "d", moved)
    with pytest.raises(DataError, match=r"data.train_src: .*train.en.gz is not a file .* was prepared from"):
        check_matches(tmp_path / "moved" / "d", cfg)  # other files than those it was made from
    (tmp_path / "moved" / "raw" / "train.de").unlink()
    with pytest.raises(DataError, match=r"moved/d/\.\./raw/train.de: input of .* is gone"):
        check_matches(tmp_path / "moved" / "d", moved)


def test_a_foreign_tokenizer_is_refused(ready, tmp_path):
    _, root = ready
    other = Tokenizer.train(["a b c d e f"] * 20, ["g h i j k"] * 20, tmp_path / "other", vocab_size=20)
    other.save(root / "tokenizer")
    with pytest.raises(DataError, match="not the one the ids"):
        PreparedData.open(root)


def test_a_run_rechecks_settings_and_inputs(corpus, tmp_path):
    cfg, pairs = corpus
    src, tgt = _files(tmp_path / "in", pairs[:1200])
    cfg = replace(cfg, train_src=str(src), train_tgt=str(tgt))
    first = prepared_for_run(cfg, tmp_path / "run", workers=1)
    again = prepared_for_run(cfg, tmp_path / "run", workers=1)  # reused, not redone
    assert again.root == first.root and again.manifest == first.manifest
    with pytest.raises(DataError, match="data.max_len is 30 but .* was prepared with 40"):
        prepared_for_run(replace(cfg, max_len=30), tmp_path / "run")
    src.write_text(src.read_text().replace("dog", "cat", 1))
    with pytest.raises(DataError, match="has changed since .* was prepared from it"):
        check_matches(first.root, cfg)


def test_existing_output_is_refused(ready):
    cfg, root = ready
    with pytest.raises(DataError, match="already exists"):
        prepare_dataset(cfg, root)


# ---- bad input, met in a worker ----------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    (b"ab\xffcd\n", r"train.de:150: invalid UTF-8 at byte 2"),
    (b"a\x00b\n", r"train.de:150: NUL byte"),
    (None, r"line counts differ: .*train.de ends after 149 lines but .*train.en has 200"),
])
def test_bad_lines_in_a_worker_name_file_and_line(tmp_path, corpus, monkeypatch, bad, message):
    cfg, pairs = corpus
    src, tgt = _files(tmp_path / "in", pairs[:200])
    lines = tgt.read_bytes().splitlines(keepends=True)
    tgt.write_bytes(b"".join(lines[:149] + ([bad] + lines[150:] if bad else [])))
    monkeypatch.setattr(prep, "CHUNK", 40)  # line 150 is in the fourth chunk: a worker's
    bad_cfg = replace(cfg, train_src=str(src), train_tgt=str(tgt))
    with pytest.raises(DataError, match=message):
        prepare_dataset(bad_cfg, tmp_path / "out", workers=2)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_cli_prints_one_line_and_leaves_nothing(tmp_path, corpus):
    cfg, pairs = corpus
    src, tgt = _files(tmp_path / "in", pairs[:50])
    tgt.write_bytes(tgt.read_bytes()[:-40])  # misaligned
    proc = subprocess.run([sys.executable, "-m", "transduce", "prepare", "--out", str(tmp_path / "out"),
                           "--set", "data.corpus=files", "--set", f"data.train_src={src}",
                           "--set", f"data.train_tgt={tgt}", "--set", f"data.tokenizer={cfg.tokenizer}"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "line counts differ" in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_full_disk_leaves_nothing_half_written(ready, tmp_path, monkeypatch):
    cfg, _ = ready
    real = prepared._HashedFile.write

    def write(self, data):
        if self.size > 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, data)

    monkeypatch.setattr(prepared._HashedFile, "write", write)
    monkeypatch.setattr(prep, "CHUNK", 64)
    with pytest.raises(DataError, match="cannot write the prepared data .No space left on device"):
        prepare_dataset(cfg, tmp_path / "full", workers=1)
    assert not (tmp_path / "full").exists() and not list(tmp_path.glob(".full.*"))


KILLED = r"""
import sys
from transduce.config import DataConfig
from transduce.data import prepare as prep
prep.CHUNK = 50
cfg = DataConfig(corpus="files", train_src=sys.argv[1], train_tgt=sys.argv[2], tokenizer=sys.argv[3])
prep.prepare_dataset(cfg, sys.argv[4], workers=2)
"""


@pytest.mark.slow
def test_sigkill_during_prepare_leaves_no_dataset_and_a_rerun_works(tmp_path, corpus):
    cfg, pairs = corpus
    src, tgt = _files(tmp_path / "in", pairs * 40)  # 52,000 pairs: long enough to be killed mid-way
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(src), str(tgt), cfg.tokenizer, str(out)])
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > 4096 for p in tmp_path.glob(".out.*/train.src.bin")):
        assert proc.poll() is None and time.monotonic() < deadline, "prepare ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    assert list(tmp_path.glob(".out.*.tmp"))  # the staging directory of the killed run
    data = prepare_dataset(replace(cfg, train_src=str(src), train_tgt=str(tgt), valid_src=None, valid_tgt=None),
                           out, workers=1)
    assert data.manifest["splits"]["train"]["pairs"] == len(PreparedData.open(out).split("train")) > 40_000
    assert not list(tmp_path.glob(".out.*.tmp"))  # cleaned up by the rerun


def test_split_texts_reads_a_split(corpus):
    cfg, pairs = corpus
    assert split_texts(cfg, "valid") == pairs[1200:]
    assert split_texts(replace(cfg, reverse=True), "valid") == [(t, s) for s, t in pairs[1200:]]


def test_the_toy_corpus_goes_the_same_way(tmp_path, monkeypatch):
    cfg = DataConfig(toy_train_size=400, toy_valid_size=20, toy_test_size=20, vocab_size=150)
    one = prepare_dataset(cfg, tmp_path / "one", workers=1)
    monkeypatch.setattr(prep, "CHUNK", 64)
    two = prepare_dataset(cfg, tmp_path / "two", workers=2)
    assert _digests(one.root) == _digests(two.root)
    train, texts = one.split("train"), split_texts(cfg, "train")
    assert len(train) == 400
    for i in (0, 399):
        assert train.pair(i)[1].tolist() == one.tokenizer.encode(texts[i][1], "tgt")


def test_a_moved_read_only_prepared_dir_without_its_text_trains_and_resumes(tmp_path, corpus):
    """Prepare once, move the directory, make it read-only, delete the raw text: a run trains on
    it and resumes, and nothing in it is written (digests and mtimes unchanged: root ignores
    the read-only bits, so that is the check that holds for every user)."""
    import shutil
    import stat

    import yaml

    cfg, pairs = corpus
    src, tgt = _files(tmp_path / "raw", pairs[:400])
    made = tmp_path / "made"
    prepare_dataset(replace(cfg, train_src=str(src), train_tgt=str(tgt)), made)
    moved = tmp_path / "elsewhere" / "prepared"
    moved.parent.mkdir()
    shutil.move(str(made), str(moved))
    shutil.rmtree(tmp_path / "raw")
    files = [p for p in sorted(moved.rglob("*")) if p.is_file()]
    before = {p: (sha256_file(p), p.stat().st_mtime_ns) for p in files}
    for p in [*files, *(d for d in moved.rglob("*") if d.is_dir()), moved]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    run = {"model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
                     "max_positions": 128},
           "data": {"prepared": str(moved), "max_tokens": 512},
           "train": {"max_steps": 6, "save_every": 3, "eval_every": 1000, "log_every": 3, "eval_bleu": False,
                     "warmup_steps": 2, "num_threads": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run), encoding="utf-8")
    try:
        for extra in ([], ["--resume", "--set", "train.max_steps=9"]):
            proc = subprocess.run([sys.executable, "-m", "transduce", "train", str(tmp_path / "run.yaml"),
                                   "--out", str(tmp_path / "run"), *extra], capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "resumed from" in proc.stdout + proc.stderr
        assert {p: (sha256_file(p), p.stat().st_mtime_ns) for p in files} == before
        assert sorted(p for p in moved.rglob("*") if p.is_file()) == files
    finally:
        for p in [moved, *moved.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
