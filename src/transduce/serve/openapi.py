"""The server's OpenAPI 3.1 document (``GET /openapi.json``): every route, its request body (the
JSON schema of its pydantic model in :func:`~.requests.request_models`), its answers and their
schemas, the errors each can give (``{"error": ...}``) and, with an API key, the bearer scheme.

Written here rather than derived by FastAPI because the routes read their bodies themselves
(:func:`~.requests.parse_body`: one-line 422s, limits checked before parsing): this document is
what the routes do, and a schema-driven fuzzer (schemathesis, in the tests) holds them to it.
"""

from typing import Any

from ..config import ServeConfig

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_STRINGS = {"type": "array", "items": {"type": "string"}}
# One Server-Sent Event of /translate_stream; its data is JSON: {"text"}, {"translation"} or {"error", "status"}.
_EVENT = {"type": "object", "required": ["event", "data"],
          "properties": {"event": {"enum": ["delta", "done", "error"]}, "data": {"type": "string"}}}

# Answers of each POST route: status -> why. Every one may also be refused by the guard and the
# body limit (401, 413, 429) and by the batcher (503 queue full or workers lost, 504 timeout).
_POST_ERRORS = {"413": "body, sentence list or sentence over the limits", "422": "malformed or invalid request",
                "500": "the batch failed (the server keeps serving)", "503": "queue full, or decoding workers lost",
                "504": "waited longer than request_timeout_s"}


def _answer(schema: dict[str, Any] | None, why: str, media: str = "application/json") -> dict[str, Any]:
    return {"description": why, "content": {media: {"schema": schema or {}}}}


def _post(model: Any, ok: dict[str, Any], summary: str, secured: bool, extra: dict[str, str] | None = None) -> dict:
    errors = {**_POST_ERRORS, **(extra or {}), **({"401": "missing or wrong API key"} if secured else {}),
              "429": "too many requests in flight from this client"}
    operation = {"summary": summary, "requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}},
        "responses": {"200": ok, **{code: _answer(_ERROR, why) for code, why in errors.items()}}}
    if secured:
        operation["security"] = [{"bearer": []}]
    return {"post": operation}


def openapi_document(title: str, version: str, cfg: ServeConfig, models: tuple) -> dict[str, Any]:
    """The OpenAPI document of :func:`~.app.create_app`'s routes for ``cfg`` (its API key)."""
    translate, attention, document, stream = models
    secured = cfg.api_key is not None
    translations = {"type": "object", "required": ["translations"],
                    "properties": {"translations": _STRINGS, "alignments": _STRINGS}}
    maps = {"type": "object", "required": ["translation", "source", "target", "matrix"],
            "properties": {"translation": {"type": "string"}, "source": _STRINGS, "target": _STRINGS,
                           "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}
    one = {"type": "object", "required": ["translation"], "properties": {"translation": {"type": "string"}}}
    paths = {
        "/translate": _post(translate, _answer(translations, "the translations in input order"),
                            "Translate sentences", secured),
        "/attention": _post(attention, _answer(maps, "the translation and its cross-attention"),
                            "One translation with its attention map", secured),
        "/translate_document": _post(document, _answer(one, "the document translated, its layout kept"),
                                     "Translate a document", secured, {"501": "the documents extra is missing"}),
        "/translate_stream": _post(stream, _answer(_EVENT, "Server-Sent Events: delta..., done (or error)",
                                                   "text/event-stream"),
                                   "Stream one translation", secured, {"501": "sse-starlette is missing"}),
        "/health": {"get": {"summary": "Queue, batching counters, workers, limits",
                            "responses": {"200": _answer({"type": "object", "required": ["status"]}, "serving")}}},
        "/": {"get": {"summary": "The demo page",
                      "responses": {"200": _answer({"type": "string"}, "HTML", "text/html")}}},
    }
    doc = {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths}
    if secured:
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
    return doc
