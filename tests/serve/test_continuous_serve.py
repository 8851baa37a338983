"""``serve --batching continuous``: plain /translate requests on the continuous batch answer as
the Translator does, under concurrency; what it does not cover keeps the request batches; a
timed-out request frees its rows; /health reports rows, queue and tokens/s."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from extra_helpers import need_extra
from toy_model import toy_pairs
from transduce.inference.translator import Translator

need_extra("serve", "fastapi", "uvicorn")
httpx = need_extra("web-test", "httpx")


@pytest.fixture(scope="module")
def continuous(trained_dir):
    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import create_app, load_service

    service = load_service(trained_dir, ServeConfig(batching="continuous", max_sentences=8, request_timeout_s=30))
    server = BackgroundServer(create_app(service)).start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, service
    server.stop()
    service.close()


def test_concurrent_requests_match_the_translator(continuous, trained_dir):
    client, _ = continuous
    sentences = [s for s, _ in toy_pairs(24, seed=4)]
    requests = [(sentences[i:i + 3], beam) for beam in (1, 4) for i in range(0, 24, 3)]
    translator = Translator.load(trained_dir)
    want = {beam: dict(zip(sentences, translator.translate(sentences, beam=beam))) for beam in (1, 4)}

    def ask(job):
        batch, beam = job
        r = httpx.post(client.base_url.join("/translate"), json={"sentences": batch, "beam": beam}, timeout=30)
        return r.status_code, r.json()

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, requests))
    for (batch, beam), (status, body) in zip(requests, answers):
        assert status == 200 and body["translations"] == [want[beam][s] for s in batch]
    health = client.get("/health").json()["continuous"]
    assert health["finished"] >= 48 and health["rows_in_use"] == 0 and health["tokens_per_s"] > 0
    assert set(health) >= {"queued", "running", "max_rows"}


def test_uncovered_settings_and_errors_keep_their_answers(continuous, trained_dir):
    client, _ = continuous
    translator = Translator.load(trained_dir)
    r = client.post("/translate", json={"sentences": ["a cat", ""], "beam": 3, "no_repeat_ngram_size": 2})
    assert r.status_code == 200
    assert r.json()["translations"] == translator.translate(["a cat", ""], beam=3, no_repeat_ngram_size=2)
    r = client.post("/translate", json={"sentences": ["a cat"], "beam": 0})
    assert r.status_code == 422 and "\n" not in r.json()["error"]


def test_a_timed_out_request_frees_its_rows(continuous):
    _, service = continuous
    route = service.continuous
    decode = service.settings(beam=4, max_len_a=0.0, max_len_b=60, min_len=59)
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(route.translate(["the red dog sleeps"] * 3, decode, timeout=0.05))
    for _ in range(200):
        if route.stats()["rows_in_use"] == 0 and route.stats()["running"] == 0:
            break
        time.sleep(0.02)
    assert route.stats()["rows_in_use"] == 0
