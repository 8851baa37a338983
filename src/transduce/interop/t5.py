"""T5 (Raffel et al., 2020, https://arxiv.org/abs/1910.10683) and mT5 as Hugging Face writes them,
both ways: the config and weight mapping between our :class:`~transduce.model.Transformer` with
T5's options and ``T5ForConditionalGeneration`` (one table, :func:`name_map`), read by the export
(:data:`EXPORT`) and the import (:data:`IMPORT`, from a ``model_type`` t5 or mt5 directory:
config.json, model.safetensors or pytorch_model.bin, spiece.model).

T5 is our pre-norm encoder-decoder with RMSNorm (``norm_kind: rms``), no biases, no scaling of
the scores (``scale_attention: false``) or of the embeddings, relative position bias
(``positions: relative``), ReLU (T5 1.0) or GEGLU (T5 1.1, mT5: ``gated-gelu``), one embedding
for both stacks and a tied output projection with the d_model^-0.5 rescale (T5 1.0) or an untied
one (T5 1.1, mT5). Weights map one for one; only the vocabulary order differs. A model trained
here with the paper's scales (``scale_embeddings``, with an untied output; ``scale_attention``)
exports with them folded into the embedding and the query weights.

Vocabulary. transduce fixes pad 0, bos 1, eos 2, unk 3, with bos the decoder's first input; T5
has pad 0, eos 1, unk 2 and starts decoding from ``decoder_start_token_id`` (pad). Our ids are
T5's reordered, ``order[i]`` being the T5 id of our id i::

    ours 0 <pad> = T5 pad     ours 1 <s> = T5 decoder start (its row; pad in T5 and mT5)
    ours 2 </s>  = T5 eos     ours 3 <unk> = T5 unk     ours 4.. = every other T5 id in order

so a T5 whose decoder start is its pad gains one row, which the imported model leaves out of its
softmax (``model.bos_in_softmax: false``: log-probabilities and beam search as T5's). Such a
model exports in T5's ids again (the row dropped, decoding from pad); any other keeps our ids
(its decoder start is our bos). Either way exporting and importing again gives the same ids.

Import. The config maps onto our Transformer with T5's options (above): relu or
gated-gelu, tied (with the output rescale) or untied. The vocabulary is reordered to our fixed
special ids (above), and the tokenizer is T5's
SentencePiece model rewritten so that its piece ids are ours, the sentinels ``<extra_id_N>``
(``extra_ids`` of tokenizer_config.json, 100 by default, the last ids of T5's tokenizer in
reverse order) kept as pieces that segmentation produces whole; ids of the embedding beyond the
tokenizer (T5 rounds its vocabulary up to a multiple of 128) become unused pieces.

An attention width ``num_heads * d_kv`` other than ``d_model`` (T5 1.1 small, mT5 small: 6 or 8
heads of 64 over 512) becomes ``model.head_dim: d_kv``. Not supported (one-line errors): another
``feed_forward_proj``, different encoder and decoder ids.

Legend: D d_model, H heads, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from ..data.tokenizer import Tokenizer
from ..errors import one_line, require
from ..model import Transformer
from .hf import HFExport, HFImport, HFImportError, generation_config, read_json, rewrite_spm
from .verify import probe_sources
from ..data.spm_model import model_type

logger = logging.getLogger(__name__)

# T5Config's feed_forward_proj -> our activation, and back
ACTIVATIONS = {"relu": "relu", "gated-gelu": "geglu"}
FFN_PROJ = {ours: hf for hf, ours in ACTIVATIONS.items()}


def t5_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that T5ForConditionalGeneration cannot express, one phrase each."""
    wants = {"arch": "encoder_decoder", "norm": "pre", "norm_kind": "rms", "positions": "relative", "bias": False,
             "share_embeddings": True, "output_bias": False}
    problems = [f"model.{k}={getattr(cfg, k)} (T5 has {k}={v})" for k, v in wants.items() if getattr(cfg, k) != v]
    if cfg.scale_embeddings and cfg.tie_output:  # (an untied head lets the scale fold into T5's embedding)
        problems.append("model.scale_embeddings=True with a tied output (T5 scales neither its embedding nor "
                        "the tied output by sqrt(d_model))")
    if cfg.activation not in FFN_PROJ:
        problems.append(f"model.activation={cfg.activation} (T5 has relu or geglu)")
    return problems


