"""The serve section: the HTTP server's address, limits and decoding resources."""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import check, positive, typecheck

# A batch a decoding worker leaves unanswered this long means a hung worker (inference/pool.py
# gives a large batch more once it has measured the model's speed).
WORKER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServeConfig:
    """Server settings (``transduce serve``); every limit is a field, checked on creation."""

    host: str = "127.0.0.1"
    """The address to listen on."""
    port: int = 8000
    """The port to listen on."""
    batch_tokens: int | None = None
    """A batch's token budget; None: the model's decoding settings' (``decode.batch_tokens``)."""
    batch_wait_ms: float = 5.0
    """How long a batch waits for more requests to join it."""
    batching: bool = True
    """Gather concurrent requests into batches; False: one request per batch."""
    max_body_bytes: int = 256 * 1024
    """Largest request body (413 beyond)."""
    max_sentences: int = 64
    """Most sentences in one request (413 beyond)."""
    max_sentence_chars: int = 2000
    """Longest sentence, in characters (413 beyond)."""
    max_queued: int = 1024
    """Requests waiting at most (503 beyond)."""
    request_timeout_s: float = 30.0
    """How long a request may wait for its answer (504 beyond)."""
    int8: bool = False
    """Dynamic int8 quantisation of the linear layers (CPU only)."""
    device: str = "cpu"
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``; worker processes need the CPU."""
    threads: int | None = None
    """CPU threads for torch; with ``workers``, per worker process (None: 1); without, None: torch's default."""
    workers: int = 0
    """Decoding worker processes, each batch spread over them; 0: decode in the server's process."""
    worker_timeout_s: float = WORKER_TIMEOUT_S
    """A batch a worker leaves unanswered this long means a hung worker, which is restarted."""
    api_key: str | None = field(default=None, repr=False)
    """Required as ``Authorization: Bearer KEY`` by the POST routes (401 otherwise); never logged."""
    max_per_client: int | None = None
    """Requests one client address may have in flight (429 beyond); None: no limit."""

    def __post_init__(self) -> None:
        typecheck(self, "serve")
        check(self.api_key is None or bool(self.api_key.strip()), "serve.api_key", "is empty")
        positive(self, "serve", ("max_per_client", "batch_tokens", "max_body_bytes", "max_sentences",
                                 "max_sentence_chars", "max_queued"))
        check(0 <= self.port <= 65535, "serve.port", f"must be in [0, 65535]; got {self.port}")
        check(self.workers >= 0, "serve.workers", f"must be >= 0; got {self.workers}")
        check(not self.workers or self.device in ("cpu", "auto"), "serve.workers",
              f"worker processes decode on the CPU; got serve.device={self.device!r}")
        positive(self, "serve", ("worker_timeout_s",))
        check(self.batch_wait_ms >= 0, "serve.batch_wait_ms", f"must be >= 0; got {self.batch_wait_ms}")
        positive(self, "serve", ("request_timeout_s",))
