"""From a :class:`~transduce.config.DataConfig` to a prepared dataset directory (``transduce prepare``).

Every corpus (the toy pair, Multi30k, plain or gzip files) goes the same way: its splits are
read as raw lines in chunks, a tokenizer is trained on a sample of the training text (or an
existing one reused), and the chunks are decoded, encoded and filtered in worker processes,
then written in order as token files (:mod:`transduce.data.prepared`). The directory is built
under a temporary name and renamed when complete: a kill at any moment leaves either no
dataset or a whole one.

``transduce train`` without ``data.prepared`` prepares into ``RUN_DIR/prepared`` once; on
``--resume`` it opens that directory, after checking that the data settings and every input
file (sha256) are still those it was made from.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from transduce.atomic import atomic_write_text
from transduce.config import DataConfig
from transduce.config.legacy import migrate_section
from transduce.checksums import sha256_file
from transduce.data import multi30k, multilingual, toy
from transduce.data.alignments import AlignedWriter
from transduce.data.clean import cleaner_for, kept_chunks
from transduce.data.corpus import (EncodedChunk, FilterStats, decode_chunks, is_gzip, read_parallel_chunks,
                                   read_tsv_chunks)
from transduce.data.encoding import Encoder
from transduce.data.labelled import check_labels, encode_example, read_labelled, segments_of
from transduce.data.prepared import (FORMAT, MANIFEST, SPLITS, TOKENIZER_DIR, VERSION, PreparedData, SplitWriter,
                                     length_dtype, read_manifest, token_dtype)
from transduce.data.tokenizer import Tokenizer, load_tokenizer
from transduce.errors import DataError

logger = logging.getLogger(__name__)

CHUNK = 20_000  # pairs a worker encodes at a time: a few MB each way, many per corpus
RUN_SUBDIR = "prepared"
# DataConfig fields that do not change the prepared ids (batching and training-time options).
_NOT_CONTENT = ("max_tokens", "bpe_dropout_sides", "prepared", "tokenizer", "valid_max_sentences")

TextPair = tuple[str, str]


# ---- where each split's lines come from ---------------------------------------------------

@dataclass
class SplitSource:
    """One split's aligned lines: a pair of files, or generated text (the toy corpus; ``read``: the
    files it was read from, hashed into the manifest). ``expect``: the official line count, checked
    once the files end (Multi30k); ``tsv``: the files are one file of input<TAB>target lines, twice."""

    names: tuple[str, str]
    files: tuple[Path, Path] | None = None
    generated: list[TextPair] | None = None
    expect: int | None = None
    tsv: bool = False
    read: tuple[Path, ...] = ()
    clean: tuple | None = None  # (data.clean, source language, target language): cleaned as read
    cleaned: Any = field(default=None, init=False)  # the last pass's Cleaner (its report)

    def raw_chunks(self) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """Undecoded line pairs in chunks of ``CHUNK`` (decoding, and its errors, happen where
        they are encoded); with ``clean``, the pairs its rules keep (each pass a fresh cleaner)."""
        if self.clean is not None:
            self.cleaned = cleaner_for(*self.clean)
            return kept_chunks(self.cleaned, self._raw_chunks(), self.names)
        return self._raw_chunks()

    def _raw_chunks(self) -> Iterator[tuple[list[bytes], list[bytes]]]:
        if self.files is None:
            lines = [[f"{p[k]}\n".encode("utf-8") for p in self.generated or ()] for k in (0, 1)]
            chunks = ((lines[0][i:i + CHUNK], lines[1][i:i + CHUNK]) for i in range(0, len(lines[0]), CHUNK))
            return chunks
        return self._counted(read_tsv_chunks(self.files[0], CHUNK) if self.tsv else
                             read_parallel_chunks(*self.files, CHUNK))

    def text_pairs(self) -> Iterator[TextPair]:
        """Decoded line pairs, read in this process."""
        return decode_chunks(self.raw_chunks(), *self.names)

    def _counted(self, chunks: Iterator[tuple[list[bytes], list[bytes]]]) -> Iterator[tuple[list[bytes], list[bytes]]]:
        n = 0
        for chunk in chunks:
            n += len(chunk[0])
            yield chunk
        if self.expect is not None and n != self.expect:
            raise DataError(f"{self.files[0]}: {n} lines, expected {self.expect} for Multi30k")

    def swapped(self) -> "SplitSource":
        files = None if self.files is None else (self.files[1], self.files[0])
        generated = None if self.generated is None else [(t, s) for s, t in self.generated]
        return SplitSource(self.names[::-1], files, generated, self.expect)


def split_sources(cfg: DataConfig) -> dict[str, SplitSource]:
    """The train/valid/test sources a config names; swapped when ``data.reverse``."""
    sources = _sources(cfg)
    return {k: v.swapped() for k, v in sources.items()} if cfg.reverse else sources


def _sources(cfg: DataConfig) -> dict[str, SplitSource]:
    if cfg.corpus == "toy":
        s = toy.make_splits(seed=cfg.toy_seed, n_train=cfg.toy_train_size, n_valid=cfg.toy_valid_size,
                            n_test=cfg.toy_test_size)
        return {k: SplitSource((f"toy {k} (source)", f"toy {k} (target)"), generated=s[k]) for k in SPLITS}
    if cfg.pairs is not None:
        return {k: SplitSource(v[0], generated=v[1], read=v[2]) for k, v in multilingual.split_texts(cfg).items()}
    if cfg.corpus in ("multi30k", "multi30k_tok"):
        root = multi30k.root_of(cfg.root)
        find = multi30k.tok_files if cfg.corpus == "multi30k_tok" else multi30k.multi30k_files
        out = {}
        for name, split in zip(SPLITS, ("train", "val", "test_2016_flickr")):
            files = find(root, split, cfg.src_lang, cfg.tgt_lang)
            out[name] = SplitSource(tuple(map(str, files)), files, expect=multi30k.MULTI30K_SPLITS[split])
        return out
    out = {}
    monolingual = cfg.train_src is None  # one text (a language model's): both sides read the tgt files
    for name in SPLITS:
        tgt = getattr(cfg, f"{name}_tgt")
        src = tgt if monolingual else getattr(cfg, f"{name}_src")
        tgt = src if cfg.corpus == "tsv" else tgt  # one file of input<TAB>target lines
        files = (Path(src), Path(tgt)) if src is not None and tgt is not None else None
        out[name] = SplitSource((str(src), str(tgt)), files, generated=None if files else [], tsv=cfg.corpus == "tsv")
    return out


def split_texts(cfg: DataConfig, split: str) -> list[TextPair]:
    """Every text pair of one (small) split, e.g. the test set a benchmark scores."""
    return list(split_sources(cfg)[split].text_pairs())


def data_settings(cfg: DataConfig) -> dict[str, Any]:
    """The settings that determine a prepared dataset's contents (recorded in its manifest)."""
    out = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in _NOT_CONTENT}
    out["bpe_dropout"] = cfg.bpe_dropout > 0  # only whether the train text is kept
    if cfg.corpus in ("multi30k", "multi30k_tok") and cfg.root is None:
        out["root"] = str(multi30k.default_root())
    return out


