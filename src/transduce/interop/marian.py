"""Import a Hugging Face ``MarianMTModel`` directory (e.g. one of the OPUS-MT models) as a
transduce model directory: the inverse of :mod:`transduce.interop.hf`. A T5 or mT5 directory
(``model_type`` t5 or mt5) is handed to :mod:`transduce.interop.hf_t5_import`, a GPT-2 one
(``gpt2``) to :mod:`transduce.interop.hf_gpt2_import`, a BERT or RoBERTa one (``bert``,
``roberta``) to :mod:`transduce.interop.hf_bert_import`, a Longformer one (``longformer``) to
:mod:`transduce.interop.hf_longformer_import`.

Weights. Marian is the paper's post-LN Transformer; its residual channels are ours under the
permutation ``P`` of :func:`~transduce.interop.hf.residual_permutation` (Marian's position table
puts all sines first), so every D-facing axis is permuted back by ``P``'s inverse. Options a
Marian config can carry are mapped (``scale_embedding``, ``activation_function`` relu/gelu/swish,
shared or separate vocabularies, tied or untied output, ``final_logits_bias`` as
``model.output_bias``) or refused with one line naming the key.

Vocabulary. transduce fixes its special ids (pad 0, bos 1, eos 2, unk 3); Marian's
``vocab.json`` has ``</s>`` 0, ``<unk>`` 1 and ``<pad>`` last, and starts decoding from
``<pad>`` (``decoder_start_token_id``). Our ids are Marian's reordered::

    ours 0 <pad> = Marian pad   ours 1 <s> = Marian decoder start (its row)
    ours 2 </s>  = Marian eos   ours 3 <unk> = Marian unk   ours 4.. = every other Marian id in order

so an imported model has one row more than Marian's (``ORDER[i]`` is the Marian id of our id i).
The tokenizer is each side's SentencePiece model rewritten so that its piece ids *are* these
ids: the pieces of ``vocab.json`` in our order, with the scores and types of ``source.spm``
(``target.spm`` for the target side); pieces the side's model does not have (the other side's,
in a shared vocabulary) become UNUSED, which segmentation never produces but decoding writes.
MarianTokenizer looks each piece *string* up in ``vocab.json``, so a span of characters the side's
model does not know (``<unk>`` to SentencePiece) that the vocabulary has, because the other side
knows it, gets that entry's id: :meth:`~transduce.data.tokenizer.Tokenizer.encode` gives an unknown
span spelled as an UNUSED piece that piece's id, the same lookup. Segmenting with the rewritten
model therefore equals MarianTokenizer's segmentation followed by its ``vocab.json`` lookup.
Pieces of an ``.spm`` file that ``vocab.json`` lacks (Marian maps them
to ``<unk>``) are dropped, with a warning: text that would use them is segmented into smaller
known pieces instead.

Not supported (one-line errors): multilingual models whose vocabulary holds language codes
(``>>de<<``: MarianTokenizer strips them from the text before SentencePiece), pre-LN
(``normalize_before``), an embedding LayerNorm, different encoder and decoder widths.

Examples:
    >>> report = import_hf("opus-mt-en-de", "runs/opus-en-de")          # doctest: +SKIP
    >>> report["max_logit_diff"] < 1e-4                                  # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.tokenizer import Tokenizer
from ..errors import ConfigError, one_line, require
from ..model import Transformer, save_model
from ..model.io import load_state_checked
from .base import staging_dir, torch_threads
from .hf import MARIAN_ACTIVATIONS, MARIAN_LN_EPS, marian_name_map, permuted, residual_permutation
from .hf_read import (HFImportError, check_against_hf, decode_config, load_hf_model, read_json, read_weights,
                      refuse_unsupported, rewrite_spm)
from .verify import LOGIT_TOL

logger = logging.getLogger(__name__)

ACTIVATIONS = {marian: ours for ours, marian in MARIAN_ACTIVATIONS.items()}
# MarianConfig keys whose non-default values transduce cannot express, and the default.
REFUSED = {"normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
           "layernorm_embedding": False, "static_position_embeddings": True}


def import_hf(hf_dir: str | os.PathLike, out: str | os.PathLike, force: bool = False) -> dict[str, object]:
    """Convert the MarianMTModel (or T5ForConditionalGeneration) directory ``hf_dir`` into the
    transduce model directory ``out`` (config.yaml with decoding settings, model.safetensors,
    tokenizer), verified against transformers' own forward pass and greedy/beam search; returns
    the verification's measurements. Nothing is written unless every check passes."""
    where = Path(hf_dir)
    if not where.is_dir():
        raise HFImportError(f"{where}: not a directory")
    config = read_json(where / "config.json")
    if config.get("model_type") in ("t5", "mt5"):
        from .hf_t5_import import import_t5
        return import_t5(where, config, out, force)
    if config.get("model_type") == "gpt2":
        from .hf_gpt2_import import import_gpt2
        return import_gpt2(where, config, out, force)
    if config.get("model_type") in ("bert", "roberta"):
        from .hf_bert_import import import_bert
        return import_bert(where, config, out, force)
    if config.get("model_type") == "longformer":
        from .hf_longformer_import import import_longformer
        return import_longformer(where, config, out, force)
    cfg, src_vocab, tgt_vocab = _model_config(config, where)
    model = Transformer(cfg)
    load_state_checked(model, _our_state(read_weights(where), cfg, src_vocab.order, tgt_vocab.order),
                       f"{where} (mapped to transduce)")
    model.eval()
    tokenizer, dropped = _tokenizer(where, src_vocab, tgt_vocab)
    with staging_dir(out, force) as tmp, torch_threads(1):
        save_model(model, tmp, decode_config(where))
        tokenizer.save(tmp)
        checks = verify_import(model, where, src_vocab, tgt_vocab)
    checks["dropped_pieces"] = dropped
    logger.info("imported %s into %s (%s)", where, out, ", ".join(f"{k}={v}" for k, v in checks.items()))
    return checks