def hf_t5_config(cfg: ModelConfig) -> dict[str, object]:
    """The T5Config keys of our ``cfg`` (with our special ids: decoding starts from our bos)."""
    return dict(
        model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=cfg.tgt_vocab_size,
        d_model=cfg.d_model, d_kv=cfg.d_head, d_ff=cfg.d_ff, num_layers=cfg.n_encoder_layers,
        num_decoder_layers=cfg.n_decoder_layers, num_heads=cfg.n_heads,
        relative_attention_num_buckets=cfg.relative_buckets, relative_attention_max_distance=cfg.relative_max_distance,
        dropout_rate=cfg.dropout, layer_norm_epsilon=cfg.layer_norm_eps, feed_forward_proj=FFN_PROJ[cfg.activation],
        # (transformers reads tie_word_embeddings, or since v5 scale_decoder_outputs, as "rescale";
        # an lm_head.weight unlike the embedding is kept untied)
        is_encoder_decoder=True, tie_word_embeddings=cfg.scale_output, scale_decoder_outputs=cfg.scale_output,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id, decoder_start_token_id=cfg.bos_id)


def _layer_names(stack: str, cross: bool, gated: bool) -> dict[str, str]:
    """Our parameter (under ``{stack}_layers.i.``) -> T5's (under ``{stack}.block.i.``)."""
    names = {"norm1.weight": "layer.0.layer_norm.weight"}
    for ours, hf in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
        names[f"self_attn.{ours}.weight"] = f"layer.0.SelfAttention.{hf}.weight"
        if cross:
            names[f"cross_attn.{ours}.weight"] = f"layer.1.EncDecAttention.{hf}.weight"
    ffn = "layer.2" if cross else "layer.1"
    if cross:
        names["norm2.weight"] = "layer.1.layer_norm.weight"
    names[f"norm{3 if cross else 2}.weight"] = f"{ffn}.layer_norm.weight"
    names["ffn.fc2.weight"] = f"{ffn}.DenseReluDense.wo.weight"
    if gated:
        names["ffn.fc1.weight"] = f"{ffn}.DenseReluDense.wi_0.weight"
        names["ffn.fc_gate.weight"] = f"{ffn}.DenseReluDense.wi_1.weight"
    else:
        names["ffn.fc1.weight"] = f"{ffn}.DenseReluDense.wi.weight"
    return names


def name_map(cfg: ModelConfig) -> dict[str, str]:
    """Every one of our parameters but the vocabulary-sized ones -> its T5 name."""
    gated = cfg.activation in ("geglu", "swiglu")
    names = {"encoder_bias.weight": "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             "decoder_bias.weight": "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             "encoder_norm.weight": "encoder.final_layer_norm.weight",
             "decoder_norm.weight": "decoder.final_layer_norm.weight"}
    for stack, n, cross in (("encoder", cfg.n_encoder_layers, False), ("decoder", cfg.n_decoder_layers, True)):
        for i in range(n):
            for ours, hf in _layer_names(stack, cross, gated).items():
                names[f"{stack}_layers.{i}.{ours}"] = f"{stack}.block.{i}.{hf}"
    return names


