"""bench/export_speed.py's size on disk: every format's model files counted (an ONNX graph's
external data too), nothing else of the directory."""

import importlib.util
from pathlib import Path

import pytest

from extra_helpers import need_extra

need_extra("export", "onnx", "onnxruntime")

_PATH = Path(__file__).resolve().parents[1] / "bench" / "export_speed.py"
_spec = importlib.util.spec_from_file_location("bench_export_speed", _PATH)
export_speed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(export_speed)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    texts = [s for s, _ in export_speed.generate_pairs(200, export_speed.SEED)]
    return export_speed.random_model_dir(tmp_path_factory.mktemp("random"), texts, "toy")


def _mb(files) -> float:
    return round(sum(f.stat().st_size for f in files) / 2**20, 2)


def test_eager_and_onnx_sizes_are_their_model_files(model_dir, tmp_path):
    import onnx

    assert [f.name for f in export_speed.model_files(model_dir)] == ["model.safetensors"]
    assert export_speed.disk_mb(model_dir) == _mb([model_dir / "model.safetensors"]) > 0
    out = export_speed.export_model(model_dir, "onnx", tmp_path / "onnx").out
    assert [f.name for f in export_speed.model_files(out)] == ["decoder.onnx", "encoder.onnx"]
    size = export_speed.disk_mb(out)
    assert size == _mb([out / "decoder.onnx", out / "encoder.onnx"]) > 0.5 * export_speed.disk_mb(model_dir)
    graph = onnx.load(str(out / "decoder.onnx"))  # its weights moved beside it, under a name of no format
    onnx.save_model(graph, str(out / "decoder.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="decoder.weights", size_threshold=0)
    assert [f.name for f in export_speed.model_files(out)] == ["decoder.onnx", "decoder.weights", "encoder.onnx"]
    assert export_speed.disk_mb(out) == _mb(export_speed.model_files(out))
    assert abs(export_speed.disk_mb(out) - size) < 0.05  # the same weights, another layout


def test_ctranslate2_size_is_its_model_bin(model_dir, tmp_path):
    need_extra("export", "ctranslate2")
    out = export_speed.export_model(model_dir, "ctranslate2", tmp_path / "ct2").out
    assert [f.name for f in export_speed.model_files(out)] == ["model.bin"]  # not its config or vocabularies
    assert export_speed.disk_mb(out) == _mb([out / "model.bin"]) > 0
