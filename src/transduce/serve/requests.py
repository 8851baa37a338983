"""What the server checks of a request before any work: the body's size (:class:`BodyLimit`),
its JSON against the pydantic models of :func:`request_models`, the sentences' count and length;
each problem an :class:`ApiError` answered as ``{"error": message}`` with its HTTP status."""

# No "from __future__ import annotations": pydantic reads the field annotations at runtime.
from ..config import ServeConfig
from ..errors import TransduceError, require


class ApiError(Exception):
    """An error answered as ``{"error": message}`` with an HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class BodyLimit:
    """ASGI middleware: 413 for a body over ``max_bytes`` (declared or streamed), before parsing."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            return await _send_json(send, 413, {"error": f"request body over {self.max_bytes} bytes"})
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise ApiError(413, f"request body over {self.max_bytes} bytes")
            return message

        return await self.app(scope, limited, send)


async def _send_json(send, status: int, payload: dict) -> None:
    import json

    body = json.dumps(payload).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def request_models():
    """The pydantic models of the request bodies (built on demand: pydantic comes with FastAPI)."""
    from pydantic import BaseModel, ConfigDict, Field

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        sentences: list[str]  # settings not given: the model's own (its saved DecodeConfig)
        beam: int | None = Field(None, ge=1, le=16)
        lenpen: float | None = Field(None, ge=0.0, le=5.0)
        max_len_a: float | None = Field(None, ge=0.0, le=4.0)
        max_len_b: int | None = Field(None, ge=0, le=1024)
        no_repeat_ngram_size: int | None = Field(None, ge=0, le=16)
        repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
        tgt_lang: str | None = Field(None, pattern=r"^[a-z]{2,3}$")  # a multilingual model's target language
        constraints: list[list[str]] | None = None  # per sentence: target phrases it must contain
        alignment: bool = False  # also answer each translation's word alignment

    class AttentionRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        sentence: str
        beam: int | None = Field(None, ge=1, le=16)
        lenpen: float | None = Field(None, ge=0.0, le=5.0)
        tgt_lang: str | None = Field(None, pattern=r"^[a-z]{2,3}$")
        layer: int = -1
        head: int | None = None

    class DocumentRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        text: str
        language: str = Field("en", pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]+)?$")
        beam: int | None = Field(None, ge=1, le=16)
        lenpen: float | None = Field(None, ge=0.0, le=5.0)
        tgt_lang: str | None = Field(None, pattern=r"^[a-z]{2,3}$")

    class StreamRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        sentence: str
        beam: int | None = Field(None, ge=1, le=16)
        lenpen: float | None = Field(None, ge=0.0, le=5.0)
        tgt_lang: str | None = Field(None, pattern=r"^[a-z]{2,3}$")

    return TranslateRequest, AttentionRequest, DocumentRequest, StreamRequest


async def parse_body(request, model):
    """The JSON body validated as ``model``; ApiError(422) with the first problem otherwise."""
    from pydantic import ValidationError

    try:
        data = await request.json()
    except ValueError:
        raise ApiError(422, "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(422, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "body"
        raise ApiError(422, f"{where}: {err['msg']}") from None


def optional(module: str, extra: str, what: str):
    """An optional package for one route, or ApiError(501) naming the extra that installs it."""
    try:
        return require(module, extra, what)
    except TransduceError as e:
        raise ApiError(501, str(e)) from None


def check_sentences(sentences: list[str], cfg: ServeConfig) -> None:
    """413 for too many or too long sentences."""
    if len(sentences) > cfg.max_sentences:
        raise ApiError(413, f"{len(sentences)} sentences; at most {cfg.max_sentences} per request")
    longest = max((len(s) for s in sentences), default=0)
    if longest > cfg.max_sentence_chars:
        raise ApiError(413, f"a sentence of {longest} characters; at most {cfg.max_sentence_chars}")
