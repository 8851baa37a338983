"""Static-shape decoding: greedy and beam search whose every step has the same shapes and never
waits on the host, captured in a CUDA graph on GPU.

Why: on a GPU, a decoding step of a translation-sized model is a few hundred small kernels, and
launching them one by one from Python, plus the host syncs of the eager searches (finished rows
leave the batch, ``bool(done.all())`` at each step), takes longer than running them. So beam
search gained little over HF ``generate`` and bf16 little over fp32 (BENCHMARKS.md). A CUDA
graph replays a recorded step as one launch, but only a step whose shapes and buffer addresses
never change and which never reads a device value on the host. Hence:

* self-attention keys/values live in preallocated (N, H, T, Dh) buffers, written at the current
  position through a 0-dim device tensor ``pos`` (``index_copy_``); each step attends over the
  whole buffer with a mask of positions <= ``pos``; positions (sinusoidal or learned tables,
  RoPE) are read at ``pos`` too;
* cross-attention keys/values are projected once per sentence, eagerly with the encoder, and
  shared by its K beams (:func:`~transduce.inference.speed.attention.fast_attention`);
* no row leaves: finished sentences are frozen by masks (they finish nothing more), sentences
  are padded up with dummy ones that start done, and the host reads "all done" only every
  ``check_every`` steps;
* under autocast the linear layers read low-precision copies of their weights, cast once per
  search (autocast's own cache cannot serve a graph, which would cast every weight every step);
* the search rules are beam.py's (:func:`~transduce.inference.search.beam.candidates`,
  :func:`~transduce.inference.search.beam.store`, :func:`~transduce.inference.search.beam.survivors`), so
  outputs equal the eager searches' (tests/inference/test_static.py).

On CUDA one step (decoder, scoring, search update, all in place) is captured after a warm-up on
a side stream. Captured searches are kept on the model in a small LRU keyed by shape (sentences,
S and T padded up, dtype, search settings) and by the addresses of the parameters, which the
graph reads live: a model trained further decodes right. :func:`~transduce.inference.speed.restore`
drops them. On CPU the same step runs eagerly, only when asked (the eager searches suit the CPU).

Legend: B sentences (padded up), K beam (1 for greedy), N = B*K rows, S source length (padded),
T output cap (padded), H heads, Dh head dim, D d_model.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn

from ...config import DecodeConfig
from ...device import autocast_dtype
from ...model.attention import full_attention_only
from ...model.embeddings import LearnedPositions, SinusoidalPositions
from ...model.transformer import Transformer
from ..speed import STATIC_SEARCHES
from ..speed.attention import fast_attention
from .beam import Beams, Finished, best_of, candidates, pick, store, survivors
from .common import AttentionChoice, SearchOutput, best_tokens, length_penalty, max_lengths

# The host reads whether every sentence is done once per this many steps (each read waits for
# the device; the steps run past the end are no-ops on frozen sentences).
CHECK_EVERY = 8
# Source length and output cap are padded up to a multiple of LENGTH_MULTIPLE, the batch to one
# of ROW_MULTIPLE sentences, so that batches of similar size share a captured graph.
LENGTH_MULTIPLE = 16
ROW_MULTIPLE = 8
# Captured searches kept per model (each holds its buffers and its graph's memory pool).
GRAPHS_KEPT = 4


def unsupported(model: nn.Module, attention: AttentionChoice | None) -> str | None:
    """Why a static search cannot run ``model`` (recording ``attention``), or None if it can:
    its buffers and masks are those of an eval-mode :class:`~transduce.model.Transformer` of full
    attention that records no attention maps."""
    if not isinstance(model, Transformer):
        return f"static decoding runs a Transformer; got {type(model).__name__}"
    if model.training:
        return "static decoding runs an eval-mode model"
    if not full_attention_only(model):
        return "static decoding runs full attention only; use static=False for local or linformer models"
    if attention is not None:
        return "static decoding records no attention maps; use static=False"
    return None


@dataclass
class _LayerBuffers:
    """One decoder layer's keys and values."""

    self_k: Tensor   # (N, H, T, Dh) written at pos
    self_v: Tensor
    cross_k: Tensor  # (B, H, S, Dh), shared by the K rows of a sentence
    cross_v: Tensor


