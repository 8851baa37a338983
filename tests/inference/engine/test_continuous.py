"""Continuous batching (transduce.inference.engine): requests that join a running batch at random
steps, with mixed settings, get what Translator gives each sentence; bad requests fail alone;
cancelled ones free their rows; the budget bounds the batch.

Same kernels on both sides (one process, one thread): the continuous batch differs from the
Translator's batch only in padding (masked keys, exactly zero weight) and in which rows share a
matrix product, which changes the last bits of a log-probability at most; tokens are compared
exactly (a flip needs a near-tie of the toy model's, which the seeded schedule does not hit)
and scores within a float32 tolerance.
"""

from __future__ import annotations

import random
import threading

import pytest
import torch

from toy_model import toy_pairs
from transduce.errors import ConfigError
from transduce.inference import Translator
from transduce.inference.engine import (Budget, CancelledRequest, ContinuousTranslator, Request, RequestSettings,
                                        Scheduler)
from transduce.model.embeddings import SinusoidalPositions

SETTINGS = [dict(beam=1), dict(beam=4), dict(beam=1, max_len_b=3), dict(beam=4, max_len_a=0.0, max_len_b=4),
            dict(beam=2, lenpen=1.0, nbest=2), dict(beam=3, stop="best_finished", lenpen=0.0),
            dict(beam=1, min_len=8), dict(beam=4, min_len=6)]


@pytest.fixture(scope="module")
def translator(trained_dir):
    tr = Translator.load(trained_dir)
    yield tr
    tr.close()


def _texts(n: int, seed: int) -> list[str]:
    return [s for s, _ in toy_pairs(n, seed)]


def _expected(translator: Translator, text: str, settings: RequestSettings):
    if settings.temperature:
        return translator.sample([text], settings.temperature, settings.top_k, settings.top_p, settings.seed,
                                 settings.decode)[0]
    return translator.translate_detailed([text], settings.decode)[0]


def _check(got, want) -> None:
    assert [h.tokens for h in got.hypotheses] == [h.tokens for h in want.hypotheses]
    assert [h.ended for h in got.hypotheses] == [h.ended for h in want.hypotheses]
    for g, w in zip(got.hypotheses, want.hypotheses):
        assert g.score == pytest.approx(w.score, abs=1e-4) and g.log_prob == pytest.approx(w.log_prob, abs=1e-4)


def test_random_arrivals_with_mixed_settings_match_translator(translator):
    """Requests arrive between steps on a seeded schedule (several per step, none for a while),
    with beam 1..4, different length limits, min_len, nbest, both stop rules and sampling."""
    rng = random.Random(0)
    texts = _texts(40, seed=5)
    settings = [RequestSettings(translator.settings(**SETTINGS[i % len(SETTINGS)])) for i in range(len(texts))]
    settings[5] = RequestSettings(translator.settings(beam=1), temperature=0.8, top_k=20, seed=11)
    settings[17] = RequestSettings(translator.settings(beam=1), temperature=1.0, top_p=0.9, seed=3)
    scheduler = Scheduler(translator.model, Budget(max_rows=24))
    results: dict[int, object] = {}
    todo = list(range(len(texts)))
    max_rows = 0
    while todo or scheduler.busy:
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 4])):
            if todo:
                i = todo.pop(0)
                ids = translator.encode_source(texts[i])[0]
                scheduler.add(Request(ids + [translator.config.eos_id], settings[i],
                                      lambda out, i=i: results.__setitem__(i, out)))
        scheduler.step()
        max_rows = max(max_rows, scheduler.rows)
    assert max_rows > 8  # the schedule did make requests share steps
    for i, text in enumerate(texts):
        assert not isinstance(results[i], BaseException), results[i]
        want = _expected(translator, text, settings[i])
        got_tokens = results[i].tokens
        want_tokens = [h.tokens + ([translator.config.eos_id] if h.ended else []) for h in want.hypotheses]
        assert got_tokens == want_tokens, (i, settings[i])
        assert results[i].scores == pytest.approx([h.score for h in want.hypotheses], abs=1e-4)


def test_submissions_from_threads_match_translate(translator):
    texts = _texts(24, seed=9)
    with ContinuousTranslator(translator, Budget(max_rows=16)) as engine:
        handles: list = [None] * len(texts)

        def client(k: int) -> None:
            for i in range(k, len(texts), 4):
                handles[i] = engine.submit(texts[i], **SETTINGS[i % 3])

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [h.result(timeout=60) for h in handles]
        stats = engine.stats()
    for i, text in enumerate(texts):
        _check(got[i], translator.translate_detailed([text], translator.settings(**SETTINGS[i % 3]))[0])
        assert got[i].best.text == translator.translate([text], **SETTINGS[i % 3])[0]
    assert stats["finished"] == len(texts) and stats["rows_in_use"] == 0 and stats["tokens_per_s"] > 0


