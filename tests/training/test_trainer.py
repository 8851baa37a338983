"""The Trainer's guards: non-finite steps, bf16 autocast, early stopping, keep-last-K."""

import math

import pytest
import torch

import transduce.training.loop as loop
from transduce.config import RunConfig
from transduce.training.checkpoint import list_checkpoints
from transduce.training.distributed import DistInfo
from transduce.data.prepare import prepared_for_run
from extra_helpers import need_extra


def _trainer(tmp_path, data=None, **train):
    cfg = RunConfig.from_dict({
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
        "data": {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 20,
                 "vocab_size": 120, "max_tokens": 256, **(data or {})},
        "train": {"eval_bleu": False, "warmup_steps": 5, "log_every": 1, **train},
    })
    data = prepared_for_run(cfg.data, tmp_path, seed=0, workers=1)
    return loop.Trainer(cfg, tmp_path, data, DistInfo(), torch.device("cpu"))


def test_non_finite_steps_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, max_bad_steps=2)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    real = loop.forward_backward

    def poisoned(*args, **kwargs):
        return real(*args, **kwargs) * math.nan

    monkeypatch.setattr(loop, "forward_backward", poisoned)
    assert trainer.train_step() is None and trainer.train_step() is None
    assert trainer.state.skipped_steps == 2
    for k, v in trainer.model.state_dict().items():  # no NaN written, no update applied
        assert torch.equal(v, before[k]), k
    with pytest.raises(loop.TrainingError, match="non-finite"):
        trainer.train_step()
    monkeypatch.setattr(loop, "forward_backward", real)


def test_bf16_autocast_step_on_cpu(tmp_path):
    trainer = _trainer(tmp_path, precision="bf16")
    metrics = trainer.train_step()
    assert metrics is not None and math.isfinite(metrics["loss"])
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights stay fp32


def test_early_stopping_and_keep_last(tmp_path):
    trainer = _trainer(tmp_path, max_steps=100, eval_every=1, save_every=1, keep_last=2, patience=1,
                       schedule="constant", lr=1e-30, warmup_steps=0)
    reason = trainer.train()  # a learning rate of 1e-30 cannot improve the validation loss for long
    assert reason == "early stopping" and trainer.state.step < 100
    assert len(list_checkpoints(tmp_path / "checkpoints")) == 2
    assert (tmp_path / "best" / "model.safetensors").is_file()


def test_reverse_swaps_every_split_and_the_cli_records_it(tmp_path, monkeypatch):
    from dataclasses import replace

    from transduce.config import DataConfig
    from transduce.data.prepare import split_texts
    data = DataConfig(toy_train_size=30, toy_valid_size=5, toy_test_size=5)
    for split in ("train", "valid", "test"):
        assert split_texts(replace(data, reverse=True), split) == [(t, s) for s, t in split_texts(data, split)]
    seen = {}
    monkeypatch.setattr(loop, "run_training", lambda cfg, run_dir, resume: seen.update(cfg=cfg, run_dir=run_dir))
    monkeypatch.chdir(tmp_path)
    from transduce.cli import train_main
    assert train_main(None, ["train.max_steps=1"], None, False, reverse=True) == 0
    assert seen["cfg"].data.reverse and seen["run_dir"].name == "run_reverse"


def test_validation_leaves_no_inference_copies_on_the_training_model(tmp_path):
    """Validation decodes through a Translator (oneDNN layers, packed and fused weights); the
    training model must come back plain, not holding a second copy of its weights."""
    trainer = _trainer(tmp_path, eval_bleu=True)
    trainer.train_step()
    metrics = trainer.validate()
    assert "val_bleu" in metrics and "val_loss" in metrics
    from transduce.inference.speed.cpu import OneDNNLinear
    assert not any(isinstance(m, OneDNNLinear) for m in trainer.model.modules())
    assert not any("_packed" in m.__dict__ or "_fused_layers" in m.__dict__ for m in trainer.model.modules())
    assert trainer.train_step() is not None


def test_bpe_dropout_resegments_each_epoch_and_resumes_exactly(tmp_path):
    dropout = {"bpe_dropout": 0.2, "bpe_dropout_sides": "both", "max_tokens": 1024}  # ~12 steps an epoch
    plain = _trainer(tmp_path / "plain")
    trainer = _trainer(tmp_path / "a", dropout, max_steps=40, save_every=10, keep_last=10,
                       schedule="constant", lr=1e-3, warmup_steps=0)
    e0, e1 = trainer.feed.epoch_data(0), trainer.feed.epoch_data(1)
    ids = [e.pairs.tokens[0].tolist() + e.pairs.tokens[1].tolist() for e in (e0, e1)]
    assert ids[0] != ids[1] and e0.plan.batches != e1.plan.batches
    again = trainer.feed.epoch_data(0)  # a function of (seed, epoch)
    assert again.pairs.tokens[0].tolist() + again.pairs.tokens[1].tolist() == ids[0]
    assert e0.pairs.tgt_lens.sum() > plain.feed.epoch_data(0).pairs.tgt_lens.sum()
    assert plain.feed.epoch_data(0).pairs is plain.feed.train_pairs  # off: the usual segmentation every epoch
    trainer.train()
    assert trainer.state.epoch >= 2, "the run should cross epoch boundaries"

    mid = list_checkpoints(tmp_path / "a" / "checkpoints")[1]  # step 20
    again = _trainer(tmp_path / "b", dropout, max_steps=40, save_every=10, keep_last=10,
                     schedule="constant", lr=1e-3, warmup_steps=0)
    again.restore(mid)
    again.train()
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, again.model.state_dict()[k]), f"{k} differs after resume"


