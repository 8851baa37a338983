"""The /translate request's tgt_lang for a multilingual model (data.pairs): the tag goes before each
sentence; a missing or unknown one is a 422 naming it."""

from __future__ import annotations

import torch

from extra_helpers import need_extra
from transduce.config import DecodeConfig, ServeConfig, model_preset
from transduce.data.multilingual import tagged
from transduce.data.tokenizer import Tokenizer

EN = ["the dog runs", "a cat sleeps", "the red bird sings"]
TGT = {"de": ["der Hund läuft", "eine Katze schläft", "der rote Vogel singt"],
       "fr": ["le chien court", "un chat dort", "l'oiseau rouge chante"]}


def test_the_server_takes_tgt_lang_and_answers_422_without_it(tmp_path):
    httpx = need_extra("serve", "fastapi", "uvicorn", "httpx")[2]
    from server_helpers import BackgroundServer
    from transduce.inference import Translator
    from transduce.model import Transformer
    from transduce.serve import TranslationService, create_app

    src = [tagged(s, lang) for lang in TGT for s in EN] * 10
    tok = Tokenizer.train(src, (TGT["de"] + TGT["fr"]) * 10, tmp_path, vocab_size=80, tags=["<2de>", "<2fr>"])
    torch.manual_seed(0)
    model = Transformer(model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                     d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                     max_positions=64)).eval()
    translator = Translator(model, tok, decode=DecodeConfig(beam=1, max_len_b=3))
    want = translator.translate(["<2fr> the dog runs"])
    service = TranslationService(translator, ServeConfig(batch_wait_ms=1))
    with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/translate", json={"sentences": ["the dog runs"], "tgt_lang": "fr"})
        assert r.status_code == 200 and r.json() == {"translations": want}
        for body, message in (({}, "say which"), ({"tgt_lang": "cs"}, "unknown target language 'cs'")):
            r = c.post("/translate", json={"sentences": ["the dog runs"], **body})
            assert r.status_code == 422 and message in r.json()["error"]
    service.close()