class StaticSearch:
    """The buffers of one search shape and the step over them (decoder, scoring, search update),
    all in place. ``beam`` 0 is greedy search (one row per sentence, summed log-probs). A kept
    search serves one search at a time (as a Translator's model: one thread searches with it)."""

    def __init__(self, model: Transformer, sentences: int, beam: int, s_cap: int, t_cap: int, dtype: torch.dtype,
                 decode: DecodeConfig, device: torch.device):
        self.model, self.beam, self.decode, self.graph = model, beam, decode, None
        cfg, k = model.config, max(beam, 1)
        n, h, dh = sentences * k, cfg.n_heads, cfg.d_model // cfg.n_heads

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        with torch.inference_mode(False):  # buffers a later search may update outside inference mode
            self.layers = [_LayerBuffers(zeros(n, h, t_cap, dh, dtype=dtype), zeros(n, h, t_cap, dh, dtype=dtype),
                                         zeros(sentences, h, s_cap, dh, dtype=dtype),
                                         zeros(sentences, h, s_cap, dh, dtype=dtype)) for _ in model.decoder_layers]
            self.src_mask = zeros(sentences, 1, 1, s_cap, dtype=torch.bool)
            self.key_positions = torch.arange(t_cap, device=device)
            self.pos, self.last = zeros(), zeros(n)                       # step; (N,) token fed to it
            self.limit, self.done = zeros(sentences), zeros(sentences, dtype=torch.bool)
            self.ids = torch.arange(sentences, device=device)
            self.row_base = self.ids.unsqueeze(1) * k                     # (B, 1) first row of a sentence
            self.tokens = zeros(sentences, k, t_cap)                      # alive hypotheses / greedy output
            self.scores = zeros(sentences, k, dtype=torch.float32)        # their summed log-probs
            self.lengths = zeros(sentences)                               # greedy only
            self.fin = Finished(zeros(sentences, k, t_cap), zeros(sentences, k),
                                zeros(sentences, k, dtype=torch.float32), zeros(sentences, k, dtype=torch.float32),
                                zeros(sentences), zeros(sentences, dtype=torch.bool), None)
            self.casts = _linear_casts(model, device)

    def load(self, cross: list[tuple[Tensor, Tensor]], mask: Tensor, limit: Tensor) -> None:
        """Reset for a batch: each layer's cross keys/values (b, H, s, Dh), the source mask
        (b, 1, 1, s), output limits (b,); the padding sentences start done."""
        cfg = self.model.config
        b, s = mask.shape[0], mask.shape[-1]
        for _, _, param, cast in self.casts:
            cast.copy_(param)  # the weights as they are now (a model trained further)
        for buf in self.layers:
            for t in (buf.self_k, buf.self_v, buf.cross_k, buf.cross_v):
                t.zero_()  # masked entries must still be finite (a masked NaN poisons the softmax)
        for buf, (k, v) in zip(self.layers, cross):
            buf.cross_k[:b, :, :s] = k
            buf.cross_v[:b, :, :s] = v
        self.src_mask.zero_()
        self.src_mask[:b, :, :, :s] = mask
        self.src_mask[b:, :, :, 0] = True  # padding sentences attend to one zero key
        self.limit.fill_(1)
        self.limit[:b] = limit
        self.done.fill_(True)
        self.done[:b] = False
        self.pos.zero_()
        self.last.fill_(cfg.bos_id)
        self.tokens.fill_(cfg.pad_id)
        self.scores.fill_(-math.inf)
        self.scores[:, 0] = 0.0  # the first step extends one hypothesis (BOS) per sentence
        self.lengths.zero_()
        fin = self.fin
        fin.tokens.fill_(cfg.pad_id)
        fin.lengths.zero_()
        fin.scores.fill_(-math.inf)
        fin.log_probs.fill_(-math.inf)
        fin.count.zero_()
        fin.best_ended.zero_()

    def step(self) -> None:
        """One decoding step: the graph's replay when captured, else the step itself."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def all_done(self) -> bool:
        return bool(self.done.all())

    def capture(self) -> None:
        """Record the step as a CUDA graph after warm-up steps on a side stream (as PyTorch's
        CUDA graphs notes ask; the warm-up changes the buffers, which :meth:`load` resets).
        Autocast's cache is off meanwhile, as those notes say: a cast it kept would be freed
        when the caller's autocast block ends, and the graph would read freed memory."""
        self.load([], torch.ones_like(self.src_mask), torch.ones_like(self.limit))
        dtype = autocast_dtype(torch.device("cuda"))
        autocast = contextlib.nullcontext() if dtype is None else torch.autocast("cuda", dtype, cache_enabled=False)
        with autocast:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step()
        self.graph = graph

    def _step(self) -> None:
        with self._cast_weights():
            states = self._decode()                                       # (N, D)
            if self.beam:
                self._beam_update(states)
            else:
                self._greedy_update(states)
        self.pos += 1

    @contextlib.contextmanager
    def _cast_weights(self) -> Iterator[None]:
        """The linear layers read :attr:`casts` for the block. Autocast would cast each weight
        at every step (its cache is off in a graph); these copies, refreshed by :meth:`load`,
        hold the same values, cast once per search."""
        for module, name, _, cast in self.casts:
            module._parameters[name] = cast
        try:
            yield
        finally:
            for module, name, param, _ in self.casts:
                module._parameters[name] = param

    def _decode(self) -> Tensor:
        """The decoder on the tokens ``last`` at position ``pos`` -> output states (N, D):
        :meth:`~transduce.model.Transformer.decode` with a KV cache, on static buffers."""
        m = self.model
        x = m.tgt_embed.tokens(self.last.unsqueeze(1))                    # (N, 1, D)
        table = position_table(m.tgt_embed.positions)
        if table is not None:
            x = x + table.index_select(0, self.pos.view(1)).to(x.dtype)   # (1, D) broadcast
        x = m.tgt_embed.dropout(x)
        visible = (self.key_positions <= self.pos).view(1, 1, 1, -1)     # (1, 1, 1, T)
        for layer, buf in zip(m.decoder_layers, self.layers):
            h = layer.norm1(x) if layer.pre_norm else x
            x = layer._residual(x, self._self_attention(layer.self_attn, h, buf, visible), layer.norm1)
            h = layer.norm2(x) if layer.pre_norm else x
            q = layer.cross_attn.split_heads(layer.cross_attn.q_proj(h))  # (N, H, 1, Dh)
            x = layer._residual(x, _attend(layer.cross_attn, q, buf.cross_k, buf.cross_v, self.src_mask), layer.norm2)
            h = layer.ffn(layer.norm3(x) if layer.pre_norm else x)
            x = layer._residual(x, h, layer.norm3)
        if m.decoder_norm is not None:
            x = m.decoder_norm(x)
        return x[:, 0]

    def _self_attention(self, attn: nn.Module, h: Tensor, buf: _LayerBuffers, visible: Tensor) -> Tensor:
        """Masked self-attention of the new position over the buffer (N, 1, D) -> (N, 1, D).
        Three projections, not a fused copy of the weights: the graph reads the live ones."""
        q, k, v = (attn.split_heads(p(h)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))  # (N, H, 1, Dh)
        if attn.rope is not None:
            q, k = attn.rope(q, self.pos), attn.rope(k, self.pos)
        buf.self_k.index_copy_(2, self.pos.view(1), k)
        buf.self_v.index_copy_(2, self.pos.view(1), v)
        return _attend(attn, q, buf.self_k, buf.self_v, visible)

    def _greedy_update(self, states: Tensor) -> None:
        """The most probable token of each live row; rows end at EOS or their limit."""
        cfg = self.model.config
        logp, token = best_tokens(self.model, states, cfg, self.pos, self.decode.min_len, 1)  # (N, 1)
        token = token[:, 0].masked_fill(self.done, cfg.pad_id)
        self.tokens[:, 0].index_copy_(1, self.pos.view(1), token.unsqueeze(1))
        self.scores[:, 0] += logp[:, 0].masked_fill(self.done, 0.0)
        ends = ~self.done & ((token == cfg.eos_id) | (self.limit <= self.pos + 1))
        self.lengths.copy_(torch.where(ends, self.pos + 1, self.lengths))
        self.done |= ends
        self.last.copy_(token)

    def _beam_update(self, states: Tensor) -> None:
        """beam.py's step on all sentences: top 2K candidates, the ending ones of the top K
        into the finished store (none for done sentences), the best K others stay alive."""
        cfg, k, decode = self.model.config, self.beam, self.decode
        row_logp, row_token = best_tokens(self.model, states, cfg, self.pos, decode.min_len, 2 * k)  # (N, w)
        beams = Beams(self.ids, self.tokens, self.scores, self.limit, None)
        cand = candidates(row_logp, row_token, beams, k, self.pos, cfg.eos_id)
        cand.ends &= ~self.done.unsqueeze(1)
        m = min(k, cand.scores.shape[1])
        length = self.pos + 1
        ending = self._extended(cand.parent[:, :m], cand.token[:, :m])   # (B, m, T)
        lp = length_penalty(length.double(), decode.lenpen).float()
        store(self.fin, slice(None), cand, lp, length.expand(*ending.shape[:2]), ending)
        scores, parent, token = survivors(cand, k)                       # (B, K) each
        self.tokens.copy_(self._extended(parent, token))
        self.scores.copy_(scores)
        self.last.copy_(token.view(-1))
        rows = (parent + self.row_base).view(-1)                          # (N,) row each beam continues
        for buf in self.layers:
            buf.self_k.copy_(buf.self_k.index_select(0, rows))
            buf.self_v.copy_(buf.self_v.index_select(0, rows))
        if decode.stop == "k_finished":
            self.done |= self.fin.count >= k
        else:
            self.done |= self.fin.best_ended & (self.fin.count >= decode.nbest)

    def _extended(self, parent: Tensor, token: Tensor) -> Tensor:
        """The alive histories of ``parent`` (B, m) with ``token`` (B, m) at ``pos`` -> (B, m, T)."""
        return pick(self.tokens, parent).index_copy_(2, self.pos.view(1), token.unsqueeze(2))

    def output(self, b: int, t_out: int) -> SearchOutput:
        """The first ``b`` sentences' hypotheses (new tensors: the buffers are reused)."""
        if self.beam:
            fin = self.fin
            return best_of(Finished(fin.tokens[:b], fin.lengths[:b], fin.scores[:b], fin.log_probs[:b],
                                    fin.count[:b], fin.best_ended[:b], None), self.decode.nbest)
        log_probs = self.scores[:b, :1].clone()
        return SearchOutput(self.tokens[:b, :1, :t_out].clone(), self.lengths[:b, None].clone(), log_probs.clone(),
                            log_probs)


