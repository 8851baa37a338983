"""FSDP2 training (``train.fsdp``) on CPU with two gloo processes: the same steps as DDP, and
checkpoints that resume under DDP and in one process and load as any model."""

import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from transduce.model import load_model

RTOL = 1e-5  # fp32: the same arithmetic but for where the ranks' gradients are summed


def _config(path) -> None:
    """A tiny toy-task run of 20 steps: two micro-batches per rank (no_sync's FSDP twin), clipping,
    a weights' average, dropout (the ranks' RNG streams), a validation and a checkpoint at step 10."""
    cfg = {
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 2, "d_ff": 64},
        "data": {"corpus": "toy", "toy_train_size": 600, "toy_valid_size": 20, "toy_test_size": 20,
                 "vocab_size": 150, "max_tokens": 256},
        "train": {"max_steps": 20, "save_every": 10, "eval_every": 10, "log_every": 1, "eval_bleu": False,
                  "num_threads": 1, "grad_accum": 2, "clip_norm": 1.0, "ema_decay": 0.9, "warmup_steps": 10},
    }
    path.write_text(yaml.safe_dump(cfg))


def _train(args: list[str], ranks: int) -> None:
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *launch, "-m", "transduce", "train", *args], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _records(run) -> dict[tuple[int, str], float]:
    """Every logged figure of a run: (step, key) -> value (rank 0's loss, the global gradient norm,
    the learning rate, the validation loss)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out |= {(record["step"], k): record[k] for k in ("loss", "grad_norm", "lr", "val_loss") if k in record}
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=RTOL), key


def _from_step_10(run, to):
    """A copy of ``run`` as it was when its step-10 checkpoint was written."""
    shutil.copytree(run, to)
    shutil.rmtree(to / "checkpoints" / "step_00000020")
    shutil.rmtree(to / "model")
    (to / "checkpoints" / "latest").write_text("step_00000010\n")
    lines = (to / "metrics.jsonl").read_text().splitlines(keepends=True)
    (to / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x)["step"] <= 10))
    return to


def _train_state(run, step: int, *keys: str) -> dict:
    state = json.loads((run / "checkpoints" / f"step_{step:08d}" / "state.json").read_text())["train_state"]
    return {k: state[k] for k in keys}


def _assert_restores_whole(run, went_on) -> None:
    """Resumed in this process with nothing left to train, ``run`` (a copy of ``went_on`` at step
    10, two ranks' and sharded) holds the checkpoint's weights, Adam state and counters bit for
    bit, and its final validation of the restored average is the one ``went_on`` logged at step 10."""
    from safetensors.torch import load_file
    from transduce.config import load_run_config
    from transduce.model.io import saved_model_settings, unique_state_dict
    from transduce.training.loop import run_training

    ckpt = run / "checkpoints" / "step_00000010"
    trainer, metrics = run_training(load_run_config(run / "config.yaml", ["train.max_steps=10"], saved_model_settings),
                                    run, resume=True)
    assert trainer.dist.world_size == 1 and metrics["val_loss"] == pytest.approx(_records(went_on)[10, "val_loss"],
                                                                                 rel=RTOL)
    keys = ("step", "epoch", "offset", "tokens")
    assert {k: getattr(trainer.state, k) for k in keys} == _train_state(went_on, 10, *keys)
    weights, average = load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "ema.safetensors"))
    restored = unique_state_dict(trainer.model)
    assert restored.keys() == weights.keys() and all(torch.equal(restored[k], weights[k]) for k in weights)
    final = load_file(str(run / "model" / "model.safetensors"))  # written from the restored average
    assert all(torch.equal(final[k], average[k]) for k in average)
    saved = torch.load(ckpt / "trainer.pt", weights_only=True)["optimizer"]["state"]
    state = trainer.optimizer.state_dict()["state"]
    assert state.keys() == saved.keys()
    for i, s in saved.items():
        assert all(torch.equal(torch.as_tensor(state[i][k]), torch.as_tensor(v)) for k, v in s.items()), i


def _assert_goes_on_alone(went_on, to) -> None:
    """``went_on``'s step-10 checkpoint resumed in one process (grad_accum 4: both ranks'
    micro-batches) to step 20. Its dropout masks are rank 0's stream, so its losses are not
    ``went_on``'s; its schedule, data position and Adam's step counts are."""
    alone = _from_step_10(went_on, to)
    _train(["--out", str(alone), "--resume", "--set", "train.grad_accum=4"], 1)
    records, want = _records(alone), _records(went_on)
    assert records.keys() == want.keys()
    assert {k: v for k, v in records.items() if k[0] <= 10 or k[1] == "lr"} == {
        k: v for k, v in want.items() if k[0] <= 10 or k[1] == "lr"}
    keys = ("step", "epoch", "offset", "tokens")
    assert _train_state(alone, 20, *keys) == _train_state(went_on, 20, *keys)
    saved = torch.load(alone / "checkpoints" / "step_00000020" / "trainer.pt", weights_only=True)["optimizer"]
    assert {float(s["step"]) for s in saved["state"].values()} == {20.0}  # Adam's counts went on from 10


@pytest.mark.slow
def test_fsdp_steps_as_ddp_and_its_checkpoint_resumes_under_ddp_and_in_one_process(tmp_path, one_thread):
    _config(tmp_path / "c.yaml")
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    _train([str(tmp_path / "c.yaml"), "--out", str(ddp)], 2)
    _train([str(tmp_path / "c.yaml"), "--out", str(fsdp), "--set", "train.fsdp=true"], 2)
    _assert_same(_records(fsdp), _records(ddp))
    step = fsdp / "checkpoints" / "step_00000010"
    assert sorted(p.name for p in step.iterdir()) == \
        sorted(p.name for p in (ddp / "checkpoints" / "step_00000010").iterdir())
    # unsharded: the optimizer state is torch.optim's own, every tensor whole
    saved = torch.load(step / "trainer.pt", weights_only=True)["optimizer"]
    model = load_model(fsdp / "model")
    params = list(model.parameters())
    assert [s["exp_avg"].shape for s in saved["state"].values()] == [p.shape for p in params]

    # the FSDP checkpoint of step 10 continues under DDP as the FSDP run went on (each rank's RNG)
    resumed = _from_step_10(fsdp, tmp_path / "ddp_resumed")
    _train(["--out", str(resumed), "--resume", "--set", "train.fsdp=false"], 2)
    _assert_same(_records(resumed), _records(fsdp))

    # ... and in one process: it restores the step-10 checkpoint whole (here, in this process), and
    # goes on taking both ranks' micro-batches
    _assert_restores_whole(_from_step_10(fsdp, tmp_path / "restored"), fsdp)
    _assert_goes_on_alone(fsdp, tmp_path / "alone")

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "transduce", "translate", str(fsdp / "model")], input="a b c\n",
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of this process alone: FSDP's DTensor paths, without other processes."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tiny():
    from transduce.config import ModelConfig
    from transduce.model.io import build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=2,
                                   n_decoder_layers=2, d_ff=32, dropout=0.0))


def _steps(model, optimizer, batches, n):
    from transduce.training.step import forward_backward

    for i in range(n):
        forward_backward(model, batches[i % 2:i % 2 + 2], 0.1, 0, 50.0, "fp32", torch.device("cpu"))
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_sharded_state_gathers_whole_and_shards_back_exactly(one_rank_group):
    """Train a sharded and a plain copy alike; the sharded one's gathered weights and optimizer
    state are the plain one's, and loaded into a fresh sharded model they continue identically."""
    from transduce.config import TrainConfig
    from transduce.data.batch import collate
    from transduce.model.io import unique_state_dict
    from transduce.training.sharding import (full_model, full_optimizer_state, load_full_state, shard_model,
                                             shard_optimizer_state)
    from transduce.training.step import build_optimizer, load_optimizer_state

    g = torch.Generator().manual_seed(1)
    batches = [collate([(torch.randint(4, 40, (5 + k,), generator=g).tolist(),
                         torch.randint(4, 40, (4 + k,), generator=g).tolist()) for k in range(3)]) for _ in range(3)]
    cfg = TrainConfig(lr=1e-3, schedule="constant")
    plain, sharded = _tiny(), _tiny()
    shard_model(sharded, "fp32")
    opt_plain, opt_sharded = build_optimizer(plain, cfg, 1e-3), build_optimizer(sharded, cfg, 1e-3)
    _steps(plain, opt_plain, batches, 3)
    _steps(sharded, opt_sharded, batches, 3)
    whole = unique_state_dict(full_model(sharded))
    assert whole.keys() == unique_state_dict(plain).keys()
    for name, t in unique_state_dict(plain).items():
        torch.testing.assert_close(whole[name], t, rtol=RTOL, atol=1e-7, msg=name)
    saved = full_optimizer_state(opt_sharded, keep=True)
    for got, want in zip(saved["state"].values(), opt_plain.state_dict()["state"].values()):
        assert not any(isinstance(v, torch.distributed.tensor.DTensor) for v in got.values())
        torch.testing.assert_close(got["exp_avg_sq"], want["exp_avg_sq"], rtol=RTOL, atol=1e-12)

    buffer = io.BytesIO()  # through a file, as a checkpoint's trainer.pt (Adam's step counters are shared otherwise)
    torch.save(saved, buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    resumed = _tiny()
    shard_model(resumed, "fp32")
    load_full_state(resumed, whole, "test")
    opt_resumed = build_optimizer(resumed, cfg, 1e-3)
    load_optimizer_state(opt_resumed, saved)
    shard_optimizer_state(opt_resumed)
    _steps(sharded, opt_sharded, batches, 2)
    _steps(resumed, opt_resumed, batches, 2)
    for (name, a), b in zip(sharded.named_parameters(), resumed.parameters()):
        assert torch.equal(a.full_tensor(), b.full_tensor()), name


def test_loading_a_mismatched_weights_file_into_a_sharded_model_is_one_line(one_rank_group):
    from transduce.errors import CheckpointError
    from transduce.model.io import unique_state_dict
    from transduce.training.sharding import load_full_state, shard_model

    state = unique_state_dict(_tiny())
    model = _tiny()
    shard_model(model, "fp32")
    state["encoder_layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match=r"ckpt: encoder_layers.0.self_attn.q_proj.weight has shape \(3, 3\)"):
        load_full_state(model, state, "ckpt")
    del state["encoder_layers.0.self_attn.q_proj.weight"]
    with pytest.raises(CheckpointError, match="missing 1 tensor"):
        load_full_state(model, state, "ckpt")
