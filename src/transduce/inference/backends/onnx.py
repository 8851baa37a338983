"""Search over exported graphs: the encoder and one-step decoder graphs that ``transduce export
--format onnx`` writes (:mod:`transduce.interop.onnx`), run by ONNX Runtime on the CPU or,
built into engines by ``--format tensorrt``, by TensorRT on a GPU (:mod:`.tensorrt`).

:class:`GraphModel` presents them as the interface every search uses
(:class:`~transduce.inference.search.common.Seq2Seq`: ``encode``, ``decode`` one step with a KV
cache, ``new_cache``, ``output_proj``), so greedy search, beam search, n-best lists, length
penalties, prefixes and the rest run unchanged over them (nothing of the search is written
again). The graphs' I/O contract, shared by both runtimes (:class:`Steps`):

``encoder``:  src (B, S) int64 -> cross_k_i, cross_v_i (B, H, S, Dh) for each decoder layer i.
``decoder``:  tokens (B, 1) int64, src_mask (B, S) bool, self_k_i / self_v_i (B, H, t, Dh),
              cross_k_i / cross_v_i -> logits (B, V), new_self_k_i / new_self_v_i (B, H, t+1, Dh).

The decoder graph ends in the output projection, so ``decode`` returns the logits as its
"states" and ``output_proj`` is the identity. Cross-attention keys/values are kept per decoder
row in the cache (a sentence's beams hold equal rows), because the graphs take one row per row.

Legend: B sentences, N decoder rows (B * beams), S source length, t cached positions, H heads,
Dh head dim, V target vocabulary.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch
from torch import Tensor, nn

from ...config import Runtime
from ...errors import CheckpointError, ConfigError, require
from ...model.transformer import DecoderOutput
from .tensorrt import TrtSteps, check_can_run

ENCODER_ONNX, DECODER_ONNX, ONNX_META = "encoder.onnx", "decoder.onnx", "onnx_config.json"
LM_ONNX = "lm.onnx"  # a decoder-only model's one step (a language model's)
# What the exported graphs' onnx_config.json must agree on with the model directory's config.
_SAME = (("n_heads", "n_heads"), ("head_dim", "d_head"), ("tgt_vocab_size", "tgt_vocab_size"),
         ("pad_id", "pad_id"), ("bos_id", "bos_id"), ("eos_id", "eos_id"))


def io_names(n_layers: int, prefix: str) -> list[str]:
    """The graphs' names of ``n_layers`` layers' key/value tensors: prefix_k_0, prefix_v_0, ..."""
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("k", "v")]


class Steps(Protocol):
    """What runs the two graphs (ONNX Runtime or TensorRT), torch tensors in and out."""

    max_rows: int | None       # rows one call takes at most (None: no limit); GraphModel splits larger batches
    max_src: int               # source positions the graphs take at most
    max_cache: int             # cached target positions a decoder step takes at most

    def encode(self, src: Tensor) -> list[Tensor]: ...

    def step(self, feeds: dict[str, Tensor]) -> list[Tensor]: ...


def ort_sessions(root: Path, threads: int | None = None, what: str | None = None,
                 names: tuple[str, ...] = (ENCODER_ONNX, DECODER_ONNX)) -> tuple:
    """ONNX Runtime CPU sessions of the exported graphs ``names`` in ``root`` (default: the
    encoder and decoder graphs)."""
    ort = require("onnxruntime", "export", what)
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    return tuple(ort.InferenceSession(str(root / name), opts, providers=providers) for name in names)


class OrtSteps:
    """The graphs in ONNX Runtime's CPU provider (torch CPU tensors in and out, numpy between)."""

    def __init__(self, root: Path, meta: dict, threads: int | None = None):
        self.encoder, self.decoder = ort_sessions(root, threads, "backend onnx")
        self.max_rows, self.max_src, self.max_cache = None, meta["max_positions"], meta["max_positions"] - 1

    def encode(self, src: Tensor) -> list[Tensor]:
        return [torch.from_numpy(a) for a in self.encoder.run(None, {"src": src.contiguous().numpy()})]

    def step(self, feeds: dict[str, Tensor]) -> list[Tensor]:
        out = self.decoder.run(None, {name: t.contiguous().numpy() for name, t in feeds.items()})
        return [torch.from_numpy(a) for a in out]


