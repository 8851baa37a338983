"""The HTTP server: FastAPI routes around a :class:`~transduce.inference.Translator` and a
:class:`~.batcher.DynamicBatcher` that owns it.

Routes:
    POST /translate  {"sentences": [...], "beam": 4, "lenpen": 0.6, "max_len_a": 1, "max_len_b": 50,
                      "no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "constraints": [[...], ...],
                      "alignment": false, "tgt_lang": "de"}
                     -> {"translations": [...]} in input order (settings not given: the model's); with
                     "alignment": true also {"alignments": ["0-0 1-2 ...", ...]}, word alignments
                     (source word i - target word j, :mod:`transduce.inference.text.alignment`)
    POST /attention  {"sentence": "...", "beam": 4, "layer": -1, "head": null, "tgt_lang": "de"}
                     -> {"translation", "source": pieces, "target": pieces, "matrix": (T x S)}
    POST /translate_document  {"text": "paragraphs...", "language": "en", "beam": 4, "lenpen": 0.6, "tgt_lang": "de"}
                     -> {"translation": "..."}: blank lines and paragraphs kept, nothing cut
                     (:mod:`~transduce.inference.documents`; the ``documents`` extra)
    POST /translate_stream  {"sentence": "...", "beam": 4, "lenpen": 0.6, "tgt_lang": "de"} -> Server-Sent Events:
                     ``delta`` {"text"} as the search settles it, then ``done`` {"translation"} (or
                     ``error`` {"error", "status"}); the deltas joined are the translation
    GET  /health     -> {"status": "ok", "batching": {...counters...}, ...}
    GET  /openapi.json  -> the OpenAPI 3.1 document of these routes (:mod:`.openapi`)
    GET  /           -> the demo page (static/index.html)

With ``api_key`` set, the POST routes need ``Authorization: Bearer KEY`` (401 otherwise; the
page asks for the key); ``max_per_client`` caps one client address's requests in flight (429).

Errors are JSON ``{"error": "..."}``: 413 for a body, a sentence list or a sentence over the
limits, 422 for malformed or invalid requests, 503 when the queue is full (or decoding workers
died or hung twice on a batch), 504 when a request waits longer than ``request_timeout_s``, 500 if a
batch fails; the server keeps serving.
FastAPI, uvicorn and sse-starlette are optional (``pip install 'transduce[serve]'``) and imported lazily.
"""

# No "from __future__ import annotations": FastAPI reads the route annotations at runtime, and
# the classes they name (Request) are imported lazily inside create_app.
import asyncio
import hmac
import logging
import os
from dataclasses import asdict
from importlib import resources
from typing import Any, Hashable

from .. import __version__
from ..config import ServeConfig
from ..data.multilingual import with_tag
from ..errors import ConfigError, TransduceError, require
from ..inference.text.alignment import format_alignment
from ..inference.pool import WorkerLost
from ..inference.runtime import ModelDirs, Runtime, load, model_dirs
from ..inference.search import AttentionChoice
from ..inference.documents import translate_document
from ..inference.streaming import stream_translation
from ..inference.translator import check_layer_head
from .batcher import DynamicBatcher
from .continuous import ContinuousRoute
from .openapi import openapi_document
from .signals import sigterm_as_interrupt
from .requests import ApiError, BodyLimit, check_sentences, optional, parse_body, request_models

logger = logging.getLogger(__name__)


