"""``transduce serve --engine triton``: a real Triton server (pytriton's tritonserver) on the
trained toy model, queried with tritonclient over HTTP and gRPC; its translations are the
Translator's, bad rows and parameters are answered per row while the server keeps serving, and
SIGTERM stops it cleanly. One server for the module: starting Triton takes seconds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from extra_helpers import free_ports, need_extra
from toy_model import toy_pairs

SENTENCES = [s for s, _ in toy_pairs(10, seed=11)]



def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    import tritonclient.http as http

    client = http.InferenceServerClient(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transduce serve --engine triton exited with {proc.returncode}")
        try:
            if client.is_model_ready("translate"):
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.5)
    raise RuntimeError("the Triton server was not ready in time")


@pytest.fixture(scope="module")
def server(trained_dir, tmp_path_factory):
    """The CLI's Triton server on free loopback ports: (process, HTTP url, gRPC url)."""
    need_extra("triton", "pytriton", "tritonclient.http", "tritonclient.grpc")
    if int(np.__version__.split(".")[0]) >= 2:
        pytest.skip(f"needs the 'triton' extra: pip install 'transduce[triton]' (pytriton needs numpy < 2; "
                    f"found {np.__version__})")
    http_port, grpc_port = free_ports(2)
    log = (tmp_path_factory.mktemp("triton") / "serve.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "transduce", "serve", str(trained_dir), "--engine", "triton",
                             "--port", str(http_port), "--grpc-port", str(grpc_port), "--threads", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_ready(proc, f"127.0.0.1:{http_port}")
        yield proc, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def translator(trained_dir):
    from transduce.inference import load

    with load(trained_dir) as t:
        yield t


def _infer(kind: str, url: str, texts: list, **parameters) -> dict[str, np.ndarray]:
    """One request of ``texts`` (str or bytes rows) over ``kind`` ("http" or "grpc")."""
    if kind == "http":
        import tritonclient.http as client
    else:
        import tritonclient.grpc as client
    rows = np.array([t.encode("utf-8") if isinstance(t, str) else t for t in texts], dtype=object).reshape(-1, 1)
    text = client.InferInput("text", list(rows.shape), "BYTES")
    text.set_data_from_numpy(rows)
    result = client.InferenceServerClient(url).infer("translate", [text], parameters=parameters or None)
    return {name: result.as_numpy(name) for name in ("translation", "score", "error")}


def _texts(column: np.ndarray) -> list[str]:
    return [x.decode("utf-8") for x in column]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_translations_are_the_translators(server, translator, kind):
    _, http_url, grpc_url = server
    out = _infer(kind, http_url if kind == "http" else grpc_url, SENTENCES)
    assert _texts(out["translation"][:, 0]) == translator.translate(SENTENCES)
    assert _texts(out["error"][:, 0]) == [""] * len(SENTENCES)


def test_nbest_and_beam_parameters(server, translator):
    _, _, grpc_url = server
    out = _infer("grpc", grpc_url, SENTENCES[:4], beam=4, nbest=3, lenpen="1.0")
    expected = translator.translate_detailed(SENTENCES[:4], beam=4, nbest=3, lenpen=1.0)
    assert out["translation"].shape == (4, 3)
    for row, scores, want in zip(out["translation"], out["score"], expected):
        assert _texts(row) == [h.text for h in want.hypotheses]
        np.testing.assert_allclose(scores, [h.score for h in want.hypotheses], rtol=1e-5, atol=1e-5)


def test_the_model_metadata_names_bytes_strings(server):
    import tritonclient.http as http

    meta = http.InferenceServerClient(server[1]).get_model_metadata("translate")
    types = {t["name"]: t["datatype"] for t in meta["inputs"] + meta["outputs"]}
    assert types == {"text": "BYTES", "translation": "BYTES", "score": "FP32", "error": "BYTES"}


def test_bad_rows_are_answered_per_row_and_the_rest_translated(server, translator):
    bad = ["", b"\xff\xfe not utf-8", "dog " * 10_000]
    out = _infer("http", server[1], [SENTENCES[0], *bad, SENTENCES[1]])
    errors = _texts(out["error"][:, 0])
    assert errors[0] == errors[4] == ""
    assert "empty" in errors[1] and "UTF-8" in errors[2] and "40000 characters" in errors[3]
    assert _texts(out["translation"][[0, 4], 0]) == translator.translate(SENTENCES[:2])


@pytest.mark.parametrize("parameters, message", [({"beam": 0}, "decode.beam"), ({"beam": 99}, "at most 16"),
                                                 ({"nbest": "two"}, "nbest: must be an integer"),
                                                 ({"temperature": 1}, "unknown parameter")])
def test_bad_parameters_are_each_rows_error(server, parameters, message):
    out = _infer("grpc", server[2], SENTENCES[:2], **parameters)
    assert all(message in e for e in _texts(out["error"][:, 0]))


def test_an_empty_batch_is_refused_and_the_server_keeps_serving(server, translator):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="got 0"):
        _infer("grpc", server[2], [])
    assert _texts(_infer("http", server[1], SENTENCES[:1])["translation"][:, 0]) == translator.translate(SENTENCES[:1])


def test_sigterm_stops_the_server_cleanly(server):
    proc, http_url, _ = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    with socket.socket() as s:  # nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", int(http_url.rsplit(":", 1)[1]))) != 0