# ---- the tokenizer ------------------------------------------------------------------------------

def _tokenizer(cfg: DataConfig, train: SplitSource, out: Path, seed: int) -> Tokenizer:
    """Reuse ``data.tokenizer`` or train on a seeded sample of the training text. A reused one
    says BOS comes first from now on (``add_bos_token``): the batches put it first (batch.pad), so
    a model trained on them, an imported GPT-2 fine-tuned included, is prompted so."""
    if cfg.tokenizer is not None:
        tokenizer = load_tokenizer(cfg.tokenizer)
        tokenizer.add_bos_token = True
        tokenizer.save(out)
        return tokenizer
    src, tgt, n = tokenizer_sample(cfg, train, seed)
    logger.info("training a %s tokenizer (vocab %d, %s) on %d of %d pairs", cfg.tokenizer_algorithm,
                cfg.vocab_size, "joint" if cfg.joint_vocab else "separate", max(len(src), len(tgt)), n)
    return Tokenizer.train(src, tgt, out, cfg.vocab_size, model_type=cfg.tokenizer_algorithm, joint=cfg.joint_vocab,
                           seed=seed, sentinels=cfg.sentinels, tags=multilingual.reserved_tags(cfg))


def tokenizer_sample(cfg: DataConfig, train: SplitSource, seed: int) -> tuple[list[str], list[str], int]:
    """The lines a tokenizer learns from: a seeded sample of ``data.tokenizer_sentences`` non-empty
    lines per side of the training split, and the split's pair count (DataError if it is empty)."""
    src, tgt, n = _sample(train.text_pairs(), cfg.tokenizer_sentences, seed)
    if n == 0:
        raise DataError("the training corpus is empty")
    return src, tgt, n


