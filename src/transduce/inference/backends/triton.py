"""The ``translate`` model that Triton serves, without Triton: requests of BYTES rows in, rows of
translations, scores and errors out. Both ways of running it call :class:`TritonTranslate`: the
server that ``transduce serve --engine triton`` starts (:mod:`transduce.serve.triton`, through pytriton) and the
Python-backend ``model.py`` of a repository that ``transduce export --format triton`` writes.

A request is ``text`` (BYTES, one sentence per row) with optional request parameters (the
:data:`PARAMETERS`, e.g. ``beam`` and ``nbest``) replacing the model directory's decoding
settings. Its answer: ``translation`` (BYTES, ``nbest`` per row, best first), ``score`` (FP32, the
same shape) and ``error`` (BYTES, one per row: "" or why that row was not translated).

Triton fails every request of a dynamic batch when the model raises, so a bad row (an empty
string, bytes that are not UTF-8, a line over the length limit) or a bad parameter is answered
in that row's ``error``, and the rest of the batch, this request's other rows included, is
translated. Requests with the same settings are translated together: the batch Triton gathered
is one call of the Translator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...errors import TransduceError, one_line

# The request parameters a client may set (Triton's "parameters"), each a DecodeConfig field, and
# its type (Triton's parameters are strings, integers or booleans, so a float may come as "0.6").
PARAMETERS = {"beam": int, "nbest": int, "lenpen": float, "max_len_a": float, "max_len_b": int,
              "no_repeat_ngram_size": int, "repetition_penalty": float}
MAX_BEAM = 16  # a request's beam at most, as the HTTP server's


@dataclass
class Rows:
    """One request's rows as the model reads them: ``texts`` (None where the row is bad),
    ``errors`` ("" where fine) and the request's decoding settings (None if its parameters are bad)."""

    texts: list[str | None]
    errors: list[str]
    decode: Any


class TritonTranslate:
    """Answers batches of ``translate`` requests with a Translator (or a TranslatorPool).

    Args:
        translator: what :func:`~transduce.inference.load` returns for a translation model.
        defaults: DecodeConfig fields replacing the model's own settings (a request's
            parameters replace these).
        max_chars: the longest row, in characters (longer rows are answered with an error).
    """

    def __init__(self, translator, defaults: dict[str, Any] | None = None, max_chars: int = 2000):
        self.translator, self.max_chars = translator, max_chars
        self.defaults = translator.settings(**(defaults or {}))

    def rows(self, text: np.ndarray, parameters: dict[str, Any]) -> Rows:
        """A request's ``text`` tensor (n x 1 BYTES) and parameters, checked row by row."""
        flat = [x for x in np.asarray(text, dtype=object).reshape(-1)]
        try:
            decode = self.settings(parameters)
        except TransduceError as e:
            return Rows([None] * len(flat), [one_line(e)] * len(flat), None)
        texts, errors = [], []
        for raw in flat:
            sentence, error = self.sentence(raw)
            texts.append(sentence)
            errors.append(error)
        return Rows(texts, errors, decode)

    def settings(self, parameters: dict[str, Any]):
        """The server's settings with a request's parameters (a TransduceError names a bad one)."""
        unknown = sorted(set(parameters) - set(PARAMETERS))
        if unknown:
            raise TransduceError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(PARAMETERS)}")
        try:
            decode = self.translator.settings(self.defaults, **{k: number(k, v) for k, v in parameters.items()})
        except (TypeError, ValueError) as e:
            raise TransduceError(one_line(e)) from None
        if decode.beam > MAX_BEAM:
            raise TransduceError(f"beam: at most {MAX_BEAM}; got {decode.beam}")
        return decode

    def sentence(self, raw) -> tuple[str | None, str]:
        """One row: (the sentence, "") or (None, why it cannot be translated)."""
        if isinstance(raw, (bytes, np.bytes_)):
            try:
                raw = bytes(raw).decode("utf-8")
            except UnicodeDecodeError as e:
                return None, f"not UTF-8 text (byte {e.start}: {bytes(raw)[e.start:e.start + 1]!r})"
        if not isinstance(raw, str):
            return None, f"not a string ({type(raw).__name__})"
        if not raw.strip():
            return None, "an empty sentence"
        if len(raw) > self.max_chars:
            return None, f"a sentence of {len(raw)} characters; at most {self.max_chars}"
        return raw, ""

    def answer(self, requests: Sequence[Rows]) -> list[dict[str, np.ndarray]]:
        """The outputs of each request: its good rows of equal settings are translated together."""
        results: list[list[Any]] = [[None] * len(r.texts) for r in requests]
        groups: dict[Any, list[tuple[int, int]]] = {}
        for i, r in enumerate(requests):
            for j, text in enumerate(r.texts):
                if text is not None:
                    groups.setdefault(r.decode, []).append((i, j))
        for decode, where in groups.items():
            try:
                done = self.translator.translate_detailed([requests[i].texts[j] for i, j in where], decode)
            except TransduceError as e:  # a setting this model cannot run: those rows' error
                for i, j in where:
                    requests[i].errors[j] = one_line(e)
                continue
            for (i, j), translation in zip(where, done):
                results[i][j] = translation
        return [outputs(r, res) for r, res in zip(requests, results)]

    def close(self) -> None:
        self.translator.close()


def number(name: str, value: Any) -> int | float:
    """A request parameter as its field's type (an int; a float, given as a number or a string)."""
    kind = PARAMETERS[name]
    if not isinstance(value, bool) and isinstance(value, (int, str) if kind is int else (int, float, str)):
        try:
            return kind(value)
        except ValueError:
            pass
    raise TransduceError(f"{name}: must be {'an integer' if kind is int else 'a number'}; got {value!r}")


def outputs(rows: Rows, translations: list[Any]) -> dict[str, np.ndarray]:
    """A request's output tensors: n x nbest translations and scores, n x 1 errors (a bad row's
    translations are "" and its scores NaN)."""
    width = rows.decode.nbest if rows.decode is not None else 1
    text = np.full((len(rows.texts), width), b"", dtype=object)
    score = np.full((len(rows.texts), width), np.nan, dtype=np.float32)
    for j, t in enumerate(translations):
        if t is None:
            continue
        for k, hyp in enumerate(t.hypotheses[:width]):
            text[j, k], score[j, k] = hyp.text.encode("utf-8"), hyp.score
    errors = np.array([[e.encode("utf-8")] for e in rows.errors], dtype=object).reshape(len(rows.errors), 1)
    return {"translation": text, "score": score, "error": errors}
