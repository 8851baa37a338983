"""``serve --batching continuous``: plain /translate requests on the continuous batch.

Each sentence of a request joins the running batch at the next decoding step
(:class:`~transduce.inference.engine.ContinuousTranslator`) instead of waiting for a batch of
its own; a request whose settings a shared step does not do (repetition controls, shortlist,
reranking), constraints, alignments, attention maps, documents and streams keep the
request-level :class:`~.batcher.DynamicBatcher`. A request that times out, or whose client
goes away (its handler is cancelled), cancels its sentences: their rows leave at the next step.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import ConfigError
from ..inference.engine import Budget, ContinuousTranslator, RequestSettings, unsupported

logger = logging.getLogger(__name__)


class ContinuousRoute:
    """The continuous batch of a server's :class:`~transduce.inference.Translator`."""

    def __init__(self, translator, max_rows: int = 256):
        why = "worker processes (--workers) run request batches" if hasattr(translator, "pool") else \
            unsupported(translator.model)
        if why is None and translator.speculation is not None:
            why = "a draft model runs on request batching"
        if why is not None:
            raise ConfigError(f"serve.batching: not continuous here ({why}); use --batching request")
        self.engine = ContinuousTranslator(translator, Budget(max_rows=max_rows))

    @staticmethod
    def covers(decode) -> bool:
        """Whether a request with these settings runs here (else on the batcher)."""
        try:
            RequestSettings(decode).check()
        except ConfigError:
            return False
        return True

    async def translate(self, texts: list[str], decode, timeout: float) -> list[str]:
        """Each text's best translation; cancelled (rows freed) on timeout or when the caller is."""
        handles = [self.engine.submit(t, decode) for t in texts]
        try:
            results = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(h.future) for h in handles)),
                                             timeout)
        finally:
            for h in handles:
                if not h.done():
                    h.cancel()
        return [r.best.text for r in results]

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def close(self) -> None:
        self.engine.close()
