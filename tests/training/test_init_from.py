"""train.init_from / ``transduce train --init-from``: start from a trained model's weights and tokenizer."""

import json
import shutil

import pytest
import torch
import yaml

from transduce.cli import main
from transduce.config import DecodeConfig, ModelConfig, RunConfig
from transduce.data.tokenizer import Tokenizer
from transduce.errors import ConfigError
from transduce.evaluation.heldout import perplexity
from transduce.model import DecoderOnlyLM, load_model
from transduce.training.checkpoint import save_model_dir
from transduce.training.loop import run_training

MODEL = {"arch": "encoder_only", "d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 0,
         "d_ff": 64, "max_positions": 64, "positions": "learned", "activation": "gelu", "scale_embeddings": False,
         "embed_norm": True}
TRAIN = {"max_steps": 30, "save_every": 30, "eval_every": 30, "log_every": 1, "warmup_steps": 5,
         "threads": 1, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3}
TOY = {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 30, "toy_test_size": 10,
       "vocab_size": 120, "max_tokens": 400, "max_len": 60}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _cfg(model=None, data=None, **train):
    return RunConfig.from_dict({"model": {**MODEL, **(model or {})}, "data": {**TOY, **(data or {})},
                                "train": {**TRAIN, **train}})


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A masked LM trained for 30 steps on the toy corpus: its run directory."""
    out = tmp_path_factory.mktemp("pretrained") / "run"
    run_training(_cfg(), out)
    return out


def _with_dropout(cfg: RunConfig, p: float) -> RunConfig:
    return RunConfig.from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "dropout": p}})


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_init_from_starts_from_the_weights_and_tokenizer(pretrained, tmp_path):
    cfg = _cfg(max_steps=1, init_from=str(pretrained / "model"), seed=7)
    trainer, _ = run_training(_with_dropout(cfg, 0.2), tmp_path / "tuned")
    saved = yaml.safe_load((tmp_path / "tuned" / "config.yaml").read_text())
    assert saved["data"]["tokenizer"] is None  # the model's own tokenizer, kept in the run (not named by path)
    digest = Tokenizer.load(pretrained / "model").digest()
    assert Tokenizer.load(tmp_path / "tuned" / "prepared" / "tokenizer").digest() == digest
    trainer.init_from(pretrained / "model")
    want = load_model(pretrained / "model").state_dict()
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, want[k]), k
    run_training(_cfg(max_steps=1, seed=7), tmp_path / "fresh")
    assert _losses(tmp_path / "tuned")[0] < _losses(tmp_path / "fresh")[0] - 0.5  # it starts where training ended


def test_cli_init_from_and_resume(pretrained, tmp_path):
    init, out = tmp_path / "init", tmp_path / "tuned"
    shutil.copytree(pretrained / "model", init)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(_cfg(save_every=2).to_dict()))
    assert main(["train", str(tmp_path / "cfg.yaml"), "--init-from", str(init), "--out", str(out),
                 "--set", "train.max_steps=2"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["init_from"] == str(init)
    digest = Tokenizer.load(init).digest()
    shutil.rmtree(init)  # the run is self-contained: its starting model may be moved or deleted
    assert main(["train", "--out", str(out), "--resume", "--set", "train.max_steps=3"]) == 0  # the run's own config
    assert len(_losses(out)) == 3
    assert Tokenizer.load(out / "model").digest() == digest
    assert perplexity(out / "model", out / "prepared" / "valid.text.src")["tokens"] > 0  # the run's model works


def test_another_arch_is_refused_in_one_line(pretrained, tmp_path):
    tok = Tokenizer.load(pretrained / "model")
    lm = DecoderOnlyLM(ModelConfig(arch="decoder_only", src_vocab_size=tok.tgt_vocab_size,
                                   tgt_vocab_size=tok.tgt_vocab_size, d_model=32, n_heads=2, n_encoder_layers=0,
                                   n_decoder_layers=1, d_ff=64))
    save_model_dir(lm, tok, tmp_path / "lm", DecodeConfig())
    with pytest.raises(ConfigError, match=r"^train.init_from: .* model.arch=decoder_only .*model.arch=encoder_only$"):
        run_training(_cfg(init_from=str(tmp_path / "lm")), tmp_path / "run")


def test_other_shapes_are_refused_in_one_line(pretrained, tmp_path):
    with pytest.raises(ConfigError, match=r"^train.init_from: .* model.d_model=32; this run's is 48$"):
        run_training(_cfg(model={"d_model": 48}, init_from=str(pretrained / "model")), tmp_path / "run")


def test_another_tokenizer_is_refused_in_one_line(pretrained, tmp_path):
    run_training(_cfg(max_steps=1, data={"vocab_size": 100}), tmp_path / "other")
    cfg = _cfg(init_from=str(pretrained / "model"), data={"tokenizer": str(tmp_path / "other" / "model")})
    with pytest.raises(ConfigError, match=r"^train.init_from: .*'s tokenizer is not the one .* prepared with"):
        run_training(cfg, tmp_path / "run")
