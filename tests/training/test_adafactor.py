"""train.optimizer: adafactor (T5's optimizer, torch's implementation): its steps are relative to
each weight's scale, as T5's small query weights need; a run with it learns and resumes bitwise."""

import json

import pytest
import torch

from transduce.config import RunConfig, TrainConfig
from transduce.errors import ConfigError
from transduce.model.transformer import Transformer
from transduce.training.step import build_optimizer
from resume_helpers import assert_resume_exact_and_average

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Adafactor"), reason="torch < 2.5 has no Adafactor")

MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64}
DATA = {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 20, "vocab_size": 120,
        "max_tokens": 256}


def _cfg(**train):
    return RunConfig.from_dict({"model": MODEL, "data": DATA, "train": {
        "eval_bleu": False, "optimizer": "adafactor", "schedule": "constant", "lr": 1e-2, "warmup_steps": 2,
        "log_every": 1, "num_threads": 1, **train}})


def test_its_step_is_relative_to_the_weights_scale():
    """Two copies of a layer, one with weights 10x smaller (as T5's queries start): Adam moves both
    by the same amount; Adafactor moves each by the same fraction of its own scale."""
    for optimizer, relative in (("adafactor", True), ("adam", False)):
        moves = []
        for scale in (1.0, 0.1):
            layer = torch.nn.Linear(16, 16, bias=False)
            torch.manual_seed(0)
            torch.nn.init.normal_(layer.weight, std=scale)
            opt = build_optimizer(layer, TrainConfig(optimizer=optimizer, schedule="constant", lr=1e-2), 1e-2)
            assert type(opt).__name__ == {"adafactor": "Adafactor", "adam": "Adam"}[optimizer]
            before = layer.weight.detach().clone()
            layer(torch.randn(8, 16, generator=torch.Generator().manual_seed(1))).square().sum().backward()
            opt.step()
            moves.append((layer.weight - before).norm().item())
        ratio = moves[0] / moves[1]
        if relative:
            assert ratio == pytest.approx(10.0, rel=1e-2), moves
        else:
            assert ratio == pytest.approx(1.0, rel=1e-2), moves


def test_a_run_with_adafactor_learns_and_resumes_bitwise(tmp_path):
    def cfg(**train):
        return _cfg(**{"max_steps": 12, "save_every": 6, "eval_every": 100, "keep_last": 2, **train})
    assert_resume_exact_and_average(cfg, tmp_path, Transformer, "encoder_layers.0.ffn.fc1.weight")
    log = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    losses = [r["loss"] for r in map(json.loads, log) if "loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses


def test_adafactor_with_cuda_graphs_is_a_one_line_error():
    with pytest.raises(ConfigError, match="train.cuda_graphs: needs train.optimizer adam or adamw"):
        TrainConfig(optimizer="adafactor", schedule="constant", lr=1e-2, cuda_graphs=True)
