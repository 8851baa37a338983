"""GPT-2 (Radford et al., 2019) as Hugging Face writes it, both ways: our
:class:`~transduce.model.DecoderOnlyLM` with GPT-2's options and ``GPT2LMHeadModel``, one
parameter table (:data:`GPT2_NORMS`, :data:`GPT2_CONV1D`) read by the export
(:data:`EXPORT`: config, safetensors) and the import (:data:`IMPORT`, a ``model_type: gpt2``
directory).

GPT-2 is our decoder-only model with pre-LN blocks, learned positions, the tanh GELU, biases, a
tied output projection and unscaled embeddings; a model with exactly those options maps onto it
weight for weight. GPT-2's linear layers are
``Conv1D`` (weights stored (in, out), the transpose of ``nn.Linear``) and its attention projects
q, k, v with one ``c_attn`` of width 3D: our three projections side by side. Our tokenizer files
are copied alongside (ids are the model's; GPT-2's byte-level BPE tokenizer is not ours).

Import. The same table read the other way (``c_attn`` split, each Conv1D transposed back). GPT-2
options transduce cannot express (an untied head, attention scaled by the inverse layer index, no
scaling) are one-line errors naming the key.

Tokenizer. GPT-2's byte-level BPE ``tokenizer.json`` is carried verbatim
(:class:`~transduce.data.hf_tokenizer.HFTokenizer`), and its ids are the model's: no reordering
(unlike Marian's). ``<|endoftext|>`` is bos, eos and pad at once, as in GPT-2. GPT-2's tokenizer
does not put it before a text (``add_bos_token`` false), so ``tokenizer.yaml`` records that and
:class:`~transduce.inference.Generator` prompts the import without it, as transformers does.

Verified before anything is written: logits within 1e-4 of transformers' on a probe batch, greedy
continuations identical on 100 prompts (:data:`IMPORT_PROMPTS`, through
:func:`~transduce.inference.search.lm.generate_ids`, the code ``transduce generate`` runs), ids
identical to ``AutoTokenizer``'s on sample text, and BOS first or not as ``AutoTokenizer`` puts it.

Legend: D d_model, V vocabulary, P max_positions.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..data.hf_tokenizer import HFTokenizer
from ..errors import require
from .base import head_width_problems
from .hf import HFExport, HFImport, HFImportError, copy_tokenizer, hf_tokenizer_differences
from .verify import Probe, probe_prompts

logger = logging.getLogger(__name__)

def gpt2_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that GPT2LMHeadModel cannot express, one phrase each."""
    wants = {"norm": "pre", "positions": "learned", "activation": "gelu_tanh", "bias": True, "tie_output": True,
             "scale_embeddings": False}
    dropout = [f"model.activation_dropout={cfg.activation_dropout} (GPT-2 has no dropout inside its MLP)"]
    return ([f"model.{k}={getattr(cfg, k)} (GPT-2 has {k}={v})" for k, v in wants.items() if getattr(cfg, k) != v]
            + head_width_problems(cfg, "GPT-2") + (dropout if cfg.activation_dropout else []))


