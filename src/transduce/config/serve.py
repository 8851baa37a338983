"""The serve section: the HTTP server's address and limits (where the model runs is
:class:`~transduce.config.runtime.Runtime`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import check, one_of, positive, typecheck

BATCHING = ("none", "request", "continuous")


@dataclass(frozen=True)
class ServeConfig:
    """Server settings (``transduce serve``); every limit is a field, checked on creation."""

    host: str = "127.0.0.1"
    """The address to listen on."""
    port: int = 8000
    """The port to listen on."""
    batch_wait_ms: float = 5.0
    """How long a batch waits for more requests to join it."""
    batching: str = "request"
    """How requests share the model (``--batching``): ``request`` (concurrent requests gathered into
    batches), ``continuous`` (as ``request``, and each sentence of a plain /translate request joins
    the running batch at the next decoding step, :mod:`transduce.inference.engine`) or ``none`` (one
    request per batch). An older ``batching: false`` / ``continuous: true`` is read as this."""
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
    api_key: str | None = field(default=None, repr=False)
    """Required as ``Authorization: Bearer KEY`` by the POST routes (401 otherwise); never logged."""
    max_per_client: int | None = None
    """Requests one client address may have in flight (429 beyond); None: no limit."""
    grpc_port: int | None = None
    """The Triton engine's gRPC port; None: ``port`` + 1."""

    def __post_init__(self) -> None:
        typecheck(self, "serve")
        one_of(self.batching, "serve.batching", BATCHING)
        check(self.api_key is None or bool(self.api_key.strip()), "serve.api_key", "is empty")
        positive(self, "serve", ("max_per_client", "max_body_bytes", "max_sentences", "max_sentence_chars",
                                 "max_queued"))
        check(0 <= self.port <= 65535, "serve.port", f"must be in [0, 65535]; got {self.port}")
        check(self.grpc_port is None or 0 <= self.grpc_port <= 65535, "serve.grpc_port",
              f"must be in [0, 65535]; got {self.grpc_port}")
        check(self.batch_wait_ms >= 0, "serve.batch_wait_ms", f"must be >= 0; got {self.batch_wait_ms}")
        positive(self, "serve", ("request_timeout_s",))