class TranslationService:
    """The model side of the server: a Translator run by a DynamicBatcher's worker thread.

    Args:
        translator: what :func:`~transduce.inference.load` returns for a translation model: a
            :class:`~transduce.inference.Translator` (one model, an ensemble, with a draft) or a
            :class:`~transduce.inference.TranslatorPool` (only the batcher's thread uses it; a pool
            spreads each batch over its worker processes).
        cfg: the server settings (batching wait, queue size, limits).
        defaults: decoding settings replacing the model's own (DecodeConfig field -> value); a
            request's settings replace these; ``batch_tokens`` is also the batcher's token budget.
    """

    def __init__(self, translator, cfg: ServeConfig, defaults: dict[str, Any] | None = None):
        if not translator.config.family.translates:
            raise ConfigError(f"serve: needs a translation model (encoder_decoder); this one is "
                              f"{translator.config.arch}")
        self.translator, self.cfg = translator, cfg
        self.defaults = translator.settings(**(defaults or {}))
        self.batch_tokens = self.defaults.batch_tokens
        self.batcher = DynamicBatcher(self._run, max_cost=self.batch_tokens, wait_ms=cfg.batch_wait_ms,
                                      max_jobs=256 if cfg.batching != "none" else 1, max_queued=cfg.max_queued)
        self.continuous = None
        if cfg.batching == "continuous":
            try:
                self.continuous = ContinuousRoute(translator)
            except BaseException:
                self.batcher.close()
                raise

    def cost(self, items: list[str] | list[tuple[str, tuple[str, ...]]]) -> int:
        """Source tokens + EOS of the items' texts: what the token budget counts."""
        texts = [t if isinstance(t, str) else t[0] for t in items]
        return sum(len(self.translator.tokenizer.encode(t, "src")) + 1 for t in texts)

    def _run(self, key: Hashable, items: list[Any]) -> list[Any]:
        """One batch of jobs with the same key: (kind, DecodeConfig, AttentionChoice or None);
        a ``constrained`` job's items are (text, its constraints), a ``document``'s (text,
        language), a ``stream``'s (text, the function its deltas go to), run one after another; an
        ``aligned`` job's answers (and ``aligned_constrained``'s) are (translation, its alignment)."""
        kind, decode, attention = key
        if kind == "translate":
            return self.translator.translate(items, decode)
        if kind == "document":
            return [translate_document(self.translator, text, decode, language) for text, language in items]
        if kind == "stream":
            return [stream_translation(self.translator, text, emit, decode) for text, emit in items]
        if kind == "constrained":
            return self.translator.translate([t for t, _ in items], decode, constraints=[list(c) for _, c in items])
        if kind in ("aligned", "aligned_constrained"):
            constraints = [list(c) for _, c in items] if kind == "aligned_constrained" else None
            results = self.translator.translate_detailed([t for t, _ in items], decode, constraints=constraints,
                                                         alignment=True)
            return [(r.best.text, format_alignment(r.best.alignment)) for r in results]
        return [attention_payload(r) for r in self.translator.translate_detailed(items, decode, attention)]

    def settings(self, **fields) -> Any:
        """The server's decoding settings with a request's fields (one best translation each)."""
        return self.translator.settings(self.defaults, nbest=1, **fields)

    def close(self) -> None:
        self.batcher.close()
        if self.continuous is not None:
            self.continuous.close()
        self.translator.close()


def attention_payload(result) -> dict[str, Any]:
    """A Translation with attention -> JSON: pieces on both axes and the (T x S) matrix."""
    best = result.best
    target = list(best.pieces) + (["</s>"] if best.ended else [])
    source = list(result.source_pieces) + (["</s>"] if result.source_tokens else [])
    matrix = [] if best.attention is None else [[round(float(x), 5) for x in row] for row in best.attention]
    return {"translation": best.text, "source": source, "target": target, "matrix": matrix}


def load_service(paths: ModelDirs, cfg: ServeConfig, runtime: Runtime = Runtime(),
                 draft: str | os.PathLike | None = None, defaults: dict[str, Any] | None = None
                 ) -> TranslationService:
    """The model directories (one, or an ensemble; a ``draft``) loaded for ``runtime`` by the
    one front door (:func:`~transduce.inference.load`), served with ``cfg`` and the decoding
    ``defaults``."""
    translator = load(paths, runtime, draft)
    try:
        return TranslationService(translator, cfg, defaults)
    except BaseException:
        translator.close()
        raise


async def run_job(service: TranslationService, key: Hashable, items: list[str]) -> list[Any]:
    """Submit to the batcher and wait (503 queue full, 504 timeout, 422/500 on failure)."""
    try:
        future = service.batcher.submit(key, items, service.cost(items))
    except RuntimeError as e:
        raise ApiError(503, str(e)) from None
    try:
        return await await_job(future, service.cfg.request_timeout_s)
    except asyncio.TimeoutError:
        future.cancel()
        raise ApiError(504, f"not answered within {service.cfg.request_timeout_s:g} s") from None
    except WorkerLost as e:
        raise ApiError(503, str(e)) from None
    except TransduceError as e:
        raise ApiError(422, str(e)) from None
    except Exception as e:  # noqa: BLE001 - reported to the client, logged by the batcher
        raise ApiError(500, f"translation failed: {type(e).__name__}: {e}") from None


