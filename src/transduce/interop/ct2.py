"""Export to CTranslate2 by filling a ``ctranslate2.specs.TransformerSpec`` from our weights.

We build the spec directly rather than going through the Hugging Face Marian converter: that
converter assumes OPUS-MT's conventions (PAD as decoder start, a zero start embedding), and
CTranslate2's own spec covers every transduce option (pre-/post-LN, learned, sinusoidal or
rotary positions, GELU/SwiGLU/GEGLU, bias-free layers, untied embeddings, heads of
``model.head_dim``, and T5's options: relative attention bias, RMSNorm, unscaled scores, the
output rescale). As in CTranslate2's own converters, parameter names are the contract, mapped by
one small function per layer.

CTranslate2 fuses the self-attention q/k/v projections into one matrix and the cross-attention
k/v into another. Our sinusoidal table is stored in the model (``position_encodings``), so its
sin/cos interleaving needs no translation. The source side gets EOS appended by CTranslate2
(``add_source_eos``), so callers pass plain SentencePiece pieces.

Legend: D d_model, V vocabulary.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import ModelConfig
from ..model import Transformer
from ..model.layers import GATED
from ..errors import require
from .base import ExportError, load_for_export
from .verify import Probe, Reference, check_against, probe_sources, search_ids

logger = logging.getLogger(__name__)

INT8_LOGPROB_TOL = 0.5  # int8 is not expected to match float32 closely; this catches breakage


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def set_linear(spec, layer: nn.Linear) -> None:
    spec.weight = as_numpy(layer.weight)
    if layer.bias is not None:
        spec.bias = as_numpy(layer.bias)


def set_fused(spec, layers: list[nn.Linear]) -> None:
    """Concatenate linears along the output axis (CTranslate2's fused q/k/v or k/v)."""
    spec.weight = np.concatenate([as_numpy(layer.weight) for layer in layers])
    if layers[0].bias is not None:
        spec.bias = np.concatenate([as_numpy(layer.bias) for layer in layers])


def set_norm(spec, norm: nn.LayerNorm | nn.RMSNorm) -> None:
    spec.gamma = as_numpy(norm.weight)
    if isinstance(norm, nn.LayerNorm):  # (an RMSNorm spec has a scale only)
        # CTranslate2 LayerNorms always have a beta; a bias-free one is a zero beta.
        spec.beta = as_numpy(norm.bias) if norm.bias is not None else np.zeros_like(spec.gamma)


def set_self_attention(spec, attn: nn.Module, norm: nn.LayerNorm) -> None:
    set_fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    set_linear(spec.linear[1], attn.out_proj)
    set_norm(spec.layer_norm, norm)


def set_cross_attention(spec, attn: nn.Module, norm: nn.LayerNorm) -> None:
    set_linear(spec.linear[0], attn.q_proj)
    set_fused(spec.linear[1], [attn.k_proj, attn.v_proj])
    set_linear(spec.linear[2], attn.out_proj)
    set_norm(spec.layer_norm, norm)


def set_ffn(spec, ffn: nn.Module, norm: nn.LayerNorm) -> None:
    # SwiGLU: silu(fc1 x) * fc_gate x -> CTranslate2's activated linear_0 and plain linear_0_noact.
    set_linear(spec.linear_0, ffn.fc1)
    set_linear(spec.linear_1, ffn.fc2)
    if ffn.fc_gate is not None:
        set_linear(spec.linear_0_noact, ffn.fc_gate)
    set_norm(spec.layer_norm, norm)


def set_encoder_layer(spec, layer: nn.Module) -> None:
    set_self_attention(spec.self_attention, layer.self_attn, layer.norm1)
    set_ffn(spec.ffn, layer.ffn, layer.norm2)


def set_decoder_layer(spec, layer: nn.Module) -> None:
    set_self_attention(spec.self_attention, layer.self_attn, layer.norm1)
    set_cross_attention(spec.attention, layer.cross_attn, layer.norm2)
    set_ffn(spec.ffn, layer.ffn, layer.norm3)


def set_inputs(spec, embed: nn.Module, cfg: ModelConfig) -> None:
    """Token embeddings, the sqrt(D) scale and the position table (none for RoPE or a relative bias)."""
    emb = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    emb.weight = as_numpy(embed.tokens.weight)
    spec.scale_embeddings = cfg.scale_embeddings
    if cfg.positions == "relative":  # the bias lives in the self-attention specs (set_attention_options)
        return
    if cfg.positions == "rope":
        # The encoder spec declares a position table even with rotary attention; drop it.
        if hasattr(spec, "position_encodings"):
            delattr(spec, "position_encodings")
    else:
        spec.position_encodings.encodings = as_numpy(embed.positions(0, cfg.max_positions))


def ct2_activation(cfg: ModelConfig):
    Activation = require("ctranslate2.specs.common_spec", "export").Activation
    return {"relu": Activation.RELU, "gelu": Activation.GELU, "gelu_tanh": Activation.GELUTanh,
            "silu": Activation.SWISH, "swiglu": Activation.SWISH, "geglu": Activation.GELUTanh}[cfg.activation]


def set_attention_options(stack, bias: nn.Module | None, cfg: ModelConfig) -> None:
    """T5's options on one stack's attention specs: the relative position bias (buckets x heads),
    one table shared by every self-attention of the stack (as CTranslate2's T5 converter shares
    it), and unscaled scores (``model.scale_attention: false``)."""
    shared = None if bias is None else (as_numpy(bias.weight), np.dtype("int32").type(cfg.relative_max_distance))
    for spec in stack.layer:
        if shared is not None:
            spec.self_attention.relative_attention_bias, spec.self_attention.relative_attention_max_distance = shared
        if not cfg.scale_attention:
            for attention in (spec.self_attention, getattr(spec, "attention", None)):
                if attention is not None:
                    attention.queries_scale = np.float32(1.0)


def transformer_spec(model: Transformer):
    """A filled ``TransformerSpec`` (no vocabulary yet) for ``model``."""
    ts = require("ctranslate2.specs.transformer_spec", "export")
    cfg = model.config
    rope = dict(rotary_dim=0, rotary_interleave=False, rotary_base=cfg.rope_base) if cfg.positions == "rope" else {}
    common = dict(pre_norm=cfg.norm == "pre", activation=ct2_activation(cfg), ffn_glu=cfg.activation in GATED,
                  head_dim=cfg.head_dim, relative_attention_bias=cfg.positions == "relative",
                  rms_norm=cfg.norm_kind == "rms", **rope)
    encoder = ts.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_heads, **common)
    decoder = ts.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, **common)
    set_inputs(encoder, model.src_embed, cfg)
    set_inputs(decoder, model.tgt_embed, cfg)
    for spec, layer in zip(encoder.layer, model.encoder_layers):
        set_encoder_layer(spec, layer)
    for spec, layer in zip(decoder.layer, model.decoder_layers):
        set_decoder_layer(spec, layer)
    if cfg.norm == "pre":
        set_norm(encoder.layer_norm, model.encoder_norm)
        set_norm(decoder.layer_norm, model.decoder_norm)
    set_attention_options(encoder, model.encoder_bias, cfg)
    set_attention_options(decoder, model.decoder_bias, cfg)
    if cfg.scale_output:  # T5's d_model^-0.5 before the tied output projection
        decoder.scale_outputs = np.float32(model.output_scale)
    set_linear(decoder.projection, model.output_proj)
    if not cfg.bos_in_softmax:  # BOS is no output class (an imported T5): a bias of -inf leaves it out
        bias = np.zeros(cfg.tgt_vocab_size, dtype=np.float32)
        bias[cfg.bos_id] = -np.inf
        decoder.projection.bias = bias
    spec = ts.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    return spec


