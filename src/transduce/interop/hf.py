"""Export to a Hugging Face ``MarianMTModel`` directory (config, safetensors, tokenizer files).

Marian is the paper's post-LN Transformer with sinusoidal positions, so a transduce model with
those options maps onto it weight for weight, with one twist: our position table interleaves
sin and cos (dims 2i, 2i+1, Sec. 3.5) while Marian puts all sines first and all cosines second.
The Transformer is equivariant to a fixed permutation of the residual-stream channels, so we
permute every D-facing weight axis (embeddings, the input side of q/k/v/fc1 and the output
projection, the output side of out_proj/fc2, the LayerNorms) by ``P = [0, 2, 4, ..., 1, 3, ...]``;
Marian's own table then equals ours under ``P`` and the two models compute the same logits.
Head dimensions (q/k/v outputs) are not in the residual stream and stay as they are.

Options Marian cannot express (pre-LN, RoPE or learned positions, SwiGLU, bias-free layers, a
LayerNorm epsilon other than 1e-5, an odd D) are refused
with a one-line error naming the option.

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
from ..model import Transformer
from ..errors import require
from ..progress import progress_bar
from .base import ExportError, head_width_problems, load_for_export, no_progress_bars
from .verify import (LOGIT_TOL, check_close, check_same_outputs, eager_logits, search_ids, probe_sources,
                     probe_targets)

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


def check_marian_compatible(cfg: ModelConfig) -> None:
    """Raise ExportError naming the first option Marian cannot express."""
    problems = marian_incompatibilities(cfg)
    if problems:
        raise ExportError(f"cannot export to Hugging Face Marian: {'; '.join(problems)}")


def residual_permutation(d_model: int) -> Tensor:
    """P such that Marian channel c holds our channel P[c]: evens (sines), then odds (cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# The Marian mapping, read both ways (export: marian_state_dict; import: hf_import.our_marian_state):
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


def generation_config(cfg: ModelConfig):
    """Defaults for ``generate``: beam 4, never PAD or BOS (as our search), stop at K finished.

    HF divides scores by len ** length_penalty, not by the GNMT penalty we use; with
    ``length_penalty=0`` (our ``lenpen=0``) both rank hypotheses by their plain log-probability.
    """
    transformers = require("transformers", "export")
    return transformers.GenerationConfig(
        decoder_start_token_id=cfg.bos_id, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id,
        pad_token_id=cfg.pad_id, bad_words_ids=[[cfg.pad_id], [cfg.bos_id]], num_beams=4,
        early_stopping=True, length_penalty=0.6, max_length=min(512, cfg.max_positions),
    )


def write_tokenizer_files(model_dir: str | os.PathLike, tok, out: Path, max_len: int) -> None:
    """source.spm, target.spm, vocab.json (+ target_vocab.json) and tokenizer_config.json.

    Our SentencePiece ids are the model ids, so vocab.json maps each piece to its own id.
    """
    from ..data.tokenizer import JOINT_MODEL, SIDE_MODELS

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
              "model_max_length": max_len, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def export_hf(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write a MarianMTModel directory for ``model_dir`` into ``out`` and verify it."""
    transformers = require("transformers", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=True)
    cfg = model.config
    check_marian_compatible(cfg)
    if (tok.src_vocab_size, tok.tgt_vocab_size) != (cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise ExportError(f"{model_dir}: tokenizer vocabularies ({tok.src_vocab_size}, {tok.tgt_vocab_size}) "
                          f"do not match the model's ({cfg.src_vocab_size}, {cfg.tgt_vocab_size})")
    hf = transformers.MarianMTModel(marian_config(cfg))
    missing, unexpected = hf.load_state_dict(marian_state_dict(model), strict=False)
    if missing or unexpected:
        raise ExportError(f"Marian weight mapping is incomplete: missing {missing[:3]}, unexpected {unexpected[:3]}")
    hf.generation_config = generation_config(cfg)
    with no_progress_bars(transformers):
        hf.save_pretrained(out)
        write_tokenizer_files(model_dir, tok, out, min(512, cfg.max_positions))
        return verify_hf(model, out)


@torch.no_grad()
def verify_hf(model: Transformer, out: Path, atol: float = LOGIT_TOL) -> dict[str, object]:
    """Reload ``out`` with transformers; compare logits, greedy and beam outputs to eager."""
    transformers = require("transformers", "export")
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    src = probe_sources(model)
    tgt = probe_targets(model, src.shape[0])
    mask = src != model.config.pad_id
    with progress_bar(3, unit="checks", desc="verifying") as bar:
        got = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        want = eager_logits(model, src, tgt)
        checks: dict[str, object] = {"max_logit_diff": check_close("Marian logits", got, want, atol)}
        bar.update()
        max_len = 12
        for beam in (1, 4):
            want = search_ids(model, src, beam, max_len)
            got_ids = marian_generate_ids(hf, src, model.config.pad_id, beam, max_len)
            name = "greedy" if beam == 1 else "beam"
            checks[f"{name}_differences"] = check_same_outputs(f"Marian {name}", model, src, want, got_ids,
                                                               beam=beam > 1)
            bar.update()
    return checks


def marian_generate_ids(hf, src: Tensor, pad_id: int, beam: int, max_len: int) -> list[list[int]]:
    """``hf.generate``'s greedy (beam 1) or beam output ids for id rows ``src`` (B, S), as our
    search decodes: length penalty 0, stopping at ``beam`` finished, ``max_len`` tokens at most."""
    options = dict(length_penalty=0.0, early_stopping=True) if beam > 1 else {}
    gen = hf.generate(input_ids=src, attention_mask=(src != pad_id).long(), num_beams=beam,
                      max_length=max_len + 1, do_sample=False, **options)  # max_length counts the decoder start
    return [row[1:].tolist() for row in gen]  # without the decoder start token


def opus_mt_layout(hf_dir: str | os.PathLike, out: str | os.PathLike, separate_vocabs: bool = False) -> Path:
    """Our Marian export ``hf_dir`` (our ids: pad 0, bos 1, eos 2, unk 3) re-laid out as the
    OPUS-MT models are: ``</s>`` 0, ``<unk>`` 1, the other pieces in order, then ``<pad>`` last,
    which is also the decoder start and takes our BOS row (one row fewer). What ``transduce
    import`` reads; the benchmarks and tests make OPUS-MT-like models from trained ones with it.
    ``separate_vocabs`` writes a target_vocab.json and gives the decoder embeddings of its own."""
    import shutil

    transformers = require("transformers", "export")
    hf_dir, out = Path(hf_dir), Path(out)
    shutil.copytree(hf_dir, out)
    vocab = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
    pieces = sorted(vocab, key=vocab.get)
    ours = [2, 3] + list(range(4, len(pieces))) + [1]                     # our id of each Marian id
    marian = {pieces[i] if i != 1 else "<pad>": m for m, i in enumerate(ours)}
    for name in ("vocab.json",) + (("target_vocab.json",) if separate_vocabs else ()):
        (out / name).write_text(json.dumps(marian, ensure_ascii=False), encoding="utf-8")
    with no_progress_bars(transformers):
        model = transformers.MarianMTModel.from_pretrained(hf_dir)
    state = model.state_dict()
    index = torch.tensor(ours)
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight"):
        state[name] = state[name][index].clone()
    state["final_logits_bias"] = state["final_logits_bias"][:, index]
    pad = len(ours) - 1
    config = model.config.to_dict()
    config.update(vocab_size=len(ours), decoder_vocab_size=len(ours), pad_token_id=pad, eos_token_id=0,
                  decoder_start_token_id=pad, bos_token_id=None, forced_eos_token_id=0)
    if separate_vocabs:
        config.update(share_encoder_decoder_embeddings=False, separate_vocabs=True)
    relaid = transformers.MarianMTModel(transformers.MarianConfig(**config))
    relaid.load_state_dict(state, strict=False)
    relaid.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=0, bad_words_ids=[[pad]], num_beams=4,
        max_length=512)
    for stale in out.glob("model*.safetensors"):
        stale.unlink()
    with no_progress_bars(transformers):
        relaid.save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}), encoding="utf-8")
    return out
