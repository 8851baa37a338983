"""Export to ONNX, one graph per model part, each with an explicit KV cache where it decodes.

A translation model: an encoder graph and a one-step decoder graph.

``encoder.onnx``:  src (B, S) int64 -> cross_k_i, cross_v_i (B, H, S, Dh) for each decoder layer
                   (the encoder output is only ever used through these projections).
``decoder.onnx``:  tokens (B, 1) int64, src_mask (B, S) bool, self_k_i / self_v_i (B, H, t, Dh),
                   cross_k_i / cross_v_i -> logits (B, V), new_self_k_i / new_self_v_i (B, H, t+1, Dh).

Batch, source length and cache length are dynamic axes (up to the model's ``max_positions``,
whose position table is baked into the graphs); the first step passes a cache of length 0.
:func:`~transduce.inference.backends.onnx.open_graphs` presents them as the interface the searches
use, so the project's own greedy and beam search decode with them (``--backend onnx``).
The graphs come from ``torch.onnx.export(dynamo=True)`` (torch.export), which traces the
cache length as a symbolic size so positions, masks and T5's relative position bias (a gather
from its buckets x heads table by bucket indices computed from positions) stay correct at every
step.

A decoder-only (GPT) or encoder-only (BERT) model, imported ones included: one graph.

``lm.onnx`` (decoder_only): one decoding step with an explicit KV cache, as the translation
model's ``decoder.onnx``::

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

Legend: B batch, S source length, T length, t cached (target) positions, H heads, Dh head dim, V vocabulary,
K classes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..model import Transformer
from ..model.attention import KVCache, LayerCache
from ..model.transformer import EncoderOutput
from ..errors import one_line, require
from ..config import GenerationConfig, Runtime
from ..inference.backends.onnx import (DECODER_ONNX, ENCODER_ONNX, LM_ONNX, ONNX_META, GraphModel, OnnxEncoder, OnnxLM,
                                       io_names, open_graphs)
from ..inference.search.lm import generate_ids
from .base import ExportError, load_for_export, quiet_loggers
from .verify import Probe, Reference, check_against, default_probe, search_ids
from ..data.tokenizer import JOINT_MODEL, META_FILE, SIDE_MODELS

logger = logging.getLogger(__name__)

ENCODER, DECODER, META, LM = ENCODER_ONNX, DECODER_ONNX, ONNX_META, LM_ONNX
OPSET = 18


class EncoderGraph(nn.Module):
    """src (B, S) -> [cross_k_0, cross_v_0, ...], each (B, H, S, Dh)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(src).memory                             # (B, S, D)
        out: list[Tensor] = []
        for layer in self.model.decoder_layers:
            out.extend(layer.cross_attn.project_kv(memory))                # 2 x (B, H, S, Dh)
        return tuple(out)