class _Vocab:
    """One side's vocab.json: its pieces in Marian's id order, its special ids, and ``order``,
    the Marian id of each of our ids (see the module docstring)."""

    def __init__(self, vocab: dict, path: Path, start: int | None = None):
        self.pieces = _by_id(vocab, path)
        missing = [p for p in ("<pad>", "</s>", "<unk>") if p not in vocab]
        if missing:
            raise HFImportError(f"{path}: has no {missing[0]} piece")
        self.pad, self.eos, self.unk = vocab["<pad>"], vocab["</s>"], vocab["<unk>"]
        self.start = self.pad if start is None else start
        specials = {self.pad, self.eos, self.unk}
        self.order = torch.tensor([self.pad, self.start, self.eos, self.unk]
                                  + [i for i in range(len(vocab)) if i not in specials])


def _by_id(vocab: dict, path: Path) -> list[str]:
    """The pieces of a vocab.json in id order; its ids must be 0..n-1."""
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < len(vocab) or pieces[i]:
            raise HFImportError(f"{path}: ids are not 0..{len(vocab) - 1}, one per piece (at {piece!r}: {i!r})")
        pieces[i] = piece
    codes = [p for p in pieces if p.startswith(">>") and p.endswith("<<")]
    if codes:
        raise HFImportError(f"{path}: a multilingual model (language codes such as {codes[0]}) is not supported")
    clash = [p for p in pieces if p == "<s>"]
    if clash:
        raise HFImportError(f"{path}: holds '<s>', which transduce reserves for the decoder start")
    return pieces