def _linear_casts(model: Transformer, device: torch.device) -> list[tuple[nn.Module, str, Tensor, Tensor]]:
    """(module, name, parameter, copy) for each weight and bias of the decoder's linear layers
    and the output projection that autocast would cast, with an empty copy in its dtype; none
    without autocast."""
    dtype = autocast_dtype(device)
    if dtype is None:
        return []
    linears = [m for m in itertools.chain(model.decoder_layers.modules(), [model.output_proj])
               if isinstance(m, nn.Linear)]
    return [(m, name, p, torch.empty_like(p, dtype=dtype)) for m in linears
            for name, p in m.named_parameters(recurse=False) if p.dtype == torch.float32]


def _attend(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Attention of one query per row (N, H, 1, Dh) over k, v (N or N/K rows), then the output
    projection -> (N, 1, D)."""
    out, _ = fast_attention(q, k, v, mask)                                # (N, H, 1, Dh)
    return attn.out_proj(out.transpose(1, 2).reshape(out.shape[0], 1, -1))


def position_table(positions: nn.Module | None) -> Tensor | None:
    """The (P, D) table that absolute positions index (None for RoPE)."""
    if isinstance(positions, SinusoidalPositions):
        return positions.table
    if isinstance(positions, LearnedPositions):
        return positions.weight
    return None


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _searches(model: nn.Module) -> collections.OrderedDict:
    """The captured searches kept on ``model`` (a plain attribute: not a submodule or state)."""
    return model.__dict__.setdefault(STATIC_SEARCHES, collections.OrderedDict())


def _search_for(model: Transformer, shape: tuple[int, int, int, int], dtype: torch.dtype, decode: DecodeConfig,
                device: torch.device) -> StaticSearch:
    """A search of ``shape`` (sentences, beam, S, T): captured and kept on CUDA, else new."""
    if device.type != "cuda":
        return StaticSearch(model, *shape, dtype, decode, device)
    autocast = autocast_dtype(device)
    weights = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
    key = (shape, dtype, device, autocast, decode.min_len, decode.lenpen, decode.stop, decode.nbest, weights)
    kept = _searches(model)
    search = kept.pop(key, None)
    if search is None:
        while len(kept) >= GRAPHS_KEPT:
            kept.popitem(last=False)
        search = StaticSearch(model, *shape, dtype, decode, device)
        with torch.cuda.device(device):
            search.capture()
    kept[key] = search
    return search


@torch.no_grad()
def static_search(model: Transformer, src: Tensor, decode: DecodeConfig = DecodeConfig(), greedy: bool = False,
                  check_every: int = CHECK_EVERY) -> SearchOutput:
    """Greedy or beam search (``decode.beam``) with static shapes; the same output as
    :func:`~transduce.inference.search.greedy.greedy_search` / :func:`~transduce.inference.search.beam.beam_search`.

    The encoder and the cross-attention keys/values run eagerly; then each step is one graph
    replay on CUDA (captured at the first search of a shape) or one eager step elsewhere.
    ``check_every``: steps between the host's checks that every sentence is done.

    Shape: src (B, S) -> SearchOutput with K = 1 (greedy) or ``decode.nbest``.
    """
    cfg, device = model.config, src.device
    b, s = src.shape
    limit = max_lengths(src, cfg, decode.max_len_a, decode.max_len_b)    # (B,)
    t_out = int(limit.max())
    if isinstance(model.tgt_embed.positions, SinusoidalPositions):
        model.tgt_embed.positions(0, t_out)  # grow the table now, not inside a captured step
    enc = model.encode(src)
    cross = [layer.cross_attn.project_kv(enc.memory) for layer in model.decoder_layers]  # (B, H, S, Dh) each
    shape = (_round_up(b, ROW_MULTIPLE), 0 if greedy else decode.beam, _round_up(s, LENGTH_MULTIPLE),
             _round_up(t_out, LENGTH_MULTIPLE))
    search = _search_for(model, shape, cross[0][0].dtype, decode, device)
    search.load(cross, enc.mask, limit)
    for step in range(t_out):
        search.step()
        if (step + 1) % check_every == 0 and step + 1 < t_out and search.all_done():
            break
    return search.output(b, t_out)
