"""The HTTP server, live on loopback: correct answers under concurrency, batching, limits, errors."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from transduce.errors import TransduceError
from transduce.inference import Runtime
from transduce.inference.translator import Translator
from toy_model import toy_pairs  # tests/toy_model.py, registered by conftest.py
from extra_helpers import need_extra

need_extra("serve", "fastapi", "uvicorn")
httpx = need_extra("web-test", "httpx")  # the client that talks to the test server


@pytest.fixture(scope="module")
def client(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        yield c


def test_concurrent_requests_are_answered_in_order_and_batched(client, trained_dir):
    sentences = [s for s, _ in toy_pairs(48, seed=11)]
    requests = [sentences[i: i + 3] for i in range(0, 48, 3)] * 2              # 32 requests
    expected = Translator.load(trained_dir).translate(sentences, beam=2)
    want = {s: t for s, t in zip(sentences, expected)}
    before = client.get("/health").json()["batching"]

    def ask(batch):
        r = httpx.post(client.base_url.join("/translate"), json={"sentences": batch, "beam": 2}, timeout=30)
        return r.status_code, r.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, requests))
    for batch, (status, body) in zip(requests, answers):
        assert status == 200
        assert body["translations"] == [want[s] for s in batch]
    after = client.get("/health").json()["batching"]
    assert after["requests"] - before["requests"] == len(requests)
    assert after["max_requests_per_batch"] > 1                                   # dynamic batching happened
    assert after["batches"] - before["batches"] < len(requests)


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 422, "not valid JSON"),
    (b"[1, 2]", 422, "must be a JSON object"),
    (json.dumps({"sentences": "a dog"}).encode(), 422, "sentences"),
    (json.dumps({"sentences": [1, 2]}).encode(), 422, "sentences.0"),
    (json.dumps({"sentences": ["a"], "beam": 0}).encode(), 422, "beam"),
    (json.dumps({"sentences": ["a"], "beam": "4"}).encode(), 422, "beam"),
    (json.dumps({"sentences": ["a"], "color": "red"}).encode(), 422, "color"),
    (json.dumps({}).encode(), 422, "sentences"),
    (json.dumps({"sentences": ["a dog"] * 9}).encode(), 413, "at most 8"),
    (json.dumps({"sentences": ["dog " * 60]}).encode(), 413, "at most 200"),
    (json.dumps({"sentences": ["a"], "pad": "x" * 9000}).encode(), 413, "over 8192 bytes"),
    (b"\xff\xfe\x00garbage", 422, "not valid JSON"),
])
def test_bad_requests_get_json_errors_and_the_server_keeps_serving(client, body, status, message):
    r = client.post("/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    assert message in r.json()["error"]
    ok = client.post("/translate", json={"sentences": ["the red dog"], "beam": 1})
    assert ok.status_code == 200 and len(ok.json()["translations"]) == 1


def test_streamed_oversized_body_is_cut_off(client):
    chunks = (b" " * 1024 for _ in range(64))                                   # no content-length
    r = client.post("/translate", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.get("/health").json()["status"] == "ok"


def test_empty_list_and_search_options(client):
    assert client.post("/translate", json={"sentences": []}).json() == {"translations": []}
    r = client.post("/translate", json={"sentences": ["a cat", ""], "beam": 3, "lenpen": 1, "max_len_b": 5})
    assert r.status_code == 200 and r.json()["translations"][1] == ""


def test_constraints_and_repetition_options(client):
    body = {"sentences": ["the red dog runs", "a cat"], "constraints": [["Katze"], []], "beam": 3,
            "no_repeat_ngram_size": 2, "repetition_penalty": 1.1}
    r = client.post("/translate", json=body)
    assert r.status_code == 200 and "Katze" in r.json()["translations"][0]
    bad = client.post("/translate", json={"sentences": ["a", "b"], "constraints": [["x"]]})
    assert bad.status_code == 422 and "constraints" in bad.json()["error"]
    long = client.post("/translate", json={"sentences": ["a"], "constraints": [["Hund " * 60]], "max_len_b": 5})
    assert long.status_code == 422 and "output limit" in long.json()["error"]


def test_alignments_on_request(client):
    plain = client.post("/translate", json={"sentences": ["the red dog sleeps", "", "a cat"]}).json()
    assert "alignments" not in plain
    r = client.post("/translate", json={"sentences": ["the red dog sleeps", "", "a cat"], "alignment": True})
    assert r.status_code == 200 and r.json()["translations"] == plain["translations"]
    alignments = r.json()["alignments"]
    assert alignments[1] == "" and all(alignments[n] for n in (0, 2))
    for text, links in zip(r.json()["translations"], alignments):
        assert all(int(j) < len(text.split()) for j in (link.split("-")[1] for link in links.split()))
    both = client.post("/translate", json={"sentences": ["a cat"], "constraints": [["Katze"]], "alignment": True})
    assert both.status_code == 200 and "Katze" in both.json()["translations"][0] and both.json()["alignments"][0]
    assert client.post("/translate", json={"sentences": [], "alignment": True}).json() == {"translations": [],
                                                                                          "alignments": []}


def test_attention_endpoint(client):
    r = client.post("/attention", json={"sentence": "the red dog sleeps", "beam": 1})
    assert r.status_code == 200
    data = r.json()
    assert data["source"][-1] == "</s>" and data["target"][-1] == "</s>"
    assert len(data["matrix"]) == len(data["target"])
    assert all(len(row) == len(data["source"]) and abs(sum(row) - 1) < 1e-3 for row in data["matrix"])
    assert client.post("/attention", json={"sentence": "  "}).status_code == 422
    assert client.post("/attention", json={"sentence": "a dog", "layer": 5}).status_code == 422


def test_page_is_served(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="translate"' in r.text and "/attention" in r.text


class _StubTranslator:
    """Looks like a Translator to the server; slow, and fails on the sentence "boom"."""

    def __init__(self, real: Translator, delay: float):
        self.config, self.tokenizer, self.decode, self.delay = real.config, real.tokenizer, real.decode, delay
        self.settings = real.settings

    def close(self) -> None:
        pass

    def translate(self, texts, decode=None):
        time.sleep(self.delay)
        if "boom" in texts:
            raise RuntimeError("stub failure")
        return [t.upper() for t in texts]


def test_timeouts_and_failures_are_answered(trained_dir):
    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import TranslationService, create_app

    service = TranslationService(_StubTranslator(Translator.load(trained_dir), delay=0.3),
                                 ServeConfig(request_timeout_s=0.1, batch_wait_ms=1))
    with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        r = c.post("/translate", json={"sentences": ["slow"]})
        assert r.status_code == 504 and "within 0.1 s" in r.json()["error"]
        service.cfg = ServeConfig(request_timeout_s=5.0)
        r = c.post("/translate", json={"sentences": ["boom"]})
        assert r.status_code == 500 and "stub failure" in r.json()["error"]
        assert c.post("/translate", json={"sentences": ["fine"]}).json() == {"translations": ["FINE"]}
    service.close()


@pytest.mark.slow
def test_worker_processes_serve_the_same_answers(trained_dir):
    """``serve --workers 2``: each batch spread over two processes; answers as one process gives,
    also after a worker is killed (SIGKILL: it alone is replaced) and after the workers hang
    (SIGSTOP: each is replaced once its batch's deadline passes)."""
    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import create_app, load_service

    sentences = [s for s, _ in toy_pairs(24, seed=5)]
    want = dict(zip(sentences, Translator.load(trained_dir).translate(sentences, beam=3)))
    service = load_service(trained_dir, ServeConfig(batch_wait_ms=20.0), Runtime(workers=2, worker_timeout_s=2.0))
    with BackgroundServer(create_app(service)) as server:
        def ask(batch):
            r = httpx.post(server.url + "/translate", json={"sentences": batch, "beam": 3}, timeout=30)
            return r.status_code, r.json()

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, [sentences[i: i + 4] for i in range(0, 24, 4)]))
        r = httpx.post(server.url + "/attention", json={"sentence": sentences[0], "beam": 3}, timeout=30)
        health = httpx.get(server.url + "/health").json()["workers"]
        os.kill(health["pids"][0], signal.SIGKILL)  # a crashed worker: the server keeps answering
        time.sleep(0.5)
        with ThreadPoolExecutor(4) as pool:
            after = list(pool.map(ask, [sentences[i: i + 4] for i in range(0, 24, 4)]))
        healed = httpx.get(server.url + "/health").json()["workers"]
        while len(healed["pids"]) < 2:  # the replacement loads the model while the survivor answers
            time.sleep(0.1)
            healed = httpx.get(server.url + "/health").json()["workers"]
        for pid in healed["pids"]:  # hung workers (SIGSTOP): replaced once their batch's deadline passes
            os.kill(pid, signal.SIGSTOP)
        stopped = ask(sentences[:4])
        unstuck = httpx.get(server.url + "/health").json()["workers"]
        following = ask(sentences[4:8])
    service.close()
    assert [status for status, _ in answers] == [200] * 6
    assert [t for _, body in answers for t in body["translations"]] == [want[s] for s in sentences]
    assert r.status_code == 200 and r.json()["translation"] == want[sentences[0]]
    assert health["count"] == 2 and health["restarts"] == 0
    assert [status for status, _ in after] == [200] * 6
    assert [t for _, body in after for t in body["translations"]] == [want[s] for s in sentences]
    # only the killed worker was replaced; the other one kept serving
    assert healed["restarts"] == 1 and set(healed["pids"]) & set(health["pids"]) == {health["pids"][1]}
    assert healed["hangs"] == 0 and healed["timeout_s"] == 2.0
    assert stopped == (200, {"translations": [want[s] for s in sentences[:4]]})
    assert (unstuck["restarts"], unstuck["hangs"]) == (3, 2) and set(unstuck["pids"]).isdisjoint(healed["pids"])
    assert following == (200, {"translations": [want[s] for s in sentences[4:8]]})