def test_bpe_dropout_config_errors():
    from transduce.errors import ConfigError
    with pytest.raises(ConfigError, match="data.bpe_dropout"):
        RunConfig.from_dict({"data": {"bpe_dropout": 1.0}})
    with pytest.raises(ConfigError, match="tokenizer_algorithm=bpe"):
        RunConfig.from_dict({"data": {"bpe_dropout": 0.1, "tokenizer_algorithm": "unigram"}})
    with pytest.raises(ConfigError, match="bpe_dropout_sides"):
        RunConfig.from_dict({"data": {"bpe_dropout": 0.1, "bpe_dropout_sides": "target"}})


def test_resume_refuses_a_checkpoint_of_another_tokenizer(tmp_path):
    from transduce.errors import CheckpointError
    trainer = _trainer(tmp_path / "a")
    trainer.train_step()
    ckpt = trainer.save()
    other = _trainer(tmp_path / "b", {"vocab_size": 110})
    with pytest.raises(CheckpointError, match="its tokenizer is not the one"):
        other.restore(ckpt)
    again = _trainer(tmp_path / "c")  # the same data settings: the same tokenizer, so it resumes
    again.restore(ckpt)
    assert again.state.step == 1


def test_model_directories_keep_the_runs_decoding_settings(tmp_path):
    """A recipe's ``decode`` section (multi30k: beam 5, lenpen 1.0) goes into every model
    directory the run writes (checkpoints, best, model, averaged or not), and translating with
    that directory uses it unless a flag says otherwise."""
    import yaml

    from transduce.cli import build_parser, decode_overrides
    from transduce.config import DecodeConfig
    from transduce.inference import Translator

    cfg = RunConfig.from_dict({
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
        "data": {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 20,
                 "vocab_size": 120, "max_tokens": 256},
        "train": {"max_steps": 2, "eval_bleu": False, "warmup_steps": 5, "save_every": 1, "keep_last": 2,
                  "average_last": 2, "eval_every": 1},
        "decode": {"beam": 5, "lenpen": 1.0},
    })
    loop.run_training(cfg, tmp_path)
    want = DecodeConfig(beam=5, lenpen=1.0)
    for d in [tmp_path / "model", tmp_path / "best", *list_checkpoints(tmp_path / "checkpoints")]:
        assert yaml.safe_load((d / "config.yaml").read_text())["decode"] == cfg.to_dict()["decode"], d
    translator = Translator.load(tmp_path / "model")
    assert translator.decode == want
    parser = build_parser()  # the flags given replace the saved settings, one by one
    assert translator.settings(**decode_overrides(parser.parse_args(["translate", str(tmp_path / "model")]))) == want
    flagged = decode_overrides(parser.parse_args(["translate", str(tmp_path / "model"), "--beam", "2"]))
    assert flagged == {"beam": 2} and translator.settings(**flagged) == DecodeConfig(beam=2, lenpen=1.0)


@pytest.mark.parametrize("train", [{}, {"pad_multiple": 8}, {"cuda_graphs": True, "pad_multiple": 8}])
def test_checkpoint_with_the_next_step_prefetched_resumes_exactly(tmp_path, train):
    """The next step's batches are made while the current one runs; a checkpoint taken then must
    not count them as consumed (and one run here crosses an epoch boundary after the save)."""
    recipe = {"max_steps": 14, "schedule": "constant", "lr": 1e-3, "warmup_steps": 0, **train}
    data = {"max_tokens": 1024}  # a few steps an epoch
    straight = _trainer(tmp_path / "a", data, **recipe)
    straight.train()
    first = _trainer(tmp_path / "b", data, **recipe)
    for _ in range(5):
        first.train_step()
    assert first._ahead is not None and first._ahead.start == (first.state.epoch, first.state.offset)
    ckpt = first.save()
    again = _trainer(tmp_path / "c", data, **recipe)
    again.restore(ckpt)
    again.train()
    assert again.state.epoch == straight.state.epoch >= 1, "the run should cross an epoch boundary"
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, again.model.state_dict()[k]), f"{k} differs after resume"


def test_cuda_graphs_mode_trains_on_square_buckets(tmp_path):
    trainer = _trainer(tmp_path, cuda_graphs=True, pad_multiple=8)
    assert trainer.graphed is not None and not trainer.graphed.graphs  # a CPU runs the step eagerly
    shapes = set()
    for _ in range(6):
        (batch,) = trainer.step_data().batches
        width = batch.src.size(1)
        assert batch.tgt_in.size(1) == width and width % 8 == 0 and len(batch) == 256 // width
        shapes.add(width)
    assert trainer.train_step()["loss"] > 0 and len(shapes) >= 2


