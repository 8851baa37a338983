"""Marian (OPUS-MT) as Hugging Face writes it, both ways: our post-LN Transformer with sinusoidal
positions and ``MarianMTModel``, one parameter table (:func:`marian_name_map`) read by the export
(:data:`EXPORT`: config, safetensors, tokenizer files) and the import (:data:`IMPORT`, a
``model_type: marian`` directory such as one of the OPUS-MT models), the descriptions
:func:`~transduce.interop.hf.export_family` and :func:`~transduce.interop.hf.import_family` run.

Marian is the paper's post-LN Transformer with sinusoidal positions, so a transduce model with
those options maps onto it weight for weight, with one twist: our position table interleaves
sin and cos (dims 2i, 2i+1, Sec. 3.5) while Marian puts all sines first and all cosines second.
The Transformer is equivariant to a fixed permutation of the residual-stream channels, so we
permute every D-facing weight axis (embeddings, the input side of q/k/v/fc1 and the output
projection, the output side of out_proj/fc2, the LayerNorms) by ``P = [0, 2, 4, ..., 1, 3, ...]``;
Marian's own table then equals ours under ``P`` and the two models compute the same logits.
Head dimensions (q/k/v outputs) are not in the residual stream and stay as they are.

Options Marian cannot express (pre-LN, RoPE or learned positions, SwiGLU, bias-free layers, a
LayerNorm epsilon other than 1e-5, an odd D) are refused with a one-line error naming the option.

Import. Weights: the same table read the other way, every D-facing axis permuted back by the
inverse of ``P`` (:func:`residual_permutation`). Options a
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
    >>> from transduce.interop import import_hf
    >>> report = import_hf("opus-mt-en-de", "runs/opus-en-de")          # doctest: +SKIP
    >>> report["max_logit_diff"] < 1e-4                                  # doctest: +SKIP
    True

Legend: D d_model, V vocabulary, P the channel permutation.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.tokenizer import Tokenizer
from ..errors import require
from ..model import Transformer
from .base import head_width_problems
from .hf import HFExport, HFImport, HFImportError, generation_config, read_json, rewrite_spm
from ..data.tokenizer import JOINT_MODEL, SIDE_MODELS

logger = logging.getLogger(__name__)

MARIAN_LN_EPS = 1e-5  # nn.LayerNorm's default, which Marian layers use without a config key
# Our FFN activations under MarianConfig's names (OPUS-MT models use "swish", which is SiLU).
MARIAN_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "swish"}


def marian_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that MarianMTModel cannot express, one phrase each."""
    problems = []
    if cfg.norm != "post":
        problems.append(f"model.norm={cfg.norm} (Marian has post-LN layers only)")
    if cfg.positions != "sinusoidal":
        problems.append(f"model.positions={cfg.positions} (Marian has sinusoidal positions only)")
    if cfg.activation not in MARIAN_ACTIVATIONS:
        problems.append(f"model.activation={cfg.activation} (Marian's FFN is not gated)")
    if not cfg.bias:
        problems.append("model.bias=false (Marian's linear layers and LayerNorms have biases)")
    if cfg.layer_norm_eps != MARIAN_LN_EPS:
        problems.append(f"model.layer_norm_eps={cfg.layer_norm_eps} (Marian uses {MARIAN_LN_EPS})")
    if cfg.d_model % 2:
        problems.append(f"model.d_model={cfg.d_model} (odd widths have a different position table)")
    return problems + head_width_problems(cfg, "Marian")