def _model_config(config: dict, where: Path) -> tuple[ModelConfig, _Vocab, _Vocab]:
    """Our ModelConfig for a MarianConfig (as a dict), and each side's vocabulary."""
    name = where / "config.json"
    if config.get("model_type") != "marian":
        raise HFImportError(f"{name}: model_type is {config.get('model_type')!r}, not 'marian', 't5', 'mt5', "
                            "'gpt2', 'bert' or 'roberta' (the kinds transduce imports)")
    refuse_unsupported(config, name, REFUSED, "transduce's Marian layout is post-LN with sinusoidal positions "
                       "and no embedding LayerNorm")
    for ours, (enc, dec) in {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim")}.items():
        if config.get(enc) != config.get(dec):
            raise HFImportError(f"{name}: {enc}={config.get(enc)} and {dec}={config.get(dec)} differ "
                                    f"(transduce has one model.{ours})")
    activation = config.get("activation_function", "swish")
    if activation not in ACTIVATIONS:
        raise HFImportError(f"{name}: activation_function={activation!r} is not supported "
                                f"(one of {', '.join(ACTIVATIONS)})")
    src_vocab = _Vocab(read_json(where / "vocab.json"), where / "vocab.json")
    separate = (where / "target_vocab.json").is_file()
    if config.get("separate_vocabs") and not separate:
        raise HFImportError(f"{where}: separate_vocabs is set but there is no target_vocab.json")
    start = config.get("decoder_start_token_id")
    tgt_vocab = (_Vocab(read_json(where / "target_vocab.json"), where / "target_vocab.json", start)
                 if separate else _Vocab(read_json(where / "vocab.json"), where / "vocab.json", start))
    for key, want in (("pad_token_id", tgt_vocab.pad), ("eos_token_id", tgt_vocab.eos),
                      ("vocab_size", len(src_vocab.pieces)),
                      ("decoder_vocab_size", len(tgt_vocab.pieces))):
        if config.get(key) not in (None, want):
            raise HFImportError(f"{name}: {key}={config[key]} but the vocabulary says {want}")
    shared = not separate and config.get("share_encoder_decoder_embeddings", True)
    try:
        cfg = ModelConfig(
            src_vocab_size=len(src_vocab.order), tgt_vocab_size=len(tgt_vocab.order),
            d_model=config["d_model"], n_heads=config["encoder_attention_heads"],
            n_encoder_layers=config["encoder_layers"], n_decoder_layers=config["decoder_layers"],
            d_ff=config["encoder_ffn_dim"], dropout=float(config.get("dropout", 0.1)),
            attention_dropout=float(config.get("attention_dropout", 0.0)),
            activation_dropout=float(config.get("activation_dropout", 0.0)),
            activation=ACTIVATIONS[activation], norm="post", positions="sinusoidal",
            max_positions=int(config.get("max_position_embeddings", 512)),
            share_embeddings=bool(shared), tie_output=bool(config.get("tie_word_embeddings", True)),
            scale_embeddings=bool(config.get("scale_embedding", False)),
            layer_norm_eps=MARIAN_LN_EPS, output_bias=True)
    except KeyError as e:
        raise HFImportError(f"{name}: missing key {e.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as e:
        raise HFImportError(f"{name}: does not map to a valid transduce config ({one_line(e)})") from None
    return cfg, src_vocab, tgt_vocab


def _our_state(state: dict[str, Tensor], cfg: ModelConfig, src_order: Tensor, tgt_order: Tensor
               ) -> dict[str, Tensor]:
    """Marian's tensors under our names: residual axes permuted back by P's inverse, vocabulary
    rows put in our order (:func:`~transduce.interop.hf.marian_name_map`, the table the export
    reads the other way)."""
    inv = torch.argsort(residual_permutation(cfg.d_model))

    def get(*names: str) -> Tensor:
        for key in names:
            if key in state:
                return state[key]
        raise HFImportError(f"Marian weights: missing tensor {names[0]}")

    src_tokens = get("model.encoder.embed_tokens.weight", "model.shared.weight")
    ours = {"src_embed.tokens.weight": src_tokens[src_order][:, inv],
            "output_proj.bias": get("final_logits_bias")[0][tgt_order]}
    if not cfg.share_embeddings:
        ours["tgt_embed.tokens.weight"] = get("model.decoder.embed_tokens.weight",
                                              "model.shared.weight")[tgt_order][:, inv]
    if not cfg.tie_output:
        ours["output_proj.weight"] = get("lm_head.weight")[tgt_order][:, inv]
    ours.update({k: permuted(get(theirs), side, inv) for k, (theirs, side) in marian_name_map(cfg).items()})
    return {k: v.contiguous() for k, v in ours.items()}


def _tokenizer(where: Path, src_vocab: _Vocab, tgt_vocab: _Vocab) -> tuple[Tokenizer, int]:
    """Each side's SentencePiece model rewritten so that its piece ids are our ids; and how many
    pieces of the .spm files vocab.json lacks."""
    protos, dropped = [], 0
    for spm_file, vocab in (("source.spm", src_vocab), ("target.spm", tgt_vocab)):
        proto, n = rewrite_spm(where / spm_file, vocab)
        protos.append(proto)
        dropped += n
    return Tokenizer(protos[0], protos[1], name=str(where)), dropped


@torch.no_grad()
def verify_import(model: Transformer, where: Path, src_vocab: _Vocab, tgt_vocab: _Vocab,
                  atol: float = LOGIT_TOL) -> dict[str, object]:
    """transformers' MarianMTModel from ``where`` against the imported model on the probe set:
    logits (in our id order) within ``atol``, and the same greedy and beam-4 outputs."""
    transformers = require("transformers", "export", "transduce import")
    hf = load_hf_model(transformers.MarianMTModel, where)
    return check_against_hf(model, hf, src_vocab.order, tgt_vocab.order, atol)


