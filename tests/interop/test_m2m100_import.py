"""NLLB-200 and M2M-100 (model_type m2m_100), and mBART-50 (mbart), from Hugging Face: random
M2M100ForConditionalGeneration and MBartForConditionalGeneration directories with the real
tokenizer classes over a SentencePiece model trained on the embedded toy corpus (m2m100_fixtures).
Imported: the same logits, source ids and greedy / beam-4 translations as transformers'
``generate(forced_bos_token_id=...)`` in several directions, through transduce's one language
mechanism (``decode.src_lang``/``tgt_lang``); bad directories and unknown language codes are
one-line errors that write nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from transduce.cli import main
from transduce.data.multilingual import code_ids
from transduce.data.tokenizer import Tokenizer
from transduce.errors import ConfigError, TransduceError
from transduce.inference.translator import Translator
from transduce.interop import import_hf
from transduce.model import load_model
from extra_helpers import need_extra
from m2m100_fixtures import SPM, hf_family_dirs
from t5_fixtures import toy_lines

transformers = need_extra("export", "transformers")
need_extra("export", "google.protobuf")  # rewriting the SentencePiece model's proto

# kind -> (source, target) language pairs translated; the sources' text is English or German
DIRECTIONS = {"nllb": [("eng_Latn", "deu_Latn"), ("deu_Latn", "fra_Latn"), ("eng_Latn", "zho_Hans")],
              "nllb-untied": [("eng_Latn", "spa_Latn")], "m2m": [("en", "de"), ("de", "ja")],
              "mbart": [("en_XX", "de_DE"), ("de_DE", "fr_XX")]}
KINDS = list(DIRECTIONS)
N_SENTENCES = 20
MAX_NEW = 21  # tokens generated at most, the forced language code included (ours: max_len_b)
HARD = ["Zwei Männer  sitzen\tauf einer   Bank.", "Café naïve déjà-vu über Straße", "東京 und 北京 sind groß.",
        "A dog 🐕 runs 👍🏽 fast!", "   leading and  inner   spaces", "ÄÖÜ äöü ß ﬁne Ａｂｃ"]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    return hf_family_dirs(transformers, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def imported(hf_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("imported")
    out = {}
    for kind, where in hf_dirs.items():
        checks = import_hf(where, root / kind)
        assert checks == {"max_logit_diff": checks["max_logit_diff"], "greedy_differences": 0,
                          "beam_differences": 0, "tokenizer_differences": 0}
        assert checks["max_logit_diff"] <= 1e-4
        out[kind] = root / kind
    return out


def _swap(ids):
    """Our ids <-> fairseq's: <pad> and <s> swapped (0 <-> 1), the rest the same."""
    ids = torch.as_tensor(ids)
    return torch.where(ids < 2, 1 - ids, ids)


def _hf(hf_dirs, kind):
    return (transformers.AutoTokenizer.from_pretrained(hf_dirs[kind]),
            transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dirs[kind]).eval())


def _code(hf_tok, lang: str) -> int:
    """transformers' id of ``lang``'s code: NllbTokenizer's token, M2M100Tokenizer's __lang__."""
    return hf_tok.get_lang_id(lang) if hasattr(hf_tok, "get_lang_id") else hf_tok.convert_tokens_to_ids(lang)


def _texts(lang: str, n: int = N_SENTENCES) -> list[str]:
    return toy_lines("de" if lang.startswith("de") else "en", n)