def residual_permutation(d_model: int) -> Tensor:
    """P such that Marian channel c holds our channel P[c]: evens (sines), then odds (cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# The Marian mapping, read both ways (export: marian_state_dict; import: our_state):
# each layer parameter of ours -> (Marian's name, the side of it that faces the residual stream,
# whose channels P permutes: "in" the columns, "out" the rows or a vector's entries, None neither).
_ATTENTION_SIDES = {"q_proj.weight": "in", "q_proj.bias": None, "k_proj.weight": "in", "k_proj.bias": None,
                    "v_proj.weight": "in", "v_proj.bias": None, "out_proj.weight": "out", "out_proj.bias": "out"}
_FFN = {"ffn.fc1.weight": ("fc1.weight", "in"), "ffn.fc1.bias": ("fc1.bias", None),
        "ffn.fc2.weight": ("fc2.weight", "out"), "ffn.fc2.bias": ("fc2.bias", "out")}
_ATTENTIONS = {"encoder": {"self_attn": "self_attn"},
               "decoder": {"self_attn": "self_attn", "cross_attn": "encoder_attn"}}
_NORMS = {"encoder": {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm"},
          "decoder": {"norm1": "self_attn_layer_norm", "norm2": "encoder_attn_layer_norm", "norm3": "final_layer_norm"}}


def _layer_names(stack: str) -> dict[str, tuple[str, str | None]]:
    """One ``stack`` layer's parameters: ours -> (Marian's, residual side)."""
    names = {f"{ours}.{leaf}": (f"{theirs}.{leaf}", side) for ours, theirs in _ATTENTIONS[stack].items()
             for leaf, side in _ATTENTION_SIDES.items()}
    names.update(_FFN)
    names.update({f"{ours}.{leaf}": (f"{theirs}.{leaf}", "out") for ours, theirs in _NORMS[stack].items()
                  for leaf in ("weight", "bias")})
    return names


def marian_name_map(cfg: ModelConfig) -> dict[str, tuple[str, str | None]]:
    """Every layer parameter of ours -> (its MarianMTModel name, the residual side P permutes)."""
    return {f"{stack}_layers.{i}.{ours}": (f"model.{stack}.layers.{i}.{theirs}", side)
            for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers))
            for i in range(n) for ours, (theirs, side) in _layer_names(stack).items()}


def permuted(t: Tensor, side: str | None, perm: Tensor) -> Tensor:
    """``t`` with its residual ``side`` (see :func:`marian_name_map`) put in the order ``perm``."""
    return t[:, perm] if side == "in" else t[perm] if side == "out" else t


def _embeddings(model: Transformer, perm: Tensor) -> dict[str, Tensor]:
    """Token embeddings, output layer, position tables (Marian recomputes the same ones)."""
    cfg = model.config
    src = model.src_embed.tokens.weight.detach()[:, perm]                # (V_src, D)
    tgt = model.tgt_embed.tokens.weight.detach()[:, perm]                # (V_tgt, D)
    table = model.src_embed.positions(0, cfg.max_positions).detach()[:, perm]  # (P, D)
    out = {"model.encoder.embed_tokens.weight": src, "model.decoder.embed_tokens.weight": tgt,
           "model.encoder.embed_positions.weight": table, "model.decoder.embed_positions.weight": table,
           "lm_head.weight": model.output_proj.weight.detach()[:, perm],
           "final_logits_bias": (model.output_proj.bias.detach()[None] if cfg.output_bias
                                 else torch.zeros(1, cfg.tgt_vocab_size))}
    if cfg.share_embeddings:
        out["model.shared.weight"] = src
    return out


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our weights under MarianMTModel's parameter names, residual channels permuted by P."""
    perm = residual_permutation(model.config.d_model)
    ours = model.state_dict()
    state = _embeddings(model, perm)
    state.update({theirs: permuted(ours[k].detach(), side, perm)
                  for k, (theirs, side) in marian_name_map(model.config).items()})
    return {k: v.float().contiguous() for k, v in state.items()}


def marian_config(cfg: ModelConfig):
    """The MarianConfig of the same shape; generation starts from our BOS, not Marian's PAD."""
    transformers = require("transformers", "export")
    return transformers.MarianConfig(
        vocab_size=cfg.src_vocab_size, decoder_vocab_size=cfg.tgt_vocab_size,
        d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=MARIAN_ACTIVATIONS[cfg.activation],
        max_position_embeddings=cfg.max_positions, scale_embedding=cfg.scale_embeddings,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=cfg.tie_output,
        pad_token_id=cfg.pad_id, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id,
        decoder_start_token_id=cfg.bos_id, forced_eos_token_id=None,
    )


def write_tokenizer_files(model_dir: str | os.PathLike, tok, out: Path, cfg: ModelConfig, order=None) -> None:
    """source.spm, target.spm, vocab.json (+ target_vocab.json) and tokenizer_config.json.

    Our SentencePiece ids are the model ids, so vocab.json maps each piece to its own id.
    """

    root = Path(model_dir)
    for side, name in (("src", "source.spm"), ("tgt", "target.spm")):
        path = root / (JOINT_MODEL if tok.joint else SIDE_MODELS[side])
        (out / name).write_bytes(path.read_bytes())
    vocab = {p: i for i, p in enumerate(tok.pieces(range(tok.src_vocab_size), "src"))}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    if not tok.joint:
        tvocab = {p: i for i, p in enumerate(tok.pieces(range(tok.tgt_vocab_size), "tgt"))}
        (out / "target_vocab.json").write_text(json.dumps(tvocab, ensure_ascii=False, indent=1), encoding="utf-8")
    config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": not tok.joint,
              "model_max_length": min(512, cfg.max_positions), "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def tokenizer_problem(tok, cfg: ModelConfig) -> str | None:
    """Why ``tok`` cannot be the export's tokenizer (its vocabularies are not the model's), or None."""
    if (tok.src_vocab_size, tok.tgt_vocab_size) != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        return (f"tokenizer vocabularies ({tok.src_vocab_size}, {tok.tgt_vocab_size}) do not match the model's "
                f"({cfg.src_vocab_size}, {cfg.tgt_vocab_size})")
    return None


