"""Training a decoder-only language model (train.task lm): data sides, loss, resume, averaging."""


import pytest
import torch
import torch.nn.functional as F

from transduce.config import RunConfig
from transduce.data.batch import collate
from transduce.errors import ConfigError
from transduce.model import DecoderOnlyLM, load_model
from transduce.training.loop import run_training
from transduce.training.step import forward_backward

from resume_helpers import assert_resume_exact_and_average, assert_trains_with_perplexity

MODEL = {"arch": "decoder_only", "d_model": 32, "n_heads": 2, "n_encoder_layers": 0, "n_decoder_layers": 2,
         "d_ff": 64, "max_positions": 64, "norm": "pre", "positions": "learned", "activation": "gelu_tanh",
         "scale_embeddings": False}
TRAIN = {"max_steps": 12, "save_every": 6, "eval_every": 6, "log_every": 3, "warmup_steps": 5,
         "num_threads": 1, "keep_last": 3, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3}


def _cfg(data=None, **train):
    data = data or {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 30, "toy_test_size": 10,
                    "vocab_size": 120, "max_tokens": 400, "max_len": 60}
    return RunConfig.from_dict({"model": MODEL, "data": data, "train": {**TRAIN, **train}})


def test_task_is_inferred_from_arch_and_checked():
    assert _cfg().task == "lm"
    assert RunConfig().task == "translation"
    with pytest.raises(ConfigError, match="train.task"):
        _cfg(task="translation")
    with pytest.raises(ConfigError, match="data.train_src"):
        RunConfig.from_dict({"data": {"corpus": "files", "train_tgt": "x.txt"}})
    with pytest.raises(ConfigError, match="data.max_len"):
        _cfg({"corpus": "toy", "max_len": 64})


def test_lm_loss_is_next_token_cross_entropy():
    torch.manual_seed(0)
    cfg = _cfg()
    model = DecoderOnlyLM(cfg.model.__class__(**{**cfg.model.__dict__, "src_vocab_size": 30,
                                                 "tgt_vocab_size": 30})).eval()  # no dropout
    batch = collate([([5, 6], [7, 8, 9]), ([5], [10, 11])])
    sums = forward_backward(model, [batch], 0.0, 0, 1.0, "fp32", torch.device("cpu"))
    want = F.cross_entropy(model(batch.tgt_in).flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0,
                           reduction="sum")
    torch.testing.assert_close(sums[1], want.detach())


def test_lm_trains_on_the_toy_target_side(tmp_path):
    trainer, metrics = run_training(_cfg(), tmp_path / "run")
    assert_trains_with_perplexity(metrics, tmp_path / "run")
    model = load_model(tmp_path / "run" / "model")
    assert isinstance(model, DecoderOnlyLM)
    assert isinstance(load_model(tmp_path / "run" / "best"), DecoderOnlyLM)


def test_lm_trains_on_monolingual_text(tmp_path):
    lines = [f"der hund {w} den ball" for w in ("sieht", "hat", "will", "mag")] * 40
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines[:20]) + "\n")
    data = {"corpus": "files", "train_tgt": str(tmp_path / "train.txt"), "valid_tgt": str(tmp_path / "valid.txt"),
            "vocab_size": 40, "max_tokens": 200, "max_len": 60}
    _, metrics = run_training(_cfg(data, max_steps=30, eval_every=30, save_every=30), tmp_path / "run")
    assert metrics["val_ppl"] < 10  # four choices, the rest determined: far below the vocabulary


def test_lm_resume_is_exact_and_checkpoints_average(tmp_path):
    assert_resume_exact_and_average(_cfg, tmp_path, DecoderOnlyLM, "decoder_layers.0.ffn.fc1.weight")
