"""Data path at scale: ``transduce prepare`` + training from a prepared directory, against the
Hugging Face ``datasets`` peer and today's in-memory path, on corpora of 0.1M to 4.5M pairs.

Corpora are generated on the fly into a temporary directory (never the repo): Multi30k's
training pairs repeated, every repetition after the first lightly perturbed (seeded: a word
dropped, duplicated, swapped with its neighbour or re-cased, on each side independently, and
sometimes the same number token appended to both sides). One joint BPE SentencePiece model
(``--vocab``, 32k; smaller with a note if the text cannot fill it) is trained once, on a sample
of the largest corpus, and every system uses it. For each size, in this one process, side by
side:

- ``transduce``: ``transduce prepare CONFIG --set data.tokenizer=TOK --out DATA`` (wall time,
  peak RSS of the process tree, pairs/s); ``transduce train`` with ``data.prepared=DATA`` for
  ``--steps`` steps (time from spawn to the first step, peak RSS); ``train --resume`` for
  ``--resume-steps`` more (time to the first new step). At the smallest size also ``train``
  without ``data.prepared`` (it prepares into the run directory itself): time to first step.
- ``hf``: ``datasets.load_dataset("text")`` of both sides, ``map(encode+filter, batched,
  num_proc=--workers)`` with the same SentencePiece model and transduce's filter (empty,
  longer than ``max_len``, ratio > ``max_ratio``), ``save_to_disk``, then ``load_from_disk`` and
  the reads a trainer makes (length columns into numpy, random rows): time and peak RSS of
  each phase, and pairs/s through ``save_to_disk``.
- ``baseline``: today's in-memory path (``git archive --baseline-rev src``, run with
  ``PYTHONPATH``), only at ``--baseline-sizes`` (it holds every pair as Python lists: ~20 GB at
  4.5M pairs), with the tokenizer copied into its run directory: time to first step, peak RSS,
  time to first step after ``--resume``.

Every measured command runs as a child process; a sampler thread sums VmRSS / RssAnon of the
child and all its descendants every ``--sample-ms`` (forked workers share pages, so the summed
VmRSS over-counts them; RssAnon is the closer figure for those), and the child's own
``ru_maxrss`` comes from ``wait4``. "Time to first step" is from spawn until
``RUN/metrics.jsonl`` holds the step (1, or the first one after the checkpoint on resume;
resumes log every step). A child that fails is recorded with its return code and the tail of
its stderr, and the run goes on.

Derived figures and the issue's targets (``verdicts``): prepare pairs/s over the ``datasets``
peer's (>= 1.5x); prepare pairs/s at each size against the smallest (linear: within +-20%);
training peak RSS at each size against the smallest (<= +10%) and above the model + Adam state
(< 1.5 GB); first step within 10 s of start, from a prepared directory and after ``--resume``.

Prints one JSON object; ``--plot PATH.png`` also draws RSS and time against corpus size.

Usage:
    python bench/data_scale.py --plot data_scale.png > data_scale.json        # 0.1M, 1M, 4.5M
    python bench/data_scale.py --sizes 0.1M --baseline-sizes 0.1M               # one size
    python bench/data_scale.py --dry                                            # CI smoke (2K, 5K)
    python bench/data_scale.py --baseline-rev 2c8c17d --baseline-sizes 0.1M,1M --keep --workdir /tmp/ds
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAX_LEN, MAX_RATIO = 250, 3.0
TRAIN_SETTINGS = dict(device="cpu", log_every=10, eval_every=100000, save_every=50, eval_bleu=False,
                      num_threads=2, warmup_steps=4000, keep_last=2)
_LIVE: dict[int, subprocess.Popen] = {}  # children to kill on exit


# ---- sizes, corpus --------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """``"0.1M"`` -> 100000, ``"2K"`` -> 2000, ``"500"`` -> 500."""
    t = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(t[-1:], 1)
    return int(round(float(t[:-1] if scale > 1 else t) * scale))


def size_label(n: int) -> str:
    if n >= 100_000:
        return f"{n / 1e6:g}M"
    return f"{n / 1e3:g}K" if n >= 1_000 else str(n)


def _read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def _perturb(line: str, rng: random.Random) -> str:
    """One light edit of ``line``: drop / duplicate / swap / re-case a word (never empties it)."""
    words = line.split()
    n = len(words)
    if n == 0:
        return line
    op = rng.randrange(4)
    i = rng.randrange(n)
    if op == 0 and n > 3:
        del words[i]
    elif op == 1:
        words.insert(i, words[i])
    elif op == 2 and n > 1:
        i = min(i, n - 2)
        words[i], words[i + 1] = words[i + 1], words[i]
    else:
        w = words[i]
        words[i] = w.lower() if w[:1].isupper() else w.capitalize()
    return " ".join(words)


def generate_corpus(m30: Path, n: int, out_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Write ``n`` pairs (``train.en``/``train.de``, plain UTF-8) into ``out_dir``, streaming.

    The first 29,000 are Multi30k's own; every later repetition perturbs each side once (and,
    one pair in five, appends the same number token to both). Deterministic in ``seed``, and a
    smaller ``n`` gives a prefix of a larger one.
    """
    t0 = time.monotonic()
    src, tgt = _read_gz(m30 / "train.en.gz"), _read_gz(m30 / "train.de.gz")
    if len(src) != len(tgt) or not src:
        raise SystemExit(f"{m30}: train.en.gz / train.de.gz are empty or misaligned")
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    written, chunk = 0, 20000
    with open(out_dir / "train.en", "w", encoding="utf-8", buffering=1 << 20) as fs, \
            open(out_dir / "train.de", "w", encoding="utf-8", buffering=1 << 20) as ft:
        rep = 0
        while written < n:
            for start in range(0, len(src), chunk):
                if written >= n:
                    break
                s_part = src[start:start + min(chunk, n - written)]
                t_part = tgt[start:start + len(s_part)]
                if rep > 0:
                    s_out, t_out = [], []
                    for s, t in zip(s_part, t_part):
                        s, t = _perturb(s, rng), _perturb(t, rng)
                        if rng.random() < 0.2:
                            num = str(rng.randrange(10000))
                            s, t = f"{s} {num}", f"{t} {num}"
                        s_out.append(s)
                        t_out.append(t)
                    s_part, t_part = s_out, t_out
                fs.write("\n".join(s_part) + "\n")
                ft.write("\n".join(t_part) + "\n")
                written += len(s_part)
            rep += 1
    size_mb = sum((out_dir / f).stat().st_size for f in ("train.en", "train.de")) / 2**20
    return {"pairs": written, "seconds": round(time.monotonic() - t0, 2), "mb": round(size_mb, 1)}


