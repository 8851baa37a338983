"""transduce's own server vs Triton, side by side: the same model, the same machine, locust as the load.

Engines (``--engines``), each a child process on loopback with ``--threads`` torch threads:
``transduce`` (``transduce serve MODEL``), ``triton`` (``transduce serve MODEL --engine triton``,
pytriton) and ``triton-repo`` (the repository ``export --format triton`` writes, run by pytriton's
bundled ``tritonserver``: Triton's Python backend running transduce). For each, and each number
of concurrent users (``--users``, default 1, 8, 32), locust runs headless
(``bench/serving_locust.py``; real HTTP, one sentence per request, no think time) for
``--seconds``; the report gives sentences/s, p50/p95/p99 latency, failures, and the server's
resident memory (the process and its children: Triton's server, its Python backend stub) sampled
every second. Prints one JSON object.

Sentences: ``--sentences FILE`` (e.g. Multi30k test2016 English), else the demo's toy pairs. Model:
``--model DIR`` (e.g. runs/demo/model); without it a random-weight model of the demo's shape.
Every request asks for ``--beam`` and ``--max-len-b``. ``--dry``: a tiny run for CI (1 and 2
users, 3 s, outputs of 8 tokens at most); the Triton engines are skipped, with the reason, where
the ``triton`` extra is absent.

Usage:
    python bench/serving.py --model runs/demo/model --seconds 60
    python bench/serving.py --dry
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    import httpx
    import psutil  # locust's dependency: RSS of the servers over time
except ImportError as err:
    raise SystemExit(f"bench/serving.py: needs the 'triton' and 'web-test' extras: pip install "
                     f"'transduce[triton,web-test]' ({err.name} is missing)") from None

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import SEED, free_port, machine  # noqa: E402

from transduce.data.toy import generate_pairs  # noqa: E402

LOCUSTFILE = Path(__file__).parent / "serving_locust.py"


def triton_absent() -> str | None:
    """Why the Triton engine cannot run here, or None."""
    try:
        from transduce.serve.triton import require_triton
        require_triton()
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return str(e)
    return None


def start(engine: str, model_dir: Path, threads: int, workdir: Path) -> tuple[subprocess.Popen, str]:
    """The engine's server on a free port, answering: (process, base URL). ``triton-repo``: the
    repository ``export --format triton`` writes, run by pytriton's bundled tritonserver."""
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "transduce", "serve", str(model_dir), "--port", str(port), "--threads", str(threads)]
    if engine == "triton":
        cmd += ["--engine", "triton", "--grpc-port", str(free_port())]
    if engine == "triton-repo":
        from transduce.interop import export_model
        from triton_repo_server import tritonserver_command  # bench/, beside this script
        export_model(model_dir, "triton", workdir / "repo", force=True)
        cmd, env = tritonserver_command(workdir / "repo", port, free_port(), workdir)
        env["OMP_NUM_THREADS"] = str(threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the stub imports transduce as this does
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    ready = url + ("/health" if engine == "transduce" else "/v2/models/translate/ready")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(ready, timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the {engine} server did not start")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def rss_mb(pid: int) -> float:
    """Resident memory of the process and its descendants, MB."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2**20, 1)


def locust(engine: str, url: str, users: int, seconds: float, env: dict, workdir: Path) -> dict:
    """One headless locust run; the aggregated row of its CSV."""
    prefix = workdir / f"{engine}_{users}"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r",
           str(users), "-t", f"{seconds:g}s", "--host", url, "--csv", str(prefix), "--only-summary",
           "--loglevel", "ERROR", "--stop-timeout", "30"]
    subprocess.run(cmd, env={**env, "SERVING_ENGINE": engine}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=seconds + 120)
    with open(f"{prefix}_stats.csv", encoding="utf-8") as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    return {"sentences_per_s": round(float(row["Requests/s"]), 2), "requests": int(row["Request Count"]),
            "failures": int(row["Failure Count"]), **{f"p{q}_ms": _ms(row[f"{q}%"]) for q in (50, 95, 99)}}


def _ms(value: str) -> float | None:
    return None if value == "N/A" else float(value)


def run_engine(engine: str, model_dir: Path, args, env: dict, workdir: Path) -> dict:
    """Every --users load on one server of ``engine`` (warmed up first), with its RSS over time."""
    proc, url = start(engine, model_dir, args.threads, workdir)
    out: dict = {}
    try:
        locust(engine, url, 2, 5, env, workdir / "warm")
        for users in args.users:
            samples: list[float] = []
            done = threading.Event()

            def sample() -> None:
                while not done.wait(1.0):
                    samples.append(rss_mb(proc.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            result = locust(engine, url, users, args.seconds, env, workdir)
            done.set()
            sampler.join()
            result["rss_mb"] = {"max": max(samples, default=0.0), "first": samples[0] if samples else 0.0,
                                "last": samples[-1] if samples else 0.0}
            out[f"{users}_users"] = result
            print(f"{engine} {users} users: {result}", file=sys.stderr)
    finally:
        out["exit_code_on_sigterm"] = stop(proc)
    return out


def sentences_file(args, workdir: Path) -> tuple[Path, str]:
    """The file of sentences the users send, and where they come from."""
    if args.sentences:
        return Path(args.sentences), args.sentences
    path = workdir / "toy.txt"
    path.write_text("\n".join(s for s, _ in generate_pairs(2000, SEED)) + "\n", encoding="utf-8")
    return path, f"the demo's toy pairs (seed {SEED})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: a random-weight one)")
    ap.add_argument("--sentences", default=None, help="a file of source sentences, one per line")
    ap.add_argument("--engines", default="transduce,triton,triton-repo",
                    help="transduce (its server), triton (serve --engine triton), triton-repo (export --format "
                         "triton run by tritonserver)")
    ap.add_argument("--users", default="1,8,32", help="comma-separated numbers of concurrent users")
    ap.add_argument("--seconds", type=float, default=60.0, help="each locust run's length")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-len-b", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    ap.add_argument("--dry", action="store_true", help="1 and 2 users, 3 s each: a check that it runs")
    args = ap.parse_args()
    if args.dry:
        args.users, args.seconds, args.max_len_b = "1,2", 3.0, min(args.max_len_b, 8)
    args.users = [int(u) for u in args.users.split(",")]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "warm").mkdir()
        path, source = sentences_file(args, workdir)
        env = {**os.environ, "SERVING_SENTENCES": str(path), "SERVING_BEAM": str(args.beam),
               "SERVING_MAX_LEN_B": str(args.max_len_b)}
        if args.model:
            model_dir = Path(args.model)
        else:
            from export_speed import random_model_dir
            model_dir = random_model_dir(workdir / "random", path.read_text(encoding="utf-8").splitlines()[:500])
        for engine in args.engines.split(","):
            absent = triton_absent() if engine.startswith("triton") else None
            results[engine] = {"skipped": absent} if absent else run_engine(engine, model_dir, args, env, workdir)
    print(json.dumps({
        "benchmark": "serving", "date": datetime.date.today().isoformat(), "machine": machine(),
        "load_average": os.getloadavg(), "model": args.model or "random (demo shape)", "sentences": source,
        "beam": args.beam, "max_len_b": args.max_len_b, "server_threads": args.threads, "seconds": args.seconds,
        "load_generator": "locust (headless, FastHttpUser, no think time)", "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
