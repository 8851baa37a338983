"""``export --format triton``: a model repository (config.pbtxt parsed as Triton's ModelConfig,
the Python backend's model.py, the model directory copied), several models in one repository,
and the repository served by the ``tritonserver`` pytriton bundles, translating as the
Translator does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from extra_helpers import free_ports, need_extra
from toy_model import toy_pairs
from transduce.errors import TransduceError
from transduce.interop import export_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from triton_repo_server import tritonserver_command  # noqa: E402

SENTENCES = [s for s, _ in toy_pairs(6, seed=21)]


@pytest.fixture(scope="module")
def repo(trained_dir, tmp_path_factory):
    """A repository of two models of the toy directory: ``translate`` and ``toy-b``."""
    out = tmp_path_factory.mktemp("triton") / "repo"
    export_model(trained_dir, "triton", out)
    export_model(trained_dir, "triton", out, name="toy-b")
    return out


def test_the_repository_layout(repo, trained_dir):
    assert sorted(p.name for p in repo.iterdir()) == ["toy-b", "translate"]
    for name in ("translate", "toy-b"):
        files = sorted(str(p.relative_to(repo / name)) for p in (repo / name).rglob("*") if p.is_file())
        copied = sorted(f"1/model_dir/{p.name}" for p in trained_dir.iterdir() if p.is_file())
        assert files == sorted(["config.pbtxt", "1/model.py", *copied])
        for f in trained_dir.iterdir():
            if f.is_file():
                assert (repo / name / "1" / "model_dir" / f.name).read_bytes() == f.read_bytes()
        compile((repo / name / "1" / "model.py").read_text(), "model.py", "exec")


def test_an_existing_model_needs_force_and_a_name_must_be_valid(repo, trained_dir):
    with pytest.raises(TransduceError, match="already exists"):
        export_model(trained_dir, "triton", repo, name="toy-b")
    export_model(trained_dir, "triton", repo, name="toy-b", force=True)
    with pytest.raises(TransduceError, match="export.name"):
        export_model(trained_dir, "triton", repo, name="../up")


def test_config_pbtxt_is_a_triton_model_config(repo):
    need_extra("triton", "tritonclient.grpc")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse((repo / "toy-b" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert (config.name, config.backend, config.max_batch_size) == ("toy-b", "python", 64)
    assert [(t.name, t.data_type) for t in config.input] == [("text", mc.TYPE_STRING)]
    assert [(t.name, t.data_type) for t in config.output] == [("translation", mc.TYPE_STRING),
                                                              ("score", mc.TYPE_FP32), ("error", mc.TYPE_STRING)]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32, 64]
    assert config.dynamic_batching.max_queue_delay_microseconds > 0



@pytest.mark.slow
def test_tritonserver_serves_the_repository(repo, trained_dir, tmp_path):
    need_extra("triton", "pytriton", "tritonclient.http")
    if int(np.__version__.split(".")[0]) >= 2:
        pytest.skip(f"needs the 'triton' extra: pip install 'transduce[triton]' (its Python backend needs numpy < 2; "
                    f"found {np.__version__})")
    import tritonclient.http as http
    from transduce.inference import load

    (repo / "toy-b").rename(tmp_path / "toy-b")  # one model: each loads torch in its own stub process
    http_port, grpc_port = free_ports(2)
    command, env = tritonserver_command(repo, http_port, grpc_port, tmp_path)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = ":".join(p for p in sys.path if p)  # the stub imports transduce as this test does
    with (tmp_path / "tritonserver.log").open("w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = http.InferenceServerClient(f"127.0.0.1:{http_port}")
        deadline = time.monotonic() + 120
        while not _ready(client) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _ready(client), (tmp_path / "tritonserver.log").read_text()[-3000:]
        text = http.InferInput("text", [len(SENTENCES), 1], "BYTES")
        text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=object).reshape(-1, 1))
        result = client.infer("translate", [text], parameters={"beam": 2})
        with load(trained_dir) as translator:
            assert [t.decode() for t in result.as_numpy("translation")[:, 0]] == translator.translate(SENTENCES,
                                                                                                      beam=2)
    finally:
        proc.terminate()
        proc.wait(60)


def _ready(client) -> bool:
    try:
        return client.is_model_ready("translate")
    except Exception:  # noqa: BLE001 - not listening yet
        return False