def test_tensorboard_events_hold_the_metrics_records(tmp_path):
    """train.tensorboard: every metrics.jsonl figure is also a TensorBoard scalar at its step."""
    import json

    accumulator = need_extra("tensorboard", "tensorboard.backend.event_processing.event_accumulator")
    trainer = _trainer(tmp_path, max_steps=4, eval_every=2, save_every=4, tensorboard=True)
    trainer.finish(trainer.train())
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    events = accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for r in train:
        for key in ("loss", "ppl", "lr", "tokens_per_s", "grad_norm"):
            assert scalars[f"train/{key}"][r["step"]] == pytest.approx(r[key], rel=1e-6)
    valid = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in valid] == [2, 4]
    assert all(scalars["valid/loss"][r["step"]] == pytest.approx(r["val_loss"], rel=1e-6) for r in valid)
    assert "train/epoch" not in scalars and "train/elapsed" not in scalars


def test_tensorboard_without_its_package_is_one_line(tmp_path, monkeypatch):
    import sys

    from transduce.errors import TransduceError

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(TransduceError, match=r"pip install 'transduce\[tensorboard\]'"):
        _trainer(tmp_path, tensorboard=True)


@pytest.mark.parametrize("attention, model", [
    ({"kind": "local", "cross": "local", "window": 3, "global_tokens": 1}, {}),
    ({"kind": "linformer", "linformer_k": 8}, {"max_positions": 64}),
])
def test_long_attention_options_train_validate_save_and_translate(tmp_path, attention, model):
    """model.attention local / linformer through a whole run: steps, BLEU validation (beam
    search on the prepared model), the saved model directory, and the Translator."""
    from transduce.inference import Translator

    cfg = RunConfig.from_dict({
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
                  "attention": attention, **model},
        "data": {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 20,
                 "vocab_size": 120, "max_tokens": 256},
        "train": {"max_steps": 3, "warmup_steps": 5, "eval_every": 3, "save_every": 3},
        "decode": {"beam": 2},
    })
    _, summary = loop.run_training(cfg, tmp_path)
    assert math.isfinite(summary["val_loss"]) and "val_bleu" in summary
    translator = Translator.load(tmp_path / "model")
    assert {k: getattr(translator.model.config.attention, k) for k in attention} == attention
    assert {k: getattr(translator.model.config, k) for k in model} == model
    assert len(translator.translate(["the dog sees the ball"])) == 1


def test_repeated_non_finite_steps_name_the_steps(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, max_bad_steps=1)
    assert trainer.train_step() is not None  # step 1 fine
    real = loop.forward_backward
    monkeypatch.setattr(loop, "forward_backward", lambda *a, **k: real(*a, **k) * math.nan)
    assert trainer.train_step() is None
    with pytest.raises(loop.TrainingError, match=r"steps 2-3 \(2 in a row\) had non-finite loss"):
        trainer.train_step()


def test_a_non_finite_validation_is_never_kept_as_best(tmp_path, monkeypatch):
    """bf16 gone wrong: a NaN validation loss must not be saved as best/, neither as the first
    evaluation nor after a finite one."""
    trainer = _trainer(tmp_path, precision="bf16", max_steps=3, eval_every=1)
    monkeypatch.setattr(trainer, "validate", lambda: {"val_loss": math.nan, "val_ppl": math.nan})
    trainer._evaluate_and_keep_best()
    assert not (tmp_path / "best").exists() and trainer.state.best is None
    monkeypatch.setattr(trainer, "validate", lambda: {"val_loss": 3.0, "val_ppl": 20.0})
    trainer._evaluate_and_keep_best()
    saved = (tmp_path / "best" / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(trainer, "validate", lambda: {"val_loss": math.nan, "val_ppl": math.nan})
    trainer._evaluate_and_keep_best()
    assert trainer.state.best == -3.0 and (tmp_path / "best" / "model.safetensors").stat().st_mtime_ns == saved


def test_a_collective_failing_while_logging_is_a_one_line_error(tmp_path, monkeypatch):
    """The logged loss's all-reduce (not only DDP's) is a collective a stopped rank makes time out:
    it ends the run with the same one-line error naming the rank and the step."""
    trainer = _trainer(tmp_path, max_steps=5)
    trainer.dist = DistInfo(rank=0, world_size=2)  # only the logging sees it: the feed keeps its own

    def timed_out(*args, **kwargs):
        raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation")

    monkeypatch.setattr(loop, "all_reduce_sum", timed_out)
    with pytest.raises(loop.TrainingError, match=r"^rank 0 of 2: a collective operation at step 1 failed"):
        trainer.train()


def test_the_cpu_trainer_trains_with_the_cpu_dropout(tmp_path):
    from transduce.training.dropout import CpuDropout
    trainer = _trainer(tmp_path)
    kinds = {type(m) for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout)}
    assert kinds == {CpuDropout}