@dataclass
class GraphEncoderOutput:
    """The source mask and the cross-attention keys/values the encoder graph gave, one row per sentence."""

    mask: Tensor          # (B, S) bool: True = a real source token
    cross: list[Tensor]   # 2 x layers of (B, H, S, Dh)

    def index_select(self, index: Tensor) -> "GraphEncoderOutput":
        return GraphEncoderOutput(self.mask.index_select(0, index), [c.index_select(0, index) for c in self.cross])


@dataclass
class GraphCache:
    """Per decoder row: the self-attention keys/values so far, the source mask and the
    cross-attention keys/values (taken from the encoder output at the first step). The
    interface of :class:`~transduce.model.attention.KVCache` that searches use: ``reorder``."""

    self_kv: list[Tensor] | None = None   # 2 x layers of (N, H, t, Dh)
    mask: Tensor | None = None            # (N, S)
    cross: list[Tensor] | None = None     # 2 x layers of (N, H, S, Dh)
    length: int = 0

    def reorder(self, index: Tensor, cross: Tensor | bool = True) -> "GraphCache":
        """A cache of rows ``index`` (N',) of this one. ``cross`` False promises that ``index``
        only permutes beams of one sentence, whose source rows are equal: when the row count is
        unchanged they stay as they are; otherwise (and for True, or a tensor of kept
        sentences) the source rows follow ``index``, since they are kept per row."""
        self_kv = None if self.self_kv is None else [t.index_select(0, index) for t in self.self_kv]
        if self.mask is None or (cross is False and index.numel() == self.mask.shape[0]):
            return GraphCache(self_kv, self.mask, self.cross, self.length)
        return GraphCache(self_kv, self.mask.index_select(0, index), [c.index_select(0, index) for c in self.cross],
                          self.length)


class GraphModel(nn.Module):
    """The exported graphs as a :class:`~transduce.inference.search.common.Seq2Seq` (see the module doc).

    Args:
        steps: what runs the graphs (:class:`OrtSteps`, :class:`~.tensorrt.TrtSteps`).
        config: the model directory's :class:`~transduce.config.ModelConfig`.
        n_layers, n_heads, head_dim: the decoder's shape, from the graphs' onnx_config.json.
    """

    def __init__(self, steps: Steps, config, n_layers: int, n_heads: int, head_dim: int):
        super().__init__()
        self.steps, self.config = steps, config
        self.shape = (n_heads, head_dim)
        self.self_names, self.cross_names = io_names(n_layers, "self"), io_names(n_layers, "cross")

    def encode(self, src: Tensor, need_weights: bool = False) -> GraphEncoderOutput:
        """Run the encoder graph. (B, S) -> :class:`GraphEncoderOutput`."""
        if src.shape[1] > self.steps.max_src:
            raise ConfigError(f"decode.max_input_len: a source of {src.shape[1]} tokens is longer than the exported "
                              f"graphs take ({self.steps.max_src}); lower max_input_len or use backend torch")
        cross = self._by_rows(lambda feeds: self.steps.encode(feeds["src"]), {"src": src})
        return GraphEncoderOutput(src != self.config.pad_id, cross)

    def new_cache(self) -> GraphCache:
        return GraphCache()

    def decode(self, tgt: Tensor, enc: GraphEncoderOutput, cache: GraphCache | None = None,
               need_weights: bool = False, project: bool = True) -> DecoderOutput:
        """One decoder step of every row: tgt (N, 1) -> states = logits (N, 1, V); ``cache`` is
        extended in place (as the model's own)."""
        if cache is None or tgt.shape[1] != 1 or need_weights:
            raise ConfigError("runtime.backend: the exported graphs decode one token a step with a cache and record "
                              "no attention; use backend torch for scoring, attention and alignments")
        if cache.mask is None:  # the first step: one row per sentence
            cache.mask, cache.cross = enc.mask, enc.cross
        if cache.self_kv is None:
            empty = cache.cross[0].new_zeros(tgt.shape[0], self.shape[0], 0, self.shape[1])  # (N, H, 0, Dh)
            cache.self_kv = [empty] * len(self.self_names)
        if cache.self_kv[0].shape[2] > self.steps.max_cache:
            raise ConfigError(f"decode.max_len_a/max_len_b: outputs longer than {self.steps.max_cache + 1} tokens do "
                              "not fit the exported graphs; lower the output limit (or rebuild the engines after "
                              "raising the model's saved one)")
        feeds = {"tokens": tgt, "src_mask": cache.mask, **dict(zip(self.self_names, cache.self_kv)),
                 **dict(zip(self.cross_names, cache.cross))}
        logits, *new = self._by_rows(self.steps.step, feeds)               # (N, V), 2 x layers of (N, H, t+1, Dh)
        cache.self_kv = new
        cache.length += 1
        states = logits.float()[:, None]                                   # (N, 1, V)
        return DecoderOutput(states, states if project else None, cache)

    def output_proj(self, states: Tensor) -> Tensor:
        """The identity: the decoder graph's outputs are already logits."""
        return states

    def _by_rows(self, run: Callable[[dict[str, Tensor]], list[Tensor]], feeds: dict[str, Tensor]) -> list[Tensor]:
        """``run(feeds)``, in chunks of at most ``steps.max_rows`` rows (the engines' profile)
        when there are more, their outputs joined: every row is computed on its own, so a
        batch or beam larger than the engines take gives what one call would."""
        rows, limit = next(iter(feeds.values())).shape[0], self.steps.max_rows
        if limit is None or rows <= limit:
            return run(feeds)
        parts = [run({name: t[i: i + limit] for name, t in feeds.items()}) for i in range(0, rows, limit)]
        return [torch.cat(outs, dim=0) for outs in zip(*parts)]


