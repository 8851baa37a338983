"""Growing a trained model's vocabulary to fine-tune it on new text (``train.extend_vocab``:
``transduce train CONFIG --init-from MODEL_DIR --extend-vocab [N]``).

The init model's tokenizer gains the pieces of the new training text it lacks
(:meth:`~transduce.data.tokenizer.Tokenizer.extended`: every old piece keeps its id, so every old
embedding row keeps its meaning). It is made once, into ``RUN_DIR/tokenizer``, and the run then
reads it as its ``data.tokenizer`` (a resumed run reuses it). The model's vocabulary matrices
(token embeddings, an untied output projection, a masked-LM head's bias) keep every old row and
gain new rows initialised as a freshly built model's are. An encoder-only model's [MASK] is its
last id, one past the tokenizer's pieces: its row moves to the new end.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from ..atomic import atomic_dir
from ..config import RunConfig
from ..data.labelled import read_labelled
from ..data.prepare import split_sources, tokenizer_sample
from ..data.tokenizer import Tokenizer
from ..errors import ConfigError
from ..model.io import unique_state_dict

logger = logging.getLogger("transduce.training")

TOKENIZER_DIR = "tokenizer"  # RUN_DIR/tokenizer: the extended tokenizer


def extend_run_vocabulary(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """``cfg`` reading ``train.init_from``'s tokenizer extended on the run's training text
    (made into ``RUN_DIR/tokenizer`` unless a previous start of the run made it)."""
    out, data = run_dir / TOKENIZER_DIR, cfg.data
    if data.prepared is not None:
        raise ConfigError("train.extend_vocab: learns its pieces from the training text, so it cannot train on "
                          f"data.prepared ({data.prepared}, encoded with another tokenizer); unset one of them")
    if data.tokenizer not in (None, str(out)):
        raise ConfigError(f"train.extend_vocab: extends train.init_from's tokenizer; leave data.tokenizer unset "
                          f"(got {data.tokenizer})")
    if not Tokenizer.exists(out):
        old = Tokenizer.load(cfg.train.init_from)
        tokenizer, added = old.extended(*_new_text(cfg), cfg.train.extend_vocab, seed=cfg.train.seed)
        if not any(added):  # still a valid fine-tuning run: the model's own vocabulary covers the text
            logger.warning("train.extend_vocab: the new text has no pieces %s lacks; training with its "
                           "tokenizer unchanged", cfg.train.init_from)
        else:
            logger.info("extended %s's tokenizer by %s new pieces (vocab src %d, tgt %d)", cfg.train.init_from,
                        added[0] if old.joint else f"{added[0]} + {added[1]}",
                        tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
        with atomic_dir(out) as tmp:
            tokenizer.save(tmp)
    return replace(cfg, data=replace(data, tokenizer=str(out)))


def _new_text(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """The (source, target) lines the tokenizer learns new pieces from: a sample of the training
    text of the side(s) the task reads (as a tokenizer of its own would be trained on)."""
    if cfg.task_spec.labelled:
        texts = [text for texts, _ in read_labelled(cfg.data.train_src) for text in texts]  # pairs: both
        return texts, texts
    src, tgt, _ = tokenizer_sample(cfg.data, split_sources(cfg.data)["train"], cfg.train.seed)
    sides = {"src": src, "tgt": tgt}
    return sides[cfg.task_spec.text[0]], sides[cfg.task_spec.text[1]]


def grow_vocab_rows(state: dict[str, torch.Tensor], model: torch.nn.Module, extra: int
                    ) -> dict[str, torch.Tensor]:
    """``state`` (a smaller vocabulary's weights) fitted to ``model``: each tensor whose first
    dimension is shorter than the model's (a vocabulary matrix or bias) becomes the model's own
    freshly initialised tensor with the old rows copied in; the last ``extra`` old rows (an
    encoder-only model's [MASK]) go to the new end. Other tensors are returned as they are.

    Shape: old (V_old, ...) -> (V_new, ...); rows [0, V_old - extra) and the last ``extra`` are old.
    """
    fresh = unique_state_dict(model)
    out = {}
    for name, old in state.items():
        new = fresh.get(name)
        if new is None or new.dim() == 0 or new.shape[1:] != old.shape[1:] or new.shape[0] <= old.shape[0]:
            out[name] = old  # unchanged (or a mismatch load_state_checked names)
            continue
        grown = new.clone()
        kept = old.shape[0] - extra
        grown[:kept] = old[:kept]
        if extra:
            grown[-extra:] = old[kept:]
        out[name] = grown
    return out
