"""bench/data_scale.py's measurements of a child process: wall time, the peak RSS of its whole
process tree (a sampler thread reading /proc), ``wait4``'s ``ru_maxrss``, and the time until its
first training step appears in ``metrics.jsonl``; children left running are killed on exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

_LIVE: dict[int, subprocess.Popen] = {}  # children to kill on exit


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


class Sampler(threading.Thread):
    """Sums VmRSS / RssAnon / RssFile over ``pid`` and its descendants every ``interval`` s."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop_event = threading.Event()
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, summed VmRSS kB, summed RssAnon kB)
        self.peak_rss = self.peak_anon = self.peak_file = self.main_hwm = self.max_procs = 0

    def tree_now(self) -> tuple[int, int, int, int]:
        kids = _children_map()
        todo, pids = [self.pid], []
        while todo:
            p = todo.pop()
            pids.append(p)
            todo.extend(kids.get(p, ()))
        rss = anon = file = 0
        for p in pids:
            s = _status_kb(p)
            if p == self.pid and "VmHWM" in s:
                self.main_hwm = s["VmHWM"]
            rss, anon, file = rss + s.get("VmRSS", 0), anon + s.get("RssAnon", 0), file + s.get("RssFile", 0)
        return rss, anon, file, len(pids)

    def run(self) -> None:
        while not self.stop_event.is_set():
            rss, anon, file, n = self.tree_now()
            self.samples.append((time.monotonic(), rss, anon))
            self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)
            self.peak_file, self.max_procs = max(self.peak_file, file), max(self.max_procs, n)
            self.stop_event.wait(self.interval)

    def peak_between(self, t0: float, t1: float) -> float | None:
        vals = [r for t, r, _ in self.samples if t0 <= t <= t1 + self.interval]  # >= 1 sample per phase
        return _mb(max(vals)) if vals else None


def _mb(kb: float) -> float:
    return round(kb / 1024, 1)


def first_step_in(metrics: Path, after: int) -> int | None:
    """The first logged training step > ``after`` in ``metrics.jsonl`` (None if none yet)."""
    try:
        text = metrics.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue  # a line being written
        if isinstance(step, int) and step > after:
            return step
    return None


def last_json(path: Path) -> dict[str, Any]:
    """The last line of a child's stdout, parsed (ValueError if there is none)."""
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    return json.loads(lines[-1])


def tail(path: Path, n: int = 12) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line[-300:] for line in lines if line.strip()][-n:]


def measure(cmd: list[str], log_dir: Path, name: str, *, env: dict[str, str] | None = None,
            metrics: Path | None = None, after_step: int = 0, stop_at_first_step: bool = False,
            timeout: float = 3600.0, interval: float = 0.05) -> dict[str, Any]:
    """Run ``cmd``; wall time, peak RSS of its process tree, and (with ``metrics``) time to first step."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=str(log_dir), start_new_session=True)
    _LIVE[proc.pid] = proc
    sampler = Sampler(proc.pid, interval)
    sampler.start()
    first_step_s = first_step = rss_at_first = None
    status, usage, killed = None, None, None
    try:
        while True:
            pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage = st, ru
                break
            now = time.monotonic()
            if metrics is not None and first_step_s is None:
                step = first_step_in(metrics, after_step)
                if step is not None:
                    first_step_s, first_step = now - t0, step
                    rss_at_first = _mb(sampler.tree_now()[0])
                    if stop_at_first_step:
                        killed = "stopped after the first step"
                        _kill(proc)
            if now - t0 > timeout and killed is None:
                killed = f"timed out after {timeout:.0f} s"
                _kill(proc)
            time.sleep(0.02)
    finally:
        wall = time.monotonic() - t0
        sampler.stop_event.set()
        sampler.join()
        _LIVE.pop(proc.pid, None)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if metrics is not None and first_step_s is None:  # exited between two polls
        step = first_step_in(metrics, after_step)
        if step is not None:
            first_step_s, first_step = wall, step
    rec = _record(proc.returncode, killed, wall, sampler, usage)
    if metrics is not None:
        rec.update(first_step_s=None if first_step_s is None else round(first_step_s, 2),
                   first_step=first_step, rss_tree_at_first_step_mb=rss_at_first)
    if killed:
        rec["note"] = killed
    if not rec["ok"]:
        rec["cmd"] = " ".join(cmd)
        rec["stderr_tail"] = tail(err_path)
    rec["_sampler"], rec["_t0"] = sampler, t0
    return rec


def _record(returncode: int, killed: str | None, wall: float, sampler: Sampler, usage) -> dict[str, Any]:
    """A finished child's return code, wall time and memory peaks."""
    return {
        "ok": returncode == 0 or killed == "stopped after the first step",
        "returncode": returncode, "wall_s": round(wall, 2),
        # the sampler can miss a short spike; the main process's own high-water mark cannot
        "peak_rss_mb": _mb(max(sampler.peak_rss, sampler.main_hwm)),
        "peak_rss_tree_mb": _mb(sampler.peak_rss), "peak_rss_anon_tree_mb": _mb(sampler.peak_anon),
        "peak_rss_file_tree_mb": _mb(sampler.peak_file), "main_vmhwm_mb": _mb(sampler.main_hwm),
        "maxrss_wait4_mb": _mb(usage.ru_maxrss) if usage else None, "max_processes": sampler.max_procs,
    }


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all() -> None:
    for proc in list(_LIVE.values()):
        _kill(proc)
        try:
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass
    _LIVE.clear()
