"""Quantisation-aware training (``train.qat``): the fake-quantised layers compute what the static
int8 model computes, a run trains through them, and its model converts with ``transduce quantize``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from extra_helpers import free_ports, need_extra
from transduce.cli import main
from transduce.config import RunConfig
from transduce.inference import load
from transduce.model import load_model
from transduce.training.loop import run_training
from transduce.training.qat import FakeQuantAttention, FakeQuantLinear, prepare_qat

MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
         "max_positions": 64, "dropout": 0.0}
TRAIN = {"max_steps": 40, "save_every": 40, "eval_every": 40, "log_every": 1, "warmup_steps": 5,
         "num_threads": 1, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3, "qat": True}
TOY = {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 20, "toy_test_size": 10,
       "vocab_size": 120, "max_tokens": 400, "max_len": 60}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def test_fake_quant_linear_computes_the_static_int8_layer():
    need_extra("quant", "torchao")
    from transduce.inference.speed.static_int8 import quantize_static
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16)
    plain = nn.Sequential(nn.Linear(16, 8))
    fake = nn.Sequential(nn.Linear(16, 8))
    fake.load_state_dict(plain.state_dict())
    prepare_qat(fake)
    assert type(fake[0]) is FakeQuantLinear and set(fake.state_dict()) == set(plain.state_dict())
    quantize_static(plain, {"0": float(x.abs().max())})  # calibrated on this very input
    with torch.no_grad():
        want, got = plain(x), fake(x)
    # the same integers; the int8 kernel sums them exactly and scales once, fake-quant in fp32
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item(), rtol=0)


def test_a_qat_run_trains_and_quantizes(tmp_path):
    need_extra("quant", "torchao")
    out = tmp_path / "run"
    cfg = RunConfig.from_dict({"model": MODEL, "data": TOY, "train": TRAIN})
    trainer, _ = run_training(cfg, out)
    assert any(type(m) is FakeQuantAttention for m in trainer.model.modules())
    losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    # from ln(120) ~ 4.8: a model that learns nothing through the rounding stays there
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0
    load_model(out / "model")  # a float model directory
    sample = out / "sample.en"
    sample.write_text("the red dog sleeps\na big cat runs\n", encoding="utf-8")
    assert main(["quantize", str(out / "model"), "--calibrate", str(sample), "--out", str(tmp_path / "int8")]) == 0
    with load(tmp_path / "int8") as tr:
        assert len(tr.translate(["the red dog sleeps"], beam=2)) == 1


def test_layers_quantize_keeps_in_float_train_in_float():
    """QAT rounds what ``transduce quantize`` rounds: the layers ``quantize.float_layers`` keeps
    in float32 (by default the vocabulary projection) are left plain, the others fake-quantised."""
    from transduce.config import ModelConfig, QuantizeConfig
    from transduce.model import Transformer
    model = prepare_qat(Transformer(ModelConfig(src_vocab_size=50, tgt_vocab_size=50, **MODEL)))
    linears = {n: type(m) for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert QuantizeConfig().float_layers == ("output_proj",)
    assert linears.pop("output_proj") is nn.Linear and set(linears.values()) == {FakeQuantLinear}


def test_the_input_scale_is_an_observer_s_moving_average_not_the_batch_s():
    """Static int8 has one input scale per layer; QAT rounds each batch by an observer's moving
    average of the batches' maxima (constant 0.01), so the second batch is computed as the static
    layer calibrated on that average computes it, whatever its own maximum."""
    need_extra("quant", "torchao")
    from transduce.inference.speed.static_int8 import quantize_static
    from transduce.training.qat import AVERAGING, observed_scales
    torch.manual_seed(0)
    first, second = torch.randn(3, 5, 16), 4 * torch.randn(3, 5, 16)
    plain, fake = nn.Sequential(nn.Linear(16, 8)), nn.Sequential(nn.Linear(16, 8))
    fake.load_state_dict(plain.state_dict())
    prepare_qat(fake)
    with torch.no_grad():
        fake(first)
        got = fake(second)
    average = float(first.abs().max()) * (1 - AVERAGING) + float(second.abs().max()) * AVERAGING
    assert float(observed_scales(fake)["0"]) == pytest.approx(average, rel=1e-6)
    quantize_static(plain, {"0": float(observed_scales(fake)["0"])})
    with torch.no_grad():
        want = plain(second)  # the second batch's largest values clip at the observed scale, as static int8's do
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item(), rtol=0)
    fake.eval()
    with torch.no_grad():
        fake(8 * second)  # evaluation reads the observer and leaves it
    assert float(observed_scales(fake)["0"]) == pytest.approx(average, rel=1e-6)


def test_observers_resume_bitwise_and_quantize_takes_them(tmp_path):
    """The observers are saved beside the weights: a resumed run continues them and steps as
    the uninterrupted one, bitwise; ``transduce quantize`` without a calibration sample gives the
    static int8 model exactly those scales (the vocabulary projection kept float, as QAT kept it)."""
    need_extra("quant", "torchao")
    from safetensors.torch import load_file
    from transduce.config.quantize import QAT_FILE
    from transduce.inference.speed.static_int8 import FILE

    def cfg(**train):
        return RunConfig.from_dict({"model": MODEL, "data": TOY, "train": {
            **TRAIN, "max_steps": 12, "save_every": 6, "eval_every": 100, **train}})
    run_training(cfg(), tmp_path / "a")
    run_training(cfg(max_steps=6), tmp_path / "b")
    run_training(cfg(), tmp_path / "b", resume=True)
    for name in ("model.safetensors", QAT_FILE):
        a, b = (load_file(str(tmp_path / r / "checkpoints" / "step_00000012" / name)) for r in "ab")
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name
    scales = load_file(str(tmp_path / "b" / "model" / QAT_FILE))
    assert "output_proj" not in scales and "encoder_layers.0.self_attn.q_proj" in scales
    assert main(["quantize", str(tmp_path / "b" / "model"), "--out", str(tmp_path / "int8")]) == 0
    saved = load_file(str(tmp_path / "int8" / FILE))
    assert set(saved) == set(scales) and all(torch.equal(saved[k], scales[k]) for k in scales)
    with load(tmp_path / "int8") as tr:
        assert len(tr.translate(["the red dog sleeps"], beam=2)) == 1


def test_quantize_without_a_sample_or_qat_scales_is_a_one_line_error(tmp_path, capsys):
    """A model not trained with train.qat has no scales of its own: --calibrate is needed; a QAT
    model's float-trained layer cannot be quantised by its (absent) scale."""
    need_extra("quant", "torchao")
    run = tmp_path / "run"
    run_training(RunConfig.from_dict({"model": MODEL, "data": TOY, "train": {**TRAIN, "max_steps": 2, "qat": False,
                                                                            "save_every": 2, "eval_every": 2}}), run)
    assert main(["quantize", str(run / "model"), "--out", str(tmp_path / "int8")]) == 2
    assert "--calibrate: " in capsys.readouterr().err and not (tmp_path / "int8").exists()
    qat = tmp_path / "qat"
    run_training(RunConfig.from_dict({"model": MODEL, "data": TOY, "train": {**TRAIN, "max_steps": 2, "save_every": 2,
                                                                            "eval_every": 2}}), qat)
    assert main(["quantize", str(qat / "model"), "--out", str(tmp_path / "int8"), "--float-layers"]) == 2
    assert "trained output_proj" in capsys.readouterr().err and not (tmp_path / "int8").exists()


