"""Static-shape decoding: greedy and beam search whose every step has the same shapes and never
waits on the host, captured in a CUDA graph on GPU, compiled by ``torch.compile`` on the CPU
when asked (``runtime.compile``).

Why: on a GPU, a decoding step of a translation-sized model is a few hundred small kernels, and
launching them one by one from Python, plus the host syncs of the eager searches (finished rows
leave the batch, ``bool(done.all())`` at each step), takes longer than running them. So beam
search gained little over HF ``generate`` and bf16 little over fp32 (BENCHMARKS.md). A CUDA
graph replays a recorded step as one launch, but only a step whose shapes and buffer addresses
never change and which never reads a device value on the host. The step is the model's own
:meth:`~transduce.model.Transformer.decode` (no layer written twice), on a different cache:

* a :class:`~transduce.inference.speed.cache.StaticKVCache`: self-attention keys/values in
  preallocated (N, H, T, Dh) buffers written at a position held in a 0-dim device tensor, with
  a key mask of the positions written so far; positions (sinusoidal or learned tables, RoPE)
  are read at that tensor too;
* cross-attention keys/values projected once per batch, eagerly with the encoder, into the
  cache, one row per sentence, shared by its K beams (the prepared model's attention,
  :func:`~transduce.inference.speed.fast_layers.fast_attention`);
* no row leaves: finished sentences are frozen by masks (they finish nothing more), sentences
  are padded up with dummy ones that start done, and the host reads "all done" only every
  ``check_every`` steps;
* under autocast, a model prepared with ``cast=`` reads low-precision copies of its linear
  weights kept between calls (:class:`~transduce.inference.speed.cast.CastLinear`; autocast's
  own cache cannot serve a graph, which would cast every weight every step);
* the search rules are beam.py's (:func:`~transduce.inference.search.beam.candidates`,
  :func:`~transduce.inference.search.beam.store`, :func:`~transduce.inference.search.beam.survivors`), so
  outputs equal the eager searches' (tests/inference/search/test_static_shapes.py).

The search runs on the model prepared for decoding (:func:`~transduce.inference.speed.prepared`).
On CUDA one step (decoder, scoring, search update, all in place) is captured after a warm-up on
a side stream. Captured searches are kept on the model in a small LRU keyed by shape (sentences,
S and T padded up, dtype, search settings) and by the addresses of the parameters and buffers,
which the graph reads live (a replaced parameter or a grown position table needs a new graph).
Weights changed in place are seen: the copies the speed layer keeps (fused projections, casts)
are rewritten in place by :func:`~transduce.inference.speed.refresh` before each search.
:func:`~transduce.inference.speed.restore` drops the kept searches. On CPU the same step runs
eagerly, only when asked (the eager searches suit the CPU), or compiled: with ``runtime.compile``
(:func:`~transduce.inference.speed.compile_step`) the step is compiled by ``torch.compile``
(Inductor: its C++ kernels fuse the step's elementwise work, the step's Python runs once at
tracing), one graph with dynamic shapes for all batch shapes of a model (a few recompilations
while the first batches' shapes are seen). So each batch runs at its own size, and a compiled
greedy search whose live sentences fall to ``COMPACT_BELOW`` of its own at a check goes on with
them alone in a smaller search (as the eager search drops finished rows: 29% fewer row-steps on
the Multi30k test set). The compiled step takes the weights as inputs, as
the eager step reads them: weights changed in place or replaced are decoded with (Inductor's
``freezing``, which would fold them in as constants, was slower here: oneDNN linear layers).

Legend: B sentences (padded up), K beam (1 for greedy), N = B*K rows, S source length (padded),
T output cap (padded), H heads, Dh head dim, D d_model.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import math

import torch
from torch import Tensor, nn

from ...config import DecodeConfig
from ...device import autocast_dtype
from ...model.attention import full_attention_only
from ...model.transformer import EncoderOutput, Transformer
from ..speed import STATIC_SEARCHES, compiles_step, prepared, refresh
from ..speed.cache import StaticKVCache
from .beam import Beams, Finished, best_of, candidates, pick, store, survivors
from .common import AttentionChoice, SearchOutput, best_tokens, length_penalty, max_lengths
from .repetition import Repetition

# The host reads whether every sentence is done once per this many steps (each read waits for
# the device; the steps run past the end are no-ops on frozen sentences).
CHECK_EVERY = 8
# A compiled greedy search goes on in a smaller search, with its live sentences only, when at a
# check at most this share of its sentences is live (the eager search drops finished rows at
# every step; a compiled step serves every row count).
COMPACT_BELOW = 0.5
# Source length and output cap are padded up to a multiple of LENGTH_MULTIPLE, the batch to one
# of ROW_MULTIPLE sentences, so that batches of similar size share a captured graph.
LENGTH_MULTIPLE = 16
ROW_MULTIPLE = 8
# Captured searches kept per model (each holds its buffers and its graph's memory pool).
GRAPHS_KEPT = 4
# Compiled (CPU) searches kept per model: their buffers only (one compiled step serves all shapes).
COMPILED_KEPT = 16
# Off CUDA, self-attention reads the cache's first positions up to the next multiple of this
# (not the whole output cap: outputs are mostly much shorter than the cap).
WINDOW_MULTIPLE = 16


def unsupported(model: nn.Module, attention: AttentionChoice | None) -> str | None:
    """Why a static search cannot run ``model`` (recording ``attention``), or None if it can:
    its buffers and masks are those of an eval-mode :class:`~transduce.model.Transformer` of full
    attention that records no attention maps."""
    if not isinstance(model, Transformer):
        return f"static decoding runs a Transformer; got {type(model).__name__}"
    if model.training:
        return "static decoding runs an eval-mode model"
    if not full_attention_only(model):
        return "static decoding runs full attention only; use static=False for other attention kinds"
    if attention is not None:
        return "static decoding records no attention maps; use static=False"
    return None


class StaticSearch:
    """The buffers of one search shape and the step over them (``model.decode`` on a
    :class:`StaticKVCache`, scoring, search update), all in place. ``beam`` 0 is greedy search
    (one row per sentence, summed log-probs; not ``scored``, the largest logit and scores 0:
    :func:`~.common.best_tokens`). ``model`` is prepared for decoding (its attention lets a
    sentence's beams share its cross-attention row). A kept search serves one search at
    a time (as a Translator's model: one thread searches with it)."""

    def __init__(self, model: Transformer, sentences: int, beam: int, s_cap: int, t_cap: int, dtype: torch.dtype,
                 decode: DecodeConfig, device: torch.device, scored: bool = True):
        self.model, self.beam, self.decode, self.scored = model, beam, decode, scored
        self.graph = self.compiled = None
        cfg, k = model.config, max(beam, 1)
        n, h, dh = sentences * k, cfg.n_heads, cfg.d_head

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        with torch.inference_mode(False):  # buffers a later search may update outside inference mode
            self.cache = StaticKVCache.empty(len(model.decoder_layers), (n, h, t_cap, dh), (sentences, h, s_cap, dh),
                                             dtype, device)
            self.src_mask = zeros(sentences, 1, 1, s_cap, dtype=torch.bool)
            # what decode attends to: the encoder's keys/values are in the cache, its states never read
            self.enc = EncoderOutput(zeros(sentences, 0, cfg.d_model, dtype=dtype), self.src_mask)
            self.last = zeros(n)                                          # (N,) token fed to the step
            self.limit, self.done = zeros(sentences), zeros(sentences, dtype=torch.bool)
            self.ids = torch.arange(sentences, device=device)
            self.row_base = self.ids.unsqueeze(1) * k                     # (B, 1) first row of a sentence
            self.tokens = zeros(sentences, k, t_cap)                      # alive hypotheses / greedy output
            self.scores = zeros(sentences, k, dtype=torch.float32)        # their summed log-probs
            self.lengths = zeros(sentences)                               # greedy only
            self.fin = Finished(zeros(sentences, k, t_cap), zeros(sentences, k),
                                zeros(sentences, k, dtype=torch.float32), zeros(sentences, k, dtype=torch.float32),
                                zeros(sentences), zeros(sentences, dtype=torch.bool), None)

    def load(self, cross: list[tuple[Tensor, Tensor]], mask: Tensor, limit: Tensor) -> None:
        """Reset for a batch: each layer's cross keys/values (b, H, s, Dh), the source mask
        (b, 1, 1, s), output limits (b,); the padding sentences start done. The kept copies of
        the weights are brought up to date first (a model trained further decodes right)."""
        cfg = self.model.config
        b, s = mask.shape[0], mask.shape[-1]
        refresh(self.model)
        self.cache.load(cross)
        self.src_mask.zero_()
        self.src_mask[:b, :, :, :s] = mask
        self.src_mask[b:, :, :, 0] = True  # padding sentences attend to one zero key
        self.limit.fill_(1)
        self.limit[:b] = limit
        self.done.fill_(True)
        self.done[:b] = False
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

    def step(self, step: int) -> None:
        """Decoding step ``step`` (from 0): the graph's replay when captured (over the whole
        cache), else the compiled step when compiled, or the step itself, whose self-attention
        reads the cache's first positions up to the next multiple of ``WINDOW_MULTIPLE``."""
        if self.graph is not None:
            self.graph.replay()
            return
        window = min(_round_up(step + 1, WINDOW_MULTIPLE), self.tokens.shape[2])
        if self.compiled is not None:
            rows = self.compiled(self, window)
            if rows is not None:
                self.cache.reorder(rows)
        else:
            self._step(window)

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

    def compile(self, warm: bool = True) -> None:
        """Compile the step (CPU): with ``warm``, one eager step first makes the fused projections
        the compiled step reads (:class:`~transduce.inference.speed.fast_layers.FastAttention`;
        not needed when another search of the model made them), then the compiled step, shared
        by every search (``torch.compile`` keys its code by the step's Python code and guards on
        the model, the search settings and the buffers' ranks).

        The beam's cache reorder runs after it, eagerly: compiled into the step (torch 2.13), the
        gather of the cache rows read some rows' newest keys from before the step wrote them
        (tests/inference/search/test_compiled.py: beam search compiled equals the eager one)."""
        if warm:
            self.load([], torch.ones_like(self.src_mask), torch.ones_like(self.limit))
            self._step(WINDOW_MULTIPLE)
        self.compiled = _compiled_step()

    def _step(self, window: int | None = None) -> None:
        rows = self._update(window)
        if rows is not None:
            self.cache.reorder(rows)

    def _update(self, window: int | None = None) -> Tensor | None:
        """The step but for the beam's cache reorder: decode, score, update the search; the
        rows (N,) the cache's rows are to be gathered from (beam), None (greedy). Self-attention
        reads the cache's first ``window`` positions (None: all; an argument, not an attribute,
        so that a compiled step takes it as a dynamic size)."""
        self.cache.attend_first(window)
        pos = self.cache.length.clone()  # the position this step decodes (decode advances the cache)
        states = self.model.decode(self.last.unsqueeze(1), self.enc, self.cache, project=False).states[:, 0]  # (N, D)
        if self.beam:
            return self._beam_update(states, pos)
        self._greedy_update(states, pos)
        return None

    def _greedy_update(self, states: Tensor, pos: Tensor) -> None:
        """The most probable token of each live row; rows end at EOS or their limit."""
        cfg = self.model.config
        repeat = Repetition.of(self.decode, self.tokens[:, 0], pos)     # the output so far: positions < pos
        logp, token = best_tokens(self.model, states, cfg, pos, self.decode.min_len, 1, None, repeat,
                                  scored=self.scored)  # (N, 1)
        token = token[:, 0].masked_fill(self.done, cfg.pad_id)
        self.tokens[:, 0].index_copy_(1, pos.view(1), token.unsqueeze(1))
        self.scores[:, 0] += logp[:, 0].masked_fill(self.done, 0.0)
        ends = ~self.done & ((token == cfg.eos_id) | (self.limit <= pos + 1))
        self.lengths.copy_(torch.where(ends, pos + 1, self.lengths))
        self.done |= ends
        self.last.copy_(token)

    def _beam_update(self, states: Tensor, pos: Tensor) -> Tensor:
        """beam.py's step on all sentences: top 2K candidates, the ending ones of the top K
        into the finished store (none for done sentences), the best K others stay alive;
        returns the row (N,) each beam continues."""
        cfg, k, decode = self.model.config, self.beam, self.decode
        repeat = Repetition.of(decode, self.tokens.view(-1, self.tokens.shape[2]), pos)  # positions < pos written
        row_logp, row_token = best_tokens(self.model, states, cfg, pos, decode.min_len, 2 * k, None, repeat)  # (N, w)
        beams = Beams(self.ids, self.tokens, self.scores, self.limit, None)
        cand = candidates(row_logp, row_token, beams, k, pos, cfg.eos_id)
        cand.ends &= ~self.done.unsqueeze(1)
        m = min(k, cand.scores.shape[1])
        length = pos + 1
        ending = self._extended(cand.parent[:, :m], cand.token[:, :m], pos)  # (B, m, T)
        lp = length_penalty(length.double(), decode.lenpen).float()
        store(self.fin, slice(None), cand, lp, length.expand(*ending.shape[:2]), ending)
        scores, parent, token = survivors(cand, k)                       # (B, K) each
        self.tokens.copy_(self._extended(parent, token, pos))
        self.scores.copy_(scores)
        self.last.copy_(token.view(-1))
        if decode.stop == "k_finished":
            self.done |= self.fin.count >= k
        else:
            self.done |= self.fin.best_ended & (self.fin.count >= decode.nbest)
        return (parent + self.row_base).view(-1)

    def _extended(self, parent: Tensor, token: Tensor, pos: Tensor) -> Tensor:
        """The alive histories of ``parent`` (B, m) with ``token`` (B, m) at ``pos`` -> (B, m, T)."""
        return pick(self.tokens, parent).index_copy_(2, pos.view(1), token.unsqueeze(2))

    def continue_from(self, other: "StaticSearch", rows: Tensor) -> None:
        """Go on with greedy search ``other``'s sentences ``rows`` (L,) in this search's first L
        rows (the others padding, done); both of the same S and T caps."""
        n = rows.numel()
        self.load([], other.src_mask.index_select(0, rows), other.limit.index_select(0, rows))
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            for name in ("self_k", "self_v", "cross_k", "cross_v"):
                getattr(mine, name)[:n] = getattr(theirs, name).index_select(0, rows)
        self.cache.length.copy_(other.cache.length)
        for name in ("last", "done", "tokens", "scores", "lengths"):
            getattr(self, name)[:n] = getattr(other, name).index_select(0, rows)

    def output_into(self, out: SearchOutput | None, sentences: Tensor, b: int, t_out: int) -> SearchOutput:
        """Greedy search's hypotheses of its first rows written to ``out`` (a new one for ``b``
        sentences when None) at ``sentences`` (L,), the sentence of each row; returns ``out``."""
        if out is None:
            tokens = torch.full((b, 1, t_out), self.model.config.pad_id, dtype=torch.long, device=self.tokens.device)
            zeros = self.lengths.new_zeros(b, 1)
            out = SearchOutput(tokens, zeros, zeros.float(), zeros.float())
        n = sentences.numel()
        out.tokens[sentences] = self.tokens[:n, :1, :t_out]
        out.lengths[sentences] = self.lengths[:n, None]
        out.scores[sentences] = self.scores[:n, :1]
        out.log_probs[sentences] = self.scores[:n, :1]
        return out

    def output(self, b: int, t_out: int) -> SearchOutput:
        """The first ``b`` sentences' hypotheses (new tensors: the buffers are reused)."""
        if self.beam:
            fin = self.fin
            return best_of(Finished(fin.tokens[:b], fin.lengths[:b], fin.scores[:b], fin.log_probs[:b],
                                    fin.count[:b], fin.best_ended[:b], None), self.decode.nbest)
        log_probs = self.scores[:b, :1].clone()
        return SearchOutput(self.tokens[:b, :1, :t_out].clone(), self.lengths[:b, None].clone(), log_probs.clone(),
                            log_probs)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _padded_shape(model: Transformer, b: int, beam: int, s: int, t_out: int, device: torch.device
                  ) -> tuple[int, int, int, int]:
    """The search shape (sentences, beam, S, T) of a batch of ``b`` sentences of ``s`` source
    positions and output cap ``t_out``: padded up so that batches of similar size share a
    captured graph, or, for a compiled step (dynamic shapes serve every size), the batch's own
    sentences and source positions (at least 2 each: Inductor specialises a size of 1)."""
    if device.type != "cuda" and compiles_step(model):
        return max(b, 2), beam, max(s, 2), _round_up(t_out, LENGTH_MULTIPLE)
    return _round_up(b, ROW_MULTIPLE), beam, _round_up(s, LENGTH_MULTIPLE), _round_up(t_out, LENGTH_MULTIPLE)


@functools.cache
def _compiled_step():
    """``StaticSearch._update`` compiled: whole (no graph breaks), dynamic shapes."""
    return torch.compile(StaticSearch._update, fullgraph=True, dynamic=True)


def _searches(model: nn.Module) -> collections.OrderedDict:
    """The captured searches kept on ``model`` (a plain attribute: not a submodule or state)."""
    return model.__dict__.setdefault(STATIC_SEARCHES, collections.OrderedDict())


def _search_for(model: Transformer, shape: tuple[int, int, int, int], dtype: torch.dtype, decode: DecodeConfig,
                device: torch.device, scored: bool = True) -> StaticSearch:
    """A search of ``shape`` (sentences, beam, S, T), ``scored`` or not: captured and kept on CUDA,
    compiled and kept on a model marked by :func:`~transduce.inference.speed.compile_step`, else new.

    The key holds the addresses of the parameters and buffers: the graph reads them by address,
    so one replaced (not changed in place) needs a new graph. Weights changed in place need
    none: the graph reads them, or the speed layer's copies that :meth:`StaticSearch.load`
    refreshes in place."""
    if device.type != "cuda":
        return _compiled_search(model, shape, dtype, decode, device, scored) if compiles_step(model) else \
            StaticSearch(model, *shape, dtype, decode, device, scored)
    autocast = autocast_dtype(device)
    weights = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
    key = (shape, dtype, device, autocast, decode.min_len, decode.lenpen, decode.stop, decode.nbest,
           decode.no_repeat_ngram_size, decode.repetition_penalty, scored, weights)

    def captured() -> StaticSearch:
        search = StaticSearch(model, *shape, dtype, decode, device, scored)
        with torch.cuda.device(device):
            search.capture()
        return search
    return _kept_search(model, key, GRAPHS_KEPT, captured)


def _compiled_search(model: Transformer, shape: tuple[int, int, int, int], dtype: torch.dtype,
                     decode: DecodeConfig, device: torch.device, scored: bool = True) -> StaticSearch:
    """A compiled search of ``shape``, kept on the model."""
    key = (shape, dtype, decode.min_len, decode.lenpen, decode.stop, decode.nbest, decode.no_repeat_ngram_size,
           decode.repetition_penalty, scored)

    def compiled() -> StaticSearch:
        search = StaticSearch(model, *shape, dtype, decode, device, scored)
        search.compile(warm=not _searches(model))  # (restore drops the kept searches and fused layers alike)
        return search
    return _kept_search(model, key, COMPILED_KEPT, compiled)


def _kept_search(model: Transformer, key: tuple, limit: int, make) -> StaticSearch:
    """The search kept on ``model`` under ``key``, else ``make()``'s, kept (the least recently
    used dropped beyond ``limit``)."""
    kept = _searches(model)
    search = kept.pop(key, None)
    if search is None:
        while len(kept) >= limit:
            kept.popitem(last=False)
        search = make()
    kept[key] = search
    return search


@torch.no_grad()
def static_search(model: Transformer, src: Tensor, decode: DecodeConfig = DecodeConfig(), greedy: bool = False,
                  check_every: int = CHECK_EVERY, scored: bool = True) -> SearchOutput:
    """Greedy or beam search (``decode.beam``) with static shapes; the same output as
    :func:`~transduce.inference.search.greedy.greedy_search` / :func:`~transduce.inference.search.beam.beam_search`.

    The encoder and the cross-attention keys/values run eagerly; then each step is one graph
    replay on CUDA (captured at the first search of a shape), one compiled step on a model marked
    by :func:`~transduce.inference.speed.compile_step` (greedy: at a check with at most
    ``COMPACT_BELOW`` of its sentences live, it goes on with them in a smaller search), or one
    eager step. ``check_every``: steps between checks that all are done; ``scored``: :class:`StaticSearch`.

    A plain model is prepared for decoding for the search (its captured search is then not
    kept: :func:`~transduce.inference.speed.restore` drops it); a Translator's model keeps them.

    Shape: src (B, S) -> SearchOutput with K = 1 (greedy) or ``decode.nbest``.
    """
    cfg, device = model.config, src.device
    b, s = src.shape
    limit = max_lengths(src, cfg, decode.max_len_a, decode.max_len_b)    # (B,)
    t_out = int(limit.max())
    if model.tgt_embed.positions is not None:
        # a sinusoidal table grows now, not inside a captured step (which reads it at a device
        # position, unchecked); learned positions refuse a too long output here
        model.tgt_embed.positions(0, t_out)
    with prepared(model):
        enc = model.encode(src)
        cross = [layer.cross_attn.project_kv(enc.memory) for layer in model.decoder_layers]  # (B, H, S, Dh) each
        shape = _padded_shape(model, b, 0 if greedy else decode.beam, s, t_out, device)
        search = _search_for(model, shape, cross[0][0].dtype, decode, device, scored)
        search.load(cross, enc.mask, limit)
        compacts = greedy and search.compiled is not None
        sentences, out = torch.arange(b, device=device), None  # (the sentence of each of the search's rows)
        for step in range(t_out):
            search.step(step)
            if (step + 1) % check_every or step + 1 == t_out:
                continue
            if not compacts:
                if search.all_done():
                    break
                continue
            live = (~search.done[:sentences.numel()]).nonzero().squeeze(1)
            if live.numel() == 0:
                break
            rows = max(live.numel(), 2)  # (Inductor specialises a size of 1)
            if live.numel() <= COMPACT_BELOW * sentences.numel() and rows < search.done.shape[0]:
                out = search.output_into(out, sentences, b, t_out)
                smaller = _search_for(model, (rows, 0) + shape[2:], cross[0][0].dtype, decode, device, scored)
                smaller.continue_from(search, live)
                search, sentences = smaller, sentences[live]
        return search.output(b, t_out) if out is None else search.output_into(out, sentences, b, t_out)