async def continuous_job(service: TranslationService, texts: list[str], decode) -> list[str]:
    """Sentences on the continuous batch (422 on a bad one, 503 shut down, 504 timeout)."""
    try:
        return await service.continuous.translate(texts, decode, service.cfg.request_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(504, f"not answered within {service.cfg.request_timeout_s:g} s") from None
    except TransduceError as e:
        raise ApiError(422, str(e)) from None
    except RuntimeError as e:
        raise ApiError(503, str(e)) from None


def request_settings(service: TranslationService, req, texts: list[str], **fields) -> Any:
    """A request's decoding settings (its fields ``model_dump(**fields)`` picks), its ``tgt_lang``
    checked against the model's target-language tags for ``texts`` (:func:`with_tag`): a missing
    or unknown one is this request's 422, not a failure of the batch it would join."""
    decode = service.settings(**req.model_dump(exclude_none=True, **fields))
    try:
        with_tag(texts, decode.tgt_lang, getattr(service.translator.tokenizer, "lang_tags", {}))
    except ConfigError as e:
        raise ApiError(422, str(e)) from None
    return decode


async def translate_job(service: TranslationService, req) -> dict[str, list[str]]:
    """A /translate request's answer: one job of plain sentences, or of (sentence, its
    constraints) items (422 unless one list of constraints per sentence); with ``alignment``
    the word alignments too."""
    decode = request_settings(service, req, req.sentences, exclude={"sentences", "constraints", "alignment"})
    if req.constraints is None and not req.alignment:
        if service.continuous is not None and service.continuous.covers(decode):
            return {"translations": await continuous_job(service, req.sentences, decode)}
        return {"translations": await run_job(service, ("translate", decode, None), req.sentences)}
    if req.constraints is not None and len(req.constraints) != len(req.sentences):
        raise ApiError(422, f"constraints: {len(req.constraints)} lists for {len(req.sentences)} sentences "
                            "(one per sentence)")
    items = [(s, tuple(c)) for s, c in zip(req.sentences, req.constraints or [()] * len(req.sentences))]
    if not req.alignment:
        return {"translations": await run_job(service, ("constrained", decode, None), items)}
    kind = "aligned" if req.constraints is None else "aligned_constrained"
    answers = await run_job(service, (kind, decode, None), items)
    return {"translations": [t for t, _ in answers], "alignments": [a for _, a in answers]}


def create_app(service: TranslationService, title: str = "transduce"):
    """The FastAPI application for ``service`` (see the module docstring for the routes)."""
    fastapi = require("fastapi", "serve", "serving")
    from fastapi import Request
    from fastapi.responses import HTMLResponse, JSONResponse

    app = fastapi.FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_bytes=service.cfg.max_body_bytes)  # inside the guard: added first

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    _add_guard(app, service.cfg)
    _add_decode_routes(app, service)

    @app.get("/health")
    async def health():
        return _health_report(service)

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(index_html())

    document = openapi_document(title, __version__, service.cfg, request_models())

    @app.get("/openapi.json")
    async def openapi():
        return document

    return app