# The GPT-2 mapping, read both ways (export: gpt2_state_dict; import: our_gpt2_state):
# a block's LayerNorms by name, and each Conv1D (weight (in, out), bias (out,)) as our nn.Linear
# layers side by side in its output columns (c_attn is q, k and v at once).
GPT2_NORMS = {"ln_1": "norm1", "ln_2": "norm3"}
GPT2_CONV1D = {"attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "attn.c_proj": ("self_attn.out_proj",), "mlp.c_fc": ("ffn.fc1",), "mlp.c_proj": ("ffn.fc2",)}


def gpt2_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Our weights under GPT2LMHeadModel's parameter names (:data:`GPT2_NORMS`, :data:`GPT2_CONV1D`)."""
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    state = {"transformer.wte.weight": ours["tgt_embed.tokens.weight"],                 # (V, D)
             "transformer.wpe.weight": ours["tgt_embed.positions.weight"],              # (P, D)
             "transformer.ln_f.weight": ours["decoder_norm.weight"], "transformer.ln_f.bias": ours["decoder_norm.bias"]}
    for i in range(len(model.decoder_layers)):
        p, q = f"transformer.h.{i}", f"decoder_layers.{i}"
        for theirs, mine in GPT2_NORMS.items():
            for leaf in ("weight", "bias"):
                state[f"{p}.{theirs}.{leaf}"] = ours[f"{q}.{mine}.{leaf}"]
        for theirs, parts in GPT2_CONV1D.items():
            state[f"{p}.{theirs}.weight"] = torch.cat([ours[f"{q}.{part}.weight"] for part in parts]).t()  # (in, out)
            state[f"{p}.{theirs}.bias"] = torch.cat([ours[f"{q}.{part}.bias"] for part in parts])
    return {k: v.float().contiguous() for k, v in state.items()}


def gpt2_config(cfg: ModelConfig):
    """The GPT2Config of the same shape (``gelu_new`` is GPT-2's tanh GELU)."""
    transformers = require("transformers", "export")
    return transformers.GPT2Config(
        vocab_size=cfg.tgt_vocab_size, n_positions=cfg.max_positions, n_embd=cfg.d_model,
        n_layer=cfg.n_decoder_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function="gelu_new",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention_dropout,
        layer_norm_epsilon=cfg.layer_norm_eps, tie_word_embeddings=True,
        bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
    )


def write_tokenizer(model_dir: Path, tok, out: Path, cfg: ModelConfig, order) -> None:
    """Our tokenizer files beside the export, if the model has a tokenizer."""
    if tok is not None:
        copy_tokenizer(model_dir, out, tok)


def export_checks(model, tok, out: Path, hf, order) -> dict[str, object]:
    """An imported tokenizer (transformers reads it too) splits sample text as ours."""
    return {"tokenizer_differences": hf_tokenizer_differences(tok, out)} if isinstance(tok, HFTokenizer) else {}


EXPORT = HFExport(
    "GPT-2", lambda cfg: "GPT2LMHeadModel", gpt2_incompatibilities, lambda cfg, order: gpt2_config(cfg),
    lambda model, order: gpt2_state_dict(model), write_tokenizer,
    generation=lambda cfg: require("transformers", "export").GenerationConfig(
        bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
        suppress_tokens=list(cfg.never_generated), do_sample=False),  # as our generate: never PAD or BOS
    tied=("lm_head.weight",), checks=export_checks)  # (lm_head.weight: tied to transformer.wte.weight)


ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "silu": "silu"}
# GPT2Config keys whose non-default values transduce cannot express, and the default.
REFUSED = {"scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "tie_word_embeddings": True,
           "add_cross_attention": False}


def gpt2_model_config(config: dict, where: Path, state, tokenizer: HFTokenizer) -> ModelConfig:
    """The :class:`ModelConfig` of a GPT2Config dict; a one-line error for what we cannot express."""
    act = config.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise HFImportError(f"{where / 'config.json'}: activation_function={act!r} is not supported "
                            f"(one of {sorted(ACTIVATIONS)})")
    vocab, d = int(config["vocab_size"]), int(config["n_embd"])
    if tokenizer.vocab_size > vocab:
        raise HFImportError(f"{where}: tokenizer.json has {tokenizer.vocab_size} tokens, more than the model's "
                            f"vocab_size={vocab}")
    eos, bos, pad = (config.get(f"{role}_token_id") for role in ("eos", "bos", "pad"))
    return ModelConfig(
        arch="decoder_only", src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, n_heads=int(config["n_head"]),
        n_encoder_layers=0, n_decoder_layers=int(config["n_layer"]), d_ff=int(config.get("n_inner") or 4 * d),
        max_positions=int(config["n_positions"]), norm="pre", positions="learned",
        activation=ACTIVATIONS[act], scale_embeddings=False, tie_output=True, bias=True,
        dropout=float(config.get("resid_pdrop", 0.1)), attention_dropout=float(config.get("attn_pdrop", 0.1)),
        layer_norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        bos_id=tokenizer.bos_id if bos is None else int(bos), eos_id=tokenizer.eos_id if eos is None else int(eos),
        pad_id=tokenizer.pad_id if pad is None else int(pad))


def _linear(state: dict[str, Tensor], name: str, ours: list[str], where: Path) -> dict[str, Tensor]:
    """A GPT-2 Conv1D (weight (in, out), bias (out,)) as nn.Linear(s) of equal widths: ``ours``
    are their names, side by side in the Conv1D's output columns."""
    try:
        weight, bias = state[f"{name}.weight"], state[f"{name}.bias"]
    except KeyError as e:
        raise HFImportError(f"{where}: GPT-2 weights lack tensor {e.args[0]}") from None
    if weight.dim() != 2 or weight.shape[1] % len(ours) or bias.shape != weight.shape[1:]:
        raise HFImportError(f"{where}: {name}.weight has shape {tuple(weight.shape)}, not (in, {len(ours)} x out)")
    out = {}
    for part, w, b in zip(ours, weight.t().chunk(len(ours)), bias.chunk(len(ours))):  # (out, in) each
        out[f"{part}.weight"], out[f"{part}.bias"] = w.contiguous(), b.contiguous()
    return out