@pytest.mark.parametrize("kind", KINDS)
def test_options_are_mapped(hf_dirs, imported, kind):
    cfg = load_model(imported[kind]).config
    mbart = kind == "mbart"
    assert (cfg.norm, cfg.scale_embeddings) == ("pre", True)
    assert (cfg.positions, cfg.activation, cfg.embed_norm, cfg.output_bias) == (
        ("learned", "gelu", True, True) if mbart else ("fairseq", "relu", False, False))
    # (transformers 5 unties both stacks' embeddings and the output from tie_word_embeddings=false)
    assert (cfg.share_embeddings, cfg.tie_output) == (kind != "nllb-untied",) * 2
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (0, 2, 2)  # the decoder starts from </s>, as fairseq's
    n_rows = json.loads((hf_dirs[kind] / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert cfg.tgt_vocab_size == n_rows  # no row added
    codes = Tokenizer.load(imported[kind]).lang_codes
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dirs[kind])
    assert {lang: int(_swap(i)) for lang, i in codes.items()} == {lang: _code(hf_tok, lang) for lang in codes}
    assert len(codes) == {"m2m": 8, "mbart": 52}.get(kind, 5)


@pytest.mark.parametrize("kind", KINDS)
def test_logits_within_1e_4_on_a_padded_batch(hf_dirs, imported, kind):
    hf_tok, hf = _hf(hf_dirs, kind)
    src_lang, tgt_lang = DIRECTIONS[kind][0]
    hf_tok.src_lang, hf_tok.tgt_lang = src_lang, tgt_lang
    batch = hf_tok(_texts(src_lang), text_target=_texts("de"), return_tensors="pt", padding=True)
    labels = batch.pop("labels")                                              # [code] text </s>, <pad>-padded
    assert (batch["attention_mask"] == 0).any() and (labels == 1).any()       # (padding on both sides)
    dec = torch.cat([torch.full((len(labels), 1), 2), labels[:, :-1]], dim=1)  # from </s>, as transformers shifts
    model = load_model(imported[kind]).eval()
    with torch.no_grad():
        want = hf(**batch, decoder_input_ids=dec).logits[..., _swap(torch.arange(model.config.tgt_vocab_size))]
        got = model(_swap(batch["input_ids"]), _swap(dec))
    real = dec != 1  # (transformers gives a padded position no position; nothing reads its output)
    assert (got - want)[real].abs().max() <= 1e-4
    assert want[real].std() > 0.5  # (not a trivial distribution)


@pytest.mark.parametrize("kind,beam", [(kind, beam) for kind in KINDS for beam in (1, 4)])
def test_translations_equal_generate_with_forced_bos(hf_dirs, imported, kind, beam):
    """Greedy and beam-4 output ids, per direction, equal transformers' with the target's code
    forced first (its pad forbidden, as our search never emits it)."""
    hf_tok, hf = _hf(hf_dirs, kind)
    translator = Translator.load(imported[kind])
    for src_lang, tgt_lang in DIRECTIONS[kind]:
        texts = _texts(src_lang)
        hf_tok.src_lang = src_lang
        batch = hf_tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = hf.generate(**batch, forced_bos_token_id=_code(hf_tok, tgt_lang), num_beams=beam,
                              length_penalty=0.0, early_stopping=True, max_new_tokens=MAX_NEW, do_sample=False,
                              bad_words_ids=[[1]], forced_eos_token_id=None)  # (mBART's config forces </s> last)
        assert (gen[:, :2] == torch.tensor([2, _code(hf_tok, tgt_lang)])).all()
        want = [_through_eos(_swap([t for t in row[2:].tolist() if t != 1]).tolist()) for row in gen]
        out = translator.translate_detailed(texts, src_lang=src_lang, tgt_lang=tgt_lang, beam=beam, lenpen=0.0,
                                            max_len_a=0.0, max_len_b=MAX_NEW)
        got = [t.best.tokens + [2] * t.best.ended for t in out]
        assert got == want, (src_lang, tgt_lang)
        assert len({tuple(g) for g in got}) > 10  # (random weights, but outputs that depend on the input)
        text = translator.translate(texts, src_lang=src_lang, tgt_lang=tgt_lang, beam=beam, lenpen=0.0,
                                    max_len_a=0.0, max_len_b=MAX_NEW)
        assert text == [t.best.text for t in out]


def test_scores_are_transformers_log_probs(hf_dirs, imported):
    """Forced decoding (transduce score) scores the target's code as the output's first token, as
    transformers' labels have it: the same token log-probs."""
    hf_tok, hf = _hf(hf_dirs, "nllb")
    hf_tok.src_lang, hf_tok.tgt_lang = "eng_Latn", "deu_Latn"
    sources, targets = _texts("eng_Latn", 5), _texts("de", 5)
    scored = Translator.load(imported["nllb"]).score(sources, targets, src_lang="eng_Latn", tgt_lang="deu_Latn")
    for source, target, ours in zip(sources, targets, scored):
        batch = hf_tok(source, text_target=target, return_tensors="pt")
        labels = batch.pop("labels")
        with torch.no_grad():
            logits = hf(**batch, decoder_input_ids=torch.cat([torch.tensor([[2]]), labels[:, :-1]], dim=1)).logits
        want = torch.log_softmax(logits, -1).gather(2, labels[..., None])[0, :, 0]
        torch.testing.assert_close(torch.tensor(ours.token_log_probs), want, atol=1e-4, rtol=1e-4)


def _through_eos(ids: list[int]) -> list[int]:
    return ids[:ids.index(2) + 1] if 2 in ids else ids


@pytest.mark.parametrize("kind", ["nllb", "m2m", "mbart"])
def test_source_ids_equal_the_hf_tokenizer(hf_dirs, imported, kind):
    """The model's input, its language code first and </s> last, is the tokenizer's, on lines with
    accents, CJK, emoji, tabs and runs of spaces (and on the toy corpus)."""
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dirs[kind])
    translator = Translator.load(imported[kind])
    for src_lang, tgt_lang in DIRECTIONS[kind]:
        hf_tok.src_lang = src_lang
        texts = HARD + _texts(src_lang, 50)
        out = translator.translate_detailed(texts, src_lang=src_lang, tgt_lang=tgt_lang, beam=1, max_len_b=1)
        for text, t in zip(texts, out):
            assert _swap(t.source_tokens + [2]).tolist() == hf_tok(text)["input_ids"], text
    assert any(3 in t.source_tokens for t in out)  # (characters the model does not know: <unk>, as theirs)


