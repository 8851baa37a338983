"""A multilingual model (data.pairs) behind the server: every route that translates takes the
request's tgt_lang (its tag goes before each sentence); a missing or unknown one is a one-line 422
naming it."""

from __future__ import annotations

import json

import pytest
import torch

from extra_helpers import need_extra
from transduce.config import DecodeConfig, ServeConfig, model_preset
from transduce.data.multilingual import tagged
from transduce.data.tokenizer import Tokenizer

EN = ["the dog runs", "a cat sleeps", "the red bird sings"]
TGT = {"de": ["der Hund läuft", "eine Katze schläft", "der rote Vogel singt"],
       "fr": ["le chien court", "un chat dort", "l'oiseau rouge chante"]}
MISSING = (({}, "say which"), ({"tgt_lang": "cs"}, "unknown target language 'cs'"))


@pytest.fixture(scope="module")
def tagged_server(tmp_path_factory):
    """(a translator of a tiny two-target model, the URL of a live server of it)."""
    need_extra("serve", "fastapi", "uvicorn", "httpx")
    from server_helpers import BackgroundServer
    from transduce.inference import Translator
    from transduce.model import Transformer
    from transduce.serve import TranslationService, create_app

    src = [tagged(s, lang) for lang in TGT for s in EN] * 10
    tok = Tokenizer.train(src, (TGT["de"] + TGT["fr"]) * 10, tmp_path_factory.mktemp("tok"), vocab_size=80,
                          tags=["<2de>", "<2fr>"])
    torch.manual_seed(0)
    model = Transformer(model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                     d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                     max_positions=64)).eval()
    translator = Translator(model, tok, decode=DecodeConfig(beam=1, max_len_b=3))
    service = TranslationService(translator, ServeConfig(batch_wait_ms=1))
    with BackgroundServer(create_app(service)) as server:
        yield translator, server.url
    service.close()


def test_the_server_takes_tgt_lang_and_answers_422_without_it(tagged_server):
    httpx = need_extra("web-test", "httpx")
    translator, url = tagged_server
    want = translator.translate(["<2fr> the dog runs"])
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/translate", json={"sentences": ["the dog runs"], "tgt_lang": "fr"})
        assert r.status_code == 200 and r.json() == {"translations": want}
        for body, message in MISSING:
            r = c.post("/translate", json={"sentences": ["the dog runs"], **body})
            assert r.status_code == 422 and message in r.json()["error"]
        r = c.post("/translate", json={"sentences": ["<2fr> the dog runs"], "tgt_lang": "fr"})
        assert r.status_code == 200 and r.json() == {"translations": want}  # tagged already: the tag once
        r = c.post("/translate", json={"sentences": ["a cat sleeps", "<2fr> the dog runs"], "tgt_lang": "de"})
        assert r.status_code == 422 and "tagged for 'fr': '<2fr> the dog runs'" in r.json()["error"]


def _stream(httpx, url: str, body: dict) -> tuple[int, list[tuple[str, dict]]]:
    events, name = [], None
    with httpx.stream("POST", url + "/translate_stream", json=body, timeout=30) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [("error", r.json())]
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
    return r.status_code, events


def test_document_stream_and_attention_routes_take_tgt_lang(tagged_server):
    httpx = need_extra("web-test", "httpx")
    need_extra("serve", "sse_starlette")
    need_extra("documents", "sentencex")
    from transduce.inference.documents import translate_document

    translator, url = tagged_server
    text = "the dog runs. a cat sleeps.\n\nthe red bird sings."
    for lang in ("de", "fr"):
        r = httpx.post(url + "/translate_document", json={"text": text, "tgt_lang": lang}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["translation"] == translate_document(translator, text, tgt_lang=lang)
        status, events = _stream(httpx, url, {"sentence": "the dog runs", "tgt_lang": lang})
        want = translator.translate([f"<2{lang}> the dog runs"])[0]
        assert status == 200 and events[-1] == ("done", {"translation": want})
        r = httpx.post(url + "/attention", json={"sentence": "the dog runs", "tgt_lang": lang}, timeout=30)
        assert r.status_code == 200 and r.json()["translation"] == want and f"<2{lang}>" in r.json()["source"]
    for body, message in MISSING:
        r = httpx.post(url + "/translate_document", json={"text": text, **body}, timeout=30)
        assert r.status_code == 422 and message in r.json()["error"] and "\n" not in r.json()["error"]
        status, events = _stream(httpx, url, {"sentence": "the dog runs", **body})
        assert status == 422 and message in events[0][1]["error"]
        r = httpx.post(url + "/attention", json={"sentence": "the dog runs", **body}, timeout=30)
        assert r.status_code == 422 and message in r.json()["error"]