def our_gpt2_state(state: dict[str, Tensor], cfg: ModelConfig, tokenizer, where: Path) -> dict[str, Tensor]:
    """GPT2LMHeadModel (or GPT2Model) weights under our parameter names."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    head = state.pop("lm_head.weight", None)
    if head is not None and "wte.weight" in state and not torch.equal(head, state["wte.weight"]):
        raise HFImportError(f"{where}: lm_head.weight differs from transformer.wte.weight (an untied head is "
                            "not supported)")
    ours = {"tgt_embed.tokens.weight": state.get("wte.weight"), "tgt_embed.positions.weight": state.get("wpe.weight"),
            "decoder_norm.weight": state.get("ln_f.weight"), "decoder_norm.bias": state.get("ln_f.bias")}
    missing = [k for k, v in ours.items() if v is None]
    if missing:
        raise HFImportError(f"{where}: GPT-2 weights lack the tensor for {missing[0]}")
    for i in range(cfg.n_decoder_layers):  # the export's table, read the other way
        p, q = f"h.{i}", f"decoder_layers.{i}"
        for theirs, mine in GPT2_NORMS.items():
            for kind in ("weight", "bias"):
                ours[f"{q}.{mine}.{kind}"] = state.get(f"{p}.{theirs}.{kind}")
        for theirs, parts in GPT2_CONV1D.items():
            ours.update(_linear(state, f"{p}.{theirs}", [f"{q}.{part}" for part in parts], where))
    missing = [k for k, v in ours.items() if v is None]
    if missing:
        raise HFImportError(f"{where}: GPT-2 weights lack the tensor for {missing[0]}")
    extra = sorted(k for k in state if k.startswith("h.") and int(k.split(".")[1]) >= cfg.n_decoder_layers)
    if extra:
        raise HFImportError(f"{where}: weights hold {extra[0]}, beyond the config's n_layer={cfg.n_decoder_layers}")
    return ours


IMPORT_PROMPTS = 100  # greedy continuations compared with transformers' on an import


def import_probe(model) -> Probe:
    """Logits on 6 prompts of 7 tokens, greedy continuations of :data:`IMPORT_PROMPTS` of 5."""
    cfg = model.config
    return Probe((probe_prompts(cfg, length=max(2, min(7, cfg.max_positions - 1))),),
                 prompts=probe_prompts(cfg, batch=IMPORT_PROMPTS, length=max(2, min(5, cfg.max_positions - 1)), seed=1))


def import_checks(where: Path, tokenizer: HFTokenizer, ours) -> dict[str, object]:
    """Identical tokenization, BOS first or not included (and how many prompts were continued)."""
    return {"greedy_prompts": IMPORT_PROMPTS,
            "tokenizer_differences": hf_tokenizer_differences(tokenizer, where, HFImportError),
            "add_bos_token": check_bos_first(tokenizer, where)}


def check_bos_first(tokenizer: HFTokenizer, where: Path) -> bool:
    """``tokenizer.add_bos_token``, checked against whether ``AutoTokenizer`` on ``where`` puts BOS
    before a text (a one-line HFImportError if they differ: our prompts would not be transformers')."""
    auto = require("transformers", "export", "transduce import").AutoTokenizer.from_pretrained(where)
    theirs = auto("a")["input_ids"][:1] == [tokenizer.bos_id]
    if theirs != tokenizer.add_bos_token:
        raise HFImportError(f"verification failed: AutoTokenizer on {where} {'puts' if theirs else 'does not put'} "
                            f"BOS before a text, unlike ours (add_bos_token={tokenizer.add_bos_token})")
    return theirs



IMPORT = HFImport(lambda where, config: HFTokenizer.from_hf_dir(where), gpt2_model_config, our_gpt2_state,
                  lambda where, tok: (tok, {}), lambda tok: "GPT2LMHeadModel", lambda tok: None, REFUSED,
                  "transduce's GPT has", probe=import_probe, checks=import_checks)
