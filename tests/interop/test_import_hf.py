"""Importing a Hugging Face MarianMTModel directory laid out as the OPUS-MT models are (``</s>`` 0,
``<unk>`` 1, ``<pad>`` last and the decoder start): same logits, tokens and translations as
transformers' MarianTokenizer + generate, and a round trip through our own Marian export."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from transduce.cli import main
from transduce.data.tokenizer import Tokenizer
from transduce.errors import TransduceError
from transduce.interop import export_model
from transduce.interop import import_hf
from transduce.inference.translator import Translator
from transduce.model import load_model
from toy_model import toy_pairs
from extra_helpers import need_extra

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from opus_mt_layout import opus_mt_layout  # noqa: E402

transformers = need_extra("export", "transformers")
need_extra("export", "google.protobuf")  # reading the SentencePiece model's proto

SOURCES = [s for s, _ in toy_pairs(24, seed=11)] + ["the zebra", ""]


def marian_layout(hf_dir, out, *, swish_bias: bool = False, separate: bool = False, seed: int = 0):
    """:func:`opus_mt_layout` (a trained model, laid out as OPUS-MT's); with ``swish_bias`` the
    FFN activation becomes swish and the output layer gets a random bias (a different, untrained
    model, for logit parity only); with ``separate`` the decoder has a vocabulary
    (target_vocab.json) and embeddings of its own, and the weights come as a pytorch_model.bin."""
    opus_mt_layout(hf_dir, out, separate_vocabs=separate)
    if not (swish_bias or separate):
        return out
    model = transformers.MarianMTModel.from_pretrained(out)
    if swish_bias:
        model.config.activation_function = "swish"
        state = model.state_dict()
        state["final_logits_bias"] = torch.randn(state["final_logits_bias"].shape,
                                                 generator=torch.Generator().manual_seed(seed))
        model = transformers.MarianMTModel(model.config)
        model.load_state_dict(state, strict=False)
    (out / "model.safetensors").unlink()
    if separate:
        torch.save(model.state_dict(), out / "pytorch_model.bin")
        model.config.save_pretrained(out)
    else:
        model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def marian_dir(trained_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("marian")
    export_model(trained_dir, "hf", root / "ours")
    return marian_layout(root / "ours", root / "marian")


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("imported") / "model"
    checks = import_hf(marian_dir, out)
    assert checks["max_logit_diff"] < 1e-4
    assert checks["greedy_differences"] == 0 and checks["dropped_pieces"] == 0
    return out


def test_tokens_equal_marian_tokenizer(marian_dir, imported):
    hf_tok = transformers.MarianTokenizer.from_pretrained(marian_dir)
    tok = Tokenizer.load(imported)
    n = len(json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8")))
    marian_id = [n - 1, n - 1, 0, 1] + list(range(2, n - 1))             # of each of our ids
    for text in SOURCES:
        marian_ids = hf_tok(text)["input_ids"]
        assert [marian_id[i] for i in tok.encode(text, "src") + [2]] == marian_ids
        assert tok.decode(tok.encode(text, "tgt"), "tgt") == hf_tok.decode(marian_ids, skip_special_tokens=True)


def test_the_round_trip_recovers_the_trained_model(trained_dir, imported):
    """Our export, re-laid out as Marian, imported again: the same ids, so the same model, bar the
    output bias (zero) that an import always carries."""
    want, got = load_model(trained_dir), load_model(imported)
    assert got.config.output_bias and got.config.activation == want.config.activation
    w, g = want.state_dict(), got.state_dict()
    for name, t in w.items():
        if name.startswith("src_embed") or name.startswith("tgt_embed") or name.startswith("output_proj"):
            torch.testing.assert_close(g[name][2:], t[2:], rtol=0, atol=0)   # pad/bos rows: Marian's pad
        else:
            torch.testing.assert_close(g[name], t, rtol=0, atol=0)
    assert not g["output_proj.bias"].any()


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_marian_generate(marian_dir, imported, beam):
    hf_tok = transformers.MarianTokenizer.from_pretrained(marian_dir)
    hf = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    texts = [s for s in SOURCES if s]
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        gen = hf.generate(**batch, num_beams=beam, length_penalty=0.0, early_stopping=True, max_new_tokens=30,
                          do_sample=False)
    want = hf_tok.batch_decode(gen, skip_special_tokens=True)
    got = Translator.load(imported).translate(texts, beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=30)
    assert got == want
    assert sum(bool(g) for g in got) == len(texts)


def test_swish_and_a_logit_bias_verify(trained_dir, tmp_path):
    export_model(trained_dir, "hf", tmp_path / "ours")
    marian = marian_layout(tmp_path / "ours", tmp_path / "marian", swish_bias=True)
    checks = import_hf(marian, tmp_path / "imported")
    assert checks["max_logit_diff"] < 1e-4
    model = load_model(tmp_path / "imported")
    assert model.config.activation == "silu" and model.output_proj.bias.abs().sum() > 0
    # and back out through our own exporter, which checks its logits against the imported model
    assert export_model(tmp_path / "imported", "hf", tmp_path / "again").checks["max_logit_diff"] < 1e-4


def test_an_imported_model_exports_to_ctranslate2(imported, tmp_path):
    need_extra("export", "ctranslate2")
    report = export_model(imported, "ctranslate2", tmp_path / "ct2")
    assert report.checks["max_logprob_diff"] < 1e-3


def test_separate_vocabularies_and_pickle_free_bin_weights(trained_dir, tmp_path):
    export_model(trained_dir, "hf", tmp_path / "ours")
    marian = marian_layout(tmp_path / "ours", tmp_path / "marian", separate=True)
    assert not (marian / "model.safetensors").exists() and (marian / "pytorch_model.bin").exists()
    checks = import_hf(marian, tmp_path / "imported")
    assert checks["max_logit_diff"] < 1e-4 and checks["greedy_differences"] == 0
    model = load_model(tmp_path / "imported")
    assert not model.config.share_embeddings and not Tokenizer.load(tmp_path / "imported").joint
    texts = [s for s in SOURCES if s][:8]
    assert Translator.load(tmp_path / "imported").translate(texts, beam=1) == Translator.load(trained_dir).translate(
        texts, beam=1)


def test_import_then_fine_tune_then_translate(imported, tmp_path):
    """The fine-tuning config names only what changes: the model is the imported one."""
    import yaml

    config = {"model": {"dropout": 0.2}, "data": {"corpus": "toy", "toy_train_size": 200, "toy_valid_size": 20,
                                       "toy_test_size": 10, "max_tokens": 400, "max_len": 40},
              "train": {"max_steps": 3, "warmup_steps": 2, "eval_every": 3, "save_every": 3, "log_every": 1,
                        "threads": 1}}
    (tmp_path / "ft.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["train", str(tmp_path / "ft.yaml"), "--init-from", str(imported), "--out", str(tmp_path / "run")]) == 0
    (tmp_path / "in.txt").write_text("the red dog sleeps\n", encoding="utf-8")
    assert main(["translate", str(tmp_path / "run" / "model"), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.txt")]) == 0
    # one line per input line, not its words: after 3 steps they depend on the CPU's kernels (with
    # ATen's plain kernels and no oneDNN the first token was EOS, an empty line)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 1
    tuned = load_model(tmp_path / "run" / "model").config
    assert tuned.dropout == 0.2 and tuned.output_bias and tuned.d_model == load_model(imported).config.d_model


def _forget(spm_path, char: str) -> None:
    """Drop every piece holding ``char`` from the SentencePiece model at ``spm_path``."""
    pb = need_extra("export", "sentencepiece.sentencepiece_model_pb2")
    proto = pb.ModelProto()
    proto.ParseFromString(spm_path.read_bytes())
    kept = [p for p in proto.pieces if char not in p.piece]
    del proto.pieces[:]
    proto.pieces.extend(kept)
    spm_path.write_bytes(proto.SerializeToString())


@torch.no_grad()
def test_a_character_only_the_target_side_knows(marian_dir, tmp_path):
    """source.spm and target.spm differ: the source model lacks 'z', which the shared vocab.json
    (and the target model) has. MarianTokenizer looks the unknown span 'z' up in vocab.json and
    finds it; the import must too, not map it to <unk>. Likewise the translations."""
    shutil.copytree(marian_dir, tmp_path / "m")
    _forget(tmp_path / "m" / "source.spm", "z")
    hf_tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "m")
    texts = ["the zebra", "the lazy zebra sees a dog", "z", "a zz dog", "the dog sees the zebra ."]
    z = json.loads((tmp_path / "m" / "vocab.json").read_text(encoding="utf-8"))["z"]
    assert all(z in hf_tok(t)["input_ids"] for t in texts if "zz" not in t)  # the case at hand: not <unk>
    assert 1 in hf_tok("a zz dog")["input_ids"]  # a span 'zz' vocab.json lacks: <unk> (Marian id 1)
    import_hf(tmp_path / "m", tmp_path / "imported")
    tok = Tokenizer.load(tmp_path / "imported")
    n = len(json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8")))
    marian_id = [n - 1, n - 1, 0, 1] + list(range(2, n - 1))             # of each of our ids
    for text in texts:
        assert [marian_id[i] for i in tok.encode(text, "src") + [2]] == hf_tok(text)["input_ids"]
        assert tok.encode_batch([text], "src") == [tok.encode(text, "src")]
        flat, _ = tok.encode_flat([text], "src")
        assert flat.tolist() == tok.encode(text, "src")
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "m").eval()
    gen = hf.generate(**hf_tok(texts, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=30,
                      do_sample=False)
    want = hf_tok.batch_decode(gen, skip_special_tokens=True)
    assert Translator.load(tmp_path / "imported").translate(texts, beam=1, max_len_a=0.0, max_len_b=30) == want


@pytest.mark.parametrize("edit, named", [
    (lambda d: d.update(normalize_before=True), "normalize_before=True"),
    (lambda d: d.update(activation_function="tanh"), "activation_function='tanh'"),
    (lambda d: d.update(model_type="bart"), "not 'marian'"),
    (lambda d: d.update(decoder_ffn_dim=7), "decoder_ffn_dim=7"),
])
def test_unsupported_options_are_refused_in_one_line(marian_dir, tmp_path, edit, named):
    shutil.copytree(marian_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    edit(config)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(TransduceError, match=named) as e:
        import_hf(tmp_path / "m", tmp_path / "out")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_python_entry_point():
    import transduce

    assert transduce.import_hf is import_hf


def test_cli(marian_dir, tmp_path, capsys):
    assert main(["import", str(marian_dir), "--out", str(tmp_path / "m")]) == 0
    assert "max_logit_diff" in capsys.readouterr().out
    assert main(["import", str(marian_dir), "--out", str(tmp_path / "m")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "nowhere"), "--out", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and err.count("\n") == 1
    shutil.copytree(marian_dir, tmp_path / "pickle")
    (tmp_path / "pickle" / "model.safetensors").unlink()
    (tmp_path / "pickle" / "pytorch_model.bin").write_bytes(b"\x80\x04cos\nsystem\n.")
    assert main(["import", str(tmp_path / "pickle"), "--out", str(tmp_path / "p")]) == 2
    assert "not loadable as plain weights" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