def _edited(hf_dir, tmp_path, edit=None, drop=None):
    shutil.copytree(hf_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    if edit is not None:
        edit(config)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    if drop is not None:
        (tmp_path / "m" / drop).unlink()
    return tmp_path / "m"


@pytest.mark.parametrize("edit, drop, named", [
    (lambda d: d.update(activation_function="tanh"), None, "activation_function='tanh' is not supported"),
    (lambda d: d.update(decoder_start_token_id=0), None, "decoder_start_token_id=0 is not supported"),
    (lambda d: d.update(decoder_ffn_dim=64), None, "encoder_ffn_dim=48 and decoder_ffn_dim=64 differ"),
    (lambda d: d.pop("d_model"), None, "missing key 'd_model'"),
    (None, SPM, "sentencepiece.bpe.model: not found"),
    (None, "tokenizer.json", "no tokenizer.json .NLLB's, mBART-50's tokenizer. or vocab.json"),
    (None, "model.safetensors", "no model.safetensors or pytorch_model.bin"),
])
def test_bad_directories_are_one_line_errors_and_write_nothing(hf_dirs, tmp_path, edit, drop, named):
    where = _edited(hf_dirs["nllb"], tmp_path, edit, drop)
    with pytest.raises(TransduceError, match=named) as e:
        import_hf(where, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_legacy_behaviour_is_refused(hf_dirs, tmp_path):
    where = _edited(hf_dirs["nllb"], tmp_path)
    tok_config = json.loads((where / "tokenizer_config.json").read_text())
    (where / "tokenizer_config.json").write_text(json.dumps({**tok_config, "legacy_behaviour": True}))
    with pytest.raises(TransduceError, match="legacy_behaviour=true"):
        import_hf(where, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_mbart25s_tokenizer_is_refused(hf_dirs, tmp_path):
    """mBART-25's MBartTokenizer puts the language code after </s> (and its models decode from it)."""
    shutil.copytree(hf_dirs["mbart"], tmp_path / "m")
    tok_config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "MBartTokenizer"
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps(tok_config))
    with pytest.raises(TransduceError, match=r"MBartTokenizer writes \[\] \+ text \+ \[2, \d+\]; transduce reads") as e:
        import_hf(tmp_path / "m", tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind, src_lang, tgt_lang, named", [
    ("nllb", "eng_Latn", "fra_Latm", "decode.tgt_lang: unknown language code 'fra_Latm'; did you mean fra_Latn"),
    ("nllb", "english", "fra_Latn", "decode.src_lang: unknown language code 'english'; this model knows deu_Latn"),
    ("nllb", None, "fra_Latn", "decode.src_lang: this model translates between 5 languages .* say which "
                               r"\(--src-lang\)"),
    ("m2m", "en", "fr", "decode.tgt_lang: unknown language code 'fr'"),
])
def test_unknown_language_codes_are_one_line_errors(imported, kind, src_lang, tgt_lang, named):
    with pytest.raises(ConfigError, match=named) as e:
        Translator.load(imported[kind]).translate(["A dog runs."], src_lang=src_lang, tgt_lang=tgt_lang)
    assert "\n" not in str(e.value)


def test_a_model_without_codes_takes_no_source_language():
    assert code_ids({}, None, None) == ([], [])
    with pytest.raises(ConfigError, match="decode.src_lang: 'en' given, but this model's inputs name no source"):
        code_ids({}, "en", None)


def test_cli_import_then_translate(hf_dirs, tmp_path, capsys):
    assert main(["import", str(hf_dirs["nllb"]), "--out", str(tmp_path / "m")]) == 0
    assert "max_logit_diff" in capsys.readouterr().out
    (tmp_path / "in.txt").write_text("A dog runs.\nTwo men sit on a bench.\n", encoding="utf-8")
    args = ["translate", str(tmp_path / "m"), "--input", str(tmp_path / "in.txt"), "--src-lang", "eng_Latn"]
    assert main([*args, "--tgt-lang", "deu_Latn", "--output", str(tmp_path / "out.txt")]) == 0
    want = Translator.load(tmp_path / "m").translate(["A dog runs.", "Two men sit on a bench."], src_lang="eng_Latn",
                                                     tgt_lang="deu_Latn")
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == want
    jsonl = ["--output-format", "jsonl", "--output", str(tmp_path / "o.jsonl")]
    assert main([*args, "--tgt-lang", "deu_Latn", *jsonl]) == 0
    best = [t.best for t in Translator.load(tmp_path / "m").translate_detailed(
        ["A dog runs.", "Two men sit on a bench."], src_lang="eng_Latn", tgt_lang="deu_Latn")]
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text(encoding="utf-8").splitlines()]
    for row, hyp in zip(rows, best, strict=True):  # the forced code is the model's, not the translation's
        assert row["pieces"] == hyp.pieces and len(row["token_log_probs"]) == len(hyp.pieces) + hyp.ended
        assert row["alignment"]
    capsys.readouterr()
    assert main([*args, "--tgt-lang", "deu_latn"]) == 2
    err = capsys.readouterr().err
    assert "did you mean deu_Latn" in err and err.count("\n") == 1
