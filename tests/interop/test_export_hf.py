"""Hugging Face Marian export: same tokens, logits, greedy and beam output as transduce."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from transduce.cli import main
from transduce.config import ModelConfig
from transduce.data.tokenizer import Tokenizer
from transduce.interop import ExportError, export_model
from transduce.interop.hf import HFSeq2Seq
from transduce.interop.marian import residual_permutation
from transduce.interop.verify import check_against, default_probe, search_ids
from transduce.inference.translator import Translator
from transduce.model import Transformer, load_model, save_model
from transduce.model.embeddings import sinusoidal_table
from extra_helpers import need_extra
from verify_helpers import MAX_LEN, assert_each_difference_fails, corrupted, many_probes, near_tie_export

transformers = need_extra("export", "transformers")

SENTENCES = ["the red dog sleeps", "a big cat sees the bird today", "green tree", "old house near a river"]


@pytest.fixture(scope="module")
def hf_dir(trained_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "marian"
    report = export_model(trained_dir, "hf", out)
    assert report.checks["max_logit_diff"] < 1e-4
    return out


def test_position_tables_match_under_the_permutation():
    """The premise of the export: Marian's half-split table is ours with channels permuted."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(50, 16).create_weight()
    torch.testing.assert_close(sinusoidal_table(50, 16)[:, residual_permutation(16)], marian, rtol=0, atol=1e-6)


def test_loads_with_auto_classes_and_same_token_ids(hf_dir, trained_dir):
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ours = Tokenizer.load(trained_dir)
    for s in SENTENCES:
        assert tok(s)["input_ids"] == ours.encode(s, "src") + [2]  # MarianTokenizer appends EOS
    ids = [1] + ours.encode(SENTENCES[0], "tgt") + [2, 0]
    assert tok.decode(ids, skip_special_tokens=True) == ours.decode(ids[1:], "tgt")


@torch.no_grad()
def test_same_logits(hf_dir, trained_dir):
    tr = Translator.load(trained_dir)
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    tgt = torch.tensor([[1] + tr.tokenizer.encode("der rot Hund", "tgt")] * len(SENTENCES))
    got = hf(**batch, decoder_input_ids=tgt).logits
    want = tr.model(batch["input_ids"], tgt)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_same_translations(hf_dir, trained_dir, beam):
    tr = Translator.load(trained_dir)
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    options = dict(num_beams=beam, length_penalty=0.0, early_stopping=True) if beam > 1 else dict(num_beams=1)
    gen = hf.generate(**batch, max_new_tokens=30, do_sample=False, **options)
    got = tok.batch_decode(gen, skip_special_tokens=True)
    want = tr.translate(SENTENCES, beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=30)
    assert got == want
    assert any(w for w in want)


def verify_hf(model, hf_dir):
    """The export's verification: transformers' model in ``hf_dir`` against ``model`` on its probes."""
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    return check_against(model, HFSeq2Seq(hf, model.config), default_probe(model), "Marian")


@pytest.mark.parametrize("beam", [1, 4])
def test_a_corrupted_eager_model_fails_verification(hf_dir, trained_dir, beam):
    """The export against the trained model with one output row times 1.5: the verification
    fails (at the logits), and so does each probe whose generate output differs, on its own."""
    model = load_model(trained_dir).eval()
    src = many_probes(model)
    broken = corrupted(model, src)
    with pytest.raises(ExportError, match="verification failed"):
        verify_hf(broken, hf_dir)
    hf = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    got = HFSeq2Seq(hf, model.config).search(src, beam, MAX_LEN)
    assert_each_difference_fails("Marian", broken, src, search_ids(broken, src, beam, MAX_LEN), got, beam=beam > 1)


def test_a_near_tie_broken_the_other_way_verifies(tmp_path, trained_dir):
    """Exported with two tokens' tie broken one way, verified against the model with it broken the
    other (logits 2 * TIE apart): greedy and beam outputs differ, by ties, and verification passes."""
    eager, out = near_tie_export(tmp_path, trained_dir, "hf")
    checks = verify_hf(eager, out)
    assert checks["greedy_differences"] >= 1 and checks["beam_differences"] >= 1


def _random_model_dir(tmp_path, trained_dir, **options):
    """A random model with the trained model's tokenizer and the given config options."""
    tok = Tokenizer.load(trained_dir)
    cfg = ModelConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=16,
                      n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, **options)
    torch.manual_seed(0)
    model = Transformer(cfg)
    if cfg.output_bias:  # zero at initialisation: make it matter
        torch.nn.init.normal_(model.output_proj.bias)
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize("options, named", [
    (dict(norm="pre"), "model.norm=pre"),
    (dict(positions="rope"), "model.positions=rope"),
    (dict(positions="learned"), "model.positions=learned"),
    (dict(activation="swiglu"), "model.activation=swiglu"),
    (dict(bias=False), "model.bias=false"),
    (dict(layer_norm_eps=1e-6), "model.layer_norm_eps=1e-06"),
    (dict(head_dim=4), "model.head_dim=4 (Marian's heads are d_model / n_heads = 8 wide)"),
])
def test_refuses_options_marian_lacks(tmp_path, trained_dir, options, named):
    model_dir = _random_model_dir(tmp_path, trained_dir, **options)
    with pytest.raises(ExportError, match=re.escape(named)):
        export_model(model_dir, "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging directory left


@pytest.mark.parametrize("options", [dict(share_embeddings=False, tie_output=False), dict(scale_embeddings=False),
                                     dict(activation="gelu"), dict(activation="silu", output_bias=True)])
def test_supported_variants_verify(tmp_path, trained_dir, options):
    report = export_model(_random_model_dir(tmp_path, trained_dir, **options), "hf", tmp_path / "out")
    assert report.checks["max_logit_diff"] < 1e-4


def test_failed_verification_leaves_nothing(tmp_path, trained_dir, monkeypatch):
    import transduce.interop.hf as hf

    def broken(model, reference, probe, what):
        raise ExportError("verification failed: simulated")

    monkeypatch.setattr(hf, "check_against", broken)
    with pytest.raises(ExportError, match="simulated"):
        export_model(trained_dir, "hf", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_cli(tmp_path, trained_dir, hf_dir, capsys):
    shutil.copytree(hf_dir, tmp_path / "taken")
    assert main(["export", str(trained_dir), "--format", "hf", "--out", str(tmp_path / "taken")]) == 2
    assert "already exists" in capsys.readouterr().err
    model_dir = _random_model_dir(tmp_path, trained_dir, norm="pre")
    assert main(["export", str(model_dir), "--format", "hf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transduce export: error: cannot export to Hugging Face Marian: model.norm=pre")
    assert len(err.splitlines()) == 1