def _configure(spec, tok, cfg) -> None:
    """Vocabularies (our pieces, by id) and the special tokens CTranslate2 must know: the pieces of
    the model's BOS and EOS ids and the tokenizer's UNK, read, never assumed."""
    spec.register_source_vocabulary(tok.pieces(range(tok.src_vocab_size), "src"))
    spec.register_target_vocabulary(tok.pieces(range(tok.tgt_vocab_size), "tgt"))
    bos, eos, unk = tok.pieces([cfg.bos_id, cfg.eos_id, tok.unk_id], "tgt")
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = unk, bos, eos
    spec.config.decoder_start_token = bos
    spec.config.add_source_eos = True


def export_ctranslate2(model_dir: str | os.PathLike, out: Path, quantization: str | None = None) -> dict[str, object]:
    """Write a CTranslate2 model for ``model_dir`` into ``out`` and verify it.

    Args:
        quantization: None (float32) or "int8" (weights stored in int8).
    """
    require("ctranslate2", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=True)
    for key in ("n_encoder_layers", "n_decoder_layers"):
        if getattr(model.config, key) == 0:
            raise ExportError(f"cannot export to CTranslate2: model.{key}=0 (it needs at least one layer)")
    if model.config.embed_norm:  # an imported mBART's layernorm_embedding: not written into the spec yet
        raise ExportError("model.embed_norm: the CTranslate2 export of an encoder-decoder with an embedding "
                          "LayerNorm (mBART) is not written yet")
    spec = transformer_spec(model)
    _configure(spec, tok, model.config)
    try:
        spec.validate()
        spec.optimize(quantization=quantization or "float32")
    except (ValueError, TypeError) as e:
        raise ExportError(f"CTranslate2 rejected the model spec: {e}") from None
    spec.save(str(out))
    return verify_ctranslate2(model, tok, out, quantization)


