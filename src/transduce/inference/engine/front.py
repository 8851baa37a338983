"""The Python front door of continuous batching: :class:`ContinuousTranslator`.

Any thread may :meth:`~ContinuousTranslator.submit` a sentence (text or source ids) with its
own settings and get a :class:`Handle` (a future of its
:class:`~transduce.inference.Translation`, its stream of settled text, ``cancel``); one decode
thread owns the model and runs the :class:`~.scheduler.Scheduler` step by step, so a request
joins the running batch at the next step instead of waiting for the batch to end.

Examples:
    >>> from transduce.inference.engine import ContinuousTranslator      # doctest: +SKIP
    >>> with ContinuousTranslator.load("runs/base/model") as engine:      # doctest: +SKIP
    ...     a = engine.submit("A dog runs.", beam=4)
    ...     b = engine.submit("A cat sleeps.", beam=1, max_len_b=20)
    ...     print(a.result().best.text, b.result().best.text)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Iterator, Sequence

from ...config import DecodeConfig, Runtime
from ...errors import ConfigError
from ..translation import Hypothesis, Translation, input_limit
from ..translator import Translator
from .requests import Request, RequestSettings, Result
from .scheduler import Budget, Scheduler

logger = logging.getLogger(__name__)

_END = object()  # closes a handle's stream


class Handle:
    """One submitted sentence: :meth:`result` waits for its
    :class:`~transduce.inference.Translation`; :meth:`stream` yields its settled text as it
    grows; :meth:`cancel` frees its rows at the next step."""

    def __init__(self, request: Request | None, future: Future):
        self.request, self.future = request, future
        self._updates: queue.SimpleQueue = queue.SimpleQueue()

    def result(self, timeout: float | None = None) -> Translation:
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        """Stop the search: its rows leave the batch at the next step; :meth:`result` raises
        :class:`~.scheduler.CancelledRequest`."""
        if self.request is not None:
            self.request.cancelled = True

    def stream(self, timeout: float | None = None) -> Iterator[str]:
        """The settled text each time it grows (greedy search and sampling settle every token,
        beam search the prefix all its hypotheses share), then the final text."""
        shown = None
        while True:
            item = self._updates.get(timeout=timeout)
            if item is _END:
                break
            if item != shown:
                shown = item
                yield item
        best = self.result(timeout).best.text
        if best != shown:
            yield best


class ContinuousTranslator:
    """Translate sentences submitted from any thread in one continuous batch.

    Args:
        translator: the :class:`~transduce.inference.Translator` whose model (prepared for
            decoding), tokenizer, device and default settings (:attr:`decode`) are used.
        budget: the running batch's limits (:class:`~.scheduler.Budget`).

    Requests whose settings a shared step does not do (repetition controls, shortlists,
    reranking; constraints, prefixes, attention maps, ensembles and draft models are not taken
    here) run on :class:`~transduce.inference.Translator`; :meth:`submit` names the setting.
    """

    def __init__(self, translator: Translator, budget: Budget = Budget()):
        if translator.speculation is not None:
            raise ConfigError("draft: speculative decoding runs on request batching, not continuous batching")
        self.translator, self.decode = translator, translator.decode
        self.scheduler = Scheduler(translator.model, budget, translator.device)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._closed = False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="transduce-continuous", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, paths, runtime: Runtime = Runtime(), budget: Budget = Budget()) -> "ContinuousTranslator":
        """A model directory's :class:`~transduce.inference.Translator`, run continuously."""
        return cls(Translator.load(paths, runtime), budget)

    def settings(self, decode: DecodeConfig | None = None, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, **overrides) -> RequestSettings:
        """A request's settings: ``decode`` (default :attr:`decode`) with ``overrides``, and sampling's."""
        settings = RequestSettings(self.translator.settings(decode, **overrides), float(temperature), top_k,
                                   float(top_p), seed)
        settings.check()
        return settings

    def submit(self, source: str | Sequence[int], decode: DecodeConfig | None = None, *, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None, **overrides) -> Handle:
        """Queue one sentence (text, or source ids without EOS) with its own settings (``decode``
        and ``overrides`` of its fields, ``beam=1`` greedy; ``temperature`` > 0 sampling).
        Invalid settings or ids raise a one-line ConfigError here; empty text gives an empty
        translation, as :meth:`~transduce.inference.Translator.translate` does."""
        if self._closed:
            raise RuntimeError("the continuous translator is closed")
        settings = self.settings(decode, temperature, top_k, top_p, seed, **overrides)
        ids, text, truncated = self._source_ids(source, settings.decode)
        future: Future = Future()
        if not ids:
            future.set_result(Translation(text, [], [], [Hypothesis("", [], [], 0.0, 0.0)], truncated))
            handle = Handle(None, future)
            handle._updates.put(_END)
            return handle
        handle = Handle(None, future)
        tok = self.translator.tokenizer
        pieces = tok.pieces(ids, side="src")

        def done(outcome: Result | BaseException) -> None:
            handle._updates.put(_END)
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(Translation(text, ids, pieces, self._hypotheses(outcome), truncated))

        def tokens(settled: list[int]) -> None:
            handle._updates.put(tok.decode([t for t in settled if t != self.translator.config.eos_id], side="tgt"))

        handle.request = Request(ids + [self.translator.config.eos_id], settings, done, tokens)
        self._inbox.put(handle.request)
        self._wake.set()
        return handle

    def translate(self, texts: Sequence[str], decode: DecodeConfig | None = None, **overrides) -> list[str]:
        """Submit ``texts`` with the same settings and wait: the best translation of each."""
        handles = [self.submit(t, decode, **overrides) for t in texts]
        return [h.result().best.text for h in handles]

    def stats(self) -> dict:
        """Rows in use, requests waiting and running, decoded positions and their rate."""
        s = self.scheduler
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return {"rows_in_use": s.rows, "queued": self._inbox.qsize() + len(s.waiting), "running": len(s.active),
                "steps": s.steps, "tokens": s.tokens, "finished": s.finished,
                "tokens_per_s": round(s.tokens / elapsed, 1), "max_rows": s.budget.max_rows}

    def close(self, timeout: float = 5.0) -> None:
        """Stop the decode thread; requests not finished get an error."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)

    def __enter__(self) -> "ContinuousTranslator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _source_ids(self, source: str | Sequence[int], decode: DecodeConfig) -> tuple[list[int], str, bool]:
        """(ids without EOS, the text, truncated) of a text or of ids, which must be in the
        source vocabulary and within ``max_input_len``."""
        if isinstance(source, str):
            ids, truncated = self.translator.encode_source(source, decode.max_input_len)
            return ids, source, truncated
        ids = [int(i) for i in source]
        if not ids:
            raise ConfigError("source: empty list of ids (give at least one token; EOS is added)")
        vocab, limit = self.translator.config.src_vocab_size, input_limit(self.translator.config, decode.max_input_len)
        if min(ids) < 0 or max(ids) >= vocab:
            raise ConfigError(f"source: ids must lie in 0..{vocab - 1}, the source vocabulary")
        if len(ids) > limit:
            raise ConfigError(f"source: {len(ids)} ids exceed decode.max_input_len={limit}")
        return ids, self.translator.tokenizer.decode(ids, side="src"), False

    def _hypotheses(self, result: Result) -> list[Hypothesis]:
        tok, eos = self.translator.tokenizer, self.translator.config.eos_id
        hyps = []
        for ids, score, log_prob in zip(result.tokens, result.scores, result.log_probs):
            ended = bool(ids) and ids[-1] == eos
            content = ids[:-1] if ended else ids
            hyps.append(Hypothesis(tok.decode(content, side="tgt"), content, tok.pieces(content, side="tgt"),
                                   score, log_prob, ended))
        return hyps

    def _loop(self) -> None:
        """The decode thread: take submissions, step while there is work, sleep when idle."""
        s = self.scheduler
        while not self._closed:
            while True:
                try:
                    request = self._inbox.get_nowait()
                except queue.Empty:
                    break
                try:
                    s.add(request)
                except Exception as e:  # noqa: BLE001 - that request fails, the others go on
                    request.on_done(e)
            if not s.busy:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            with self.translator.autocast():
                s.step()
        s.fail_all(RuntimeError("the continuous translator is shut down"))
        while True:
            try:
                self._inbox.get_nowait().on_done(RuntimeError("the continuous translator is shut down"))
            except queue.Empty:
                break

