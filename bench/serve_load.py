"""Server throughput and latency under a bounded load, with and without dynamic batching.

Starts ``transduce serve MODEL`` in a child process on loopback (once per ``--modes`` entry:
with batching, with ``--no-batching``, or with ``--workers N``), then sends ``--requests`` POST
/translate requests, one sentence each, from ``--clients`` concurrent clients in this process
(asyncio + httpx), and prints one JSON object: requests/s, p50/p90/p99 latency, and the
server's batching counters from /health.

Model: ``--model DIR`` (e.g. ``runs/demo/model``); without it, a fixed random-weight model of the
demo's shape whose outputs are cut at ``--max-len-b`` tokens (random weights never emit EOS).

With ``--kill-at S`` (one ``workersN`` mode), the load runs for ``--seconds`` instead and one worker
(a pid from /health) is SIGKILLed ``S`` seconds in: the report gives p99 latency of the requests
sent before the kill (steady) and of those sent in the ``--window`` seconds after it, and the
failed requests (issue #37: a killed worker must cost one worker, not the pool).

Needs the ``serve`` extra and httpx. Usage:
    python bench/serve_load.py [--model runs/demo/model] [--clients 32] [--requests 2000] [--beam 4]
    python bench/serve_load.py --modes workers2 --clients 16 --seconds 40 --kill-at 20 --window 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from transduce.data.toy import generate_pairs

SEED = 20240602


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, port: int, mode: str, threads: int) -> subprocess.Popen:
    """``mode``: "batching", "no-batching", or "workersN" (batching, N worker processes of
    ``threads // N`` threads each)."""
    cmd = [sys.executable, "-m", "transduce", "serve", str(model_dir), "--port", str(port)]
    if mode.startswith("workers"):
        n = int(mode[len("workers"):])
        cmd += ["--workers", str(n), "--threads", str(max(1, threads // n))]
    else:
        cmd += ["--threads", str(threads)]
    if mode == "no-batching":
        cmd.append("--no-batching")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the server did not start")


async def load(url: str, sentences: list[str], clients: int, options: dict) -> tuple[list[float], int, float]:
    """Send one request per sentence with ``clients`` in flight; returns latencies, errors, wall time."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for s in sentences:
        queue.put_nowait(s)
    latencies: list[float] = []
    errors = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        while not queue.empty():
            sentence = queue.get_nowait()
            start = time.perf_counter()
            r = await http.post("/translate", json={"sentences": [sentence], **options})
            latencies.append(time.perf_counter() - start)
            errors += r.status_code != 200

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return latencies, errors, time.perf_counter() - start


async def timed_load(url: str, sentences: list[str], clients: int, options: dict, seconds: float,
                     kill_at: float) -> tuple[list[tuple[float, float, int]], dict]:
    """Requests from ``clients`` for ``seconds``; one worker SIGKILLed at ``kill_at``. Returns
    (sent at, latency, status) per request, and what was killed when."""
    records: list[tuple[float, float, int]] = []
    killed: dict = {}
    t0 = time.perf_counter()

    async def client(http: httpx.AsyncClient, k: int) -> None:
        i = k
        while (sent := time.perf_counter() - t0) < seconds:
            try:
                r = await http.post("/translate", json={"sentences": [sentences[i % len(sentences)]], **options})
                status = r.status_code
            except httpx.HTTPError:
                status = 0
            records.append((sent, time.perf_counter() - t0 - sent, status))
            i += clients

    async def killer(http: httpx.AsyncClient) -> None:
        await asyncio.sleep(kill_at)
        pid = (await http.get("/health")).json()["workers"]["pids"][0]
        os.kill(pid, signal.SIGKILL)
        killed.update(pid=pid, at_s=round(time.perf_counter() - t0, 2))

    limits = httpx.Limits(max_connections=clients + 1, max_keepalive_connections=clients + 1)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.gather(killer(http), *(client(http, k) for k in range(clients)))
    return records, killed


@contextlib.contextmanager
def warm_server(model_dir: Path, mode: str, args, sentences: list[str]):
    """A server of ``mode`` on a free port, warmed up by 64 sentences: (its URL, the decode
    options of every request); stopped after the block."""
    port = free_port()
    proc = start_server(model_dir, port, mode, args.threads)
    url = f"http://127.0.0.1:{port}"
    options = {"beam": args.beam, "max_len_b": args.max_len_b}
    try:
        asyncio.run(load(url, sentences[:64], min(8, args.clients), options))
        yield url, options
    finally:
        proc.terminate()
        proc.wait(10)


def run_kill(model_dir: Path, mode: str, args, sentences: list[str]) -> dict:
    """p99 steady vs p99 in the ``args.window`` seconds after one worker is SIGKILLed."""
    with warm_server(model_dir, mode, args, sentences) as (url, options):
        records, killed = asyncio.run(timed_load(url, sentences, args.clients, options, args.seconds, args.kill_at))
        workers = httpx.get(url + "/health").json()["workers"]
    at = killed["at_s"]
    steady = [lat for sent, lat, _ in records if sent + lat < at]
    after = [lat for sent, lat, _ in records if at <= sent + lat < at + args.window or at - lat <= sent < at]
    p99_steady, p99_after = percentile(steady, 99), percentile(after, 99)
    return {"requests": len(records), "failed": sum(status != 200 for _, _, status in records),
            "p99_steady_ms": p99_steady, "p99_after_kill_ms": p99_after, "ratio": round(p99_after / p99_steady, 2),
            "requests_steady": len(steady), "requests_after_kill": len(after), "max_after_kill_ms":
            round(1000 * max(after), 1), "killed": killed, "window_s": args.window, "seconds": args.seconds,
            "restarts": workers["restarts"], "pids_after": workers["pids"]}


def percentile(values: list[float], q: float) -> float:
    return round(1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def run_one(model_dir: Path, mode: str, args, sentences: list[str]) -> dict:
    with warm_server(model_dir, mode, args, sentences) as (url, options):
        before = httpx.get(url + "/health").json()["batching"]
        latencies, errors, wall = asyncio.run(load(url, sentences, args.clients, options))
        after = httpx.get(url + "/health").json()["batching"]
        stats = {k: after[k] - before[k] for k in ("batches", "requests")}
        stats["max_requests_per_batch"] = after["max_requests_per_batch"]
    return {"requests_per_s": round(len(sentences) / wall, 1), "p50_ms": percentile(latencies, 50),
            "p90_ms": percentile(latencies, 90), "p99_ms": percentile(latencies, 99), "errors": errors,
            "seconds": round(wall, 1), "batches": stats["batches"],
            "mean_requests_per_batch": round(stats["requests"] / max(1, stats["batches"]), 2),
            "max_requests_per_batch": stats["max_requests_per_batch"]}


def machine() -> str:
    """CPU model and count, e.g. "AMD EPYC 7B13, 2 CPUs, Linux"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} CPUs, {platform.system()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: runs/demo/model if present)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-len-b", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the server process (with workersN: shared among the workers)")
    ap.add_argument("--modes", default="batching,no-batching",
                    help="comma-separated: batching, no-batching, workersN (batching on N worker processes)")
    ap.add_argument("--seconds", type=float, default=40.0, help="with --kill-at: how long the load runs")
    ap.add_argument("--kill-at", type=float, default=None,
                    help="SIGKILL one worker this many seconds into a --seconds load (workersN modes)")
    ap.add_argument("--window", type=float, default=5.0, help="with --kill-at: the seconds after the kill")
    args = ap.parse_args()
    sentences = [s for s, _ in generate_pairs(args.requests, SEED)]
    model = args.model or ("runs/demo/model" if Path("runs/demo/model/config.yaml").is_file() else None)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if model:
            model_dir = Path(model)
        else:
            sys.path.insert(0, str(Path(__file__).parent))
            from export_speed import random_model_dir
            model_dir = random_model_dir(Path(tmp) / "random", sentences)
        for mode in args.modes.split(","):
            run = run_kill if args.kill_at is not None and mode.startswith("workers") else run_one
            results[mode] = run(model_dir, mode, args, sentences)
            print(f"{mode}: {results[mode]}", file=sys.stderr)
    print(json.dumps({
        "benchmark": "serve_load", "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "model": model or f"random (demo shape), outputs cut at {args.max_len_b} tokens",
        "clients": args.clients, "requests": args.requests, "sentences_per_request": 1, "beam": args.beam,
        "server_threads": args.threads, "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
