"""A training run's reports: metrics.jsonl records, and a logged step's figures beside the
progress bar on a terminal or as a log line elsewhere."""

import io
import json
import logging
import sys

import pytest
import torch

import transduce.progress as progress
from transduce.config import RunConfig
from transduce.data.prepare import prepared_for_run
from transduce.progress import FORCE_ENV, progress_bar
from transduce.training.distributed import DistInfo
from transduce.training.loop import Trainer
from transduce.training.report import MetricsLog

RECORD = {"step": 3, "epoch": 0, "loss": 2.5, "ppl": 12.2, "lr": 0.000123, "tokens_per_s": 4321.0,
          "grad_norm": 1.0, "elapsed": 0.5}


@pytest.fixture(autouse=True)
def _not_quiet(monkeypatch):
    monkeypatch.setattr(progress, "QUIET", False)
    monkeypatch.delenv(FORCE_ENV, raising=False)


def test_off_a_terminal_a_logged_step_is_a_log_line_and_a_record(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    log = MetricsLog(tmp_path, is_main=True, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="transduce.training"), progress_bar(10, unit="steps") as bar:
        log.write_step(RECORD, bar, 10)
    assert sys.stderr.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == ["step 3/10 loss 2.5 lr 0.000123 tokens_per_s 4321"]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == RECORD


def test_on_a_bar_a_logged_step_is_its_postfix(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv(FORCE_ENV, "1")
    log = MetricsLog(tmp_path, is_main=True, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="transduce.training"), progress_bar(10, unit="steps") as bar:
        bar.update(3)
        log.write_step(RECORD, bar, 10)
    assert "3/10" in sys.stderr.getvalue() and "loss=2.5, lr=0.000123, tok/s=4321" in sys.stderr.getvalue()
    assert not caplog.records


def test_other_ranks_neither_write_nor_log(tmp_path, caplog):
    log = MetricsLog(tmp_path, is_main=False, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="transduce.training"), progress_bar(10, "steps", enabled=False) as bar:
        log.write_step(RECORD, bar, 10)
    assert not caplog.records and not (tmp_path / "metrics.jsonl").exists()


def test_training_draws_steps_loss_and_eta(tmp_path, monkeypatch):
    """A run's bar counts from the step it starts at (here after one step, as a resumed run)."""
    cfg = RunConfig.from_dict({
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
        "data": {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 20,
                 "vocab_size": 120, "max_tokens": 256},
        "train": {"eval_bleu": False, "warmup_steps": 5, "log_every": 1, "max_steps": 4, "eval_every": 100,
                  "save_every": 100},
    })
    trainer = Trainer(cfg, tmp_path, prepared_for_run(cfg.data, tmp_path, seed=0, workers=1), DistInfo(),
                      torch.device("cpu"))
    trainer.train_step()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv(FORCE_ENV, "1")
    assert trainer.train() == "max_steps"
    drawn = sys.stderr.getvalue()
    assert "training:  25%" in drawn and "4/4 [" in drawn and "loss=" in drawn and "tok/s=" in drawn
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [2, 3, 4]