EXPORT = HFExport("Marian", lambda cfg: "MarianMTModel", marian_incompatibilities,
                  lambda cfg, order: marian_config(cfg), lambda model, order: marian_state_dict(model),
                  write_tokenizer_files, tokenizer_problem, generation=generation_config)


ACTIVATIONS = {marian: ours for ours, marian in MARIAN_ACTIVATIONS.items()}
# MarianConfig keys whose non-default values transduce cannot express, and the default.
REFUSED = {"normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
           "layernorm_embedding": False, "static_position_embeddings": True}


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


def vocabularies(where: Path, config: dict) -> tuple[_Vocab, _Vocab]:
    """Each side's vocabulary: vocab.json, and target_vocab.json where they are separate."""
    src_vocab = _Vocab(read_json(where / "vocab.json"), where / "vocab.json")
    separate = (where / "target_vocab.json").is_file()
    if config.get("separate_vocabs") and not separate:
        raise HFImportError(f"{where}: separate_vocabs is set but there is no target_vocab.json")
    path = where / ("target_vocab.json" if separate else "vocab.json")
    return src_vocab, _Vocab(read_json(path), path, config.get("decoder_start_token_id"))


def marian_model_config(config: dict, where: Path, state, vocabs: tuple[_Vocab, _Vocab]) -> ModelConfig:
    """Our ModelConfig for a MarianConfig (as a dict) with these vocabularies."""
    name = where / "config.json"
    src_vocab, tgt_vocab = vocabs
    for ours, (enc, dec) in {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim")}.items():
        if config.get(enc) != config.get(dec):
            raise HFImportError(f"{name}: {enc}={config.get(enc)} and {dec}={config.get(dec)} differ "
                                    f"(transduce has one model.{ours})")
    activation = config.get("activation_function", "swish")
    if activation not in ACTIVATIONS:
        raise HFImportError(f"{name}: activation_function={activation!r} is not supported "
                                f"(one of {', '.join(ACTIVATIONS)})")
    for key, want in (("pad_token_id", tgt_vocab.pad), ("eos_token_id", tgt_vocab.eos),
                      ("vocab_size", len(src_vocab.pieces)),
                      ("decoder_vocab_size", len(tgt_vocab.pieces))):
        if config.get(key) not in (None, want):
            raise HFImportError(f"{name}: {key}={config[key]} but the vocabulary says {want}")
    shared = not (where / "target_vocab.json").is_file() and config.get("share_encoder_decoder_embeddings", True)
    return ModelConfig(
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


def our_state(state: dict[str, Tensor], cfg: ModelConfig, vocabs: tuple[_Vocab, _Vocab], where: Path
              ) -> dict[str, Tensor]:
    """Marian's tensors under our names: residual axes permuted back by P's inverse, vocabulary
    rows put in our order (:func:`marian_name_map`, the table the export
    reads the other way)."""
    src_order, tgt_order = vocabs[0].order, vocabs[1].order
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


def marian_tokenizer(where: Path, vocabs: tuple[_Vocab, _Vocab]) -> tuple[Tokenizer, dict[str, object]]:
    """Each side's SentencePiece model rewritten so that its piece ids are our ids; and how many
    pieces of the .spm files vocab.json lacks (``dropped_pieces``)."""
    protos, dropped = [], 0
    for spm_file, vocab in zip(("source.spm", "target.spm"), vocabs):
        proto, n = rewrite_spm(where / spm_file, vocab)
        protos.append(proto)
        dropped += n
    return Tokenizer(protos[0], protos[1], name=str(where)), {"dropped_pieces": dropped}


IMPORT = HFImport(vocabularies, marian_model_config, our_state, marian_tokenizer, lambda vocabs: "MarianMTModel",
                  lambda vocabs: (vocabs[0].order, vocabs[1].order), REFUSED,
                  "transduce's Marian layout is post-LN with sinusoidal positions and no embedding LayerNorm")