@pytest.mark.slow
def test_a_worker_killed_under_load_fails_no_request(trained_dir):
    """16 clients keep asking while one of two workers is SIGKILLed: every request is answered
    (200, the right translation), only the killed worker is replaced, and the server answered
    batches between the kill and the replacement's start (asserted on counters, not on time)."""
    import threading

    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import create_app, load_service

    sentences = [s for s, _ in toy_pairs(32, seed=7)]
    want = dict(zip(sentences, Translator.load(trained_dir).translate(sentences, beam=2)))
    service = load_service(trained_dir, ServeConfig(batch_wait_ms=5.0), Runtime(workers=2))
    stop, failures, answered = threading.Event(), [], []

    def client(k: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            i = k
            while not stop.is_set():
                s = sentences[i % len(sentences)]
                r = http.post("/translate", json={"sentences": [s], "beam": 2})
                ok = r.status_code == 200 and r.json()["translations"] == [want[s]]
                (answered if ok else failures).append((s, r.status_code))
                i += 1

    def health() -> dict:
        return httpx.get(server.url + "/health").json()

    def wait_until(condition) -> None:
        end = time.monotonic() + 300  # only ends a hang
        while not condition():
            assert time.monotonic() < end
            time.sleep(0.05)

    with BackgroundServer(create_app(service)) as server:
        clients = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in clients:
            t.start()
        try:
            wait_until(lambda: len(answered) >= 32)
            victim, survivor = health()["workers"]["pids"]
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: health()["workers"]["restarts"] == 1)
            at_restart = len(answered)
            wait_until(lambda: len(health()["workers"]["pids"]) == 2)  # the replacement has loaded
            wait_until(lambda: len(answered) >= at_restart + 32)
        finally:
            stop.set()
            for t in clients:
                t.join(120)
        workers = health()["workers"]
    service.close()
    assert failures == []
    assert workers["restarts"] == 1 and survivor in workers["pids"] and victim not in workers["pids"]
    pool = service.translator.pool
    events = [e[1:] for e in pool.events]
    died = events.index(("died", victim))
    ready = next(i for i, (what, pid) in enumerate(events) if what == "ready" and i > died)
    assert ("answered", survivor) in events[died:ready]  # it kept answering while the new one loaded