def sample_lines(path: Path, n_total: int, k: int, seed: int) -> list[str]:
    """A seeded sample of ``k`` lines of a ``n_total``-line file, in file order, streaming."""
    picked = sorted(random.Random(seed).sample(range(n_total), k)) if k < n_total else None
    out = []
    with open(path, encoding="utf-8") as f:
        if picked is None:
            return [line.rstrip("\n") for line in f]
        it = iter(picked)
        nxt = next(it, None)
        for i, line in enumerate(f):
            if i == nxt:
                out.append(line.rstrip("\n"))
                nxt = next(it, None)
                if nxt is None:
                    break
    return out


# ---- measuring a child process ---------------------------------------------------------------

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


def _first_step(metrics: Path, after: int) -> int | None:
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


def _last_json(path: Path) -> dict[str, Any]:
    """The last line of a child's stdout, parsed (ValueError if there is none)."""
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    return json.loads(lines[-1])


def _tail(path: Path, n: int = 12) -> list[str]:
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
                step = _first_step(metrics, after_step)
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
        step = _first_step(metrics, after_step)
        if step is not None:
            first_step_s, first_step = wall, step
    rec: dict[str, Any] = {
        "ok": proc.returncode == 0 or killed == "stopped after the first step",
        "returncode": proc.returncode, "wall_s": round(wall, 2),
        # the sampler can miss a short spike; the main process's own high-water mark cannot
        "peak_rss_mb": _mb(max(sampler.peak_rss, sampler.main_hwm)),
        "peak_rss_tree_mb": _mb(sampler.peak_rss), "peak_rss_anon_tree_mb": _mb(sampler.peak_anon),
        "peak_rss_file_tree_mb": _mb(sampler.peak_file), "main_vmhwm_mb": _mb(sampler.main_hwm),
        "maxrss_wait4_mb": _mb(usage.ru_maxrss) if usage else None, "max_processes": sampler.max_procs,
    }
    if metrics is not None:
        rec.update(first_step_s=None if first_step_s is None else round(first_step_s, 2),
                   first_step=first_step, rss_tree_at_first_step_mb=rss_at_first)
    if killed:
        rec["note"] = killed
    if not rec["ok"]:
        rec["cmd"] = " ".join(cmd)
        rec["stderr_tail"] = _tail(err_path)
    rec["_sampler"], rec["_t0"] = sampler, t0
    return rec


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_all() -> None:
    for proc in list(_LIVE.values()):
        _kill(proc)
        try:
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, ChildProcessError):
            pass
    _LIVE.clear()