def _add_guard(app, cfg: ServeConfig) -> None:
    """The API key (constant-time comparison) and the per-client limit, as middleware in front of
    the POST routes."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    expected = None if cfg.api_key is None else f"Bearer {cfg.api_key.strip()}".encode()
    in_flight: dict[str, int] = {}

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.method != "POST":
            return await call_next(request)
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"error": "missing or wrong API key (Authorization: Bearer KEY)"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
        client = request.client.host if request.client else "?"
        if cfg.max_per_client is not None and in_flight.get(client, 0) >= cfg.max_per_client:
            return JSONResponse({"error": f"too many requests in flight from {client} "
                                          f"(at most {cfg.max_per_client})"}, status_code=429)
        in_flight[client] = in_flight.get(client, 0) + 1
        try:
            return await call_next(request)
        finally:
            in_flight[client] -= 1
            if not in_flight[client]:
                del in_flight[client]


def _add_decode_routes(app, service: TranslationService) -> None:
    """POST /translate and POST /attention."""
    from fastapi import Request

    TranslateRequest, AttentionRequest, DocumentRequest, StreamRequest = request_models()
    cfg, model_cfg = service.cfg, service.translator.config

    @app.post("/translate")
    async def translate(request: Request):
        req = await parse_body(request, TranslateRequest)
        check_sentences(req.sentences, cfg)
        if not req.sentences:
            return {"translations": []} | ({"alignments": []} if req.alignment else {})
        return await translate_job(service, req)

    @app.post("/attention")
    async def attention(request: Request):
        req = await parse_body(request, AttentionRequest)
        check_sentences([req.sentence], cfg)
        if not req.sentence.strip():
            raise ApiError(422, "sentence: is empty")
        try:
            check_layer_head(model_cfg, req.layer, req.head, "layer")
        except ConfigError as e:
            raise ApiError(422, str(e)) from None
        decode = request_settings(service, req, [req.sentence], include={"beam", "lenpen", "tgt_lang"})
        key = ("attention", decode, AttentionChoice(req.layer, req.head))
        return (await run_job(service, key, [req.sentence]))[0]

    @app.post("/translate_document")
    async def translate_document_route(request: Request):
        optional("sentencex", "documents", "document translation")
        req = await parse_body(request, DocumentRequest)
        decode = request_settings(service, req, [req.text], include={"beam", "lenpen", "tgt_lang"})
        return {"translation": (await run_job(service, ("document", decode, None), [(req.text, req.language)]))[0]}

    @app.post("/translate_stream")
    async def translate_stream(request: Request):
        sse = optional("sse_starlette", "serve", "streaming")
        req = await parse_body(request, StreamRequest)
        check_sentences([req.sentence], cfg)
        decode = request_settings(service, req, [req.sentence], include={"beam", "lenpen", "tgt_lang"})
        loop, deltas = asyncio.get_running_loop(), asyncio.Queue()

        def emit(delta: str) -> None:  # called from the batcher's thread
            loop.call_soon_threadsafe(deltas.put_nowait, delta)

        job = asyncio.ensure_future(run_job(service, ("stream", decode, None), [(req.sentence, emit)]))
        return sse.EventSourceResponse(stream_events(job, deltas))


async def stream_events(job: asyncio.Future, deltas: asyncio.Queue):
    """The Server-Sent Events of a streamed translation: each delta as it comes, then the whole
    translation (``done``) or the job's error (``error``)."""
    import json

    while True:
        getter = asyncio.ensure_future(deltas.get())
        await asyncio.wait({getter, job}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            break
        yield {"event": "delta", "data": json.dumps({"text": getter.result()})}
    while not deltas.empty():  # what the search emitted before the job's result arrived
        yield {"event": "delta", "data": json.dumps({"text": deltas.get_nowait()})}
    try:
        yield {"event": "done", "data": json.dumps({"translation": job.result()[0]})}
    except ApiError as e:
        yield {"event": "error", "data": json.dumps({"error": e.message, "status": e.status})}


def _health_report(service: TranslationService) -> dict[str, Any]:
    """GET /health: the queue, the batcher's counters, the workers and the limits."""
    cfg, pool = service.cfg, getattr(service.translator, "pool", None)
    if pool is not None:
        pool.refresh()  # a replacement that has loaded since the last batch is counted
    workers = None if pool is None else {"count": pool.workers, "pids": pool.pids, "restarts": pool.restarts,
                                         "hangs": pool.hangs, "timeout_s": pool.timeout_s}
    return {"status": "ok", "queued": service.batcher.queued(), "batching": asdict(service.batcher.stats),
            "workers": workers, "continuous": None if service.continuous is None else service.continuous.stats(),
            "limits": {"max_sentences": cfg.max_sentences, "max_sentence_chars": cfg.max_sentence_chars,
                       "max_body_bytes": cfg.max_body_bytes, "batch_tokens": service.batch_tokens,
                       "batch_wait_ms": cfg.batch_wait_ms, "batching": cfg.batching}}


def serve(paths: ModelDirs, cfg: ServeConfig, runtime: Runtime = Runtime(), draft: str | os.PathLike | None = None,
          defaults: dict[str, Any] | None = None) -> None:
    """Load the model directories as :func:`load_service` does and serve them with uvicorn until
    SIGINT (Ctrl-C) or SIGTERM, then close the service (``transduce serve``; it exits 0)."""
    uvicorn = require("uvicorn", "serve", "serving")
    require("fastapi", "serve", "serving")
    model_dir = model_dirs(paths)[0]
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and cfg.api_key is None:
        logger.warning("serving on %s: reachable from other machines, and without an API key anyone can use "
                       "it (serve --api-key-file FILE or $TRANSDUCE_API_KEY)", cfg.host)
    settings = {**asdict(cfg), "api_key": None if cfg.api_key is None else "(set)"}
    with sigterm_as_interrupt():
        service = load_service(paths, cfg, runtime, draft, defaults)
        logger.info("serving %s on http://%s:%d (settings: %s; %s)", model_dir, cfg.host, cfg.port, settings, runtime)
        try:
            uvicorn.run(create_app(service, title=f"transduce: {os.path.basename(os.path.abspath(model_dir))}"),
                        host=cfg.host, port=cfg.port, log_level="info")
        except KeyboardInterrupt:  # SIGINT or SIGTERM after uvicorn's shutdown: how a server is stopped
            pass
        finally:
            service.close()
    logger.info("stopped serving %s (requests in flight answered, batcher and model closed)", model_dir)


def index_html() -> str:
    """The demo page shipped as package data (serve/static/index.html)."""
    return resources.files("transduce.serve").joinpath("static/index.html").read_text(encoding="utf-8")


async def await_job(future, timeout: float) -> Any:
    """Wait for a batcher future from async code without blocking the event loop."""
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
