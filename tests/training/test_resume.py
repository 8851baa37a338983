"""Exact resume after a real SIGKILL, and checkpoints that survive a kill during a save."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from transduce.training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

CONFIG = {
    "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
              "max_positions": 128},
    "data": {"corpus": "toy", "toy_train_size": 1000, "toy_valid_size": 50, "toy_test_size": 50,
             "vocab_size": 200, "max_tokens": 512},
    "train": {"max_steps": 40, "save_every": 5, "eval_every": 1000, "log_every": 5, "eval_bleu": False,
              "warmup_steps": 10, "num_threads": 1, "keep_last": 3},
}


def _train(cfg_path: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen([sys.executable, "-m", "transduce", "train", str(cfg_path), "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    _finish(_train(cfg_path, tmp_path / "a"))

    proc = _train(cfg_path, tmp_path / "b")
    target = tmp_path / "b" / "checkpoints" / "step_00000010"
    deadline = time.monotonic() + 240
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = latest_checkpoint(tmp_path / "b" / "checkpoints")
    assert killed_at is not None and killed_at.name < "step_00000040", "the run ended before it was killed"
    assert not (tmp_path / "b" / "model").exists()
    _, _, info = load_checkpoint(killed_at)
    assert info["train_state"]["offset"] > 0  # mid-epoch

    out = _finish(_train(cfg_path, tmp_path / "b", "--resume"))
    assert "resumed from" in out
    a = load_file(str(tmp_path / "a" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"


def test_existing_run_needs_resume(tmp_path):
    from transduce.cli import main
    cfg = {**CONFIG, "train": {**CONFIG["train"], "max_steps": 5}}
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(cfg_path), "--out", str(tmp_path / "r")]) == 0
    assert main(["train", str(cfg_path), "--out", str(tmp_path / "r")]) == 2
    assert main(["train", "--out", str(tmp_path / "r"), "--resume"]) == 0  # nothing left to do


WRITER = r"""
import sys, torch
from pathlib import Path
from transduce.config import ModelConfig
from transduce.model import Transformer
from transduce.training.checkpoint import save_checkpoint

class Tok:
    def save(self, d):
        (Path(d) / "spm.model").write_bytes(b"x" * 1000)

model = Transformer(ModelConfig(src_vocab_size=4000, tgt_vocab_size=4000, d_model=128, n_heads=2,
                                n_encoder_layers=2, n_decoder_layers=2, d_ff=256))
opt = torch.optim.Adam(model.parameters())
step = 0
while True:
    step += 1
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(step))
    save_checkpoint(Path(sys.argv[1]), step, model, Tok(), {"optimizer": opt.state_dict(),
                    "rng_cpu": torch.get_rng_state()}, {"train_state": {"step": step}}, keep_last=2)
    print(step, flush=True)
