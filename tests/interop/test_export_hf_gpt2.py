"""Hugging Face GPT-2 export of a decoder-only model: same logits and greedy output as transduce."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from transduce.cli import main
from transduce.config import GenerationConfig, RunConfig
from transduce.data.tokenizer import Tokenizer
from transduce.interop import ExportError, export_model
from transduce.inference import Generator
from transduce.inference.search.lm import generate_ids
from transduce.model import DecoderOnlyLM, save_model
from transduce.training.loop import run_training
from extra_helpers import need_extra

transformers = need_extra("export", "transformers")

GPT2_OPTIONS = {"arch": "decoder_only", "norm": "pre", "positions": "learned", "activation": "gelu_tanh",
                "scale_embeddings": False, "tie_output": True, "bias": True}
PROMPTS = ["ein hund", "die frau sieht", "der mann"]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """A small GPT trained briefly on the toy corpus's German side."""
    run = tmp_path_factory.mktemp("gpt") / "run"
    cfg = RunConfig.from_dict({
        "model": {**GPT2_OPTIONS, "d_model": 32, "n_heads": 4, "n_encoder_layers": 0, "n_decoder_layers": 2,
                  "d_ff": 64, "max_positions": 64, "dropout": 0.0},
        "data": {"corpus": "toy", "toy_train_size": 400, "toy_valid_size": 20, "toy_test_size": 10,
                 "vocab_size": 120, "max_tokens": 600, "max_len": 60},
        "train": {"max_steps": 40, "eval_every": 40, "save_every": 40, "schedule": "constant", "lr": 3e-3,
                  "label_smoothing": 0.0, "threads": 1, "warmup_steps": 0},
    })
    run_training(cfg, run)
    return run / "model"


@pytest.fixture(scope="module")
def hf_dir(lm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "gpt2"
    assert main(["export", str(lm_dir), "--format", "hf", "--out", str(out)]) == 0
    return out


def test_export_reports_parity(lm_dir, tmp_path):
    report = export_model(lm_dir, "hf", tmp_path / "gpt2")
    assert report.checks["max_logit_diff"] < 1e-4
    assert report.checks["greedy_differences"] == 0


@torch.no_grad()
def test_same_logits(hf_dir, lm_dir):
    gen = Generator.load(lm_dir)
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    assert isinstance(hf, transformers.GPT2LMHeadModel)
    tok = Tokenizer.load(hf_dir)  # our tokenizer travels with the export
    rows = [[1] + tok.encode(p, "tgt") for p in PROMPTS]
    width = min(len(r) for r in rows)
    ids = torch.tensor([r[:width] for r in rows])
    got = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(got, gen.model(ids), rtol=0, atol=1e-4)


@torch.no_grad()
def test_same_greedy_generation(hf_dir, lm_dir):
    gen = Generator.load(lm_dir)
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    for prompt in PROMPTS:
        ids = torch.tensor([gen.encode([prompt])[0]])
        ours = generate_ids(gen.model, ids, GenerationConfig(max_new_tokens=20, temperature=0))[0]
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
        theirs = out[0, ids.shape[1]:].tolist()
        theirs = theirs[:theirs.index(2)] if 2 in theirs else theirs
        assert theirs == ours and len(ours) > 0


def test_incompatible_options_and_formats(tmp_path, lm_dir):
    cfg = RunConfig.from_dict({"model": {**GPT2_OPTIONS, "norm": "post", "d_model": 16, "n_heads": 2,
                                         "d_ff": 32, "src_vocab_size": 20, "tgt_vocab_size": 20}}).model
    save_model(DecoderOnlyLM(cfg), tmp_path / "post")
    with pytest.raises(ExportError, match="model.norm=post"):
        export_model(tmp_path / "post", "hf", tmp_path / "out")
    save_model(DecoderOnlyLM(replace(cfg, norm="pre", head_dim=4)), tmp_path / "narrow")
    with pytest.raises(ExportError, match=r"model\.head_dim=4 \(GPT-2's heads are d_model / n_heads = 8 wide\)"):
        export_model(tmp_path / "narrow", "hf", tmp_path / "out")
    with pytest.raises(ExportError, match="decoder_only"):
        export_model(lm_dir, "triton", tmp_path / "triton")
