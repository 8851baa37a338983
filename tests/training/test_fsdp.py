"""FSDP2 training (``train.fsdp``) on CPU with two gloo processes: the same steps as DDP, and
checkpoints that resume under DDP and in one process and load as any model."""

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
    the validation loss)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out |= {(record["step"], k): record[k] for k in ("loss", "grad_norm", "val_loss") if k in record}
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


@pytest.mark.slow
def test_fsdp_steps_as_ddp_and_its_checkpoint_resumes_under_ddp_and_in_one_process(tmp_path):
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

    # ... and in one process, taking both ranks' micro-batches (its dropout masks are rank 0's stream)
    alone = _from_step_10(fsdp, tmp_path / "alone")
    _train(["--out", str(alone), "--resume", "--set", "train.grad_accum=4"], 1)
    assert (alone / "checkpoints" / "step_00000020").is_dir()

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "transduce", "translate", str(fsdp / "model")], input="a b c\n",
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