def read_graph_meta(root: str | os.PathLike, config, backend: str) -> dict:
    """The exported graphs' onnx_config.json in ``root``, after a one-line error unless it is
    there and describes a model of ``config``'s shape and vocabulary."""
    path = Path(root) / ONNX_META
    if not path.is_file():
        raise CheckpointError(f"{root}: no exported graphs ({ONNX_META}); write them with transduce export MODEL_DIR "
                              f"--format {backend} --out {root}")
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("arch", "encoder_decoder") != config.arch:
        raise CheckpointError(f"{root}: the graphs are of a model.arch={meta.get('arch', 'encoder_decoder')} model; "
                              f"the model directory's is {config.arch}: export this model")
    vocab = getattr(config, config.family.vocab)
    for key, field in _SAME:
        if key not in meta and not config.family.translates:
            continue  # a language model's or encoder's graphs record their vocabulary as vocab_size
        if meta.get(key) != getattr(config, field):
            raise CheckpointError(f"{root}: the graphs are of another model ({key} {meta.get(key)}, the model "
                                  f"directory's {field} is {getattr(config, field)}); export this model")
    if meta.get("vocab_size", vocab) != vocab:
        raise CheckpointError(f"{root}: the graphs are of another model (vocab_size {meta['vocab_size']}, the model "
                              f"directory's is {vocab}); export this model")
    return meta


def open_graphs(config, device: torch.device, runtime: Runtime) -> nn.Module:
    """The exported graphs of ``runtime.engines`` for a model of ``config``, on ``device``, as
    ``runtime.backend`` says: ONNX Runtime (CPU, fp32) or TensorRT engines (CUDA, at the
    precision they were built for). A translation model's graphs as a :class:`GraphModel`; a
    language model's as an :class:`OnnxLM`, a classifier's as an :class:`OnnxClassifier` (ONNX
    Runtime only)."""
    backend = runtime.backend
    fam = config.family
    runnable = fam.translates or (backend == "onnx" and (fam.generates or bool(config.labels)))
    if not runnable:
        what = "translation, language and classifier models" if backend == "onnx" else "translation models"
        masked_lm = fam.masked_lm and not config.labels
        raise ConfigError(f"runtime.backend: {backend} runs {what}; this one is a model.arch={config.arch} model"
                          f"{' without labels (a masked LM)' if masked_lm else ''}")
    if backend == "onnx" and device.type != "cpu":
        raise ConfigError(f"runtime.backend: onnx runs ONNX Runtime on the CPU; got device {device} (use backend "
                          "tensorrt on a GPU)")
    if backend == "tensorrt":
        check_can_run(device)  # what is missing (a GPU, the package) before what is wrong
    meta = read_graph_meta(runtime.engines, config, backend)
    if backend == "onnx":
        if runtime.precision != "fp32":
            raise ConfigError(f"runtime.precision: the ONNX graphs compute in fp32; got {runtime.precision}")
        if not fam.translates:
            return OnnxLM(runtime.engines, runtime.threads) if fam.generates else \
                OnnxClassifier(runtime.engines, config, runtime.threads)
        steps: Steps = OrtSteps(Path(runtime.engines), meta, runtime.threads)
    else:
        steps = TrtSteps.open(Path(runtime.engines), device, runtime.precision)
    return GraphModel(steps, config, meta["n_decoder_layers"], meta["n_heads"], meta["head_dim"])