def _sample(pairs: Iterator[TextPair], k: int, seed: int) -> tuple[list[str], list[str], int]:
    """Up to ``k`` non-empty lines per side, a uniform seeded sample kept in corpus order
    (reservoir sampling: one pass, memory bounded by ``k``); every line when there are fewer."""
    reservoirs: list[list[tuple[int, str]]] = [[], []]
    seen = [0, 0]
    rngs = [random.Random(seed), random.Random(seed + 1)]
    n = 0
    for n, pair in enumerate(pairs, start=1):
        for side in (0, 1):
            line = pair[side]
            if not line.strip():
                continue
            i, reservoir = seen[side], reservoirs[side]
            seen[side] += 1
            if len(reservoir) < k:
                reservoir.append((i, line))
            elif (j := rngs[side].randrange(i + 1)) < k:
                reservoir[j] = (i, line)
    src, tgt = ([line for _, line in sorted(r)] for r in reservoirs)
    return src, tgt, n


# ---- the dataset directory -----------------------------------------------------------------

def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def prepare_dataset(cfg: DataConfig, out: str | os.PathLike, workers: int | None = None,
                    seed: int = 0) -> PreparedData:
    """Read, tokenize, encode and filter every split of ``cfg`` into the new directory ``out``.

    Args:
        workers: encoding processes (default: one per core); 1 encodes in this process.
        seed: seeds the tokenizer's training sample and SentencePiece.

    Raises:
        DataError: ``out`` exists, or bad input (the message names file and line), or a failed write.
    """
    out = Path(out)
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise DataError(f"--workers: must be at least 1; got {workers}")
    if out.exists():
        raise DataError(f"{out}: already exists; prepare into a new directory (or remove this one)")
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.*.tmp"):  # left by a killed prepare
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        _fill(cfg, stage, workers, seed)
        os.chmod(stage, 0o755)
        os.rename(stage, out)
    except OSError as err:  # reading errors are DataErrors already: this is writing (a full disk...)
        shutil.rmtree(stage, ignore_errors=True)
        where = f"{err.filename}: " if err.filename else ""
        raise DataError(f"{out}: cannot write the prepared data ({where}{err.strerror or err})") from err
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return PreparedData.open(out)


def _inputs(files: list[tuple[str, Path]], stage: Path) -> list[dict[str, Any]]:
    """Each input file's manifest entry (split, path, size, sha256). The path is relative to the
    prepared directory when the input lies beside it (under its parent: a project moved or copied
    whole keeps its inputs), absolute only when it lies elsewhere. Read back with :func:`input_path`."""
    for _, path in files:
        is_gzip(path)  # a missing or unreadable input: its own one-line error, before any work
    return [{"split": name, "path": _manifest_path(path.resolve(), stage.resolve()), "size": path.stat().st_size,
             "sha256": sha256_file(path)} for name, path in files]


def _manifest_path(path: Path, stage: Path) -> str:
    # ``stage`` is a sibling of the final directory: a path relative to one is relative to the other
    return os.path.relpath(path, stage) if path.is_relative_to(stage.parent) else str(path)


def input_path(root: Path, item: dict[str, Any]) -> Path:
    """A manifest input's path (relative ones are relative to the prepared directory ``root``)."""
    return Path(root) / item["path"]


