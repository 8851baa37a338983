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
from typing import Callable, Sequence

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


# Runs one search over a (B, S) batch of source ids.
Search = Callable[[Tensor], SearchOutput]


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> CUDA if available else CPU; a ConfigError for CUDA without a GPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {device} requested but CUDA is not available")
    return device


class Translator:
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
        if precision not in PRECISIONS:
            raise ConfigError(f"precision: must be one of {', '.join(PRECISIONS)}; got {precision!r}")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        if self.device.type == "cpu":
            use_onednn_linears(self.model)  # same math, faster CPU matmuls (see inference.cpu)
        self.tokenizer = tokenizer
        self.precision = precision
        cfg = model.config
        cap = cfg.max_positions - 1 if getattr(cfg, "positions", None) == "learned" else max_input_len
        self.max_input_len = min(max_input_len, cap)

    def close(self) -> None:
        """Undo the in-place CPU switch and drop the kept weight copies (see
        :func:`~transduce.inference.cpu.drop_inference_state`). The translator still works
        afterwards, through plain ``F.linear`` (slower on CPU; a new Translator switches again)."""
        drop_inference_state(self.model)

    def __enter__(self) -> "Translator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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

        def search(src: Tensor) -> SearchOutput:
            if beam == 1:
                return greedy_search(self.model, src, max_len_a, max_len_b, min_len, True,
                                     need_attention, attention_layer, attention_head)
            return beam_search(self.model, src, beam, lenpen, max_len_a, max_len_b, nbest, min_len,
                               need_attention, attention_layer, attention_head, stop)

        return self._run(texts, search, batch_tokens)

    def sample(self, texts: Sequence[str], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, max_len_a: float = _DEFAULTS.max_len_a,
               max_len_b: int = _DEFAULTS.max_len_b, batch_tokens: int = _DEFAULTS.batch_tokens,
               ) -> list[Translation]:
        """One sampled translation per text (see :func:`~transduce.inference.sampling.sample`)."""
        check_sampling(temperature, top_k, top_p)
        return self._run(texts, lambda src: sample(self.model, src, temperature, top_k, top_p, seed,
                                                   max_len_a, max_len_b), batch_tokens)

    def encode_source(self, text: str) -> tuple[list[int], bool]:
        """Source ids (no EOS), cut to ``max_input_len``; returns (ids, truncated)."""
        ids = self.tokenizer.encode(text, side="src")
        if len(ids) <= self.max_input_len:
            return ids, False
        logger.warning("input of %d tokens truncated to max_input_len=%d: %.40r...",
                       len(ids), self.max_input_len, text)
        return ids[: self.max_input_len], True

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to bf16/fp16 when ``precision`` asks for it, else nothing."""
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _run(self, texts: Sequence[str], search: Search, batch_tokens: int) -> list[Translation]:
        """Tokenize, search in length-sorted batches, and return results in input order."""
        results = [self._source(text) for text in texts]
        todo = [i for i, r in enumerate(results) if r.source_tokens]
        eos = self.model.config.eos_id
        for batch in length_sorted_batches([len(results[i].source_tokens) + 1 for i in todo], batch_tokens):
            index = [todo[j] for j in batch]
            src = self._pad([results[i].source_tokens + [eos] for i in index])  # (B, S)
            with torch.inference_mode(), self.autocast():
                out = search(src).cpu()
            for row, i in enumerate(index):
                results[i].hypotheses = self._hypotheses(out, row, len(results[i].source_tokens) + 1)
            logger.debug("translated a batch of %d sentences (%d source tokens wide)", *src.shape)
        return results

    def _source(self, text: str) -> Translation:
        ids, truncated = self.encode_source(text)
        pieces = self.tokenizer.pieces(ids, side="src")
        empty = [Hypothesis("", [], [], 0.0, 0.0)] if not ids else []
        return Translation(text, ids, pieces, empty, truncated)

    def _pad(self, rows: list[list[int]]) -> Tensor:
        width = max(len(r) for r in rows)
        pad = self.model.config.pad_id
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=self.device)

    def _hypotheses(self, out: SearchOutput, row: int, src_len: int) -> list[Hypothesis]:
        """Hypothesis objects of batch row ``row``, skipping empty (-inf) slots."""
        hyps = []
        eos = self.model.config.eos_id
        for k in range(out.tokens.shape[1]):
            score = float(out.scores[row, k])
            if score == float("-inf") and hyps:
                continue
            ids = out.hypothesis(row, k)
            ended = bool(ids) and ids[-1] == eos
            content = ids[:-1] if ended else ids
            attention = None
            if out.attention is not None:
                attention = out.attention[row, k, : len(ids), :src_len].float().cpu()
            hyps.append(Hypothesis(self.tokenizer.decode(content, side="tgt"),
                                   content, self.tokenizer.pieces(content, side="tgt"),
                                   score, float(out.log_probs[row, k]), ended, attention))
        return hyps

    def _check_attention(self, layer: int, head: int | None) -> None:
        cfg = self.model.config
        n_layers = getattr(cfg, "n_decoder_layers", None)
        if n_layers is not None and not -n_layers <= layer < n_layers:
            raise ConfigError(f"attention layer: must be in [{-n_layers}, {n_layers}); got {layer}")
        n_heads = getattr(cfg, "n_heads", None)
        if head is not None and n_heads is not None and not 0 <= head < n_heads:
            raise ConfigError(f"attention head: must be in [0, {n_heads}); got {head}")
