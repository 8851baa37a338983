"""The moving average of the weights (train.ema_decay): equal to one computed by hand, resumed
bitwise, what validation and the final model use, and the checkpoints' averages averaged."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import transduce.training.loop as loop
from transduce.config import RunConfig
from transduce.data.prepare import prepared_for_run
from transduce.errors import ConfigError
from transduce.model.transformer import Transformer
from transduce.training.distributed import DistInfo
from transduce.training.ema import EMA_WEIGHTS, ema_decay_at
from resume_helpers import assert_resume_exact_and_average

MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64}
DATA = {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 20, "vocab_size": 120,
        "max_tokens": 256}


def _cfg(**train):
    return RunConfig.from_dict({"model": MODEL, "data": DATA, "train": {
        "eval_bleu": False, "warmup_steps": 5, "log_every": 1, "num_threads": 1, "ema_decay": 0.9, **train}})


def _trainer(tmp_path, **train):
    cfg = _cfg(**train)
    return loop.Trainer(cfg, tmp_path, prepared_for_run(cfg.data, tmp_path, seed=0, workers=1), DistInfo(),
                        torch.device("cpu"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ema_equals_the_average_computed_by_hand(tmp_path, precision):
    trainer = _trainer(tmp_path, precision=precision)
    names = [n for n, _ in trainer.model.named_parameters()]
    want = {n: p.detach().double().clone() for n, p in trainer.model.named_parameters()}
    for n_update in range(6):
        assert trainer.train_step() is not None
        d = min(0.9, (1 + n_update) / (10 + n_update))
        assert ema_decay_at(0.9, n_update) == d
        for name, p in trainer.model.named_parameters():
            want[name] = d * want[name] + (1 - d) * p.detach().double()
    got = dict(zip(names, trainer.ema.shadow))
    for name in names:
        assert got[name].dtype == torch.float32  # kept in fp32 under bf16 autocast too
        torch.testing.assert_close(got[name].double(), want[name], rtol=1e-6, atol=1e-7)
    moved = [n for n, p in trainer.model.named_parameters() if not torch.allclose(got[n], p.detach())]
    assert moved, "the average should lag the weights"


def test_validation_uses_the_average_and_keeps_the_weights(tmp_path):
    trainer = _trainer(tmp_path, max_steps=8, eval_every=8, save_every=8)
    trainer.train()
    own = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with_ema = trainer.validate()
    for k, v in trainer.model.state_dict().items():  # the block gave the weights back
        assert torch.equal(v, own[k]), k
    ema, trainer.ema = trainer.ema, None
    without = trainer.validate()
    trainer.model.load_state_dict(ema.state_dict(trainer.model), strict=False)
    assert trainer.validate() == with_ema
    assert with_ema["val_loss"] != without["val_loss"]
    trainer.ema = ema
    trainer.model.load_state_dict(own)
    trainer.finish("max_steps")
    final = load_file(str(tmp_path / "model" / "model.safetensors"))
    saved = load_file(str(tmp_path / "checkpoints" / "step_00000008" / EMA_WEIGHTS))
    for k, v in final.items():  # the final model is the average, as the checkpoint keeps it
        assert torch.equal(v, saved[k]), k


def test_ema_resumes_bitwise_and_checkpoint_averages_average(tmp_path):
    def cfg(**train):
        return _cfg(**{"max_steps": 12, "save_every": 6, "eval_every": 100, "keep_last": 2, **train})
    assert_resume_exact_and_average(cfg, tmp_path, Transformer, "encoder_layers.0.ffn.fc1.weight", EMA_WEIGHTS)


def test_average_cli_takes_the_checkpoints_averages(tmp_path):
    loop.run_training(_cfg(max_steps=4, save_every=2, eval_every=100), tmp_path / "run")
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    out = subprocess.run([sys.executable, "-m", "transduce", "average", *map(str, ckpts), "--ema",
                          "--out", str(tmp_path / "avg")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = load_file(str(tmp_path / "avg" / "model.safetensors"))
    parts = [load_file(str(c / EMA_WEIGHTS)) for c in ckpts]
    for k, v in got.items():
        torch.testing.assert_close(v, (parts[0][k].double() + parts[1][k].double()).div(2).float())


def test_ema_decay_out_of_range_is_a_one_line_error():
    with pytest.raises(ConfigError, match="train.ema_decay"):
        _cfg(ema_decay=1.0)