def ct2_translate_ids(translator, tok, src, beam: int, max_len: int, lenpen: float = 0.0) -> list[list[int]]:
    """Run ``translator`` on id rows (tokens + EOS, padded) and return output ids (EOS appended)."""
    sources = [tok.pieces([i for i in row.tolist() if i not in (tok.pad_id, tok.eos_id)], "src") for row in src]
    # CTranslate2's default min_decoding_length is 1; ours (min_len) is 0.
    results = translator.translate_batch(
        sources, beam_size=beam, max_decoding_length=max_len, min_decoding_length=0, length_penalty=lenpen,
        suppress_sequences=[["<pad>"], ["<s>"]], return_end_token=True)
    vocab = {p: i for i, p in enumerate(tok.pieces(range(tok.tgt_vocab_size), "tgt"))}
    return [[vocab[p] for p in r.hypotheses[0]] for r in results]


def ct2_log_probs(translator, tok, src, tgt_ids: list[list[int]]) -> list[float]:
    """CTranslate2's log P(target | source) per sentence, targets as ids (EOS included if present).

    ``score_batch`` always scores an EOS after the target; it is left out for targets that
    have none (a hypothesis cut at the length limit), so both sides sum the same tokens.
    """
    sources = [tok.pieces([i for i in row.tolist() if i not in (tok.pad_id, tok.eos_id)], "src") for row in src]
    targets = [tok.pieces([i for i in t if i != tok.eos_id], "tgt") for t in tgt_ids]
    results = translator.score_batch(sources, targets)
    return [sum(r.log_probs[: len(t)]) for r, t in zip(results, tgt_ids)]


class CT2Translator(Reference):
    """The exported model in ``ctranslate2.Translator``: the sequence log-probs of a probe's targets
    (it gives no logits) and its searches, which end a sentence once its best extension ended (our
    "best_finished") and leave PAD and BOS out of the softmax (``suppress_sequences``)."""

    stop, renormalized = "best_finished", True

    def __init__(self, translator, tok, beams: tuple[int, ...]):
        self.translator, self.tok, self.beams = translator, tok, beams

    def outputs(self, probe: Probe) -> dict[str, torch.Tensor]:
        return {"sequence_logprobs": torch.tensor(ct2_log_probs(self.translator, self.tok, probe.inputs[0],
                                                                probe.targets))}

    def search(self, src, beam: int, max_len: int) -> list[list[int]]:
        return ct2_translate_ids(self.translator, self.tok, src, beam, max_len)


@torch.no_grad()
def verify_ctranslate2(model: Transformer, tok, out: Path, quantization: str | None) -> dict[str, object]:
    """Load ``out``; compare the log-probs of our greedy outputs and greedy/beam outputs with the
    eager model (int8: the log-probs loosely, and how often the greedy outputs agree)."""
    ctranslate2 = require("ctranslate2", "export")
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="default", intra_threads=1)
    src = probe_sources(model)
    greedy = search_ids(model, src, 1, 12)
    tol = INT8_LOGPROB_TOL * max(1, len(max(greedy, key=len))) if quantization else 1e-3
    reference = CT2Translator(translator, tok, () if quantization else (1, 4))
    checks = check_against(model, reference, Probe((src,), targets=greedy), "CTranslate2", tol)
    if quantization:  # int8 outputs may legitimately differ; report how often they agree
        got_ids = ct2_translate_ids(translator, tok, src, 1, 12)
        checks["greedy_agreement"] = sum(a == b for a, b in zip(greedy, got_ids)) / len(greedy)
    return checks
