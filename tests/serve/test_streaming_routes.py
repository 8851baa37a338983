"""The server's /translate_stream (Server-Sent Events) and /translate_document, live on loopback."""

from __future__ import annotations

import json

from extra_helpers import need_extra
from toy_model import toy_pairs
from transduce.inference import Translator

need_extra("serve", "fastapi", "uvicorn", "sse_starlette")
need_extra("documents", "sentencex")
httpx = need_extra("web-test", "httpx")


def _events(url: str, body: dict) -> list[tuple[str, dict]]:
    events, name = [], None
    with httpx.stream("POST", url + "/translate_stream", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
    return events


def test_the_stream_joined_equals_the_plain_translation(live_server, trained_dir):
    translator = Translator.load(trained_dir)
    for beam in (1, 4):
        for sentence, _ in toy_pairs(4, seed=7):
            events = _events(live_server.url, {"sentence": sentence, "beam": beam})
            assert [e for e, _ in events][-1] == "done" and {e for e, _ in events[:-1]} <= {"delta"}
            want = translator.translate([sentence], beam=beam)[0]
            assert "".join(d["text"] for _, d in events[:-1]) == events[-1][1]["translation"] == want


def test_a_bad_stream_request_is_a_json_error(live_server):
    r = httpx.post(live_server.url + "/translate_stream", json={"sentence": 3}, timeout=30)
    assert r.status_code == 422 and "sentence" in r.json()["error"]


def test_a_document_keeps_its_paragraphs(live_server, trained_dir):
    from transduce.inference.documents import translate_document

    text = "the red dog runs. the cat sleeps!\n\n \nthe old bird sings today.\nthe tree."
    r = httpx.post(live_server.url + "/translate_document", json={"text": text, "beam": 2}, timeout=30)
    assert r.status_code == 200
    assert r.json()["translation"] == translate_document(Translator.load(trained_dir), text, beam=2)
    assert r.json()["translation"].count("\n") == text.count("\n")
