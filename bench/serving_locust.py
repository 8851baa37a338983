"""The locust users of bench/serving.py (a locustfile: ``locust -f bench/serving_locust.py``).

Each user sends one sentence per request, the next as soon as the last is answered (no think
time), to the server of ``$SERVING_ENGINE``: ``transduce`` (POST /translate JSON) or ``triton`` and
``triton-repo`` (POST /v2/models/translate/infer, KServe v2 JSON), with ``$SERVING_BEAM`` and
``$SERVING_MAX_LEN_B`` as the request's settings. The sentences are ``$SERVING_SENTENCES`` (a
file, one per line); a response that is not 200, or that names an error, is a failure.
"""

from __future__ import annotations

import itertools
import os

from locust import FastHttpUser, constant, task

ENGINE = os.environ.get("SERVING_ENGINE", "transduce")
BEAM = int(os.environ.get("SERVING_BEAM", "4"))
MAX_LEN_B = int(os.environ.get("SERVING_MAX_LEN_B", "50"))
with open(os.environ.get("SERVING_SENTENCES", "/dev/null"), encoding="utf-8") as f:
    SENTENCES = [line.rstrip("\n") for line in f if line.strip()] or ["the red dog"]
_NEXT = itertools.count()


def _request(sentence: str) -> tuple[str, dict]:
    if ENGINE.startswith("triton"):
        return "/v2/models/translate/infer", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                                          "data": [sentence]}],
                                               "parameters": {"beam": BEAM, "max_len_b": MAX_LEN_B}}
    return "/translate", {"sentences": [sentence], "beam": BEAM, "max_len_b": MAX_LEN_B}


def _error(engine: str, body: dict) -> str:
    """What the answer names as an error ("" if none)."""
    if not engine.startswith("triton"):
        return body.get("error", "") if "translations" not in body else ""
    outputs = {o["name"]: o["data"] for o in body.get("outputs", [])}
    return outputs.get("error", ["no outputs"])[0]


class Translator(FastHttpUser):
    wait_time = constant(0)

    @task
    def translate(self) -> None:
        path, payload = _request(SENTENCES[next(_NEXT) % len(SENTENCES)])
        with self.client.post(path, json=payload, name=ENGINE, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
            elif error := _error(ENGINE, response.json()):
                response.failure(error)