# ---- the Hugging Face datasets peer (runs as a child: ``data_scale.py _hf_peer ...``) ----------

_SP = None


def _hf_encode(batch: dict[str, list], model: str, max_len: int, max_ratio: float) -> dict[str, list]:
    global _SP
    if _SP is None:
        import sentencepiece
        _SP = sentencepiece.SentencePieceProcessor(model_file=model)
    src, tgt = _SP.encode(batch["src"], out_type=int), _SP.encode(batch["tgt"], out_type=int)
    out: dict[str, list] = {"src_ids": [], "tgt_ids": [], "src_len": [], "tgt_len": []}
    for s, t in zip(src, tgt):
        ns, nt = len(s), len(t)
        if ns == 0 or nt == 0 or ns > max_len or nt > max_len or max(ns, nt) > max_ratio * min(ns, nt):
            continue  # transduce's filter: empty, too long, bad ratio
        out["src_ids"].append(s)
        out["tgt_ids"].append(t)
        out["src_len"].append(ns)
        out["tgt_len"].append(nt)
    return out


def hf_peer(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="data_scale.py _hf_peer")
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--spm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=MAX_LEN)
    ap.add_argument("--max-ratio", type=float, default=MAX_RATIO)
    ap.add_argument("--touch-rows", type=int, default=20000)
    a = ap.parse_args(argv)
    import datasets
    import numpy as np

    datasets.disable_progress_bars()
    phases: dict[str, list[float]] = {}

    def mark(name: str) -> None:
        phases[name] = [time.monotonic()]

    def done(name: str) -> None:
        phases[name].append(time.monotonic())

    mark("load_text")
    src = datasets.load_dataset("text", data_files=a.src, split="train", cache_dir=a.cache)
    tgt = datasets.load_dataset("text", data_files=a.tgt, split="train", cache_dir=a.cache)
    ds = datasets.concatenate_datasets([src.rename_column("text", "src"), tgt.rename_column("text", "tgt")], axis=1)
    n_in = len(ds)
    done("load_text")
    mark("map")
    ds = ds.map(_hf_encode, batched=True, batch_size=1000, num_proc=a.num_proc, remove_columns=["src", "tgt"],
                fn_kwargs=dict(model=a.spm, max_len=a.max_len, max_ratio=a.max_ratio))
    done("map")
    mark("save")
    ds.save_to_disk(a.out)
    done("save")
    del ds, src, tgt
    mark("load_back")
    back = datasets.load_from_disk(a.out)
    src_len = np.asarray(back.data.column("src_len").to_numpy())
    tgt_len = np.asarray(back.data.column("tgt_len").to_numpy())
    rows = sorted(random.Random(0).sample(range(len(back)), min(a.touch_rows, len(back))))
    touched = 0
    for i in range(0, len(rows), 256):  # batches of random rows, as a trainer's sampler reads them
        batch = back[rows[i:i + 256]]
        touched += sum(len(x) for x in batch["src_ids"]) + sum(len(x) for x in batch["tgt_ids"])
    done("load_back")
    disk = sum(p.stat().st_size for p in Path(a.out).rglob("*") if p.is_file())
    print(json.dumps({"pairs_in": n_in, "pairs_kept": len(back), "phases": phases, "saved_at": phases["save"][1],
                      "tokens": int(src_len.sum() + tgt_len.sum()), "touched_tokens": touched,
                      "disk_mb": round(disk / 2**20, 1), "datasets": datasets.__version__}))


