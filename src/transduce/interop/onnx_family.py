"""Export a decoder-only (GPT) or encoder-only (BERT) model to ONNX, imported ones included.

``lm.onnx`` (decoder_only): one decoding step with an explicit KV cache, as the translation
model's ``decoder.onnx`` (:mod:`~transduce.interop.onnx_export`)::

    tokens (B, 1) int64, self_k_i / self_v_i (B, H, t, Dh) -> logits (B, V), new_self_k_i / new_self_v_i (B, H, t+1, Dh)

A prompt is fed a token at a time from an empty cache (t = 0), then each generated token.

``encoder.onnx`` (encoder_only): ids (B, T) int64 (and ``token_types`` (B, T) int64 where the
model has two or more token types; RoBERTa's single type is inside the graph) -> ``logits``: the
masked-LM logits (B, T, V) or the class logits (B, K); with a next-sentence head also
``nsp_logits`` (B, 2). Rows are right-padded with PAD, which no position attends to.

The graphs run in ONNX Runtime through :mod:`transduce.inference.backends.onnx`
(:class:`~transduce.inference.backends.onnx.OnnxLM`, the model interface generation uses, so the
verification's greedy continuations are :func:`~transduce.inference.search.lm.generate_ids` over
it; :class:`~transduce.inference.backends.onnx.OnnxEncoder`), as ``load(model_dir,
Runtime(backend="onnx", engines=...))`` runs them for :class:`~transduce.inference.Generator` and
:class:`~transduce.inference.Classifier`.

Legend: B batch, T length, t cached positions, H heads, Dh head dim, V vocabulary, K classes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import GenerationConfig
from ..errors import require
from ..inference.backends.onnx import ENCODER_ONNX, LM_ONNX, OnnxEncoder, OnnxLM, io_names
from ..model.attention import KVCache, LayerCache
from .base import load_for_export
from .onnx_export import META, OPSET, export_graph
from .verify import check_close

LM, ENCODER = LM_ONNX, ENCODER_ONNX


class LMStepGraph(nn.Module):
    """One step of a decoder-only model with flat cache tensors in and out (module docstring)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.n_layers = len(model.decoder_layers)

    def forward(self, tokens: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        layers = [LayerCache(caches[2 * i], caches[2 * i + 1]) for i in range(self.n_layers)]
        out = self.model.decode(tokens, KVCache(layers, length=caches[0].shape[2]))  # symbolic t
        return (out.logits[:, -1], *[t for c in out.cache.layers for t in (c.self_k, c.self_v)])


class EncoderOnlyGraph(nn.Module):
    """ids (B, T) [, token_types (B, T)] -> the head's logits [, next-sentence logits]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, token_types: Tensor | None = None) -> tuple[Tensor, ...]:
        states = self.model(ids, token_types)                                # (B, T, D)
        head = self.model.classify(states) if self.model.config.n_classes else self.model.mlm_logits(states)
        return (head, self.model.next_sentence_logits(states)) if self.model.config.nsp else (head,)


def _meta(model: nn.Module, out: Path, **extra) -> None:
    cfg = model.config
    meta = dict(arch=cfg.arch, n_heads=cfg.n_heads, head_dim=cfg.d_head, pad_id=cfg.pad_id, bos_id=cfg.bos_id,
                eos_id=cfg.eos_id, max_positions=cfg.max_positions, opset=OPSET, **extra)
    (out / META).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def export_lm_graph(model: nn.Module, out: Path) -> None:
    """Write ``lm.onnx`` and its onnx_config.json for the decoder-only ``model`` into ``out``."""
    Dim, cfg = torch.export.Dim, model.config
    n = len(model.decoder_layers)
    batch, past = Dim("batch", min=1, max=4096), Dim("past_len", min=0, max=cfg.max_positions - 1)
    kv = [torch.zeros(2, cfg.n_heads, 3, cfg.d_head) for _ in range(2 * n)]
    shapes = ({0: batch}, tuple({0: batch, 2: past} for _ in range(2 * n)))  # the varargs are one tuple
    export_graph(LMStepGraph(model), (torch.full((2, 1), 5, dtype=torch.long), *kv), out / LM,
                 ["tokens", *io_names(n, "self")], ["logits", *io_names(n, "new_self")], shapes)
    _meta(model, out, n_layers=n, vocab_size=cfg.tgt_vocab_size, never_generated=list(cfg.never_generated))


def export_encoder_graph(model: nn.Module, out: Path) -> None:
    """Write ``encoder.onnx`` and its onnx_config.json for the encoder-only ``model`` into ``out``."""
    Dim, cfg = torch.export.Dim, model.config
    batch, length = Dim("batch", min=1, max=4096), Dim("length", min=2, max=cfg.max_positions)
    types = cfg.type_vocab_size >= 2  # one type (RoBERTa): type 0 everywhere, inside the graph
    ids = torch.full((2, 5), 5, dtype=torch.long)
    args, inputs = ((ids, torch.zeros_like(ids)), ["ids", "token_types"]) if types else ((ids,), ["ids"])
    outputs = ["logits", "nsp_logits"] if cfg.nsp else ["logits"]
    export_graph(EncoderOnlyGraph(model), args, out / ENCODER, inputs, outputs, ({0: batch, 1: length},) * len(args))
    _meta(model, out, token_types=types, vocab_size=cfg.src_vocab_size, n_classes=cfg.n_classes, nsp=cfg.nsp,
          labels=list(cfg.labels))


def export_onnx_family(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write the graph (+ config and tokenizer files) of a decoder_only or encoder_only model; verify."""
    require("onnx", "export")
    model, tok = load_for_export(model_dir, need_tokenizer=False)
    if tok is not None:
        tok.save(out)
    if model.config.family.generates:
        export_lm_graph(model, out)
        return verify_onnx_lm(model, out)
    export_encoder_graph(model, out)
    return verify_onnx_encoder(model, out)


@torch.no_grad()
def verify_onnx_lm(model: nn.Module, out: Path, atol: float = 1e-4) -> dict[str, object]:
    """Teacher-forced logits on probe prompts within ``atol`` of ours; greedy continuations identical."""
    from ..inference.search.lm import generate_ids
    from .base import ExportError
    from .hf_gpt2 import probe_prompts

    cfg, runner = model.config, OnnxLM(out)
    prompts = probe_prompts(cfg, length=min(7, cfg.max_positions - 1))
    got = runner.decode(prompts).logits
    checks: dict[str, object] = {"max_logit_diff": check_close("ONNX Runtime logits", got, model(prompts), atol)}
    gen = GenerationConfig(max_new_tokens=min(12, cfg.max_positions - prompts.shape[1]), temperature=0)
    want = generate_ids(model, prompts, gen)
    differences = sum(a != b for a, b in zip(generate_ids(runner, prompts, gen), want))
    if differences:
        raise ExportError(f"verification failed: ONNX greedy output differs from ours in {differences} of "
                          f"{len(want)} probes")
    checks["greedy_differences"] = differences
    return checks


@torch.no_grad()
def verify_onnx_encoder(model: nn.Module, out: Path, atol: float = 1e-4) -> dict[str, object]:
    """The head's logits (and the next-sentence logits) on padded probes within ``atol`` of ours."""
    from .hf_bert import probe_inputs

    cfg = model.config
    ids, types = probe_inputs(cfg)
    got = OnnxEncoder(out).run(ids.numpy(), None if types is None else types.numpy())
    states = model(ids, types)
    head = model.classify(states) if cfg.n_classes else model.mlm_logits(states)
    name = "max_class_logit_diff" if cfg.n_classes else "max_logit_diff"
    checks: dict[str, object] = {name: check_close("ONNX Runtime logits", torch.from_numpy(got["logits"]), head, atol)}
    if cfg.nsp:
        checks["max_nsp_logit_diff"] = check_close("ONNX Runtime next-sentence logits",
                                                   torch.from_numpy(got["nsp_logits"]),
                                                   model.next_sentence_logits(states), atol)
    return checks
