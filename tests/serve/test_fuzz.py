"""Fuzzing the API: arbitrary JSON, sizes, unicode and types at /translate and /attention never
give a 500 or take the server down; it answers the next valid request."""

from __future__ import annotations

import json

import pytest

from extra_helpers import need_extra

need_extra("serve", "fastapi", "uvicorn")
httpx = need_extra("web-test", "httpx")  # the client that talks to the test server
need_extra("test", "hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# Text with what breaks naive servers: surrogates (as JSON escapes), RTL and zero-width marks,
# combining characters, NUL, very long runs.
TRICKY = st.sampled_from(["\u202e", "\u200b", "\u0301", "\u0000", "\ufeff", "\U0001f600", "\u05d0", "a" * 3000,
                          " ", "\n", "\t", "the red dog"])
TEXT = st.one_of(st.text(max_size=40), st.lists(TRICKY, max_size=5).map("".join))
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={
    "sentences": st.one_of(st.lists(TEXT, max_size=70), JSON),
    "sentence": st.one_of(TEXT, JSON),
    "beam": st.one_of(st.integers(-5, 10**12), JSON), "lenpen": st.one_of(st.floats(allow_nan=True), JSON),
    "max_len_a": JSON, "max_len_b": st.one_of(st.integers(-10, 10**9), JSON),
    "layer": st.one_of(st.integers(-100, 100), JSON), "head": st.one_of(st.integers(-100, 100), JSON),
})
LONE_SURROGATE = b'{"sentences": ["\\ud800 the dog"]}'


@pytest.fixture(scope="module")
def client(live_server):
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        yield c


def _check(client, response) -> None:
    assert response.status_code < 500 or response.status_code in (503, 504), response.text
    assert "error" in response.json() or response.status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(FIELDS, JSON), route=st.sampled_from(["/translate", "/attention"]))
@example(body=float("inf"), route="/translate")
@example(body={"sentences": ["the dog"], "lenpen": float("nan")}, route="/translate")
def test_arbitrary_json_is_never_a_server_error(client, body, route):
    # Encoded here, as Python's json does (NaN and Infinity included, as a careless client sends
    # them): httpx's own encoder refuses them (0.28+), which failed the test, not the server.
    _check(client, client.post(route, content=json.dumps(body).encode("utf-8"),
                               headers={"Content-Type": "application/json"}))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_are_never_a_server_error(client, raw):
    _check(client, client.post("/translate", content=raw, headers={"Content-Type": "application/json"}))


def test_escaped_surrogates_and_the_next_valid_request(client):
    _check(client, client.post("/translate", content=LONE_SURROGATE, headers={"Content-Type": "application/json"}))
    r = client.post("/translate", json={"sentences": ["the red dog"]})
    assert r.status_code == 200 and len(r.json()["translations"]) == 1
    assert json.loads(client.get("/health").text)["status"] == "ok"