def test_defaults_and_missing_extra():
    from transduce.config import ServeConfig
    from transduce.errors import require

    assert ServeConfig().host == "127.0.0.1"
    from transduce.errors import ConfigError
    for bad in (dict(workers=-1), dict(workers=2, device="cuda")):
        with pytest.raises(ConfigError, match="runtime.workers"):
            Runtime(**bad)
    with pytest.raises(ConfigError, match="runtime.worker_timeout_s"):
        Runtime(workers=2, worker_timeout_s=0)
    with pytest.raises(TransduceError, match=r"pip install 'transduce\[serve\]'"):
        require("transduce_no_such_package", "serve")


def test_an_api_key_guards_the_post_routes_and_clients_are_limited(trained_dir):
    """serve --api-key-file: 401 without the key or with a wrong one; the page and /health stay
    open; --max-per-client: a client's requests beyond the limit in flight are answered 429."""
    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import TranslationService, create_app

    service = TranslationService(_StubTranslator(Translator.load(trained_dir), delay=0.4),
                                 ServeConfig(api_key="s3cret", max_per_client=1, batching="none", batch_wait_ms=1))
    good = {"Authorization": "Bearer s3cret"}
    with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        r = c.post("/translate", json={"sentences": ["a"]})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer s3cre"}
        assert c.post("/translate", json={"sentences": ["a"]}, headers=wrong).status_code == 401
        assert c.post("/translate", json={"sentences": ["a"]}, headers=good).json() == {"translations": ["A"]}
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200
        with ThreadPoolExecutor(2) as pool:
            codes = sorted(pool.map(lambda s: c.post("/translate", json={"sentences": [s]}, headers=good).status_code,
                                    ["x", "y"]))
        assert codes == [200, 429]
    service.close()


