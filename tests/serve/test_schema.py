"""schemathesis against the server's own OpenAPI document (GET /openapi.json): requests generated
from each route's schema (valid and invalid bodies), every answer checked: no 5xx but the
documented 503/504, status codes and content types as documented, JSON bodies matching their
schemas. Once without and once with an API key (then also: requests without it are 401)."""

from __future__ import annotations

import pytest

from extra_helpers import need_extra

need_extra("serve", "fastapi", "uvicorn")
schemathesis = need_extra("web-test", "schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

KEY = "s3cret-key"


@pytest.fixture(scope="module", params=[None, KEY], ids=["open", "api_key"])
def keyed_server(request, trained_dir):
    from server_helpers import BackgroundServer
    from transduce.config import ServeConfig
    from transduce.serve import create_app, load_service

    service = load_service(trained_dir, ServeConfig(batch_wait_ms=5.0, max_sentences=8, max_sentence_chars=200,
                                                   max_body_bytes=8192, api_key=request.param))
    server = BackgroundServer(create_app(service)).start()
    yield server, request.param
    server.stop()
    service.close()


@pytest.fixture(scope="module")
def api_schema(keyed_server):
    server, _ = keyed_server
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def test_every_route_answers_as_its_schema_says(api_schema, keyed_server):
    """Each operation in turn, 25 generated cases each (schemathesis' own strategies, run by
    hypothesis here: its pytest plugin does not support this pytest). Every check but "a
    schema-valid request is accepted": a request may be valid JSON-Schema-wise and still be refused
    with its documented 422 or 413 for what JSON Schema cannot say (a constraints list per sentence,
    a layer the model has, a sentence that is not blank, 6.0 given for an integer)."""
    from hypothesis import given
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    _, key = keyed_server
    headers = {"Authorization": f"Bearer {key}"} if key else None
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) == 6
    for operation in operations:
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case):
            case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance])

        check()


def test_the_document_names_every_route_and_the_key(keyed_server):
    import httpx

    server, key = keyed_server
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert set(doc["paths"]) == {"/translate", "/attention", "/translate_document", "/translate_stream", "/health",
                                 "/"}
    assert ("security" in doc["paths"]["/translate"]["post"]) == (key is not None)
    if key:
        answer = httpx.post(f"{server.url}/translate", json={"sentences": ["the dog"]})
        assert answer.status_code == 401 and "401" in doc["paths"]["/translate"]["post"]["responses"]
