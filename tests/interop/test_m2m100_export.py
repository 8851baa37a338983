"""NLLB-200 (tied and untied), M2M-100 and mBART-50 exported back to Hugging Face: the random
directories of m2m100_fixtures imported, then exported (``export --format hf``): every tensor of
model.safetensors the original's, bit for bit (but for two that transformers never reads and the
import drops: mBART's two position rows before position 0, written as zeros, and an untied NLLB's
model.shared, written as its encoder's embedding), config.json's architecture the original's, the
exported tokenizer (AutoTokenizer) giving the original's ids, and the export's own verification
(logits, greedy and beam against transformers) passed. Models these families cannot express, or
without language codes, are one-line errors that write nothing."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from transduce.cli import main
from transduce.data.tokenizer import Tokenizer
from transduce.interop import ExportError, export_model, import_hf
from transduce.model import build_model, load_model, save_model
from extra_helpers import need_extra
from m2m100_fixtures import hf_family_dirs
from t5_fixtures import toy_lines

transformers = need_extra("export", "transformers")
need_extra("export", "google.protobuf")  # rewriting the SentencePiece model's proto

# kind -> the languages its tokenizer is checked in (the sources' text is English or German)
LANGS = {"nllb": ["eng_Latn", "deu_Latn", "zho_Hans"], "nllb-untied": ["spa_Latn"], "m2m": ["en", "de"],
         "mbart": ["en_XX", "de_DE"]}
KINDS = list(LANGS)
HARD = ["Zwei Männer  sitzen\tauf einer   Bank.", "Café naïve déjà-vu über Straße", "東京 und 北京 sind groß.",
        "A dog 🐕 runs 👍🏽 fast!", "   leading and  inner   spaces", "ÄÖÜ äöü ß ﬁne Ａｂｃ", "", "x"]
# config.json keys that are not the model's architecture (how it was initialised, by which version)
NOT_ARCHITECTURE = {"transformers_version", "init_std", "dtype", "torch_dtype"}
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")  # (mBART's)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    return hf_family_dirs(transformers, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def imported(hf_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("imported")
    for kind, where in hf_dirs.items():
        import_hf(where, root / kind)
    return {kind: root / kind for kind in hf_dirs}


@pytest.fixture(scope="module")
def exported(imported, tmp_path_factory):
    root = tmp_path_factory.mktemp("exported")
    out = {}
    for kind, model_dir in imported.items():
        checks = export_model(model_dir, "hf", root / kind).checks
        assert checks == {"max_logit_diff": checks["max_logit_diff"], "greedy_differences": 0,
                          "beam_differences": 0, "tokenizer_differences": 0}
        assert checks["max_logit_diff"] <= 1e-4
        out[kind] = root / kind
    return out


def _json(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("kind", KINDS)
def test_every_tensor_is_the_originals(hf_dirs, exported, kind):
    want = load_file(hf_dirs[kind] / "model.safetensors")
    got = load_file(exported[kind] / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        if kind == "mbart" and name in POSITIONS:  # (rows 0-1: before position 0, never read, not imported)
            assert torch.equal(got[name][2:], tensor[2:]) and not got[name][:2].any(), name
        elif kind == "nllb-untied" and name == "model.shared.weight":  # (untied: never read, not imported)
            assert torch.equal(got[name], want["model.encoder.embed_tokens.weight"])
        else:
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("kind", KINDS)
def test_config_is_the_originals(hf_dirs, exported, kind):
    want, got = (_json(d[kind] / "config.json") for d in (hf_dirs, exported))
    assert {k: v for k, v in got.items() if k not in NOT_ARCHITECTURE} == {
        k: v for k, v in want.items() if k not in NOT_ARCHITECTURE}
    assert _json(exported[kind] / "generation_config.json") == _json(hf_dirs[kind] / "generation_config.json")


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_gives_the_originals_ids(hf_dirs, exported, kind):
    """Source and target ids (the language code first, </s> last) on lines with accents, CJK, emoji,
    tabs and runs of spaces and on the toy corpus, the same tokenizer class and vocabulary."""
    want, got = (transformers.AutoTokenizer.from_pretrained(d[kind]) for d in (hf_dirs, exported))
    assert type(got).__name__ == type(want).__name__
    assert got.get_vocab() == want.get_vocab()
    texts = HARD + toy_lines("en", 30) + toy_lines("de", 30)
    for lang in LANGS[kind]:
        for tok in (want, got):
            tok.src_lang, tok.tgt_lang = lang, lang
        for text in texts:
            assert got(text)["input_ids"] == want(text)["input_ids"], (lang, text)
            assert got(text_target=text)["input_ids"] == want(text_target=text)["input_ids"], (lang, text)
        assert got.decode(want(texts[:5])["input_ids"][0]) == want.decode(want(texts[:5])["input_ids"][0])


@pytest.mark.parametrize("kind", KINDS)
def test_import_of_the_export_is_the_import(imported, exported, tmp_path, kind):
    import_hf(exported[kind], tmp_path / "again")
    want, got = load_model(imported[kind]), load_model(tmp_path / "again")
    assert got.config == want.config
    for (name, a), (_, b) in zip(sorted(want.state_dict().items()), sorted(got.state_dict().items())):
        assert torch.equal(a, b), name
    assert Tokenizer.load(tmp_path / "again").protos == Tokenizer.load(imported[kind]).protos


def test_cli_export(imported, tmp_path, capsys):
    assert main(["export", str(imported["mbart"]), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert "max_logit_diff" in capsys.readouterr().out
    assert transformers.AutoConfig.from_pretrained(tmp_path / "hf").model_type == "mbart"


def _without_codes(tok: Tokenizer) -> Tokenizer:
    """``tok`` with its language codes unused pieces (a tokenizer that names no language)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(tok.protos[0])
    for i in tok.lang_codes.values():
        proto.pieces[i].type = pb.ModelProto.SentencePiece.UNUSED
    return Tokenizer(proto.SerializeToString())


@pytest.mark.parametrize("kind, change, named", [
    ("nllb", dict(norm="post"), "cannot export to Hugging Face M2M-100: model.norm=post .M2M-100 has norm=pre."),
    ("nllb", dict(bos_id=1), "model.bos_id=1 .M2M-100 has bos_id=2."),
    ("mbart", dict(bias=False), "cannot export to Hugging Face mBART: model.bias=False"),
    ("m2m", None, "the tokenizer holds no language codes"),
])
def test_what_the_family_cannot_express_is_one_line(imported, tmp_path, kind, change, named):
    model = load_model(imported[kind])
    tok = Tokenizer.load(imported[kind])
    if change is not None:
        model = build_model(dataclasses.replace(model.config, **change))
    else:
        tok = _without_codes(tok)
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    with pytest.raises(ExportError, match=named) as e:
        export_model(tmp_path / "m", "hf", tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_a_tokenizer_with_other_codes_than_m2m100s_lists_is_refused(imported, tmp_path):
    shutil.copytree(imported["m2m"], tmp_path / "m")
    from sentencepiece import sentencepiece_model_pb2 as pb

    tok = Tokenizer.load(tmp_path / "m")
    proto = pb.ModelProto()
    proto.ParseFromString(tok.protos[0])
    proto.pieces[max(tok.lang_codes.values())].piece = "__xx__"
    Tokenizer(proto.SerializeToString()).save(tmp_path / "m")
    with pytest.raises(ExportError, match="are not M2M100Tokenizer's m2m100 or wmt21 list"):
        export_model(tmp_path / "m", "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