class DecoderStepGraph(nn.Module):
    """One decoding step with flat cache tensors in and out (see the module docstring)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.n_layers = len(model.decoder_layers)

    def forward(self, tokens: Tensor, src_mask: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        n = self.n_layers
        self_kv, cross_kv = caches[: 2 * n], caches[2 * n:]
        layers = [LayerCache(self_kv[2 * i], self_kv[2 * i + 1], cross_kv[2 * i], cross_kv[2 * i + 1])
                  for i in range(n)]
        cache = KVCache(layers, length=self_kv[0].shape[2])              # symbolic t
        enc = EncoderOutput(memory=None, mask=src_mask[:, None, None, :])  # (B, 1, 1, S)
        out = self.model.decode(tokens, enc, cache)
        new = [t for c in out.cache.layers for t in (c.self_k, c.self_v)]
        return (out.logits[:, -1], *new)                                   # (B, V), 2n x (B, H, t+1, Dh)


def export_graph(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
                 dynamic_shapes: tuple) -> None:
    """torch.onnx.export with the dynamo exporter, quietly; ExportError with a one-line reason."""
    require("onnxscript", "export")
    try:
        # traced on SDPA's math kernel: the layout of its output is the one the exporter's
        # decomposition produces (on the CPU flash kernel's, a float mask such as T5's position
        # bias left a view of the heads' transposed output that the decomposition cannot take)
        with warnings.catch_warnings(), quiet_loggers("onnxscript", "onnx_ir", "torch.onnx", "torch.export"), \
                sdpa_kernel([SDPBackend.MATH]):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, args, dynamo=True, input_names=inputs, output_names=outputs,
                                        dynamic_shapes=dynamic_shapes, opset_version=OPSET, verbose=False)
        program.save(str(path), external_data=False)
    except Exception as e:  # the exporter raises many types; report the first line only
        raise ExportError(f"torch.onnx.export failed for {path.name}: {one_line(e)}") from None


def _example(model: Transformer, batch: int = 2, src_len: int = 5, past: int = 3) -> tuple:
    """Example inputs for tracing: a source batch and a decoder step with ``past`` cached positions."""
    cfg = model.config
    n, h, dh = len(model.decoder_layers), cfg.n_heads, cfg.d_head
    src = torch.full((batch, src_len), 5, dtype=torch.long)
    kv = lambda t: torch.zeros(batch, h, t, dh)  # noqa: E731
    caches = [kv(past) for _ in range(2 * n)] + [kv(src_len) for _ in range(2 * n)]
    step = (torch.full((batch, 1), 5, dtype=torch.long), torch.ones(batch, src_len, dtype=torch.bool), *caches)
    return src, step


def export_graphs(model: Transformer, out: Path) -> None:
    """Write encoder.onnx and decoder.onnx for ``model`` into ``out``."""
    Dim = torch.export.Dim
    n = len(model.decoder_layers)
    batch, src_len = Dim("batch", min=1, max=4096), Dim("src_len", min=1, max=model.config.max_positions)
    past = Dim("past_len", min=0, max=model.config.max_positions - 1)
    src, step = _example(model)
    cross = io_names(n, "cross")  # the graphs' I/O contract is written once, beside its runner
    export_graph(EncoderGraph(model), (src,), out / ENCODER, ["src"], cross, ({0: batch, 1: src_len},))
    caches = (*[{0: batch, 2: past}] * (2 * n), *[{0: batch, 2: src_len}] * (2 * n))
    shapes = ({0: batch}, {0: batch, 1: src_len}, caches)  # the varargs are one tuple
    export_graph(DecoderStepGraph(model), step, out / DECODER, ["tokens", "src_mask", *io_names(n, "self"), *cross],
                 ["logits", *io_names(n, "new_self")], shapes)


def _write_meta(model: Transformer, out: Path) -> None:
    cfg = model.config
    meta = dict(n_decoder_layers=len(model.decoder_layers), n_heads=cfg.n_heads, head_dim=cfg.d_head,
                pad_id=cfg.pad_id, bos_id=cfg.bos_id, eos_id=cfg.eos_id, tgt_vocab_size=cfg.tgt_vocab_size,
                max_positions=cfg.max_positions, opset=OPSET)
    (out / META).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def _copy_tokenizer(model_dir: str | os.PathLike, out: Path) -> None:

    for name in (META_FILE, JOINT_MODEL, *SIDE_MODELS.values()):
        if (Path(model_dir) / name).is_file():
            shutil.copy2(Path(model_dir) / name, out / name)


def export_onnx(model_dir: str | os.PathLike, out: Path) -> dict[str, object]:
    """Write the two graphs (+ config and tokenizer files) for ``model_dir`` into ``out``; verify."""
    require("onnx", "export")
    model, _ = load_for_export(model_dir, need_tokenizer=False)
    export_graphs(model, out)
    _write_meta(model, out)
    _copy_tokenizer(model_dir, out)
    return verify_onnx(model, out)


def onnx_graphs(model: Transformer, out: Path, threads: int | None = None) -> GraphModel:
    """The graphs in ``out`` (exported from ``model``) in ONNX Runtime, behind the searches' interface."""
    runtime = Runtime(device="cpu", backend="onnx", engines=str(out), threads=threads)
    return open_graphs(model.config, torch.device("cpu"), runtime)


@torch.no_grad()
def graph_step_logits(graphs: GraphModel, src: Tensor, tgt: Tensor) -> Tensor:
    """Teacher-forced logits of the graphs, one decoder step per target position. (B, S), (B, T) -> (B, T, V)."""
    enc, cache = graphs.encode(src), graphs.new_cache()
    return torch.cat([graphs.decode(tgt[:, t: t + 1], enc, cache).logits for t in range(tgt.shape[1])], dim=1)


class OnnxGraphs(Reference):
    """The graphs ``model`` was exported to in ``out``, in ONNX Runtime, as the reference of
    :func:`~.verify.check_against`: a translation model's step-by-step teacher-forced logits and
    greedy outputs (the project's own search over the graphs, as ``--backend onnx`` runs it); a
    language model's logits and greedy continuations (:func:`~transduce.inference.search.lm.generate_ids`
    over them); an encoder's head logits."""

    beams = (1,)

    def __init__(self, model: nn.Module, out: Path):
        self.family = fam = model.config.family
        self.runner = onnx_graphs(model, out) if fam.translates else OnnxLM(out) if fam.generates else OnnxEncoder(out)

    def outputs(self, probe: Probe) -> dict[str, Tensor]:
        if self.family.translates:
            return {"logits": graph_step_logits(self.runner, *probe.inputs)}
        if self.family.generates:
            return {"logits": self.runner.decode(probe.inputs[0]).logits}
        ids, types = probe.inputs
        got = self.runner.run(ids.numpy(), None if types is None else types.numpy())
        logits = torch.from_numpy(got["logits"])
        named = {"mlm_logits" if logits.dim() == 3 else "class_logits": logits}
        return {**named, **({"nsp_logits": torch.from_numpy(got["nsp_logits"])} if "nsp_logits" in got else {})}

    def search(self, src: Tensor, beam: int, max_len: int) -> list[list[int]]:
        return search_ids(self.runner, src, beam, max_len)

    def generate(self, prompts: Tensor, new: int) -> list[list[int]]:
        return generate_ids(self.runner, prompts, GenerationConfig(max_new_tokens=new, temperature=0))


def verify_onnx(model: nn.Module, out: Path) -> dict[str, object]:
    """The graphs in ``out`` in ONNX Runtime against the eager ``model`` on its probes."""
    return check_against(model, OnnxGraphs(model, out), default_probe(model), "ONNX Runtime")


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
    else:
        export_encoder_graph(model, out)
    return verify_onnx(model, out)