def _manifest(cfg: DataConfig, inputs: list, tokenizer: Tokenizer, dtype, t0: float, splits: dict,
              **extra: Any) -> str:
    manifest = {"format": FORMAT, "version": VERSION, "data": data_settings(cfg), "inputs": inputs,
                "tokenizer": {"digest": tokenizer.digest(), "joint": tokenizer.joint,
                              "src_vocab_size": tokenizer.src_vocab_size, "tgt_vocab_size": tokenizer.tgt_vocab_size},
                "dtype": dtype.str, "seconds": round(time.monotonic() - t0, 2), "splits": splits, **extra}
    return json.dumps(manifest, indent=1) + "\n"


def _fill(cfg: DataConfig, stage: Path, workers: int, seed: int) -> None:
    if cfg.labelled:
        return _fill_labelled(cfg, stage)
    t0 = time.monotonic()
    sources = split_sources(cfg)
    if cfg.clean is not None:  # the training pairs only, in the direction trained (after data.reverse)
        langs = (cfg.tgt_lang, cfg.src_lang) if cfg.reverse else (cfg.src_lang, cfg.tgt_lang)
        sources["train"].clean = (cfg.clean, *langs)
    aligned = [("train", Path(cfg.train_alignments))] if cfg.train_alignments else []
    inputs = _inputs([(name, path) for name, src in sources.items() for path in (src.files or src.read)] + aligned,
                     stage)
    tokenizer = _tokenizer(cfg, sources["train"], stage / TOKENIZER_DIR, seed)
    dtype = token_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    splits = {}
    with Encoder(tokenizer, cfg, dtype.str, workers) as encoder:
        for name in SPLITS:
            texts = "all" if name != "train" else ("kept" if cfg.bpe_dropout > 0 else None)
            writer = SplitWriter(stage, name, dtype, length_dtype(cfg.max_len), texts)
            if name == "train" and aligned:  # the links read with their pairs, kept with them
                writer = AlignedWriter(writer, aligned[0][1], cfg.reverse, sources[name].names)
            encoder.run(sources[name], writer, texts is not None or isinstance(writer, AlignedWriter))
            splits[name] = writer.close()
            if sources[name].cleaned is not None:
                splits[name]["clean"] = sources[name].cleaned.report.to_dict()
                logger.info("%s: cleaning %s", name, sources[name].cleaned.report.summary())
            if writer.stats.total or name == "train":
                logger.info("%s: %s", name, writer.stats.summary())
    if sum(splits["train"]["filter"].values()) == 0:
        raise DataError("the training corpus is empty")
    if splits["train"]["pairs"] == 0:
        raise DataError("no training pair survived filtering (see data.max_len / data.max_ratio)")
    atomic_write_text(stage / MANIFEST, _manifest(cfg, inputs, tokenizer, dtype, t0, splits))
    os.chmod(stage / MANIFEST, 0o644)


