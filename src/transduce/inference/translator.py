"""Text in, text out: tokenize, batch by length, search, detokenize, restore input order.

Examples:
    >>> tr = Translator.load("runs/base/model")                            # doctest: +SKIP
    >>> tr.translate(["A dog runs.", ""])                                   # doctest: +SKIP
    ['Ein Hund läuft.', '']
    >>> best = tr.translate_detailed(["A dog runs."], nbest=2)[0].hypotheses[0]  # doctest: +SKIP
    >>> best.pieces, best.score, best.attention.shape                      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import Tensor

from ..config import DecodeConfig
from ..errors import CheckpointError, ConfigError
from .batching import length_sorted_batches
from .beam import beam_search
from .cpu import drop_inference_state, use_onednn_linears
from .sampling import check_sampling, sample
from .search import SearchOutput, greedy_search

logger = logging.getLogger(__name__)

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_DEFAULTS = DecodeConfig()


@dataclass
class Hypothesis:
    """One output of the search.

    Attributes:
        text: detokenized output.
        tokens: target ids, without BOS and EOS.
        pieces: subword strings of ``tokens``.
        score: the ranking score (length-normalised log-prob for beam search).
        log_prob: sum of the token log-probabilities.
        ended: whether the hypothesis ended with EOS (False: it hit the length limit).
        attention: (T, S) cross-attention, rows = ``tokens`` (+ EOS if ``ended``), columns =
            the source tokens + EOS; None unless asked for.
    """

    text: str
    tokens: list[int]
    pieces: list[str]
    score: float
    log_prob: float
    ended: bool = True
    attention: Tensor | None = None


@dataclass
class Translation:
    """The n-best hypotheses of one input line, best first."""

    source: str
    source_tokens: list[int]
    source_pieces: list[str]
    hypotheses: list[Hypothesis] = field(default_factory=list)
    truncated: bool = False

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]


@dataclass(frozen=True)
class SearchSpec:
    """The settings of one search, runnable on any batch of source ids.

    A plain value, so worker processes can be sent it (see
    :class:`~transduce.inference.pool.TranslatorPool`). ``beam`` 1 is greedy search;
    ``temperature`` set means sampling (``beam``, ``lenpen``, ``nbest`` and ``stop`` unused).
    """

    beam: int = _DEFAULTS.beam
    lenpen: float = _DEFAULTS.lenpen
    nbest: int = 1
    max_len_a: float = _DEFAULTS.max_len_a
    max_len_b: int = _DEFAULTS.max_len_b
    min_len: int = 0
    stop: str = _DEFAULTS.stop
    need_attention: bool = False
    attention_layer: int = -1
    attention_head: int | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def run(self, model: torch.nn.Module, src: Tensor) -> SearchOutput:
        """Search a (B, S) batch of source ids (EOS-terminated, PAD-padded)."""
        if self.temperature is not None:
            return sample(model, src, self.temperature, self.top_k, self.top_p, self.seed,
                          self.max_len_a, self.max_len_b)
        if self.beam == 1:
            return greedy_search(model, src, self.max_len_a, self.max_len_b, self.min_len, True,
                                 self.need_attention, self.attention_layer, self.attention_head)
        return beam_search(model, src, self.beam, self.lenpen, self.max_len_a, self.max_len_b, self.nbest,
                           self.min_len, self.need_attention, self.attention_layer, self.attention_head,
                           self.stop)


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> CUDA if available else CPU; a ConfigError for CUDA without a GPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {device} requested but CUDA is not available")
    return device


class BaseTranslator:
    """The text side of translation: tokenize, batch by length, detokenize, restore input order.

    Subclasses say where the searches run: :class:`Translator` in this process,
    :class:`~transduce.inference.pool.TranslatorPool` in worker processes. They set
    ``tokenizer``, ``config`` (the model's :class:`~transduce.config.ModelConfig`) and
    ``max_input_len``, and implement :meth:`_search`.
    """

    tokenizer: object
    config: object
    max_input_len: int

    def _search(self, batches: list[Tensor], spec: SearchSpec) -> Iterator[SearchOutput]:
        """One CPU :class:`SearchOutput` per (B, S) batch of source ids, in order."""
        raise NotImplementedError

    def _batches(self, lengths: list[int], batch_tokens: int) -> list[list[int]]:
        """Indices of ``lengths`` grouped into the batches to search."""
        return length_sorted_batches(lengths, batch_tokens)

    def close(self) -> None:
        """Release what the translator holds (nothing here)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def translate(self, texts: Sequence[str], beam: int = _DEFAULTS.beam, lenpen: float = _DEFAULTS.lenpen,
                  max_len_a: float = _DEFAULTS.max_len_a, max_len_b: int = _DEFAULTS.max_len_b,
                  batch_tokens: int = _DEFAULTS.batch_tokens, stop: str = _DEFAULTS.stop) -> list[str]:
        """Translate each text; beam 1 is greedy search. Empty input gives empty output."""
        out = self.translate_detailed(texts, beam, lenpen, 1, max_len_a, max_len_b, batch_tokens, stop=stop)
        return [t.best.text for t in out]

    def translate_detailed(
        self, texts: Sequence[str], beam: int = _DEFAULTS.beam, lenpen: float = _DEFAULTS.lenpen,
        nbest: int = 1, max_len_a: float = _DEFAULTS.max_len_a, max_len_b: int = _DEFAULTS.max_len_b,
        batch_tokens: int = _DEFAULTS.batch_tokens, need_attention: bool = False,
        attention_layer: int = -1, attention_head: int | None = None, min_len: int = 0,
        stop: str = _DEFAULTS.stop,
    ) -> list[Translation]:
        """Translate with beam search (greedy when ``beam == 1``), keeping ``nbest`` hypotheses.

        Settings are validated as :class:`~transduce.config.DecodeConfig`; attention options as
        :func:`~transduce.inference.beam.beam_search`.
        """
        DecodeConfig(beam=beam, lenpen=float(lenpen), max_len_a=float(max_len_a), max_len_b=max_len_b,
                     nbest=nbest, batch_tokens=batch_tokens, stop=stop)
        self._check_attention(attention_layer, attention_head)
        spec = SearchSpec(beam, float(lenpen), nbest, float(max_len_a), max_len_b, min_len, stop,
                          need_attention, attention_layer, attention_head)
        return self._run(texts, spec, batch_tokens)

    def sample(self, texts: Sequence[str], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, max_len_a: float = _DEFAULTS.max_len_a,
               max_len_b: int = _DEFAULTS.max_len_b, batch_tokens: int = _DEFAULTS.batch_tokens,
               ) -> list[Translation]:
        """One sampled translation per text (see :func:`~transduce.inference.sampling.sample`)."""
        check_sampling(temperature, top_k, top_p)
        spec = SearchSpec(max_len_a=float(max_len_a), max_len_b=max_len_b, temperature=float(temperature),
                          top_k=top_k, top_p=float(top_p), seed=seed)
        return self._run(texts, spec, batch_tokens)

    def encode_source(self, text: str) -> tuple[list[int], bool]:
        """Source ids (no EOS), cut to ``max_input_len``; returns (ids, truncated)."""
        ids = self.tokenizer.encode(text, side="src")
        if len(ids) <= self.max_input_len:
            return ids, False
        logger.warning("input of %d tokens truncated to max_input_len=%d: %.40r...",
                       len(ids), self.max_input_len, text)
        return ids[: self.max_input_len], True

    def _run(self, texts: Sequence[str], spec: SearchSpec, batch_tokens: int) -> list[Translation]:
        """Tokenize, search in length-sorted batches, and return results in input order."""
        results = [self._source(text) for text in texts]
        todo = [i for i, r in enumerate(results) if r.source_tokens]
        eos = self.config.eos_id
        batches = [[todo[j] for j in batch]
                   for batch in self._batches([len(results[i].source_tokens) + 1 for i in todo], batch_tokens)]
        sources = [self._pad([results[i].source_tokens + [eos] for i in index]) for index in batches]  # (B, S) each
        for index, out in zip(batches, self._search(sources, spec)):
            for row, i in enumerate(index):
                results[i].hypotheses = self._hypotheses(out, row, len(results[i].source_tokens) + 1)
            logger.debug("translated a batch of %d sentences", len(index))
        return results

    def _source(self, text: str) -> Translation:
        ids, truncated = self.encode_source(text)
        pieces = self.tokenizer.pieces(ids, side="src")
        empty = [Hypothesis("", [], [], 0.0, 0.0)] if not ids else []
        return Translation(text, ids, pieces, empty, truncated)

    def _pad(self, rows: list[list[int]]) -> Tensor:
        """A (B, S) CPU tensor of the rows, PAD-padded."""
        width = max(len(r) for r in rows)
        pad = self.config.pad_id
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)

    def _hypotheses(self, out: SearchOutput, row: int, src_len: int) -> list[Hypothesis]:
        """Hypothesis objects of batch row ``row``, skipping empty (-inf) slots."""
        hyps = []
        eos = self.config.eos_id
        for k in range(out.tokens.shape[1]):
            score = float(out.scores[row, k])
            if score == float("-inf") and hyps:
                continue
            ids = out.hypothesis(row, k)
            ended = bool(ids) and ids[-1] == eos
            content = ids[:-1] if ended else ids
            attention = None
            if out.attention is not None:
                attention = out.attention[row, k, : len(ids), :src_len].float()
            hyps.append(Hypothesis(self.tokenizer.decode(content, side="tgt"),
                                   content, self.tokenizer.pieces(content, side="tgt"),
                                   score, float(out.log_probs[row, k]), ended, attention))
        return hyps

    def _check_attention(self, layer: int, head: int | None) -> None:
        cfg = self.config
        n_layers = getattr(cfg, "n_decoder_layers", None)
        if n_layers is not None and not -n_layers <= layer < n_layers:
            raise ConfigError(f"attention layer: must be in [{-n_layers}, {n_layers}); got {layer}")
        n_heads = getattr(cfg, "n_heads", None)
        if head is not None and n_heads is not None and not 0 <= head < n_heads:
            raise ConfigError(f"attention head: must be in [0, {n_heads}); got {head}")