def hf_t5_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our weights under T5's names, in our id order (the export's; T5 ties embed_tokens to shared).
    The paper's scales, which T5 does not apply, are folded into the weights: sqrt(d_model) into
    the embedding (``scale_embeddings``, with an untied output) and 1/sqrt(d_head) into every
    query projection (``scale_attention``: T5 folds it into their initialisation)."""
    cfg = model.config
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    q_scale = cfg.d_head ** -0.5 if cfg.scale_attention else 1.0
    state = {hf: (ours[k] * q_scale if k.endswith("attn.q_proj.weight") else ours[k]).contiguous()
             for k, hf in name_map(cfg).items()}
    rows = t5_rows(cfg)
    shared = ours["src_embed.tokens.weight"][rows]
    state["shared.weight"] = shared * model.src_embed.tokens.scale  # sqrt(d_model) with scale_embeddings, else 1
    state["lm_head.weight"] = ours["output_proj.weight"][rows].clone()  # (a copy: safetensors stores no shared tensors)
    return state


def t5_rows(cfg: ModelConfig) -> Tensor:
    """Our ids in the exported model's order: all of them, or without bos where it is pad's row
    again (``bos_in_softmax`` false: an imported T5, exported in T5's ids)."""
    ids = torch.arange(cfg.tgt_vocab_size)
    return ids if cfg.bos_in_softmax else ids[ids != cfg.bos_id]


def t5_order(cfg: ModelConfig) -> Tensor:
    """The exported model's id of each of our ids (bos: pad's, where it is not exported)."""
    order = torch.empty(cfg.tgt_vocab_size, dtype=torch.long)
    rows = t5_rows(cfg)
    order[rows] = torch.arange(len(rows))
    if not cfg.bos_in_softmax:
        order[cfg.bos_id] = order[cfg.pad_id]
    return order


def t5_view(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with the exported model's vocabulary size and special ids (decoding from pad where
    bos is not exported), for the config files."""
    if cfg.bos_in_softmax:
        return cfg
    order = t5_order(cfg)
    n = cfg.tgt_vocab_size - 1
    return dataclasses.replace(cfg, src_vocab_size=n, tgt_vocab_size=n, pad_id=int(order[cfg.pad_id]),
                               bos_id=int(order[cfg.pad_id]), eos_id=int(order[cfg.eos_id]), bos_in_softmax=True)


def our_t5_state(state: dict[str, Tensor], cfg: ModelConfig, order: Tensor, where: Path | None = None
                 ) -> dict[str, Tensor]:
    """T5's tensors (of the directory ``where``) under our names, vocabulary rows put in our order."""
    def get(name: str) -> Tensor:
        if name not in state:
            raise HFImportError(f"{where}: T5 weights lack tensor {name}")
        return state[name]

    ours = {k: get(hf) for k, hf in name_map(cfg).items()}
    shared = state["shared.weight"] if "shared.weight" in state else get("encoder.embed_tokens.weight")
    ours["src_embed.tokens.weight"] = shared[order]
    if not cfg.tie_output:
        ours["output_proj.weight"] = get("lm_head.weight")[order]
    return {k: v.float().contiguous() for k, v in ours.items()}


def tokenizer_problem(tok, cfg: ModelConfig) -> str | None:
    """Why ``tok`` cannot be T5's tokenizer (one SentencePiece unigram model of the model's ids), or None."""

    proto = tok.protos[0]
    if not tok.joint or model_type(proto) != "unigram" or tok.src_vocab_size != cfg.tgt_vocab_size:
        return (f"T5's tokenizer is one SentencePiece unigram model of the model's {cfg.tgt_vocab_size} ids; this "
                f"one is {'joint' if tok.joint else 'separate'}, {model_type(proto)}, {tok.src_vocab_size} ids")
    return None


def write_tokenizer(model_dir: Path, tok, out: Path, cfg: ModelConfig, order: Tensor) -> None:
    """spiece.model (in the exported ids) and tokenizer_config.json naming the sentinels."""
    proto = tok.protos[0]
    (out / "spiece.model").write_bytes(proto if cfg.bos_in_softmax else _without_bos(proto, cfg))
    sentinels = [p for p in tok.pieces(range(cfg.tgt_vocab_size)) if p.startswith("<extra_id_")]
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "additional_special_tokens": sentinels,
         "model_max_length": cfg.max_positions}, indent=1), encoding="utf-8")


def tokenizer_checks(model: Transformer, tok, out: Path, hf, order: Tensor) -> dict[str, object]:
    """``tokenizer_differences``: texts (our decoding of the probe sources) that transformers'
    tokenizer on ``out`` reads into other ids than ours (+ EOS; ``order``: the exported id of each of ours)."""
    hf_tok = require("transformers", "export").AutoTokenizer.from_pretrained(out)
    differ = 0
    for row in probe_sources(model).tolist():
        text = tok.decode(row, "src")
        differ += hf_tok(text)["input_ids"] != order[tok.encode(text, "src") + [model.config.eos_id]].tolist()
    return {"tokenizer_differences": differ}