def test_stream_yields_growing_text_then_the_translation(translator):
    with ContinuousTranslator(translator) as engine:
        for beam in (1, 4):
            handle = engine.submit("the red dog sleeps", beam=beam)
            parts = list(handle.stream(timeout=60))
            assert parts[-1] == handle.result().best.text == translator.translate(["the red dog sleeps"], beam=beam)[0]
            assert all(parts[-1].startswith(p.rstrip()) for p in parts)


@pytest.mark.parametrize("call, message", [
    (dict(beam=0), "beam"),
    (dict(nbest=3, beam=2), "nbest"),
    (dict(no_repeat_ngram_size=2), "continuous batching"),
    (dict(temperature=1.0, top_p=2.0), "top_p"),
    (dict(max_len_b=-5, unknown=1), "unknown"),
])
def test_invalid_settings_are_a_one_line_error(translator, call, message):
    with ContinuousTranslator(translator) as engine:
        with pytest.raises(ConfigError, match=message) as info:
            engine.submit("a cat", **call)
        assert "\n" not in str(info.value)


def test_bad_sources_fail_alone_and_empty_text_is_empty(translator):
    with ContinuousTranslator(translator) as engine:
        running = engine.submit("the old dog sees the big cat near the river", beam=4)
        for source, message in (([], "empty"), ([10 ** 6], "vocabulary"), ([5] * 5000, "max_input_len")):
            with pytest.raises(ConfigError, match=message):
                engine.submit(source)
        assert engine.submit("").result(timeout=5).best.text == ""
        ids = translator.encode_source("a cat")[0]
        assert engine.submit(ids, beam=1).result(timeout=60).best.text == translator.translate(["a cat"], beam=1)[0]
        assert running.result(timeout=60).best.text == translator.translate(
            ["the old dog sees the big cat near the river"], beam=4)[0]


def test_a_failing_request_does_not_stall_the_batch(translator, monkeypatch):
    """One request's search raises mid-batch: it gets the error, the others their translations."""
    from transduce.inference.engine.requests import BeamRun

    real = BeamRun.advance

    def advance(self, logp, step):
        if self.decode.lenpen == 0.123 and step == 2:
            raise RuntimeError("boom")
        return real(self, logp, step)

    monkeypatch.setattr(BeamRun, "advance", advance)
    texts = _texts(6, seed=2)
    with ContinuousTranslator(translator) as engine:
        handles = [engine.submit(t, beam=4, lenpen=0.123 if i == 2 else 0.6) for i, t in enumerate(texts)]
        with pytest.raises(RuntimeError, match="boom"):
            handles[2].result(timeout=60)
        for i in (0, 1, 3, 4, 5):
            assert handles[i].result(timeout=60).best.text == translator.translate([texts[i]], beam=4)[0]


def test_cancel_frees_the_rows(translator):
    scheduler = Scheduler(translator.model, Budget(max_rows=8))
    outcome = {}
    long = RequestSettings(translator.settings(beam=4, max_len_a=0.0, max_len_b=40, min_len=30))
    src = translator.encode_source("the red dog")[0] + [translator.config.eos_id]
    r = Request(src, long, lambda out: outcome.setdefault("a", out))
    scheduler.add(r)
    for _ in range(3):
        scheduler.step()
    assert scheduler.rows == 4
    r.cancelled = True
    scheduler.step()
    assert scheduler.rows == 0 and not scheduler.busy and isinstance(outcome["a"], CancelledRequest)


def test_budget_admits_fifo_and_bounds_the_wait(translator):
    """Rows beyond the budget wait; a small request may pass a big one until the big one has
    waited max_wait_ms, after which it goes first."""
    src = translator.encode_source("the red dog")[0] + [translator.config.eos_id]
    order = []

    def request(name: str, beam: int) -> Request:
        settings = RequestSettings(translator.settings(beam=beam, max_len_a=0.0, max_len_b=30, min_len=20))
        return Request(list(src), settings, lambda out: order.append(name))

    for wait_ms, passes in ((1e6, True), (0.0, False)):
        scheduler = Scheduler(translator.model, Budget(max_rows=5, max_wait_ms=wait_ms))
        first, big, small = request("first", 4), request("big", 4), request("small", 1)
        for r in (first, big, small):
            scheduler.add(r)
        scheduler.step()
        running = {id(r) for r in scheduler.active}
        assert id(first) in running and id(big) not in running
        assert (id(small) in running) == passes
        scheduler.fail_all(RuntimeError("stop"))


def test_positions_per_row_match_each_rows_own():
    table = SinusoidalPositions(8, 32)
    start = torch.tensor([0, 5, 17])
    rows = table(start, 2)                                                # (3, 2, 8)
    assert rows.shape == (3, 2, 8)
    for i, s in enumerate(start.tolist()):
        assert torch.equal(rows[i], table(s, 2))
