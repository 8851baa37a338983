"""TensorRT engines on a GPU (``export --format tensorrt``, ``--backend tensorrt``): fp32 engines give
the eager model's translations, greedy and beam 4; fp16 ones nearly all of them; a plan of another
TensorRT version is refused with a one-line error. Skipped without CUDA or the tensorrt extra."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from transduce.config import Runtime
from transduce.errors import CheckpointError
from transduce.interop import export_model
from transduce.interop.tensorrt import EngineBuild
from transduce.inference import load
from transduce.inference.backends.onnx import GraphModel
from toy_model import toy_pairs
from extra_helpers import need_extra

need_extra("tensorrt", "tensorrt")
need_extra("export", "onnx", "onnxruntime", "onnxscript")
if not torch.cuda.is_available():
    pytest.skip("TensorRT engines need a CUDA GPU", allow_module_level=True)

TEXTS = [s for s, _ in toy_pairs(24, seed=5)] + ["", "the dog"]


@pytest.fixture(scope="module")
def engines(trained_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("trt")
    for precision in ("fp32", "fp16"):
        export_model(trained_dir, "tensorrt", root / precision, build=EngineBuild(precision, max_batch=256))
    return root


@pytest.mark.parametrize("settings", [dict(beam=1), dict(beam=4, nbest=2)], ids=["greedy", "beam4"])
def test_fp32_engines_translate_as_eager(trained_dir, engines, settings):
    with load(trained_dir, Runtime(device="cuda")) as eager, \
            load(trained_dir, Runtime(device="cuda", backend="tensorrt", engines=str(engines / "fp32"))) as trt:
        assert isinstance(trt.model, GraphModel)
        want = eager.translate_detailed(TEXTS, **settings)
        got = trt.translate_detailed(TEXTS, **settings)
    assert [[h.tokens for h in t.hypotheses] for t in got] == [[h.tokens for h in t.hypotheses] for t in want]


def test_fp16_engines_nearly_agree(trained_dir, engines):
    """Half precision may flip a near tie; the trained toy model's outputs are far from ties, so
    at most one in ten may differ (the benchmark measures BLEU on Multi30k)."""
    with load(trained_dir, Runtime(device="cuda")) as eager, \
            load(trained_dir, Runtime(device="cuda", precision="fp16", backend="tensorrt",
                                      engines=str(engines / "fp16"))) as trt:
        want, got = eager.translate(TEXTS, beam=4), trt.translate(TEXTS, beam=4)
    assert sum(a == b for a, b in zip(want, got)) >= 0.9 * len(TEXTS)


def test_plans_of_another_tensorrt_are_refused(trained_dir, engines, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(engines / "fp32", other)
    meta = json.loads((other / "tensorrt.json").read_text())
    (other / "tensorrt.json").write_text(json.dumps({**meta, "tensorrt": "0.0.1"}))
    with pytest.raises(CheckpointError, match="built by TensorRT 0.0.1; .* rebuild them"):
        load(trained_dir, Runtime(device="cuda", backend="tensorrt", engines=str(other)))