def run_hf(corpus: Path, spm_model: Path, work: Path, workers: int, timeout: float, interval: float,
           n: int) -> dict[str, Any]:
    out, cache = work / "hf_dataset", work / "hf_cache"
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HOME": str(work / "hf_home"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_hf_peer", "--src", str(corpus / "train.en"),
           "--tgt", str(corpus / "train.de"), "--spm", str(spm_model), "--out", str(out), "--cache", str(cache),
           "--num-proc", str(workers)]
    rec = measure(cmd, work / "logs", "hf", env=env, timeout=timeout, interval=interval)
    sampler, spawned = rec.pop("_sampler"), rec.pop("_t0")
    if not rec["ok"]:
        return rec
    try:
        info = _last_json(work / "logs" / "hf.stdout")
    except ValueError:  # JSONDecodeError included
        rec.update(ok=False, error="no JSON from the peer", stderr_tail=_tail(work / "logs" / "hf.stderr"))
        return rec
    phases = {}
    for name, (t0, t1) in info.pop("phases").items():
        phases[name] = {"seconds": round(t1 - t0, 2), "peak_rss_tree_mb": sampler.peak_between(t0, t1)}
    # from spawn (interpreter start and imports included, as in ``prepare``'s wall time) until saved
    to_saved = info["saved_at"] - spawned
    work_s = sum(phases[k]["seconds"] for k in ("load_text", "map", "save"))
    rec.update(info, phases=phases, seconds_to_saved=round(to_saved, 2), pairs_per_s=round(n / to_saved, 1),
               pairs_per_s_excluding_startup=round(n / work_s, 1) if work_s > 0 else None)
    rec.pop("saved_at")
    return rec


# ---- the runs --------------------------------------------------------------------------------

