"""A vocabulary shortlist for CPU decoding (Marian's lexical shortlist, CTranslate2's vocabulary map).

Built once from a parallel corpus with the model's tokenizer: for each source token the ``k``
target tokens most associated with it (the Dice coefficient of their sentence co-occurrence,
2 c(s, t) / (c(s) + c(t)), so that frequent target tokens do not crowd out the rest), plus the
``frequent`` most frequent target tokens. Stored with the model as ``shortlist.safetensors``.

With ``decode.shortlist: true`` a batch's search projects its decoder states onto, and takes
the softmax over, only the union of its source tokens' lists, the frequent tokens and PAD/BOS/EOS
(:class:`~transduce.inference.search.common.BatchVocab`): a (rows, U) product instead of
(rows, V). A shortlist holding every target id gives exactly the full search's output.

Legend: Vs/Vt source/target vocabulary, U the batch's union.
"""

from __future__ import annotations

import os
from itertools import zip_longest
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import Tensor

from ...atomic import atomic_path
from ...data.corpus import read_lines
from ...data.tokenizer import Tokenizer
from ...errors import CheckpointError, ConfigError, DataError
from ...model.io import load_model_config
from .common import BatchVocab

FILE = "shortlist.safetensors"


class Shortlist:
    """Each source id's candidate target ids (``table`` (Vs, k), -1-padded) and the always-kept
    ``frequent`` target ids (N,)."""

    def __init__(self, table: Tensor, frequent: Tensor):
        self.table, self.frequent = table.long(), frequent.long()

    def union(self, src: Tensor, always: Iterable[int]) -> Tensor:
        """The sorted target ids a batch of sources may produce: its tokens' lists, the frequent
        ids and ``always`` (PAD, BOS, EOS). Shape: src (B, S) -> (U,)."""
        rows = self.table[src.unique().cpu().clamp(max=self.table.shape[0] - 1)].flatten()   # (S' * k,)
        extra = torch.tensor(list(always), dtype=torch.long)
        return torch.cat([rows[rows >= 0], self.frequent, extra]).unique()               # sorted

    def vocab(self, model: torch.nn.Module, src: Tensor) -> BatchVocab | None:
        """The batch's :class:`BatchVocab` for ``model``'s output projection (None where that is
        not a plain weight: an int8 layer, an ensemble, which then decode over the full vocabulary)."""
        cfg = model.config
        return BatchVocab.restrict(model.output_proj, self.union(src, (cfg.pad_id, cfg.bos_id, cfg.eos_id)), cfg)

    def save(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_file
        path = Path(directory) / FILE
        with atomic_path(path, suffix=".safetensors") as tmp:
            save_file({"table": self.table.int().contiguous(), "frequent": self.frequent.int().contiguous()}, str(tmp))
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Shortlist | None":
        """The shortlist saved in a model directory, or None where it has none."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        path = Path(directory) / FILE
        if not path.is_file():
            return None
        try:
            t = load_file(str(path))
            return cls(t["table"], t["frequent"])
        except (SafetensorError, KeyError) as e:
            raise CheckpointError(f"{path}: not a shortlist ({e}); rebuild it with transduce shortlist") from None


def build_shortlist(pairs: Iterable[tuple[list[int], list[int]]], src_vocab: int, tgt_vocab: int, k: int,
                    frequent: int) -> Shortlist:
    """A :class:`Shortlist` from tokenized sentence pairs (source ids, target ids)."""
    if k < 1 or frequent < 0:
        raise ConfigError(f"shortlist: k must be >= 1 and frequent >= 0; got k {k}, frequent {frequent}")
    keys, src_count, tgt_count = [], torch.zeros(src_vocab), torch.zeros(tgt_vocab)
    for s_ids, t_ids in pairs:
        s, t = torch.tensor(sorted(set(s_ids)), dtype=torch.long), torch.tensor(sorted(set(t_ids)), dtype=torch.long)
        src_count[s] += 1
        tgt_count[t] += 1
        keys.append((s[:, None] * tgt_vocab + t[None, :]).flatten())                  # (|s| * |t|,)
    if not keys:
        raise DataError("shortlist: the corpus has no sentence pair")
    pair, count = torch.cat(keys).unique(return_counts=True)
    s, t = pair // tgt_vocab, pair % tgt_vocab
    dice = 2 * count / (src_count[s] + tgt_count[t])
    order = dice.argsort(descending=True, stable=True)
    order = order[s[order].argsort(stable=True)]                                       # by source, best first
    s, t = s[order], t[order]
    first = torch.searchsorted(s, s)                                                   # each group's start
    keep = (torch.arange(len(s)) - first) < k
    table = torch.full((src_vocab, k), -1, dtype=torch.long)
    table[s[keep], (torch.arange(len(s)) - first)[keep]] = t[keep]
    return Shortlist(table, tgt_count.argsort(descending=True, stable=True)[:frequent])


def shortlist_corpus(model_dir: str, src_path: str, tgt_path: str, k: int, frequent: int) -> Shortlist:
    """Build a model directory's shortlist from raw parallel text with its tokenizer, and save it
    there (atomically)."""
    cfg = load_model_config(model_dir)
    tokenizer = Tokenizer.load(model_dir)
    src, tgt = read_lines(src_path), read_lines(tgt_path)

    def pairs() -> Iterator[tuple[list[int], list[int]]]:
        for a, b in zip_longest(src, tgt):
            if a is None or b is None:
                raise DataError(f"--src/--tgt: {src_path} and {tgt_path} have different numbers of lines")
            yield tokenizer.encode(a, side="src"), tokenizer.encode(b, side="tgt")

    shortlist = build_shortlist(pairs(), cfg.src_vocab_size, cfg.tgt_vocab_size, k, frequent)
    shortlist.save(model_dir)
    return shortlist
