"""Import a Hugging Face T5 or mT5 directory (``T5ForConditionalGeneration``: config.json,
model.safetensors or pytorch_model.bin, spiece.model) as a transduce model directory, verified
against transformers before anything is written.

The config maps onto our Transformer with T5's options (:mod:`~transduce.interop.hf_t5`): relu or
gated-gelu, tied (with the output rescale) or untied. The vocabulary is reordered to our fixed
special ids (:mod:`~transduce.interop.hf_t5`'s docstring), and the tokenizer is T5's
SentencePiece model rewritten so that its piece ids are ours, the sentinels ``<extra_id_N>``
(``extra_ids`` of tokenizer_config.json, 100 by default, the last ids of T5's tokenizer in
reverse order) kept as pieces that segmentation produces whole; ids of the embedding beyond the
tokenizer (T5 rounds its vocabulary up to a multiple of 128) become unused pieces.

An attention width ``num_heads * d_kv`` other than ``d_model`` (T5 1.1 small, mT5 small: 6 or 8
heads of 64 over 512) becomes ``model.head_dim: d_kv``. Not supported (one-line errors): another
``feed_forward_proj``, different encoder and decoder ids.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.tokenizer import Tokenizer
from ..errors import ConfigError, one_line, require
from ..model import Transformer, save_model
from ..model.io import load_state_checked
from .base import staging_dir, torch_threads
from .hf_read import (HFImportError, check_against_hf, decode_config, load_hf_model, read_json, read_weights,
                      rewrite_spm)
from .hf_t5 import ACTIVATIONS, our_t5_state

logger = logging.getLogger(__name__)

SPIECE = "spiece.model"


class _T5Vocab:
    """T5's ids: its pieces in id order (SentencePiece's, then the sentinels, then unused rows
    up to the embedding's size) and ``order``, the T5 id of each of our ids."""

    def __init__(self, config: dict, where: Path, n_rows: int):
        sp = require("sentencepiece", "export", "transduce import")
        path = where / SPIECE
        try:
            proc = sp.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise HFImportError(f"{path}: not a SentencePiece model ({one_line(e)})") from None
        tok_config = where / "tokenizer_config.json"
        extra = int(read_json(tok_config).get("extra_ids", 100)) if tok_config.is_file() else 100
        n = proc.get_piece_size()
        if n + extra > n_rows:
            raise HFImportError(f"{path}: {n} pieces and {extra} sentinels exceed the model's vocab_size={n_rows}")
        self.pieces = ([proc.id_to_piece(i) for i in range(n)] + [f"<extra_id_{k}>" for k in range(extra - 1, -1, -1)]
                       + [f"<unused_{i}>" for i in range(n + extra, n_rows)])
        self.pad, self.eos, self.unk = int(config.get("pad_token_id", 0)), int(config.get("eos_token_id", 1)), \
            proc.unk_id()
        start = config.get("decoder_start_token_id")
        self.start = self.pad if start is None else int(start)
        specials = {self.pad, self.eos, self.unk, self.start}
        self.order = torch.tensor([self.pad, self.start, self.eos, self.unk]
                                  + [i for i in range(n_rows) if i not in specials])


