"""Data-parallel training on CPU with two gloo processes."""

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from extra_helpers import free_ports

WORKER = r"""
import os, sys, torch
import numpy as np
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transduce.config import ModelConfig
from transduce.data.batch import collate
from transduce.model import Transformer
from transduce.inference.search import AttentionChoice
from transduce.training.loop import forward_backward

GUIDED = sys.argv[2] == "guided"  # batches with alignment references, and the guided loss on head 1

def make():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, n_heads=4,
                                    n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0))
    g = torch.Generator().manual_seed(1)
    batches = []
    for n in (3, 5, 2, 4):  # four micro-batches of different sizes and lengths
        pairs = [(torch.randint(4, 50, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist(),
                  torch.randint(4, 50, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist())
                 for _ in range(n)]
        links = [np.array([[0, 0], [1, 1], [1, 2]]) for _ in pairs] if GUIDED else None
        starts = (np.arange(50) % 2 == 0, np.arange(50) % 3 == 0)  # word starts: every other id, every third
        batches.append(collate(pairs, links=links, word_starts=starts))
    return model, batches

out = sys.argv[1]
model, batches = make()
total = sum(b.n_tgt_tokens for b in batches)
cpu = torch.device("cpu")
if os.environ.get("WORLD_SIZE", "1") == "1":
    forward_backward(model, batches, 0.1, 0, total, "fp32", cpu, guided=(0.5, AttentionChoice(-1, 1)))
else:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(model)
    forward_backward(ddp, batches[rank::world], 0.1, 0, total / world, "fp32", cpu,  # 2 micro-batches each
                     guided=(0.5, AttentionChoice(-1, 1)))
if os.environ.get("RANK", "0") == "0":
    torch.save({n: p.grad for n, p in model.named_parameters()}, out)
if dist.is_initialized():
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("guided", ["plain", "guided"])
def test_two_process_gradients_equal_single_process(tmp_path, guided):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    single = subprocess.run([sys.executable, str(script), str(tmp_path / "single.pt"), guided], capture_output=True,
                            text=True)
    assert single.returncode == 0, single.stderr
    port = free_ports(1)[0]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path / "ddp.pt"), guided], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out
    a = torch.load(tmp_path / "single.pt", weights_only=True)
    b = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=1e-5, msg=k)


@pytest.mark.slow
def test_torchrun_train_then_resume_on_one_process(tmp_path):
    cfg_path = tmp_path / "c.yaml"
    _toy_run(cfg_path, max_steps=6, save_every=3, eval_every=100)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "transduce", "train", str(cfg_path), "--out", str(run)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    state = yaml.safe_load((run / "checkpoints" / "step_00000006" / "state.json").read_text())
    assert state["world_size"] == 2
    assert state["train_state"]["offset"] == 12 or state["train_state"]["epoch"] > 0  # 2 batches a step
    # continue the same run on one process
    more = subprocess.run([sys.executable, "-m", "transduce", "train", "--out", str(run), "--resume",
                           "--set", "train.max_steps=9"], capture_output=True, text=True, timeout=300)
    assert more.returncode == 0, more.stderr[-3000:]
    assert (run / "checkpoints" / "step_00000009").is_dir()
    assert (run / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_the_logged_loss_is_the_global_batchs(tmp_path):
    """Two ranks with one batch each log the loss per token of both batches (not rank 0's share):
    what one process logs that trains on the same two batches a step (grad_accum 2)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _toy_run(tmp_path / "one.yaml", max_steps=4, grad_accum=2)
    _toy_run(tmp_path / "two.yaml", max_steps=4)
    for name, launch in (("one", []), ("two", ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"])):
        cmd = [sys.executable, *(launch or []), "-m", "transduce", "train", str(tmp_path / f"{name}.yaml"), "--out",
               str(tmp_path / name), "--set", "model.dropout=0.0"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    logged = {name: [r for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())
                     if "loss" in r] for name in ("one", "two")}
    assert [r["step"] for r in logged["two"]] == [r["step"] for r in logged["one"]] == [1, 2, 3, 4]
    for one, two in zip(logged["one"], logged["two"]):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert two["ppl"] == pytest.approx(one["ppl"], rel=1e-5)


def _toy_run(path, **train) -> None:
    """Write a tiny toy-task training config to ``path`` (``train`` keys override the defaults)."""
    cfg = {
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
        "data": {"corpus": "toy", "toy_train_size": 600, "toy_valid_size": 20, "toy_test_size": 20,
                 "vocab_size": 150, "max_tokens": 256},
        "train": {"eval_every": 100000, "log_every": 1, "eval_bleu": False, "num_threads": 1, **train},
    }
    path.write_text(yaml.safe_dump(cfg))


def _rank1_once_saved(proc: subprocess.Popen, run_dir, wait_s: float = 240) -> int:
    """The pid of rank 1 of torchrun ``proc``, once ``run_dir`` holds the step-2 checkpoint."""
    deadline = time.monotonic() + wait_s
    while not (run_dir / "checkpoints" / "step_00000002").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rank1 = _rank_pid(proc.pid, 1)
    assert rank1 is not None
    return rank1


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the torchrun worker with RANK=rank among ``parent``'s descendants."""
    import glob

    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            env = open(path, "rb").read().split(b"\0")
            status = open(path.replace("environ", "status")).read()
        except OSError:
            continue
        ppid = int(status.split("PPid:")[1].split()[0])
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID=" in b"".join(env) and \
                (ppid == parent or os.path.exists(f"/proc/{ppid}") and f"PPid:\t{parent}" in
                 open(f"/proc/{ppid}/status").read()):
            return int(path.split("/")[2])
    return None


@pytest.mark.slow
def test_a_stopped_rank_is_an_error_in_the_others_not_a_freeze(tmp_path):
    """SIGSTOP rank 1 mid-training: rank 0's next all-reduce gives up after train.dist_timeout_s
    and it exits with one line naming itself and the step."""
    import signal

    _toy_run(tmp_path / "c.yaml", max_steps=100000, save_every=2, dist_timeout_s=5)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "-m", "transduce", "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    rank1 = None
    try:
        rank1 = _rank1_once_saved(proc, tmp_path / "run")
        os.kill(rank1, signal.SIGSTOP)
        stopped_at = time.monotonic()
        while time.monotonic() - stopped_at < 120 and "collective operation" not in (tmp_path / "log.txt").read_text():
            time.sleep(0.2)
        waited = time.monotonic() - stopped_at
    finally:
        if rank1 is not None:  # torchrun may have stopped it already, once rank 0 gave up
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank1, signal.SIGKILL)
        proc.wait(timeout=120)
        log.close()
    text = (tmp_path / "log.txt").read_text()
    lines = [line for line in text.splitlines() if "collective operation at step" in line]
    assert lines and lines[0].startswith("transduce train: error: rank 0 of 2:"), text[-3000:]
    assert waited < 60 and proc.returncode != 0



@pytest.mark.slow
def test_a_killed_rank_is_restarted_by_torchrun_and_resumes_bitwise(tmp_path):
    """torchrun --max-restarts 1: SIGKILL rank 1 mid-run; the agent restarts both ranks, which
    resume from the last checkpoint (a first attempt with --resume and no checkpoint starts
    afresh) and end with the weights of an uninterrupted run, bit for bit (each rank restores
    its own RNG state: their dropout streams differ)."""
    import signal

    from safetensors.torch import load_file

    _toy_run(tmp_path / "c.yaml", max_steps=12, save_every=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def torchrun(out: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *extra,
                "-m", "transduce", "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / out)]

    whole = subprocess.run(torchrun("whole"), capture_output=True, text=True, env=env, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen(torchrun("killed", "--max-restarts", "1") + ["--resume"], stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    try:
        os.kill(_rank1_once_saved(proc, tmp_path / "killed"), signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "log.txt").read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "resumed from" in text, text[-3000:]  # killed before the end, and restarted
    want = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    got = load_file(str(tmp_path / "killed" / "model" / "model.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
