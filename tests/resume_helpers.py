"""What every task's training tests check: a short run lowers its loss and reports perplexity
(not BLEU); a run stopped at step 6 and resumed equals a straight 12-step run bit for bit, and the
run's final model is the average of its last checkpoints."""

import json

from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file

from transduce.model import load_model
from transduce.training.loop import run_training


def assert_resume_exact_and_average(cfg: Callable, tmp_path: Path, model_class: type, weight: str,
                                    weights_file: str = "model.safetensors") -> None:
    """``cfg(**train)`` gives a run of 12 steps saving every 6; ``weight`` names one parameter.
    A run with ``train.ema_decay`` passes ``weights_file="ema.safetensors"``: its moving average
    resumes bitwise too, and the final model is the average of the checkpoints' averages."""
    run_training(cfg(), tmp_path / "a")
    run_training(cfg(max_steps=6), tmp_path / "b")
    run_training(cfg(average_last=2), tmp_path / "b", resume=True)
    for name in {"model.safetensors", weights_file}:
        a = load_file(str(tmp_path / "a" / "checkpoints" / "step_00000012" / name))
        b = load_file(str(tmp_path / "b" / "checkpoints" / "step_00000012" / name))
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}: {k} differs after resume"
    a = load_file(str(tmp_path / "a" / "checkpoints" / "step_00000012" / weights_file))
    averaged = load_model(tmp_path / "b" / "model")  # the mean of steps 6 and 12
    assert isinstance(averaged, model_class)
    six = load_file(str(tmp_path / "b" / "checkpoints" / "step_00000006" / weights_file))
    torch.testing.assert_close(averaged.state_dict()[weight], (a[weight] + six[weight]) / 2)


def assert_trains_with_perplexity(metrics: dict, run_dir: Path) -> None:
    """A language-model task's run: perplexity and no BLEU, the logged loss fell."""
    assert "val_ppl" in metrics and "val_bleu" not in metrics
    log = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert losses[-1] < losses[0]
