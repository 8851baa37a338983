"""Word alignments from cross-attention: subword -> word mapping, the forced pass (equal to the
attention maps of the plain path), the trained toy model's monotone alignments, the CLI."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from transduce.cli import main
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference import Translator, attention_maps
from transduce.inference.text.alignment import (alignment_choice, format_alignment, hard_alignment, parse_alignment,
                                           word_index)
from transduce.inference.text.markup import TOKEN


@pytest.fixture(scope="module")
def translator(trained_dir) -> Translator:
    return Translator.load(trained_dir)


def test_word_index_follows_sentencepiece_word_starts():
    assert word_index(["▁the", "▁r", "e", "d", "▁", "d", "og", "."]) == [0, 1, 1, 1, 2, 2, 2, 2]
    assert word_index(["og", "▁x"]) == [0, 1]  # a first piece without "▁" is still word 0
    assert word_index([]) == []


def test_hard_alignment_links_each_target_piece_to_its_most_attended_source_word():
    src, tgt = ["▁a", "b", "▁c"], ["▁x", "▁y", "z"]               # words: a b | c  ->  x | y z
    att = torch.tensor([[0.1, 0.1, 0.7, 0.1],                        # x -> c (column 3 is EOS)
                        [0.6, 0.2, 0.1, 0.1],                        # y -> a
                        [0.0, 0.1, 0.0, 0.9],                        # z -> EOS ignored -> b
                        [0.0, 0.0, 0.0, 1.0]])                       # the EOS row is ignored
    assert hard_alignment(att, src, tgt) == [(0, 1), (1, 0)]
    assert hard_alignment(att, [], tgt) == []


def test_pharaoh_format_round_trip_and_errors():
    links = [(0, 0), (1, 2), (2, 1)]
    assert format_alignment(links) == "0-0 1-2 2-1" and parse_alignment("0-0 1-2 2-1") == links
    assert parse_alignment("  ") == []
    with pytest.raises(ConfigError, match="align.txt:3: expected i-j"):
        parse_alignment("0-1 2", "align.txt:3")


def test_alignment_layer_is_checked_and_minus_two_means_the_last_of_one_layer(translator):
    cfg = translator.config
    assert alignment_choice(cfg, DecodeConfig()).layer == -2  # the toy model's decoder has 2 layers
    with pytest.raises(ConfigError, match="decode.alignment_layer"):
        alignment_choice(cfg, DecodeConfig(alignment_layer=5))
    with pytest.raises(ConfigError, match="decode.alignment_head"):
        alignment_choice(cfg, DecodeConfig(alignment_head=cfg.n_heads))

    class OneLayer:
        n_decoder_layers, n_heads = 1, 4
    assert alignment_choice(OneLayer, DecodeConfig()).layer == -1


@pytest.mark.parametrize("layer, head", [(-1, None), (0, 2)])
def test_forced_cross_attention_equals_the_attention_maps(translator, layer, head):
    """The batched forced pass (padding, length sorting) gives the plain one-sentence maps."""
    from transduce.inference.scoring import forced_batches
    from transduce.inference.search import AttentionChoice

    texts = ["the red dog sleeps", "a cat", "the old bird sees the small house today"]
    results = translator.translate_detailed(texts, beam=2)
    eos = translator.config.eos_id
    src = [r.source_tokens + [eos] for r in results]
    tgt = [r.best.tokens + [eos] for r in results]
    seen = 0
    with torch.inference_mode():
        for index, out in forced_batches(translator, src, tgt, translator.decode, AttentionChoice(layer, head)):
            for row, i in enumerate(index):
                ref = attention_maps(translator, texts[i], layer=layer, head=head, beam=2).cross  # (T, S)
                got = out.cross_attention[row, : len(tgt[i]), : len(src[i])]
                torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
                seen += 1
    assert seen == len(texts)


def test_a_word_for_word_model_aligns_monotonically(translator):
    """The toy task translates word for word: the alignments of its exact outputs are diagonal."""
    import toy_model

    pairs = toy_model.toy_pairs(30, seed=123)
    results = translator.translate_detailed([s for s, _ in pairs], alignment=True)
    exact = [(s, r) for (s, t), r in zip(pairs, results) if r.best.text == t]
    assert len(exact) >= 10
    diagonal = sum(i == j for _, r in exact for i, j in r.best.alignment)
    words = sum(len(s.split()) for s, _ in exact)
    assert diagonal >= 0.85 * words
    assert all(j < len(r.best.text.split()) for _, r in exact for _, j in r.best.alignment)


def test_empty_input_has_an_empty_alignment(translator):
    out = translator.translate_detailed(["", "the dog"], alignment=True)
    assert out[0].best.alignment == [] and out[1].best.alignment


def test_cli_jsonl_alignment_and_markup(trained_dir, tmp_path):
    src = tmp_path / "src.txt"
    lines = ["the <b>red dog</b> sleeps", "a cat <br/> runs {name}", "", "</i> the <u>bird"]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(out), "--output-format",
                 "jsonl", "--alignment-layer", "-1", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[2]["alignment"] == "" and all(rows[n]["alignment"] for n in (0, 1, 3))
    marked = tmp_path / "marked.txt"
    assert main(["translate", str(trained_dir), "--input", str(src), "--output", str(marked), "--markup",
                 "--device", "cpu"]) == 0
    got = marked.read_text(encoding="utf-8").splitlines()
    assert len(got) == len(lines) and got[2] == ""
    for text, translation in zip(lines, got):
        tags = [Counter(m.group(0) for m in TOKEN.finditer(t)) for t in (text, translation)]
        assert tags[0] == tags[1]
    assert main(["translate", str(trained_dir), "--input", str(src), "--markup", "--nbest", "2",
                 "--device", "cpu"]) == 2


MARKED = ["the <b>dog</b> runs", "a <i>cat</i> sleeps <br/> today", "<u>the red bird</u> sings {name}"]


@pytest.fixture(scope="module")
def tagged_translator(tmp_path_factory) -> Translator:
    """A tiny two-target model (random weights: its attention links words every which way)."""
    from transduce.config import model_preset
    from transduce.data.multilingual import tagged
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import Transformer

    plain = [TOKEN.sub(" ", t) for t in MARKED]
    src = [tagged(s, lang) for lang in ("de", "fr") for s in plain] * 10
    tok = Tokenizer.train(src, ["der Hund läuft heute", "le chat dort bien"] * 30, tmp_path_factory.mktemp("tok"),
                          vocab_size=60, tags=["<2de>", "<2fr>"])
    torch.manual_seed(1)
    model = Transformer(model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                     d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                     max_positions=64)).eval()
    return Translator(model, tok, decode=DecodeConfig(beam=1, max_len_a=1.0, max_len_b=2))


def test_markup_after_a_target_language_tag(tagged_translator, tmp_path):
    """A line's leading ``<2de>`` is the model's tag, neither markup nor a word of the line: the
    tags go back where they go with ``tgt_lang`` de, in a list and in a file."""
    from transduce.inference.files import translate_file

    want = tagged_translator.translate(MARKED, markup=True, tgt_lang="de")
    lines = [f"<2de> {t}" for t in MARKED]
    assert tagged_translator.translate(lines, markup=True) == want
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    translate_file(tagged_translator, src, out, markup=True)
    assert out.read_text(encoding="utf-8").splitlines() == want
    assert all(Counter(TOKEN.findall(a)) == Counter(TOKEN.findall(b)) for a, b in zip(MARKED, want))
    assert not any("<2de>" in t for t in want)