def _fill_labelled(cfg: DataConfig, stage: Path) -> None:
    """A classification set (:mod:`transduce.data.labelled`): each split's example ids as its
    source side, its label id as its target side; the labels (class id -> name) and whether the
    rows are single texts or sentence pairs (``segments``) in the manifest. Classification sets
    are small: encoded here, without worker processes or filtering (texts are cut to max_len)."""
    t0 = time.monotonic()
    paths = {name: Path(p) for name in SPLITS if (p := getattr(cfg, f"{name}_src")) is not None}
    inputs = _inputs(list(paths.items()), stage)
    if cfg.tokenizer is None:
        raise DataError("data.tokenizer: labelled text is encoded with an existing tokenizer (a pre-trained "
                        "model's: data.tokenizer or train.init_from)")
    tokenizer = load_tokenizer(cfg.tokenizer)
    tokenizer.save(stage / TOKENIZER_DIR)
    rows = {name: read_labelled(path) for name, path in paths.items()}
    if not rows["train"]:
        raise DataError(f"{paths['train']}: the training corpus is empty")
    labels = tuple(sorted({label for _, label in rows["train"]}))
    segments = segments_of(rows["train"])
    ids = {label: i for i, label in enumerate(labels)}
    dtype = token_dtype(max(tokenizer.src_vocab_size, len(labels)))
    splits = {}
    for name in SPLITS:
        examples = rows.get(name, [])
        check_labels(examples, labels, paths.get(name))
        if examples and segments_of(examples) != segments:
            raise DataError(f"{paths[name]}:1: {'sentence pairs' if segments == 2 else 'single texts'} in "
                            f"{paths['train']}, but not here (every split holds the same kind of row)")
        tokens = [encode_example(tokenizer, texts, cfg.max_len) for texts, _ in examples]
        lens = np.fromiter(map(len, tokens), np.int64, len(tokens))
        chunk = EncodedChunk(np.fromiter((t for row in tokens for t in row), dtype, int(lens.sum())), lens,
                             np.array([ids[label] for _, label in examples], dtype), np.ones(len(examples), np.int64),
                             np.ones(len(examples), bool), FilterStats(kept=len(examples)))
        writer = SplitWriter(stage, name, dtype, length_dtype(cfg.max_len), None)
        writer.add(chunk)
        splits[name] = writer.close()
    logger.info("labelled %s: %s classes (%s)", "sentence pairs" if segments == 2 else "texts", len(labels),
                ", ".join(labels[:10]))
    atomic_write_text(stage / MANIFEST, _manifest(cfg, inputs, tokenizer, dtype, t0, splits, labels=list(labels),
                                                  segments=segments))
    os.chmod(stage / MANIFEST, 0o644)


def check_matches(root: Path, cfg: DataConfig) -> None:
    """DataError unless ``root`` was prepared from ``cfg``'s settings and its input files as they are now."""
    manifest = read_manifest(root)
    have = migrate_section("data", manifest["data"])  # a directory prepared before a key was renamed or folded
    for key, value in data_settings(cfg).items():
        if key.endswith(("_src", "_tgt")):  # a file: the same file wherever the project now lies
            recorded = {input_path(root, i).resolve() for i in manifest["inputs"]}
            if value is not None and Path(value).resolve() not in recorded:
                raise DataError(f"data.{key}: {value} is not a file {root} was prepared from (start a new run "
                                "in another directory, or prepare again)")
        elif have.get(key, getattr(DataConfig, key, None)) != value:  # a key newer than the data: its default
            raise DataError(f"data.{key} is {value!r} but {root} was prepared with {have.get(key)!r} "
                            "(start a new run in another directory, or prepare again)")
    for item in manifest["inputs"]:
        path = input_path(root, item)
        if not path.is_file():
            raise DataError(f"{path}: input of {root} is gone")
        if path.stat().st_size != item["size"] or sha256_file(path) != item["sha256"]:
            raise DataError(f"{path} has changed since {root} was prepared from it (sha256 differs): "
                            "restore it, or start a new run in another directory")


def prepared_for_run(cfg: DataConfig, run_dir: Path, seed: int = 0, workers: int | None = None) -> PreparedData:
    """What a training run trains on: ``data.prepared``, else ``RUN_DIR/prepared`` (made once, checked after)."""
    if cfg.prepared is not None:  # the sha256 of a WMT-size directory: read while training starts
        return _with_tokenizer_check(PreparedData.open(cfg.prepared, verify="background"), cfg)
    root = run_dir / RUN_SUBDIR
    if root.exists():
        check_matches(root, cfg)
        return _with_tokenizer_check(PreparedData.open(root, verify="background"), cfg)
    legacy = run_dir / TOKENIZER_DIR  # a run started before prepared data: keep its tokenizer
    if cfg.tokenizer is None and Tokenizer.exists(legacy):
        cfg = replace(cfg, tokenizer=str(legacy))
    return prepare_dataset(cfg, root, workers, seed)


def _with_tokenizer_check(data: PreparedData, cfg: DataConfig) -> PreparedData:
    if cfg.tokenizer is not None and load_tokenizer(cfg.tokenizer).digest() != data.tokenizer.digest():
        raise DataError(f"data.tokenizer={cfg.tokenizer} is not the tokenizer {data.root} was prepared with")
    return data