@dataclass(frozen=True)
class LMGraphConfig:
    """What generation reads of a model's config, from the graph's onnx_config.json."""

    pad_id: int
    bos_id: int
    eos_id: int
    max_positions: int


class OnnxLM(nn.Module):
    """``lm.onnx`` in ONNX Runtime as a decoder-only model for generation (module docstring):
    ``decode`` feeds the step graph a token at a time, its logits the states.

    Examples:
        >>> lm = OnnxLM("exported/onnx")                                  # doctest: +SKIP
        >>> gen = GenerationConfig(max_new_tokens=5, temperature=0)
        >>> generate_ids(lm, torch.tensor([[1, 57, 12]]), gen)            # doctest: +SKIP
        [[31, 8, 44, 9, 17]]
    """

    def __init__(self, directory: str | os.PathLike, threads: int | None = None):
        super().__init__()
        root = Path(directory)
        self.meta = json.loads((root / ONNX_META).read_text(encoding="utf-8"))
        (self.session,) = ort_sessions(root, threads, names=(LM_ONNX,))
        m = self.meta
        self.config = LMGraphConfig(m["pad_id"], m["bos_id"], m["eos_id"], m["max_positions"])
        self.names = io_names(m["n_layers"], "self")

    def new_cache(self) -> GraphCache:
        return GraphCache()

    def decode(self, tgt: Tensor, cache: GraphCache | None = None, project: bool = True) -> DecoderOutput:
        """tgt (B, T) after the ``cache`` (extended in place; None: an empty one) -> states =
        logits (B, T, V)."""
        cache = GraphCache() if cache is None else cache
        if cache.self_kv is None:
            m = self.meta
            cache.self_kv = [torch.zeros(tgt.shape[0], m["n_heads"], 0, m["head_dim"])] * len(self.names)
        ids, out = tgt.cpu().long().numpy(), []
        for t in range(ids.shape[1]):
            logits, *kv = self.session.run(None, {"tokens": ids[:, t: t + 1],
                                                  **{n: c.numpy() for n, c in zip(self.names, cache.self_kv)}})
            cache.self_kv = [torch.from_numpy(c) for c in kv]                # 2 x layers of (B, H, t+1, Dh)
            out.append(logits)                                               # (B, V)
            cache.length += 1
        states = torch.stack([torch.from_numpy(o) for o in out], dim=1).float()  # (B, T, V)
        return DecoderOutput(states, states if project else None, cache)

    def output_proj(self, states: Tensor) -> Tensor:
        """The identity: the graph's outputs are already logits."""
        return states


class OnnxEncoder:
    """``encoder.onnx`` in ONNX Runtime: ids (B, T) [, token types] -> {output name: array}."""

    def __init__(self, directory: str | os.PathLike, threads: int | None = None):
        root = Path(directory)
        self.meta = json.loads((root / ONNX_META).read_text(encoding="utf-8"))
        (self.session,) = ort_sessions(root, threads, names=(ENCODER_ONNX,))

    def run(self, ids, token_types=None) -> dict:
        """ids (B, T) [, token types (B, T)], numpy integer arrays -> {output name: numpy array}."""
        feeds = {"ids": ids.astype("int64")}
        if self.meta["token_types"]:
            feeds["token_types"] = (ids * 0 if token_types is None else token_types).astype("int64")
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, feeds)))


class OnnxClassifier(nn.Module):
    """``encoder.onnx`` of a classifier as the model :class:`~transduce.inference.Classifier` runs:
    ``forward`` gives the graph's class logits (B, K), ``classify`` passes them on."""

    def __init__(self, directory: str | os.PathLike, config, threads: int | None = None):
        super().__init__()
        self.runner, self.config = OnnxEncoder(directory, threads), config

    def forward(self, ids: Tensor, token_types: Tensor | None = None) -> Tensor:
        out = self.runner.run(ids.cpu().numpy(), None if token_types is None else token_types.cpu().numpy())
        return torch.from_numpy(out["logits"])                               # (B, K)

    def classify(self, logits: Tensor) -> Tensor:
        return logits
