"""train.freeze (parameter prefixes left untrained) and train.head_lr (the heads' own peak
learning rate): the two knobs fine-tuners reach for first."""

import pytest
import torch

from transduce.config import ModelConfig, RunConfig, TrainConfig
from transduce.errors import ConfigError
from transduce.model import EncoderOnly, build_model, load_model
from transduce.training.loop import run_training
from transduce.training.step import HEAD_PREFIXES, build_optimizer, freeze_parameters

MODEL = {"arch": "encoder_only", "d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 0,
         "d_ff": 64, "max_positions": 64, "norm": "post", "positions": "learned", "activation": "gelu",
         "scale_embeddings": False, "embed_norm": True}
TRAIN = {"max_steps": 4, "save_every": 4, "eval_every": 4, "log_every": 2, "warmup_steps": 0, "threads": 1,
         "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3}
TOY = {"corpus": "toy", "toy_train_size": 200, "toy_valid_size": 20, "toy_test_size": 10, "vocab_size": 100,
       "max_tokens": 400, "max_len": 60}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _encoder(**train) -> tuple[EncoderOnly, TrainConfig]:
    torch.manual_seed(0)
    return EncoderOnly(ModelConfig(**{**MODEL, "src_vocab_size": 50, "tgt_vocab_size": 50, "dropout": 0.0})), \
        TrainConfig(**{**TRAIN, **train})


def test_frozen_prefixes_keep_their_weights_through_training(tmp_path):
    cfg = RunConfig.from_dict({"model": MODEL, "data": TOY, "train": {**TRAIN, "freeze": ["embed.", "layers.0."]}})
    run_training(cfg, tmp_path / "run")
    trained = load_model(tmp_path / "run" / "model")
    torch.manual_seed(cfg.train.seed)  # the Trainer's initialisation, again
    start = dict(build_model(trained.config).named_parameters())
    for name, p in trained.named_parameters():
        frozen = name.startswith(("embed.", "layers.0."))
        assert torch.equal(p, start[name]) == frozen, name


def test_a_prefix_that_names_nothing_is_a_one_line_error():
    model, _ = _encoder()
    with pytest.raises(ConfigError, match=r"train.freeze: 'encoder\.' names no parameter.*embed\., layers\."):
        freeze_parameters(model, ("encoder.",))
    with pytest.raises(ConfigError, match="train.freeze"):
        TrainConfig(freeze=[""])


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_heads_step_with_their_own_learning_rate(optimizer):
    model, cfg = _encoder(head_lr=3e-2, optimizer=optimizer, weight_decay=0.0)
    freeze_parameters(model, ("layers.1.",))
    opt = build_optimizer(model, cfg)
    grouped = [p for g in opt.param_groups for p in g["params"]]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(grouped) == len(trainable) == len({id(p) for p in grouped})  # each once, frozen ones left out
    ids = torch.randint(4, 49, (3, 9))
    model.mlm_logits(model(ids)).square().mean().backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for g in opt.param_groups:  # as the training loop does with the scheduled rate
        g["lr"] = cfg.lr * g.get("lr_ratio", 1.0)
    opt.step()
    for name, p in model.named_parameters():
        if p.grad is None or not p.grad.abs().gt(0).all():
            continue
        want = (cfg.head_lr if name.startswith(HEAD_PREFIXES) else cfg.lr)
        # Adam's first step moves a weight by lr * g / (|g| + eps): lr, but for the tiniest gradients
        torch.testing.assert_close((p - before[name]).abs(), torch.full_like(p, want), rtol=1e-2, atol=0)


def test_head_lr_needs_a_peak_lr_schedule():
    with pytest.raises(ConfigError, match="train.head_lr: needs a schedule with a peak"):
        TrainConfig(head_lr=1e-3)
    with pytest.raises(ConfigError, match="train.head_lr"):
        TrainConfig(schedule="constant", lr=1e-3, head_lr=0.0)