class Translator(BaseTranslator):
    """A model and its tokenizer, ready to translate lists of sentences.

    Args:
        model: an eval-mode :class:`~transduce.model.Transformer` (or anything with the same
            ``encode``/``decode``/``new_cache``/``config``).
        tokenizer: a :class:`~transduce.data.tokenizer.Tokenizer` (``encode``/``decode``/``pieces``).
        device: "cpu", "cuda", "cuda:1" or "auto".
        precision: "fp32", or "bf16"/"fp16" autocast (meant for CUDA).
        max_input_len: longer inputs are cut to this many tokens, with a warning.

    On CPU the model's linear layers are switched in place to oneDNN (same parameters and
    results; see :func:`~transduce.inference.cpu.use_onednn_linears`), and searches keep
    packed and fused copies of the weights. :meth:`close` (or leaving a ``with Translator(...)``
    block) hands the model back as it came, without those copies: do that before training a
    model you translated with.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, device: str | torch.device = "cpu",
                 precision: str = "fp32", max_input_len: int = _DEFAULTS.max_input_len):
        check_precision(precision)
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        if self.device.type == "cpu":
            use_onednn_linears(self.model)  # same math, faster CPU matmuls (see inference.cpu)
        self.tokenizer = tokenizer
        self.precision = precision
        self.config = model.config
        self.max_input_len = input_limit(self.config, max_input_len)

    def close(self) -> None:
        """Undo the in-place CPU switch and drop the kept weight copies (see
        :func:`~transduce.inference.cpu.drop_inference_state`). The translator still works
        afterwards, through plain ``F.linear`` (slower on CPU; a new Translator switches again)."""
        drop_inference_state(self.model)

    @classmethod
    def load(cls, model_dir: str | os.PathLike, device: str | torch.device = "cpu",
             precision: str = "fp32", max_input_len: int = _DEFAULTS.max_input_len) -> "Translator":
        """Load the model (``config.yaml`` + ``model.safetensors``) and tokenizer of a model dir."""
        from ..data.tokenizer import Tokenizer
        from ..model import load_model

        if not os.path.isdir(model_dir):
            raise CheckpointError(f"{model_dir}: model directory not found")
        device = resolve_device(device)
        return cls(load_model(model_dir, device), Tokenizer.load(model_dir), device, precision, max_input_len)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to bf16/fp16 when ``precision`` asks for it, else nothing."""
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _search(self, batches: list[Tensor], spec: SearchSpec) -> Iterator[SearchOutput]:
        for src in batches:
            with torch.inference_mode(), self.autocast():
                out = spec.run(self.model, src.to(self.device)).cpu()
            yield out  # outside the block: the caller does not run in inference mode


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def input_limit(config, max_input_len: int) -> int:
    """``max_input_len``, capped by what learned positions can represent."""
    cap = config.max_positions - 1 if getattr(config, "positions", None) == "learned" else max_input_len
    return min(max_input_len, cap)