"""


@pytest.mark.parametrize("delay", [0.3, 0.7, 1.1])
def test_checkpoint_survives_sigkill_during_save(tmp_path, delay):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ck")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"  # at least one complete checkpoint exists
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    latest = latest_checkpoint(tmp_path / "ck")
    weights, _, info = load_checkpoint(latest)
    step = info["train_state"]["step"]
    assert all((w == float(step)).all() for w in weights.values())
    for ckpt in list_checkpoints(tmp_path / "ck"):  # every visible checkpoint is complete
        load_checkpoint(ckpt)


def _run_in_process(cfg_path: Path, out: Path, *extra: str) -> None:
    from transduce.cli import main

    assert main(["train", str(cfg_path), "--out", str(out), *extra]) == 0


def test_resume_skips_a_damaged_newest_checkpoint_and_stays_exact(tmp_path, caplog):
    """A flipped bit in the newest checkpoint: --resume says so, resumes from the one before, and
    ends with the weights of an uninterrupted run."""
    cfg = {**CONFIG, "train": {**CONFIG["train"], "max_steps": 15}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    _run_in_process(tmp_path / "run.yaml", tmp_path / "a")
    (tmp_path / "short.yaml").write_text(yaml.safe_dump({**cfg, "train": {**cfg["train"], "max_steps": 10}}))
    _run_in_process(tmp_path / "short.yaml", tmp_path / "b")
    newest = latest_checkpoint(tmp_path / "b" / "checkpoints")
    assert newest.name == "step_00000010"
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x04
    weights.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        _run_in_process(tmp_path / "run.yaml", tmp_path / "b", "--resume")
    assert "step_00000010 is damaged" in caplog.text and "resuming from step_00000005" in caplog.text
    a = load_file(str(tmp_path / "a" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model" / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize("fault", ["ENOSPC", "EROFS", "EACCES"])
def test_a_storage_fault_during_a_save_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch, capsys, fault):
    """A full disk, an output remounted read-only, or permissions taken away mid-run: one line,
    exit 2, and the checkpoint before it intact and still ``latest``."""
    import errno

    import torch

    import transduce.training.checkpoint as checkpoint
    from transduce.cli import main

    cfg = {**CONFIG, "train": {**CONFIG["train"], "max_steps": 10}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    real, calls = torch.save, []

    def full_disk(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint (step 10)
            raise OSError(getattr(errno, fault), os.strerror(getattr(errno, fault)))
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    assert main(["train", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert os.strerror(getattr(errno, fault)) in err and err.count("\n") == 1 and "Traceback" not in err
    ckpts = tmp_path / "r" / "checkpoints"
    assert latest_checkpoint(ckpts).name == "step_00000005"
    assert [p.name for p in list_checkpoints(ckpts)] == ["step_00000005"]
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000005"]  # no half-written directory
    load_checkpoint(latest_checkpoint(ckpts))  # intact


@pytest.mark.parametrize("moment", [1, 12, 27])
def test_sigterm_saves_a_checkpoint_exits_0_and_resume_is_bitwise_identical(tmp_path, moment, uninterrupted):
    """A SIGTERM (preemption) once step ``moment``'s log line is out: the run
    ends at the next step boundary with a checkpoint of that step and exit code 0, writes no
    final model, and --resume ends with the uninterrupted run's weights, bit for bit."""
    cfg_path, reference = uninterrupted
    out = tmp_path / "b"
    proc = _train(cfg_path, out, "--set", "train.log_every=1")
    lines = []
    for line in proc.stdout:  # the step lines are logged once a step is done
        lines.append(line)
        if line.startswith(f"step {moment}/"):
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)  # a step and a checkpoint: bounded, never a hang
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "preempted (SIGTERM)" in text and not (out / "model").exists()
    stopped = latest_checkpoint(out / "checkpoints")
    assert stopped is not None and moment <= int(stopped.name.split("_")[1]) < 40
    resumed = _finish(_train(cfg_path, out, "--resume", "--set", "train.log_every=1"))
    assert "resumed from" in resumed
    b = load_file(str(out / "model" / "model.safetensors"))
    assert reference.keys() == b.keys()
    for k in reference:
        assert (reference[k] == b[k]).all(), f"{k} differs after a SIGTERM at step {moment} and a resume"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The tiny run trained without a stop: (its config file, its final weights)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    cfg_path = tmp / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    _finish(_train(cfg_path, tmp / "a", "--set", "train.log_every=1"))
    return cfg_path, load_file(str(tmp / "a" / "model" / "model.safetensors"))


def test_sigterm_at_20_random_moments_then_resume_is_bitwise_identical(tmp_path, monkeypatch):
    """Twenty preemptions of one run, each a real SIGTERM at a random moment of its training
    (inside a step, between steps, during a checkpoint write), each followed by --resume: every
    stop exits 0 with a checkpoint, and the run ends with the uninterrupted run's weights, bit for bit."""
    import random
    import threading

    import transduce.training.loop as loop

    cfg_path = tmp_path / "run.yaml"  # long enough for 20 stops of a step or few each
    cfg_path.write_text(yaml.safe_dump({**CONFIG, "train": {**CONFIG["train"], "max_steps": 80}}))
    _run_in_process(cfg_path, tmp_path / "a", "--set", "train.log_every=1")
    reference = load_file(str(tmp_path / "a" / "model" / "model.safetensors"))
    rng, timers = random.Random(20), []
    real_train = loop.Trainer.train

    def train_then_sigterm_later(trainer):  # the clock starts when training does, not at start-up
        timers.append(threading.Timer(rng.uniform(0.0, 0.05), os.kill, (os.getpid(), signal.SIGTERM)))
        timers[-1].start()
        return real_train(trainer)

    monkeypatch.setattr(loop.Trainer, "train", train_then_sigterm_later)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal after a run's end hits no one
    out, stops = tmp_path / "b", []
    try:
        while not (out / "model").exists() and len(stops) < 20:
            _run_in_process(cfg_path, out, *(["--resume"] if stops else []), "--set", "train.log_every=1")
            timers[-1].join()
            if not (out / "model").exists():
                stops.append(int(latest_checkpoint(out / "checkpoints").name.split("_")[1]))
        monkeypatch.setattr(loop.Trainer, "train", real_train)
        if not (out / "model").exists():
            _run_in_process(cfg_path, out, "--resume", "--set", "train.log_every=1")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(stops) == 20 and stops == sorted(stops), stops
    b = load_file(str(out / "model" / "model.safetensors"))
    for k in reference:
        assert (reference[k] == b[k]).all(), f"{k} differs after preemptions at steps {stops} and resumes"
