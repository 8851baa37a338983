"""Multilingual training (data.pairs): target-language tags, pair sampling, per-pair validation,
translation into a chosen language, and the one-line errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from transduce.config import DataConfig, DecodeConfig, RunConfig, model_preset
from transduce.data.multilingual import (PairDraws, epoch_indices, pair_ids, pair_texts, sampling_probs, tagged,
                                         with_tag)
from transduce.data.prepared import TokenPairs
from transduce.data.tokenizer import Tokenizer
from transduce.errors import ConfigError

EN = ["the dog runs", "a cat sleeps", "the red bird sings", "an old man eats"]
DE = ["der Hund läuft", "eine Katze schläft", "der rote Vogel singt", "ein alter Mann isst"]
FR = ["le chien court", "un chat dort", "l'oiseau rouge chante", "un vieil homme mange"]
TEXT = {"de": DE, "fr": FR}


@pytest.fixture(scope="module")
def tagged_tokenizer(tmp_path_factory) -> Tokenizer:
    src = [tagged(s, lang) for lang in TEXT for s in EN] * 10
    tgt = (DE + FR) * 10
    return Tokenizer.train(src, tgt, tmp_path_factory.mktemp("tok"), vocab_size=90, tags=["<2de>", "<2fr>"])


@pytest.mark.parametrize("settings, message", [
    (dict(corpus="toy", pairs=["en-de"]), "data.pairs: needs data.corpus multi30k"),
    (dict(pairs=["en-xx"]), r"data.pairs\[0\].tgt: unknown language 'xx'"),
    (dict(pairs=["ende"]), r"data.pairs\[0\]: expected SRC-TGT"),
    (dict(pairs=[{"src": "en", "tgt": "de", "weight": 0}]), r"data.pairs\[0\].weight: must be a number > 0"),
    (dict(pairs=[{"src": "en", "tgt": "de", "weight": 1}, "en-fr"]), "give a weight to every pair or to none"),
    (dict(pairs=["en-de"], pair_temperature=0.0), "data.pair_temperature: must be > 0"),
    (dict(pairs=["en-de", "fr-de"]), "each target language once"),
    (dict(pairs=["en-de", "en-de"]), "lists a pair twice"),
    (dict(pairs=[]), "at least one pair"),
    (dict(pairs=["en-de"], reverse=True), "data.reverse: does not apply"),
])
def test_bad_pairs_are_one_line_config_errors(settings, message):
    with pytest.raises(ConfigError, match=message) as err:
        DataConfig(**{"corpus": "multi30k", **settings})
    assert "\n" not in str(err.value)


def test_pairs_read_as_strings_or_mappings():
    cfg = DataConfig(corpus="multi30k", pairs=[{"src": "en", "tgt": "fr", "weight": 3}, {"src": "en", "tgt": "de",
                                                                                           "weight": 1.5}])
    assert cfg.pairs == [{"src": "en", "tgt": "fr", "weight": 3.0}, {"src": "en", "tgt": "de", "weight": 1.5}]
    assert DataConfig(corpus="multi30k", pairs=["en-de"]).pairs == [{"src": "en", "tgt": "de", "weight": None}]


def test_tags_are_whole_pieces_of_the_vocabulary_and_prefixed(tagged_tokenizer):
    tok = tagged_tokenizer
    assert set(tok.lang_tags) == {"de", "fr"}
    for lang, tag_id in tok.lang_tags.items():
        assert tok.pieces([tag_id], "src") == [f"<2{lang}>"]
        ids = tok.encode(tagged("the dog runs", lang), "src")
        assert tag_id in ids[:2] and ids.count(tag_id) == 1
    assert tok.src_vocab_size == 90  # the tags are within vocab_size
    texts = pair_texts(lambda s, t: list(zip(EN[:2], TEXT[t][:2])), [{"src": "en", "tgt": "de"},
                                                                    {"src": "en", "tgt": "fr"}], interleave=True)
    assert texts == [("<2de> the dog runs", DE[0]), ("<2fr> the dog runs", FR[0]),
                     ("<2de> a cat sleeps", DE[1]), ("<2fr> a cat sleeps", FR[1])]


def test_a_tokenizer_without_tags_has_none(tmp_path):
    assert Tokenizer.train(EN * 5, DE * 5, tmp_path, vocab_size=60).lang_tags == {}


@pytest.mark.parametrize("sizes, weights, temperature, expected", [
    ([3000, 1000, 500], [1.0, 1.0, 2.0], 1.0, [0.25, 0.25, 0.5]),
    ([3000, 1000, 500], [None] * 3, 1.0, [3000 / 4500, 1000 / 4500, 500 / 4500]),
    ([3000, 1000, 500], [None] * 3, 2.0, np.sqrt([3000, 1000, 500]) / np.sqrt([3000, 1000, 500]).sum()),
    ([3000, 1000, 500], [None] * 3, 1e6, [1 / 3] * 3),
])
def test_draws_over_epochs_match_the_weights_or_temperature(sizes, weights, temperature, expected):
    probs = sampling_probs(sizes, weights, temperature)
    np.testing.assert_allclose(probs, expected, rtol=1e-4)
    ids = np.repeat(np.arange(len(sizes)), sizes)
    rng = np.random.default_rng(0)
    ids = ids[rng.permutation(ids.size)]  # the pairs' sentences anywhere in the split
    counts = np.zeros(len(sizes))
    for epoch in range(20):
        drawn = epoch_indices(ids, probs, seed=3, epoch=epoch)
        assert drawn.size == ids.size
        counts += np.bincount(ids[drawn], minlength=len(sizes))
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=1e-3)


def test_draws_are_a_function_of_seed_and_epoch_and_cover_each_pair():
    ids = np.repeat([0, 1], [100, 10])
    probs = np.array([0.5, 0.5])
    first = epoch_indices(ids, probs, seed=1, epoch=4)
    np.testing.assert_array_equal(first, epoch_indices(ids, probs, seed=1, epoch=4))  # an exact resume
    assert not np.array_equal(first, epoch_indices(ids, probs, seed=1, epoch=5))
    small = first[ids[first] == 1]
    assert small.size == 55 and set(small.tolist()) == set(range(100, 110))  # each repeated 5-6 times
    assert np.bincount(small - 100).min() >= 5


def test_a_sentence_s_pair_is_read_off_its_tag(tagged_tokenizer):
    tok = tagged_tokenizer
    src = [tok.encode(tagged(s, lang), "src") for lang in ("fr", "de") for s in EN]
    tgt = [tok.encode(t, "tgt") for t in FR + DE]
    pairs = TokenPairs.from_rows(src, tgt, np.dtype(np.uint16), np.dtype(np.uint8))
    cfg = DataConfig(corpus="multi30k", pairs=["en-de", {"src": "en", "tgt": "fr"}])
    draws = PairDraws.of(cfg, pairs, tok)
    assert draws.ids.tolist() == [1] * 4 + [0] * 4
    np.testing.assert_allclose(draws.probs, [0.5, 0.5])
    heads = np.array([[5, 7], [9, 9]])
    assert pair_ids(heads, [7, 8]).tolist() == [0, -1]


def test_with_tag_tags_or_refuses_in_one_line():
    tags = {"de": 10, "fr": 11}
    assert with_tag(["a b"], "fr", tags) == ["<2fr> a b"]
    assert with_tag(["<2de> a b"], None, tags) == ["<2de> a b"]
    assert with_tag(["a b"], None, {}) == ["a b"]
    for texts, lang, tags_, message in ((["a b"], None, tags, "translates into de, fr: say which"),
                                        (["a b"], "cs", tags, "unknown target language 'cs'; this model knows de, fr"),
                                        (["a b"], "de", {}, "not trained with target-language tags")):
        with pytest.raises(ConfigError, match=message) as err:
            with_tag(texts, lang, tags_)
        assert str(err.value).startswith("decode.tgt_lang: ") and "\n" not in str(err.value)


def test_a_line_tagged_already_keeps_its_one_tag_or_refuses_another_language():
    tags = {"de": 10, "fr": 11}
    assert with_tag(["<2de> a b", "a b", "<2de>"], "de", tags) == ["<2de> a b", "<2de> a b", "<2de>"]
    assert with_tag(["<2xx> a b"], "de", tags) == ["<2de> <2xx> a b"]  # no tag of this model: a word
    with pytest.raises(ConfigError, match=re.escape("is 'de', but this line is tagged for 'fr': '<2fr> a\\nb'")) as err:
        with_tag(["a b", "<2fr> a\nb"], "de", tags)
    assert "\n" not in str(err.value)


def _tiny_model(tok: Tokenizer):
    from transduce.model import Transformer
    torch.manual_seed(0)
    return Transformer(model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                    max_positions=64)).eval()


def test_translate_with_a_target_language_puts_its_tag_first(tagged_tokenizer, one_thread):
    from transduce.inference import Translator
    tok = tagged_tokenizer
    with Translator(_tiny_model(tok), tok, decode=DecodeConfig(beam=1, max_len_b=3)) as translator:
        for lang in ("de", "fr"):
            out = translator.translate_detailed(["the dog runs"], tgt_lang=lang)[0]
            assert out.source_tokens == tok.encode(f"<2{lang}> the dog runs", "src")
            assert f"<2{lang}>" in out.source_pieces[:2]
            assert out.source == "the dog runs"  # the user's text: the tag is the model's input only
        assert translator.translate(["the dog runs"], tgt_lang="de") == translator.translate(["<2de> the dog runs"])
        with pytest.raises(ConfigError, match="say which"):
            translator.translate(["the dog runs"])
        with pytest.raises(ConfigError, match="unknown target language 'cs'"):
            translator.translate(["the dog runs"], tgt_lang="cs")


def test_word_alignments_number_the_users_words_not_the_tag(tagged_tokenizer, one_thread):
    from transduce.inference import Translator
    from transduce.data.multilingual import tag_length
    tok = tagged_tokenizer
    for tokens, pieces, n in (([7, 1], ["<2de>", "\u2581a"], 1), ([3, 7, 1], ["\u2581", "<2de>", "\u2581a"], 2),
                              ([3, 1], ["\u2581", "\u2581a"], 0), ([], [], 0)):
        assert tag_length(tokens, pieces, {7}) == n
    with Translator(_tiny_model(tok), tok, decode=DecodeConfig(beam=1, max_len_b=6)) as translator:
        links = [link for lang in ("de", "fr") for text in EN
                 for link in translator.translate_detailed([text], tgt_lang=lang, alignment=True)[0].best.alignment
                 if link[0] >= len(text.split())]
        assert links == []  # a source word index past the user's words: the tag counted as a word
        tagged_first = translator.translate_detailed(["<2de> the dog runs"], alignment=True)[0]
        assert max(i for i, _ in tagged_first.best.alignment) <= 2


def test_validation_scores_each_language_pair(tagged_tokenizer, one_thread, monkeypatch):
    """Each pair's BLEU is sacrebleu's over that pair's own outputs and references. The outputs
    are set (an untrained model's would score 0 whatever they were scored against): German's are
    its references, French's two of them swapped, so the pairs score 100 and less than 100."""
    from sacrebleu.metrics import BLEU
    from transduce.inference import Translator
    from transduce.training.validation import validation_bleu
    tok = tagged_tokenizer
    cfg = RunConfig.from_dict({"data": {"corpus": "multi30k", "pairs": ["en-de", "en-fr"]},
                               "decode": {"max_len_b": 3}})
    texts = [(tagged(s, lang), t) for lang in ("de", "fr") for s, t in zip(EN, TEXT[lang])]
    hyps = {"de": list(DE), "fr": [FR[1], FR[0], *FR[2:]]}
    outputs = dict(zip([s for s, _ in texts], hyps["de"] + hyps["fr"]))
    asked = []
    monkeypatch.setattr(Translator, "translate", lambda self, sources, **kw: asked.extend(sources) or
                        [outputs[s] for s in sources])
    scores = validation_bleu(_tiny_model(tok), tok, texts, cfg, torch.device("cpu"))
    assert asked == [s for s, _ in texts]

    def bleu(h, r):
        return BLEU().corpus_score(h, [r]).score

    assert scores == {"val_bleu": pytest.approx(bleu(hyps["de"] + hyps["fr"], DE + FR)),
                      "val_bleu/en-de": pytest.approx(bleu(hyps["de"], DE)),
                      "val_bleu/en-fr": pytest.approx(bleu(hyps["fr"], FR))}
    assert scores["val_bleu/en-de"] == pytest.approx(100) and 0 < scores["val_bleu/en-fr"] < 100
    for lang, other in (("de", FR), ("fr", DE)):  # another pair's references score otherwise
        assert scores[f"val_bleu/en-{lang}"] != pytest.approx(bleu(hyps[lang], other))


def test_cli_translate_takes_tgt_lang_and_refuses_a_missing_or_unknown_one(tagged_tokenizer, tmp_path, capsys,
                                                                           one_thread):
    from transduce.cli import main
    from transduce.model import save_model
    model_dir = tmp_path / "model"
    tagged_tokenizer.save(model_dir)
    save_model(_tiny_model(tagged_tokenizer), model_dir, DecodeConfig(beam=1, max_len_b=3))
    src = tmp_path / "in.txt"
    src.write_text("the dog runs\na cat sleeps\n", encoding="utf-8")
    assert main(["translate", str(model_dir), "--input", str(src), "--tgt-lang", "fr"]) == 0
    want = capsys.readouterr().out
    assert len(want.splitlines()) == 2
    for extra, message in (([], "say which (--tgt-lang)"), (["--tgt-lang", "cs"], "unknown target language 'cs'")):
        assert main(["translate", str(model_dir), "--input", str(src), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err
    src.write_text("<2fr> the dog runs\na cat sleeps\n", encoding="utf-8")  # one line tagged already: kept once
    assert main(["translate", str(model_dir), "--input", str(src), "--tgt-lang", "fr"]) == 0
    assert capsys.readouterr().out == want
    out = tmp_path / "out.txt"
    assert main(["translate", str(model_dir), "--input", str(src), "--tgt-lang", "de", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "tagged for 'fr': '<2fr> the dog runs'" in err and "\n" not in err and not out.exists()



def test_multi30k_pairs_are_read_tagged_and_hashed(multi30k_root):
    from transduce.data.prepare import split_sources
    cfg = DataConfig(corpus="multi30k", root=str(multi30k_root), pairs=["en-de", "en-fr", "en-cs"])
    sources = split_sources(cfg)
    train, valid = sources["train"].generated, sources["valid"].generated
    assert len(train) == 3 * 29000 and len(valid) == 3 * 1014
    assert [s.split(" ", 1)[0] for s, _ in train[::29000]] == ["<2de>", "<2fr>", "<2cs>"]
    assert [s.split(" ", 1)[0] for s, _ in valid[:6]] == ["<2de>", "<2fr>", "<2cs>"] * 2  # interleaved
    assert valid[0][0] == valid[1][0].replace("<2fr>", "<2de>")  # the same English sentence
    assert sorted(p.name for p in sources["valid"].read) == ["val.cs.gz", "val.de.gz", "val.en.gz", "val.fr.gz"]


def _saved(tok: Tokenizer, model_dir):
    from transduce.model import save_model
    tok.save(model_dir)
    save_model(_tiny_model(tok), model_dir, DecodeConfig(beam=1, max_len_b=3))
    return model_dir


def test_cli_score_takes_tgt_lang_as_translate_does(tagged_tokenizer, tmp_path, capsys, one_thread):
    from transduce.cli import main
    model_dir = _saved(tagged_tokenizer, tmp_path / "model")
    (tmp_path / "src").write_text("the dog runs\na cat sleeps\n", encoding="utf-8")
    (tmp_path / "tagged").write_text("<2fr> the dog runs\n<2fr> a cat sleeps\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("le chien court\nun chat dort\n", encoding="utf-8")
    args = ["score", str(model_dir), "--tgt", str(tmp_path / "tgt"), "--output-format", "jsonl"]
    assert main([*args, "--src", str(tmp_path / "tagged")]) == 0
    want = capsys.readouterr().out
    assert main([*args, "--src", str(tmp_path / "src"), "--tgt-lang", "fr"]) == 0
    assert capsys.readouterr().out == want
    assert main([*args, "--src", str(tmp_path / "tagged"), "--tgt-lang", "fr"]) == 0
    assert capsys.readouterr().out == want  # tagged already: not twice
    assert main([*args, "--src", str(tmp_path / "src"), "--tgt-lang", "de"]) == 0
    assert capsys.readouterr().out != want  # the tag is the model's input: another language, another score
    for extra, message in (([], "say which (--tgt-lang)"), (["--tgt-lang", "cs"], "unknown target language 'cs'")):
        assert main([*args, "--src", str(tmp_path / "src"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err


def test_a_document_counts_the_tag_in_each_sentence_length(tagged_tokenizer, tmp_path, capsys, caplog, one_thread):
    from extra_helpers import need_extra
    need_extra("documents", "sentencex")
    from transduce.cli import main
    from transduce.inference import Translator
    from transduce.inference.documents import translate_document
    text = "the red bird sings. an old man eats the dog.\n\na cat sleeps."
    with Translator(_tiny_model(tagged_tokenizer), tagged_tokenizer, decode=DecodeConfig(beam=1, max_len_b=3)) as tr:
        with caplog.at_level("WARNING", logger="transduce"):
            out = translate_document(tr, text, tgt_lang="fr", max_input_len=6)
        assert "truncated" not in caplog.text  # each piece fits with its tag: cut finer, never truncated
        assert out.count("\n") == 2
        want = translate_document(tr, text, tgt_lang="fr") + "\n"
    model_dir = _saved(tagged_tokenizer, tmp_path / "model")
    doc = tmp_path / "doc.txt"
    doc.write_text(text + "\n", encoding="utf-8")
    args = ["translate", str(model_dir), "--documents", "--input", str(doc)]
    assert main([*args, "--tgt-lang", "fr"]) == 0
    assert capsys.readouterr().out == want
    assert main(args) == 2 and "say which (--tgt-lang)" in capsys.readouterr().err