def _model_config(config: dict, where: Path, tied: bool, n_ids: int, start_is_pad: bool) -> ModelConfig:
    """Our ModelConfig for a T5Config / MT5Config (as a dict); ``start_is_pad``: the decoder
    starts from PAD, so our BOS is PAD's row again and no class of T5's output."""
    name = where / "config.json"
    proj = config.get("feed_forward_proj", "relu" if config["model_type"] == "t5" else "gated-gelu")
    if proj not in ACTIVATIONS:
        raise HFImportError(f"{name}: feed_forward_proj={proj!r} is not supported (one of {', '.join(ACTIVATIONS)})")
    try:
        d_model, heads, d_kv = int(config["d_model"]), int(config["num_heads"]), int(config["d_kv"])
        # transformers rescales a tied output unless told not to (scale_decoder_outputs, or before
        # v5 tie_word_embeddings=false); mT5's code never does
        scale = tied and config["model_type"] == "t5" and bool(
            config.get("scale_decoder_outputs", config.get("tie_word_embeddings", True)))
        return ModelConfig(
            src_vocab_size=n_ids, tgt_vocab_size=n_ids, d_model=d_model, n_heads=heads,
            head_dim=None if heads * d_kv == d_model else d_kv,
            n_encoder_layers=int(config["num_layers"]),
            n_decoder_layers=int(config.get("num_decoder_layers") or config["num_layers"]), d_ff=int(config["d_ff"]),
            dropout=float(config.get("dropout_rate", 0.1)), activation=ACTIVATIONS[proj], norm="pre",
            norm_kind="rms", positions="relative",
            relative_buckets=int(config.get("relative_attention_num_buckets", 32)),
            relative_max_distance=int(config.get("relative_attention_max_distance", 128)), max_positions=512,
            bias=False, share_embeddings=True, tie_output=tied, scale_embeddings=False, scale_attention=False,
            scale_output=scale, bos_in_softmax=not start_is_pad,
            layer_norm_eps=float(config.get("layer_norm_epsilon", 1e-6)))
    except KeyError as e:
        raise HFImportError(f"{name}: missing key {e.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as e:
        raise HFImportError(f"{name}: does not map to a valid transduce config ({one_line(e)})") from None


def _is_tied(state: dict[str, Tensor]) -> bool:
    """Whether the output projection is the embedding: no lm_head.weight, or an equal one."""
    head, shared = state.get("lm_head.weight"), state.get("shared.weight")
    return head is None or (shared is not None and torch.equal(head, shared))


def _tokenizer(where: Path, vocab: _T5Vocab) -> Tokenizer:
    """spiece.model rewritten so that its ids are ours, the sentinels segmented whole."""
    pb = require("sentencepiece.sentencepiece_model_pb2", "export", "transduce import")
    rewritten, _ = rewrite_spm(where / SPIECE, vocab)
    proto = pb.ModelProto()
    proto.ParseFromString(rewritten)
    for piece in proto.pieces:
        if piece.piece.startswith("<extra_id_"):
            piece.type = pb.ModelProto.SentencePiece.USER_DEFINED
    return Tokenizer(proto.SerializeToString(), name=str(where))


def import_t5(where: Path, config: dict, out, force: bool = False) -> dict[str, object]:
    """:func:`~transduce.interop.hf_import.import_hf` for a T5 or mT5 directory ``where`` whose
    config.json holds ``config``."""
    if not (where / SPIECE).is_file():
        raise HFImportError(f"{where / SPIECE}: not found (a T5 directory's SentencePiece tokenizer)")
    state = read_weights(where)
    if "vocab_size" not in config:
        raise HFImportError(f"{where / 'config.json'}: missing key 'vocab_size'")
    vocab = _T5Vocab(config, where, int(config["vocab_size"]))
    cfg = _model_config(config, where, _is_tied(state), len(vocab.order), vocab.start == vocab.pad)
    model = Transformer(cfg)
    try:
        ours = our_t5_state(state, cfg, vocab.order)
    except KeyError as e:
        raise HFImportError(f"{where}: T5 weights lack tensor {e.args[0]}") from None
    load_state_checked(model, ours, f"{where} (mapped to transduce)")
    model.eval()
    tokenizer = _tokenizer(where, vocab)
    with staging_dir(out, force) as tmp, torch_threads(1):
        save_model(model, tmp, decode_config(where))
        tokenizer.save(tmp)
        transformers = require("transformers", "export", "transduce import")
        hf = load_hf_model(transformers.AutoModelForSeq2SeqLM, where)
        checks = check_against_hf(model, hf, vocab.order, vocab.order)
    logger.info("imported %s into %s (%s)", where, out, ", ".join(f"{k}={v}" for k, v in checks.items()))
    return checks