# (T5's config is written as it is: transformers would tie its lm_head to the embedding)
EXPORT = HFExport("T5", lambda cfg: "T5ForConditionalGeneration", t5_incompatibilities,
                  lambda cfg, order: hf_t5_config(t5_view(cfg)), lambda model, order: hf_t5_state_dict(model),
                  write_tokenizer, tokenizer_problem, lambda cfg, tok: t5_order(cfg),
                  lambda cfg: generation_config(t5_view(cfg)), checks=tokenizer_checks)


def _without_bos(proto: bytes, cfg: ModelConfig) -> bytes:
    """Our SentencePiece model in T5's ids: bos's piece dropped, the special ids renumbered."""
    pb = require("sentencepiece.sentencepiece_model_pb2", "export")
    model = pb.ModelProto()
    model.ParseFromString(proto)
    del model.pieces[cfg.bos_id]
    order, spec = t5_order(cfg), model.trainer_spec
    unk = spec.unk_id
    spec.pad_id, spec.eos_id, spec.bos_id = int(order[cfg.pad_id]), int(order[cfg.eos_id]), -1
    spec.unk_id = int(order[unk])
    return model.SerializeToString()


SPIECE = "spiece.model"


class T5Vocab:
    """T5's ids (config.json's ``vocab_size`` rows of its embedding): its pieces in id order
    (SentencePiece's, then the sentinels, then unused rows up to the embedding's size) and
    ``order``, the T5 id of each of our ids."""

    def __init__(self, where: Path, config: dict):
        sp = require("sentencepiece", "export", "transduce import")
        path = where / SPIECE
        if not path.is_file():
            raise HFImportError(f"{path}: not found (a T5 directory's SentencePiece tokenizer)")
        n_rows = int(config["vocab_size"])
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


def t5_model_config(config: dict, where: Path, state: dict[str, Tensor], vocab: T5Vocab) -> ModelConfig:
    """Our ModelConfig for a T5Config / MT5Config (as a dict); a decoder that starts from PAD
    makes our BOS PAD's row again and no class of T5's output."""
    name = where / "config.json"
    tied, n_ids, start_is_pad = _is_tied(state), len(vocab.order), vocab.start == vocab.pad
    proj = config.get("feed_forward_proj", "relu" if config["model_type"] == "t5" else "gated-gelu")
    if proj not in ACTIVATIONS:
        raise HFImportError(f"{name}: feed_forward_proj={proj!r} is not supported (one of {', '.join(ACTIVATIONS)})")
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


def _is_tied(state: dict[str, Tensor]) -> bool:
    """Whether the output projection is the embedding: no lm_head.weight, or an equal one."""
    head, shared = state.get("lm_head.weight"), state.get("shared.weight")
    return head is None or (shared is not None and torch.equal(head, shared))


def t5_tokenizer(where: Path, vocab: T5Vocab) -> tuple[Tokenizer, dict]:
    """spiece.model rewritten so that its ids are ours, the sentinels segmented whole."""
    pb = require("sentencepiece.sentencepiece_model_pb2", "export", "transduce import")
    rewritten, _ = rewrite_spm(where / SPIECE, vocab)
    proto = pb.ModelProto()
    proto.ParseFromString(rewritten)
    for piece in proto.pieces:
        if piece.piece.startswith("<extra_id_"):
            piece.type = pb.ModelProto.SentencePiece.USER_DEFINED
    return Tokenizer(proto.SerializeToString(), name=str(where)), {}


IMPORT = HFImport(T5Vocab, t5_model_config,
                  lambda state, cfg, vocab, where: our_t5_state(state, cfg, vocab.order, where), t5_tokenizer,
                  lambda vocab: "AutoModelForSeq2SeqLM", lambda vocab: (vocab.order, vocab.order))