def test_api_key_file_errors_and_config(tmp_path, capsys):
    from transduce.cli import main
    from transduce.config import ServeConfig
    from transduce.errors import ConfigError

    (tmp_path / "empty").write_text("\n")
    assert main(["serve", str(tmp_path), "--api-key-file", str(tmp_path / "empty")]) == 2
    assert "is empty" in capsys.readouterr().err
    assert "s3cret" not in repr(ServeConfig(api_key="s3cret"))  # never logged
    for bad in (dict(api_key=" "), dict(max_per_client=0)):
        with pytest.raises(ConfigError):
            ServeConfig(**bad)


@pytest.fixture(scope="module")
def serve_models(trained_dir, tmp_path_factory):
    """A second member for ensembles (a copy) and a draft (the model's first decoder layer)."""
    import shutil

    from inference_helpers import layer_prefix_draft
    root = tmp_path_factory.mktemp("serve-models")
    shutil.copytree(trained_dir, root / "copy")
    return {"copy": root / "copy", "draft": layer_prefix_draft(trained_dir, root / "draft")}


# serve takes every model-loading option translate takes (one front door, inference.load):
# each answers what `transduce translate` prints with the same options
LOADING = {
    "ensemble": (["{copy}"], {}),
    "draft": (["--draft", "{draft}"], {}),
    "bf16": (["--precision", "bf16"], {"precision": "bf16"}),
    "int8": (["--int8"], {"int8": True}),
    "workers": (["--workers", "2"], {"workers": 2}),
    "ensemble-workers-beam": (["{copy}", "--workers", "2", "--beam", "2"], {"workers": 2}),
}


@pytest.mark.parametrize("option", list(LOADING))
def test_serve_answers_what_translate_prints(trained_dir, serve_models, tmp_path, capsys, option):
    from server_helpers import BackgroundServer
    from transduce.cli import build_parser, decode_overrides, main
    from transduce.serve import ServeConfig, create_app, load_service

    flags, runtime = LOADING[option]
    flags = [f.format(**{k: str(v) for k, v in serve_models.items()}) for f in flags]
    sentences = [s for s, _ in toy_pairs(12, seed=21)]
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    assert main(["translate", str(trained_dir), *flags, "--device", "cpu", "--input", str(tmp_path / "in.txt")]) == 0
    printed = capsys.readouterr().out.splitlines()
    args = build_parser().parse_args(["serve", str(trained_dir), *flags])  # the same flags, as serve parses them
    service = load_service([args.model_dir, *args.ensemble], ServeConfig(batch_wait_ms=1.0),
                           Runtime(device="cpu", **runtime), args.draft, decode_overrides(args))
    try:
        with BackgroundServer(create_app(service)) as server:
            r = httpx.post(server.url + "/translate", json={"sentences": sentences}, timeout=60)
    finally:
        service.close()
    assert r.status_code == 200 and r.json()["translations"] == printed
