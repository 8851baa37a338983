"""Export a decoder-only model to a Hugging Face ``GPT2LMHeadModel`` directory (config, safetensors).

GPT-2 (Radford et al., 2019) is our :class:`~transduce.model.DecoderOnlyLM` with pre-LN blocks,
learned positions, the tanh GELU, biases, a tied output projection and unscaled embeddings;
a model with exactly those options maps onto it weight for weight. GPT-2's linear layers are
``Conv1D`` (weights stored (in, out), the transpose of ``nn.Linear``) and its attention projects
q, k, v with one ``c_attn`` of width 3D: our three projections side by side. Our tokenizer files
are copied alongside (ids are the model's; GPT-2's byte-level BPE tokenizer is not ours).

Legend: D d_model, V vocabulary, P max_positions.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import GenerationConfig, ModelConfig
from ..data.hf_tokenizer import HFTokenizer
from ..errors import require
from ..inference.search.lm import generate_ids
from .base import ExportError, head_width_problems, load_for_export, no_progress_bars
from .verify import N_SPECIAL, check_close


# Texts a byte-level BPE tokenizer must split as transformers does: spaces, tabs, accents, CJK,
# emoji, a control character, empty and blank lines.
SAMPLE_TEXT = ["A dog runs across the grass.", "Zwei Männer  sitzen\tauf einer Bank.", "", "  ",
               "Café naïve 東京 👍🏽 \x07", "line one\n\nline three"]


def gpt2_incompatibilities(cfg: ModelConfig) -> list[str]:
    """The options of ``cfg`` that GPT2LMHeadModel cannot express, one phrase each."""
    wants = {"norm": "pre", "positions": "learned", "activation": "gelu_tanh", "bias": True, "tie_output": True,
             "scale_embeddings": False}
    return ([f"model.{k}={getattr(cfg, k)} (GPT-2 has {k}={v})" for k, v in wants.items() if getattr(cfg, k) != v]
            + head_width_problems(cfg, "GPT-2"))


# The GPT-2 mapping, read both ways (export: gpt2_state_dict; import: hf_gpt2_import.our_gpt2_state):
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


def export_hf_gpt2(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write a GPT2LMHeadModel directory for the decoder-only ``model_dir`` into ``out``, verified."""
    transformers = require("transformers", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=False)
    cfg = model.config
    problems = gpt2_incompatibilities(cfg)
    if problems:
        raise ExportError(f"cannot export to Hugging Face GPT-2: {'; '.join(problems)}")
    if cfg.activation_dropout:
        raise ExportError(f"cannot export to Hugging Face GPT-2: model.activation_dropout={cfg.activation_dropout} "
                          "(GPT-2 has no dropout inside its MLP)")
    hf = transformers.GPT2LMHeadModel(gpt2_config(cfg))
    missing, unexpected = hf.load_state_dict(gpt2_state_dict(model), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to transformer.wte.weight
    if missing or unexpected:
        raise ExportError(f"GPT-2 weight mapping is incomplete: missing {missing[:3]}, unexpected {unexpected[:3]}")
    hf.tie_weights()
    hf.generation_config = transformers.GenerationConfig(
        bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
        suppress_tokens=list(cfg.never_generated), do_sample=False)  # as our generate: never PAD or BOS
    with no_progress_bars(transformers):
        hf.save_pretrained(out)
        if tok is not None:
            copy_tokenizer(Path(model_dir), out, tok)
        checks = verify_hf_gpt2(model, out)
        if tok is not None and isinstance(tok, HFTokenizer):  # an imported tokenizer: transformers reads it too
            checks["tokenizer_differences"] = hf_tokenizer_differences(tok, out)
        return checks


def copy_tokenizer(model_dir: Path, out: Path, tok, tokenizer_class: str = "GPT2Tokenizer") -> None:
    """Our tokenizer files beside the export (``load_tokenizer`` works on ``out``); a Hugging Face
    one (byte-level BPE, WordPiece) also with the files AutoTokenizer reads, naming its special
    tokens and ``tokenizer_class``."""
    for f in model_dir.iterdir():
        if f.is_file() and (f.suffix in (".model", ".yaml") or f.name == "tokenizer.json") and f.name != "config.yaml":
            shutil.copy2(f, out / f.name)
    if isinstance(tok, HFTokenizer):
        names = {f"{role}_token": token for role, token in tok.tokens.items()}
        prefix = {"add_prefix_space": False} if tok.kind == "byte_level_bpe" else {}
        config = {"tokenizer_class": tokenizer_class, **prefix, **names}
        (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
        (out / "special_tokens_map.json").write_text(json.dumps(names, ensure_ascii=False), encoding="utf-8")


def hf_tokenizer_differences(tok: HFTokenizer, out: Path, error=ExportError) -> int:
    """How many of a few hard texts AutoTokenizer on ``out`` splits differently from ``tok``
    (a one-line ``error`` if any)."""
    auto = require("transformers", "export").AutoTokenizer.from_pretrained(out)
    bad = [t for t in SAMPLE_TEXT if auto(t, add_special_tokens=False)["input_ids"] != tok.encode(t)]
    if bad:
        raise error(f"verification failed: AutoTokenizer on {out} splits {bad[0]!r} differently from ours")
    return 0


def probe_prompts(cfg: ModelConfig, batch: int = 6, length: int = 7, seed: int = 0) -> Tensor:
    """BOS + random ordinary tokens, all of one length. (B, length)."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(N_SPECIAL, cfg.tgt_vocab_size, (batch, length - 1), generator=g)
    return torch.cat([torch.full((batch, 1), cfg.bos_id), body], dim=1)


@torch.no_grad()
def verify_hf_gpt2(model: nn.Module, out: Path, atol: float = 1e-4) -> dict[str, object]:
    """Reload ``out`` with transformers; compare logits and greedy continuations with ours."""
    transformers = require("transformers", "export")
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    cfg = model.config
    prompts = probe_prompts(cfg, length=min(7, cfg.max_positions - 1))
    got = hf(input_ids=prompts, attention_mask=torch.ones_like(prompts)).logits   # (B, T, V)
    checks: dict[str, object] = {"max_logit_diff": check_close("GPT-2 logits", got, model(prompts), atol)}
    new = min(12, cfg.max_positions - prompts.shape[1])
    want = generate_ids(model, prompts, GenerationConfig(max_new_tokens=new, temperature=0))
    gen = hf.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new,
                      do_sample=False)
    got = [_until_eos(row[prompts.shape[1]:].tolist(), cfg.eos_id) for row in gen]
    differences = sum(a != b for a, b in zip(got, want))
    if differences:
        raise ExportError(f"verification failed: GPT-2 greedy output differs from ours in {differences} of "
                          f"{len(want)} probes")
    checks["greedy_differences"] = differences
    return checks


def _until_eos(row: list[int], eos: int) -> list[int]:
    return row[:row.index(eos)] if eos in row else row
