"""Soak test of ``transduce serve --workers N`` (issue #22): hours-of-load behaviour, in minutes.

Starts ``transduce serve MODEL --workers 2`` in a child process on loopback (a free port) and
drives it for ``--minutes`` with ``--clients`` threads, each sending one request after another,
a mix of valid requests (1-4 sentences of varied length), oversized ones (a body, a sentence
list or a sentence over the server's limits, read from /health) and malformed ones (bad JSON,
wrong types, unknown fields, out-of-range settings), while a worker process (a pid from /health)
is SIGKILLed every ``--kill-every`` seconds, and (``--hang-at S``) one is SIGSTOPped once: a hung
worker, which the server must notice by its batch deadline (``--worker-timeout``) and replace.
Every request has a client-side timeout: one with
no answer by then is **hung**; one whose connection fails is **lost**.

Prints one JSON object: per minute, the requests answered, answers by status code, p50/p99
latency of the valid requests answered 200, the server's RSS (main process, and its workers
separately, from /proc/PID/status), its thread and file-descriptor counts, and the worker
restarts /health reports; totals; and the issue's goal, pass/fail per part: 0 requests lost or
hung; no 5xx but 503 (a batch whose worker died twice); the main process's RSS within 5% from
minute 2 to the last minute. The server is always stopped (also on Ctrl-C, SIGTERM or an
error), with every process it started; the report says if any was left.

Needs the ``serve`` extra and httpx. Usage:
    python bench/soak.py --model runs/demo/model [--minutes 10] [--clients 32] [--kill-every 60]
                         [--hang-at 45 --worker-timeout 10]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_report import KINDS, Outcome, report  # noqa: E402

from transduce.data.toy import generate_pairs  # noqa: E402

SEED = 20261201
SAMPLE_EVERY_S = 2.0


# ---------------------------------------------------------------------------------- requests

def valid_body(rng: random.Random, sentences: list[str]) -> dict:
    """1-4 sentences, each one to three toy sentences long (sometimes empty)."""
    def one() -> str:
        if rng.random() < 0.05:
            return ""
        return " ".join(rng.choice(sentences) for _ in range(rng.choice((1, 1, 1, 2, 3))))
    return {"sentences": [one() for _ in range(rng.randint(1, 4))]}


def oversized_body(rng: random.Random, limits: dict, sentence: str) -> bytes:
    """A body, a sentence list or a sentence over the server's limits."""
    choice = rng.randrange(3)
    if choice == 0:
        n = limits["max_body_bytes"] // len(sentence) + 8
        return json.dumps({"sentences": [sentence] * n}).encode()
    if choice == 1:
        return json.dumps({"sentences": [sentence] * (limits["max_sentences"] + 1)}).encode()
    long = (sentence + " ") * (limits["max_sentence_chars"] // len(sentence) + 2)
    return json.dumps({"sentences": [long]}).encode()


MALFORMED = (b"{not json", b"", b"[1, 2, 3]", b'"sentences"', b'{"sentences": "a dog runs"}',
             b'{"sentences": [1, 2]}', b'{"sentences": ["a"], "beam": "4"}', b'{"sentences": ["a"], "beam": 0}',
             b'{"sentences": ["a"], "colour": "red"}', b'{"sentence": ["a"]}', b'\xff\xfe{"sentences"',
             b'{"sentences": ["a"], "lenpen": 1e999}', b'{"sentences": [null]}', b'{"sentences": ["\\ud800"]')


def request_body(rng: random.Random, kind: str, sentences: list[str], limits: dict) -> bytes:
    if kind == "valid":
        return json.dumps(valid_body(rng, sentences)).encode()
    if kind == "oversized":
        return oversized_body(rng, limits, rng.choice(sentences))
    return rng.choice(MALFORMED)


def send(http: httpx.Client, body: bytes, t0: float, kind: str) -> Outcome:
    """POST /translate; a timeout is a hung request, any other transport failure a lost one."""
    start = time.monotonic()
    try:
        r = http.post("/translate", content=body, headers={"content-type": "application/json"})
        return Outcome(start - t0, kind, r.status_code, time.monotonic() - start)
    except httpx.TimeoutException:
        return Outcome(start - t0, kind, None, time.monotonic() - start, "hung")
    except httpx.TransportError as e:
        return Outcome(start - t0, kind, None, time.monotonic() - start, f"lost: {type(e).__name__}")


def client_loop(url: str, timeout: float, seed: int, limits: dict, sentences: list[str], t0: float,
                stop: threading.Event, out: list[Outcome]) -> None:
    """One client: requests one after another until ``stop`` (list.append is thread-safe)."""
    rng = random.Random(seed)
    kinds, weights = list(KINDS), list(KINDS.values())
    with httpx.Client(base_url=url, timeout=timeout) as http:
        while not stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            out.append(send(http, request_body(rng, kind, sentences, limits), t0, kind))


# ---------------------------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``transduce serve`` in its own process group, so that stopping it stops every process it
    started (its workers, multiprocessing's resource tracker)."""

    def __init__(self, model: Path, port: int, workers: int, threads: int, log: Path,
                 worker_timeout: float | None = None):
        cmd = [sys.executable, "-m", "transduce", "serve", str(model), "--port", str(port),
               "--workers", str(workers), "--threads", str(threads)]
        if worker_timeout is not None:
            cmd += ["--worker-timeout", str(worker_timeout)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.log = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not answer /health within {timeout:g} s: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        return " | ".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int:
        """Ctrl-C to the server (a graceful shutdown), then SIGKILL to its group after 30 s;
        returns how many of its processes were still there afterwards (0 expected)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        pgid = self.proc.pid
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)  # workers notice their parent is gone within PARENT_POLL_S
        left = group_members(pgid)
        if left:
            os.killpg(pgid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        return len(left)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields and fields[4] == str(pgid) and fields[2] != "Z":
                pids.append(int(entry))
    return pids


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields (pid, comm, state, ppid, pgrp, ...); [] if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    comm_end = text.rindex(")")
    return [text[:text.index(" ")], text[text.index("(") + 1:comm_end]] + text[comm_end + 2:].split()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS (kB) and Threads from /proc/PID/status, and the open file descriptors; {} if gone
    (or a zombie: a killed worker not yet reaped has no VmRSS)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    values = dict(line.split(":", 1) for line in lines if ":" in line)
    if "VmRSS" not in values:
        return {}
    return {"rss_kb": int(values["VmRSS"].split()[0]), "threads": int(values["Threads"]), "fds": fds}


def health(url: str) -> dict | None:
    try:
        return httpx.get(url + "/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None


# ---------------------------------------------------------------------------------- monitors

def sampler(server: Server, t0: float, stop: threading.Event, samples: list[dict], errors: list[str]) -> None:
    """Every SAMPLE_EVERY_S: the main process's RSS, threads and fds, each worker's RSS, and the
    restarts /health reports. A failure to sample is counted in the report, not fatal."""
    while not stop.wait(SAMPLE_EVERY_S):
        try:
            samples.append(sample(server, t0))
        except Exception as e:  # noqa: BLE001 - reported as monitor_errors
            errors.append(f"sampler: {type(e).__name__}: {e}")


def sample(server: Server, t0: float) -> dict:
    h = health(server.url)
    workers = (h or {}).get("workers") or {}
    rss = {pid: proc_status(pid).get("rss_kb") for pid in workers.get("pids", [])}
    return {"t": time.monotonic() - t0, "main": proc_status(server.proc.pid), "health_ok": h is not None,
            "workers_rss_kb": {p: v for p, v in rss.items() if v is not None}, "restarts": workers.get("restarts"),
            "hangs": workers.get("hangs")}


def our_worker(server: Server, n: int) -> int | None:
    """The ``n``-th worker /health names (in turn), if it is a child of the server (never another process)."""
    pids = ((health(server.url) or {}).get("workers") or {}).get("pids") or []
    pid = pids[n % len(pids)] if pids else None
    return pid if pid is not None and (proc_stat(pid) or [None] * 4)[3] == str(server.proc.pid) else None


def hanger(server: Server, at: float, t0: float, stop: threading.Event, kills: list[dict]) -> None:
    """SIGSTOP one worker once, ``at`` seconds in: a hung worker (the pool must notice it by the
    batch deadline, replace it and retry its batch)."""
    if stop.wait(max(0.0, t0 + at - time.monotonic())):
        return
    pid = our_worker(server, 0)
    try:
        os.kill(pid, signal.SIGSTOP) if pid is not None else None
    except ProcessLookupError:
        pid = None
    kills.append({"t": round(time.monotonic() - t0, 1), "pid": pid, "killed": False, "stopped": pid is not None})


def killer(server: Server, every: float, t0: float, end: float, stop: threading.Event, kills: list[dict]) -> None:
    """SIGKILL a worker every ``every`` seconds until ``end``, the workers in turn; only a pid
    /health names that is a child of the server (never another process)."""
    n = 0
    while t0 + every * (n + 1) < end and not stop.wait(max(0.0, t0 + every * (n + 1) - time.monotonic())):
        n += 1
        pid = our_worker(server, n)
        ours = pid is not None
        if ours:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                ours = False
        kills.append({"t": round(time.monotonic() - t0, 1), "pid": pid, "killed": ours})


# ---------------------------------------------------------------------------------- main

def soak(args: argparse.Namespace) -> dict:
    port = args.port or free_port()
    sentences = [en for en, _ in generate_pairs(500, SEED)]
    with tempfile.TemporaryDirectory(prefix="transduce-soak-") as tmp:
        server = Server(Path(args.model), port, args.workers, args.threads, Path(tmp) / "server.log",
                        args.worker_timeout)
        outcomes: list[Outcome] = []
        samples: list[dict] = []
        kills: list[dict] = []
        errors: list[str] = []
        stop = threading.Event()
        threads: list[threading.Thread] = []
        left = None
        try:
            limits = server.wait_ready(args.start_timeout)["limits"]
            t0 = time.monotonic()
            threads = [threading.Thread(target=client_loop, daemon=True, name=f"soak-client-{i}",
                                        args=(server.url, args.timeout, SEED + i, limits, sentences, t0, stop,
                                              outcomes)) for i in range(args.clients)]
            threads.append(threading.Thread(target=sampler, args=(server, t0, stop, samples, errors),
                                            daemon=True))
            if args.kill_every > 0:
                end = t0 + 60 * args.minutes
                threads.append(threading.Thread(target=killer, args=(server, args.kill_every, t0, end, stop, kills),
                                                daemon=True))
            if args.hang_at is not None:
                threads.append(threading.Thread(target=hanger, args=(server, args.hang_at, t0, stop, kills),
                                                daemon=True))
            for t in threads:
                t.start()
            stop.wait(max(0.0, t0 + 60 * args.minutes - time.monotonic()))
            if server.proc.poll() is not None:
                raise RuntimeError(f"the server died during the soak: {server.log_tail()}")
        finally:
            stop.set()
            for t in threads:
                t.join(args.timeout + 10)
            if threads:
                samples.append(sample(server, t0))
            left = server.stop()
            log = server.log.read_text(errors="replace")
            if args.out:  # the server's own log beside the report: what a failed soak is read from
                Path(args.out).with_suffix(".server.log").write_text(log, encoding="utf-8")
        result = report(outcomes, samples, kills, args.minutes, left, tuple(errors))
        result["server_log"] = log_summary(log)
    result["settings"] = {"minutes": args.minutes, "clients": args.clients, "kill_every_s": args.kill_every,
                          "hang_at_s": args.hang_at, "worker_timeout_s": args.worker_timeout,
                          "workers": args.workers, "threads_per_worker": args.threads,
                          "client_timeout_s": args.timeout, "mix": KINDS,
                          "date": datetime.date.today().isoformat(), "cpus": os.cpu_count()}
    return result


def log_summary(log: str) -> dict:
    """What the server logged: tracebacks, ERROR lines, and worker deaths it noticed."""
    return {"tracebacks": log.count("Traceback (most recent call last)"),
            "errors": sum(line.startswith("ERROR") or " ERROR " in line for line in log.splitlines()),
            "worker_died_warnings": log.count("a decoding worker process died")}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (e.g. runs/demo/model)")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to drive the server (default: 10)")
    ap.add_argument("--clients", type=int, default=32, help="client threads, each one request at a time (default: 32)")
    ap.add_argument("--kill-every", type=float, default=60.0,
                    help="SIGKILL a worker every this many seconds; 0: never (default: 60)")
    ap.add_argument("--hang-at", type=float, default=None, metavar="S",
                    help="SIGSTOP one worker once, S seconds in (a hung worker; default: none)")
    ap.add_argument("--worker-timeout", type=float, default=None, metavar="S",
                    help="the server's --worker-timeout: how soon a hung worker is replaced (default: its own)")
    ap.add_argument("--port", type=int, default=0, help="server port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--workers", type=int, default=2, help="the server's worker processes (default: 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker (default: 1)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="client-side timeout per request; no answer by then is a hung request (default: 60; "
                         "the server answers 504 after its own 30 s)")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for the server to start")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report to this file")
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.clients < 1 or args.kill_every < 0 or args.workers < 1 or args.timeout <= 0:
        ap.error("--minutes, --clients, --workers and --timeout must be positive, --kill-every >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def terminate(signum, frame):  # SIGTERM: stop as Ctrl-C does (the finally blocks stop the server)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        result = soak(args)
    except KeyboardInterrupt:
        print("soak: interrupted; the server and its workers were stopped", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    text = json.dumps(result, indent=2)
    if args.out:
        write_atomic(args.out, text + "\n")
    print(text)
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