def write_config(path: Path, corpus: Path, m30: Path, vocab: int, max_tokens: int, steps: int) -> None:
    import yaml

    cfg = {
        "model": {"preset": "tiny"},
        "data": {"corpus": "files", "train_src": str(corpus / "train.en"), "train_tgt": str(corpus / "train.de"),
                 "valid_src": str(m30 / "val.en.gz"), "valid_tgt": str(m30 / "val.de.gz"),
                 "src_lang": "en", "tgt_lang": "de", "vocab_size": vocab, "max_len": MAX_LEN,
                 "max_ratio": MAX_RATIO, "max_tokens": max_tokens, "valid_max_sentences": 200},
        "train": {**TRAIN_SETTINGS, "max_steps": steps},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")


def train_pair(python_env: dict[str, str], config: Path, run: Path, sets: list[str], steps: int, resume_steps: int,
               logs: Path, tag: str, timeout: float, interval: float, do_resume: bool = True) -> dict[str, Any]:
    """``train`` for ``steps`` steps then ``train --resume`` to ``resume_steps``: both measured."""
    cli = [sys.executable, "-m", "transduce.cli", "train"]
    sets_args = [x for s in sets for x in ("--set", s)]
    first = measure([*cli, str(config), "--out", str(run), *sets_args], logs, f"{tag}_train", env=python_env,
                    metrics=run / "metrics.jsonl", timeout=timeout, interval=interval)
    first.pop("_sampler")
    rec: dict[str, Any] = {"train": first}
    if not do_resume:
        return rec
    if not first["ok"]:
        rec["resume"] = {"ok": False, "skipped": "train failed"}
        return rec
    res = measure([*cli, "--out", str(run), "--resume", "--set", f"train.max_steps={resume_steps}",
                   "--set", "train.log_every=1"], logs, f"{tag}_resume", env=python_env,
                  metrics=run / "metrics.jsonl", after_step=steps, timeout=timeout, interval=interval)
    res.pop("_sampler")
    rec["resume"] = res
    return rec


def train_tokenizer_child(argv: list[str]) -> None:
    """``data_scale.py _train_tok``: the shared joint BPE model, and the training model's state size."""
    ap = argparse.ArgumentParser(prog="data_scale.py _train_tok")
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--lines", type=int, required=True, help="lines in each file")
    ap.add_argument("--sample", type=int, required=True, help="lines per side to train on")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import transduce
    from transduce.config import model_preset
    from transduce.data.tokenizer import Tokenizer
    from transduce.model import Transformer

    t0 = time.monotonic()
    k = min(a.sample, a.lines)
    src = sample_lines(Path(a.src), a.lines, k, a.seed)
    tgt = sample_lines(Path(a.tgt), a.lines, k, a.seed + 1)
    tok = Tokenizer.train(src, tgt, a.out, vocab_size=a.vocab, model_type="bpe", joint=True, seed=a.seed)
    seconds = time.monotonic() - t0
    vocab = tok.src_vocab_size
    params = sum(p.numel() for p in Transformer(model_preset("tiny", src_vocab_size=vocab,
                                                             tgt_vocab_size=vocab)).parameters())
    print(json.dumps({"vocab": vocab, "lines_per_side": k, "train_seconds": round(seconds, 2),
                      "model_params": params, "transduce_from": str(Path(transduce.__file__).parent)}))


def train_tokenizer(corpus: Path, n: int, args: argparse.Namespace, out: Path, work: Path,
                    baseline_src: Path | None) -> dict[str, Any]:
    """Train the shared tokenizer in a child, with this tree's transduce (or, if that cannot be
    imported, e.g. mid-change, the baseline revision's: the same SentencePiece training)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "_train_tok", "--src", str(corpus / "train.en"),
           "--tgt", str(corpus / "train.de"), "--lines", str(n), "--sample", str(args.tok_sample),
           "--out", str(out), "--vocab", str(args.vocab), "--seed", str(args.seed)]
    tries = [("repo", ROOT / "src")] + ([("baseline", baseline_src)] if baseline_src else [])
    failures = []
    for name, src in tries:
        env = {**os.environ, "PYTHONPATH": str(src)}
        rec = measure(cmd, work / "logs", f"tokenizer_{name}", env=env, timeout=args.child_timeout)
        rec.pop("_sampler")
        if rec["ok"]:
            try:
                rec.update(_last_json(work / "logs" / f"tokenizer_{name}.stdout"))
                if failures:
                    rec["repo_tree_failed"] = failures
                return rec
            except ValueError:
                rec.update(ok=False, error="no JSON from the tokenizer child")
        failures.append(rec)
    raise SystemExit("data_scale: cannot train the shared tokenizer: " + json.dumps(failures)[-2000:])


def bench_size(n: int, args: argparse.Namespace, work: Path, tok_dir: Path, vocab: int, smallest: bool,
               baseline_src: Path | None) -> dict[str, Any]:
    label = size_label(n)
    sdir = work / f"s{label}"
    corpus = sdir / "corpus"
    rec: dict[str, Any] = {"pairs": n, "label": label}
    rec["corpus"] = generate_corpus(args.multi30k, n, corpus, args.seed)
    config = sdir / "config.yaml"
    write_config(config, corpus, args.multi30k, vocab, args.max_tokens, args.steps)
    logs = sdir / "logs"
    new_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    kw = dict(timeout=args.child_timeout, interval=args.sample_ms / 1000)

    # transduce: prepare, then train from the prepared directory, then resume
    prep_dir = sdir / "prepared"
    prep = measure([sys.executable, "-m", "transduce.cli", "prepare", str(config), "--set", f"data.tokenizer={tok_dir}",
                    "--out", str(prep_dir), "--workers", str(args.workers)], logs, "prepare", env=new_env, **kw)
    prep.pop("_sampler")
    if prep["ok"]:
        prep["pairs_per_s"] = round(n / prep["wall_s"], 1)
        manifest = prep_dir / "manifest.json"
        if manifest.is_file():
            prep["manifest_bytes"] = manifest.stat().st_size
        prep["disk_mb"] = round(sum(p.stat().st_size for p in prep_dir.rglob("*") if p.is_file()) / 2**20, 1)
    new: dict[str, Any] = {"prepare": prep}
    if prep["ok"]:
        new.update(train_pair(new_env, config, sdir / "run_new", [f"data.prepared={prep_dir}"], args.steps,
                              args.resume_steps, logs, "new", **kw))
    else:
        new["train"] = new["resume"] = {"ok": False, "skipped": "prepare failed"}
    if smallest:  # train straight from text: it prepares into the run directory itself
        direct = measure([sys.executable, "-m", "transduce.cli", "train", str(config), "--out",
                          str(sdir / "run_direct"), "--set", f"data.tokenizer={tok_dir}"], logs, "new_direct",
                         env=new_env, metrics=sdir / "run_direct" / "metrics.jsonl", stop_at_first_step=True, **kw)
        direct.pop("_sampler")
        new["train_unprepared"] = direct
    rec["transduce"] = new
    if not args.keep:
        shutil.rmtree(sdir / "run_direct", ignore_errors=True)

    # Hugging Face datasets
    if args.no_hf:
        rec["hf"] = {"ok": False, "skipped": "--no-hf"}
    elif not _importable("datasets"):
        rec["hf"] = {"ok": False, "skipped": "datasets is not installed (pip install datasets)"}
    else:
        rec["hf"] = run_hf(corpus, tok_dir / "spm.model", sdir, args.workers, args.child_timeout,
                           args.sample_ms / 1000, n)
        if not args.keep:
            shutil.rmtree(sdir / "hf_dataset", ignore_errors=True)
            shutil.rmtree(sdir / "hf_cache", ignore_errors=True)

    # today's in-memory path
    if baseline_src is None:
        rec["baseline"] = {"ok": False, "skipped": "no --baseline-rev"}
    elif n not in args.baseline_sizes:
        rec["baseline"] = {"ok": False, "skipped": "size not in --baseline-sizes (the in-memory path holds every pair "
                                                   "as Python lists; ~20 GB at 4.5M pairs)"}
    else:
        run = sdir / "run_old"
        shutil.copytree(tok_dir, run / "tokenizer")
        old_env = {**os.environ, "PYTHONPATH": str(baseline_src)}
        rec["baseline"] = train_pair(old_env, config, run, [], args.steps, args.resume_steps, logs, "old", **kw)
    if not args.keep:
        shutil.rmtree(sdir, ignore_errors=True)
    return rec


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def _get(d: dict, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def derive(results: list[dict[str, Any]], state_mb: float | None) -> dict[str, Any]:
    """Ratios against the peer and the smallest size, and the issue's targets as booleans."""
    base = results[0]
    base_pps = _get(base, "transduce", "prepare", "pairs_per_s")
    base_rss = _get(base, "transduce", "train", "peak_rss_mb")
    per_size, verdicts = {}, {}
    for r in results:
        pps = _get(r, "transduce", "prepare", "pairs_per_s")
        hf_pps = _get(r, "hf", "pairs_per_s")
        rss = _get(r, "transduce", "train", "peak_rss_mb")
        d = {
            "prepare_vs_hf_pairs_per_s": round(pps / hf_pps, 2) if pps and hf_pps else None,
            "prepare_pairs_per_s_vs_smallest": round(pps / base_pps, 3) if pps and base_pps else None,
            "train_rss_vs_smallest_pct": round(100 * (rss / base_rss - 1), 1) if rss and base_rss else None,
            "train_rss_beyond_model_state_mb": round(rss - state_mb, 1) if rss and state_mb else None,
            "first_step_vs_baseline": _ratio(_get(r, "transduce", "train", "first_step_s"),
                                             _get(r, "baseline", "train", "first_step_s")),
            "train_rss_vs_baseline": _ratio(rss, _get(r, "baseline", "train", "peak_rss_mb")),
        }
        per_size[r["label"]] = d
        first = _get(r, "transduce", "train", "first_step_s")
        resumed = _get(r, "transduce", "resume", "first_step_s")
        verdicts[r["label"]] = {
            "prepare_at_least_1_5x_hf": None if d["prepare_vs_hf_pairs_per_s"] is None
            else d["prepare_vs_hf_pairs_per_s"] >= 1.5,
            "prepare_linear_within_20pct": None if d["prepare_pairs_per_s_vs_smallest"] is None
            else abs(d["prepare_pairs_per_s_vs_smallest"] - 1) <= 0.20,
            "train_rss_within_10pct_of_smallest": None if d["train_rss_vs_smallest_pct"] is None
            else d["train_rss_vs_smallest_pct"] <= 10.0,
            "train_rss_under_1_5gb_beyond_model_state": None if d["train_rss_beyond_model_state_mb"] is None
            else d["train_rss_beyond_model_state_mb"] < 1536,
            "first_step_within_10s": None if first is None else first <= 10.0,
            "first_step_after_resume_within_10s": None if resumed is None else resumed <= 10.0,
        }
    flat = [v for vs in verdicts.values() for v in vs.values()]
    return {"per_size": per_size, "verdicts": verdicts,
            "all_targets_met": None if any(v is None for v in flat) else all(flat)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def plot(results: list[dict[str, Any]], path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))

    def series(ax, keys: tuple[str, ...], label: str, marker: str) -> None:
        pts = [(r["pairs"], _get(r, *keys)) for r in results]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=label)

    series(ax1, ("transduce", "train", "peak_rss_mb"), "transduce train (prepared)", "o")
    series(ax1, ("baseline", "train", "peak_rss_mb"), "today's train (in memory)", "s")
    series(ax1, ("transduce", "prepare", "peak_rss_mb"), "transduce prepare", "^")
    series(ax1, ("hf", "peak_rss_mb"), "datasets (map+save+load)", "v")
    series(ax2, ("transduce", "prepare", "wall_s"), "transduce prepare", "^")
    series(ax2, ("hf", "seconds_to_saved"), "datasets through save_to_disk", "v")
    series(ax2, ("transduce", "train", "first_step_s"), "first step, prepared", "o")
    series(ax2, ("baseline", "train", "first_step_s"), "first step, today's", "s")
    for ax, ylabel in ((ax1, "peak RSS, process tree (MB)"), (ax2, "time (s)")):
        ax.set_xscale("log")
        ax.set_xlabel("corpus size (pairs)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax2.set_yscale("log")
    fig.suptitle("transduce data path at scale (2-core CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def environment(args: argparse.Namespace) -> dict[str, Any]:
    from importlib import metadata

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        rev, dirty = None, None
    return {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": version("torch"),
            "sentencepiece": version("sentencepiece"), "datasets": version("datasets"),
            "repo_rev": rev, "src_dirty": dirty, "command": " ".join([Path(sys.executable).name, *sys.argv])}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("_hf_peer", "_train_tok"):
        (hf_peer if sys.argv[1] == "_hf_peer" else train_tokenizer_child)(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help="corpus sizes, comma-separated (K/M suffixes); default 0.1M,1M,4.5M")
    ap.add_argument("--vocab", type=int, default=None, help="joint BPE vocabulary (default 32000; 500 with --dry)")
    ap.add_argument("--tok-sample", type=int, default=200000, help="tokenizer training lines per side")
    ap.add_argument("--multi30k", type=Path, default=None,
                    help="Multi30k folder (train.{en,de}.gz, val.{en,de}.gz); default $TRANSDUCE_MULTI30K "
                         "or ../shared/data/multi30k")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder and every size's files")
    ap.add_argument("--baseline-rev", default=None, help="git revision of today's in-memory path (default 2c8c17d; "
                                                        "none with --dry unless given)")
    ap.add_argument("--baseline-sizes", default="0.1M,1M", help="sizes to run the in-memory path at")
    ap.add_argument("--no-hf", action="store_true", help="skip the datasets peer")
    ap.add_argument("--workers", type=int, default=2, help="prepare --workers and datasets num_proc")
    ap.add_argument("--steps", type=int, default=None, help="training steps before the resume (default 50)")
    ap.add_argument("--resume-steps", type=int, default=None, help="total steps after --resume (default 60)")
    ap.add_argument("--max-tokens", type=int, default=None, help="data.max_tokens of the training runs (1024)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-ms", type=float, default=50.0, help="RSS sampling interval")
    ap.add_argument("--child-timeout", type=float, default=3600.0, help="seconds before a child is killed")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG of RSS and time against size")
    ap.add_argument("--dry", action="store_true", help="CI smoke: sizes 2K,5K, vocab 500, 10+2 steps")
    args = ap.parse_args()
    dry = args.dry
    args.sizes = sorted({parse_size(s) for s in (args.sizes or ("2K,5K" if dry else "0.1M,1M,4.5M")).split(",")})
    args.baseline_sizes = {parse_size(s) for s in args.baseline_sizes.split(",") if s.strip()}
    args.vocab = args.vocab or (500 if dry else 32000)
    args.steps = args.steps or (10 if dry else 50)
    args.resume_steps = args.resume_steps or (args.steps + (2 if dry else 10))
    args.max_tokens = args.max_tokens or (512 if dry else 1024)
    if args.baseline_rev is None and not dry:
        args.baseline_rev = "2c8c17d"
    if args.multi30k is None:
        env_root = os.environ.get("TRANSDUCE_MULTI30K")
        args.multi30k = Path(env_root) if env_root else ROOT.parent / "shared" / "data" / "multi30k"
    args.multi30k = args.multi30k.resolve()
    for f in ("train.en.gz", "train.de.gz", "val.en.gz", "val.de.gz"):
        if not (args.multi30k / f).is_file():
            ap.error(f"--multi30k: {args.multi30k / f} not found")
    TRAIN_SETTINGS["save_every"] = args.steps

    work = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="data_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    if ROOT in work.parents or work == ROOT:
        ap.error("--workdir: corpora must not be written into the repository")
    cleanup = not args.keep
    atexit.register(_kill_all)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report: dict[str, Any] = {"environment": environment(args), "workdir": str(work) if args.keep else None,
                              "settings": {"sizes": args.sizes, "vocab": args.vocab, "steps": args.steps,
                                           "resume_steps": args.resume_steps, "max_tokens": args.max_tokens,
                                           "workers": args.workers, "model": "tiny", "max_len": MAX_LEN,
                                           "max_ratio": MAX_RATIO, "baseline_rev": args.baseline_rev,
                                           "baseline_sizes": sorted(args.baseline_sizes), "dry": dry}}
    try:
        baseline_src = None
        if args.baseline_rev:
            baseline_src = work / "baseline_src"
            baseline_src.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline_rev, "src"],
                                     capture_output=True)
            if archive.returncode != 0:
                report["baseline_error"] = archive.stderr.decode(errors="replace").strip()
                baseline_src = None
            else:
                subprocess.run(["tar", "-x", "-C", str(baseline_src)], input=archive.stdout, check=True)
                baseline_src = baseline_src / "src"

        # one tokenizer for every system: trained on a sample of the largest corpus
        largest = max(args.sizes)
        tok_corpus, tok_dir = work / "tok_corpus", work / "tokenizer"
        gen = generate_corpus(args.multi30k, largest, tok_corpus, args.seed)
        tok = train_tokenizer(tok_corpus, largest, args, tok_dir, work, baseline_src)
        shutil.rmtree(tok_corpus, ignore_errors=True)
        vocab = tok["vocab"]
        state_mb = round(tok["model_params"] * 4 * 4 / 2**20, 1)
        report["tokenizer"] = {"requested_vocab": args.vocab, "vocab": vocab,
                               "fell_back_to_smaller_vocab": vocab < args.vocab,
                               "trained_on_lines_per_side": tok["lines_per_side"],
                               "train_seconds": tok["train_seconds"], "peak_rss_mb": tok["peak_rss_mb"],
                               "transduce_from": tok["transduce_from"],
                               f"corpus_generation_{size_label(largest)}": gen}
        if "repo_tree_failed" in tok:
            report["tokenizer"]["repo_tree_failed"] = [
                {"returncode": f["returncode"], "stderr_tail": f.get("stderr_tail", [])[-3:]}
                for f in tok["repo_tree_failed"]]
        report["model_state_mb"] = state_mb
        report["model_params"] = tok["model_params"]

        results = []
        for i, n in enumerate(args.sizes):
            results.append(bench_size(n, args, work, tok_dir, vocab, i == 0, baseline_src))
            print(f"[data_scale] {size_label(n)} done", file=sys.stderr, flush=True)
        report["results"] = [_clean(r) for r in results]
        report["derived"] = derive(results, state_mb)
        if args.plot:
            note = plot(results, args.plot)
            report["plot"] = note or str(args.plot)
    finally:
        _kill_all()
        if cleanup:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=1))


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


if __name__ == "__main__":
    main()
