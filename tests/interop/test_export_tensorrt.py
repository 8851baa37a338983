"""TensorRT engines, everything up to the build (no GPU, no tensorrt): profile shapes, the precision
plan, the description written beside the plans and the check that plans fit the running TensorRT and
GPU; the one-line errors of building or running engines where that cannot be done."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from transduce.config import DecodeConfig, Runtime
from transduce.errors import CheckpointError, ConfigError, TransduceError
from transduce.interop.tensorrt import EngineBuild, limits_for, plan_meta, precision_plan, profile_shapes
from transduce.inference.backends.onnx import io_names
from transduce.inference.backends.tensorrt import TrtSteps, plan_mismatch, read_plan_meta

META = {"n_decoder_layers": 2, "n_heads": 4, "head_dim": 8, "max_positions": 256}
HAS_TRT = importlib.util.find_spec("tensorrt") is not None


def test_limits_follow_max_positions_and_decode_settings():
    # sources up to max_input_len + EOS, outputs up to a * S + b, all within the position table
    small = limits_for(256, DecodeConfig(max_input_len=100, max_len_a=1.0, max_len_b=50), max_batch=32)
    assert (small.max_src, small.max_cache, small.max_batch) == (101, 150, 32)
    capped = limits_for(256, DecodeConfig(), max_batch=512)
    assert (capped.max_src, capped.max_cache) == (256, 255)
    assert capped.opt_batch <= capped.max_batch and capped.opt_src <= capped.max_src


def test_profile_shapes_cover_every_input_of_both_graphs():
    limits = limits_for(META["max_positions"], DecodeConfig(max_input_len=63), max_batch=16)
    shapes = profile_shapes(META, limits)
    assert set(shapes["decoder"]) == {"tokens", "src_mask", *io_names(2, "self"), *io_names(2, "cross")}
    assert shapes["encoder"]["src"] == ((1, 1), (16, 32), (16, 64))
    lo, opt, hi = shapes["decoder"]["self_k_1"]
    assert lo == (1, 4, 0, 8) and hi == (16, 4, limits.max_cache, 8)  # the first step's cache is empty
    assert shapes["decoder"]["cross_v_0"][2] == (16, 4, 64, 8)
    for graph in shapes.values():
        for lo, opt, hi in graph.values():
            assert all(a <= b <= c for a, b, c in zip(lo, opt, hi))


@pytest.mark.parametrize("version", ["10.13.0.35", "11.4.0.106"])
def test_precision_plan(version):
    assert precision_plan("fp32", version) == {"flags": [], "fp32_layers": [], "autocast": None, "fp32_ops": []}
    for precision, flag in (("fp16", "FP16"), ("bf16", "BF16")):
        plan = precision_plan(precision, version)
        if version.startswith("10."):   # weak typing: builder flags, norms and softmax constrained to fp32
            assert plan["flags"] == [flag, "PREFER_PRECISION_CONSTRAINTS"] and plan["autocast"] is None
            assert plan["fp32_layers"] == ["NORMALIZATION", "SOFTMAX"]
        else:                           # TensorRT 11 is strongly typed: the graph is converted first
            assert plan["flags"] == [] and plan["autocast"] == precision
            assert plan["fp32_ops"] == ["LayerNormalization", "Softmax"]


def test_plan_description_and_the_check_that_it_runs_here():
    gpu = {"gpu": "NVIDIA H200", "compute_capability": "9.0"}
    limits = limits_for(256, DecodeConfig(), 64)
    meta = json.loads(json.dumps(plan_meta(META, EngineBuild("fp16", 64), limits, "10.13.0.35", gpu)))
    assert meta["precision"] == "fp16" and meta["max_batch"] == 64 and meta["max_src"] == 256
    assert meta["profiles"]["encoder"]["src"][2] == [64, 256]
    assert plan_mismatch(meta, "10.13.0.35", gpu) is None
    assert "built by TensorRT 10.13.0.35; this is TensorRT 10.14.1" in plan_mismatch(meta, "10.14.1", gpu)
    other = {"gpu": "NVIDIA A100", "compute_capability": "8.0"}
    assert "built for NVIDIA H200 (compute capability 9.0); this is NVIDIA A100 (8.0)" in \
        plan_mismatch(meta, "10.13.0.35", other)


def test_engine_build_settings_are_checked():
    with pytest.raises(ConfigError, match="export.precision: must be one of fp32, fp16, bf16"):
        EngineBuild("int8")
    with pytest.raises(ConfigError, match="export.max_batch: must be >= 1"):
        EngineBuild("fp16", 0)


def test_runtime_backend_settings_are_checked():
    with pytest.raises(ConfigError, match="runtime.backend: must be one of torch, onnx, tensorrt"):
        Runtime(backend="openvino", engines="x")
    with pytest.raises(ConfigError, match="runtime.engines"):
        Runtime(backend="tensorrt")
    with pytest.raises(ConfigError, match="runtime.backend: onnx runs in this process"):
        Runtime(device="cpu", backend="onnx", engines="x", workers=2)


def test_running_engines_needs_cuda_then_the_plans_then_tensorrt(tmp_path):
    with pytest.raises(ConfigError, match="runtime.backend: tensorrt runs on a CUDA device; got device cpu"):
        TrtSteps.open(tmp_path, torch.device("cpu"), "fp16")
    with pytest.raises(CheckpointError, match="no TensorRT engines .* --format tensorrt --out"):
        read_plan_meta(tmp_path)
    if HAS_TRT:
        return
    with pytest.raises(TransduceError, match=r"needs the optional package 'tensorrt'.*transduce\[tensorrt\]"):
        TrtSteps.open(tmp_path, torch.device("cuda"), "fp16")  # what is missing before what is wrong


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transduce", *args], capture_output=True, text=True, cwd=cwd,
                          input="the dog\n", timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")
def test_cli_errors_are_one_line_and_write_nothing(trained_dir, tmp_path):
    out = tmp_path / "out.txt"
    for args, words in ((["--device", "cpu"], "runtime.backend: tensorrt runs on a CUDA device"),
                        (["--device", "cuda"], "CUDA is not available")):
        run = _cli("translate", str(trained_dir), "--backend", "tensorrt", "--engines", str(tmp_path), "--output",
                   str(out), *args)
        assert run.returncode == 2 and words in run.stderr, run.stderr
        assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
        assert not out.exists()
    engines = tmp_path / "engines"
    run = _cli("export", str(trained_dir), "--format", "tensorrt", "--out", str(engines), "--precision", "fp16")
    why = "building engines needs a CUDA GPU" if HAS_TRT else "needs the optional package 'tensorrt'"
    assert run.returncode == 2 and why in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not engines.exists()
    run = _cli("export", str(trained_dir), "--format", "onnx", "--out", str(engines), "--precision", "fp16")
    assert run.returncode == 2 and "--precision/--max-batch: are for --format tensorrt" in run.stderr
