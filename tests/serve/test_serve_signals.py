"""``transduce serve`` stopped by SIGTERM (``kill``, systemd, a container's stop, bench/serving.py)
as by Ctrl-C: uvicorn's shutdown, then the batcher and the worker pool closed, exit 0, no
traceback. uvicorn raises a caught signal again once it has shut down; SIGTERM's default handler
then killed the process (-15) before the pool was closed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


from extra_helpers import free_ports, need_extra

httpx = need_extra("serve", "fastapi", "uvicorn", "httpx")[2]


def _health(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transduce serve exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            return httpx.get(url + "/health", timeout=5).json()
        except httpx.TransportError:  # not listening yet
            time.sleep(0.2)
    raise RuntimeError("transduce serve did not answer in time")


def test_sigterm_stops_the_server_cleanly(trained_dir):
    port = free_ports(1)[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "transduce", "serve", str(trained_dir), "--port", str(port),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _health(proc, url)
        assert httpx.post(url + "/translate", json={"sentences": ["the red dog runs"]}, timeout=60).status_code == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Finished server process" in err
    assert "stopped serving" in err  # after the service (its batcher, a worker pool) was closed