OBSERVER_WORKER = r"""
import contextlib, json, sys, torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transduce.training.qat import average_observers, prepare_qat

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = prepare_qat(nn.Sequential(nn.Linear(4, 4)))
fsdp = sys.argv[3] == "fsdp"
if fsdp:  # as the trainer shards it (train.fsdp): the weights sharded, the observers each rank's own
    from transduce.training.sharding import set_gradient_sync, shard_model
    shard_model(model, "fp32")
    wrapped = model
else:  # as the trainer wraps it: buffers broadcast from rank 0
    wrapped = DistributedDataParallel(model)
seen = []
for step in range(3):
    for i, top in enumerate(json.loads(sys.argv[2])[rank]):  # two micro-batches a step, accumulated
        x = torch.full((2, 4), top * (step + 1))
        if fsdp:
            set_gradient_sync(model, i == 1)
        with wrapped.no_sync() if i == 0 and not fsdp else contextlib.nullcontext():
            wrapped(x).sum().backward()
    average_observers(model)  # what the trainer does after each step of a QAT run
    seen.append(float(model[0].input_absmax))
open(sys.argv[1] + str(rank), "w").write(json.dumps(seen))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_under_ddp_the_observers_follow_every_rank_s_batches(tmp_path, wrap):
    """Two gloo ranks, each observing its own batches: after each step both hold the moving
    average of the ranks' mean, not rank 0's own (which DDP's buffer broadcast would leave), nor
    each rank its own (FSDP shards the weights only)."""
    from transduce.training.qat import AVERAGING
    tops = [[1.0, 5.0], [3.0, 2.0]]  # each rank's micro-batches' largest magnitudes
    script = tmp_path / "worker.py"
    script.write_text(OBSERVER_WORKER)
    port = free_ports(1)[0]
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "seen"), json.dumps(tops), wrap],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out
    want, mean = [], 0.0
    for step in range(3):
        ends = []
        for rank_tops in tops:
            v = mean
            for top in rank_tops:
                v = top * (step + 1) if v == 0 else v + AVERAGING * (top * (step + 1) - v)
            ends.append(v)
        mean = sum(ends) / len(ends)
        want.append(mean)
    for r in range(2):
        assert json.loads((tmp_path / f"seen{r}").read_text()) == pytest.approx(want, rel=1e-6)
