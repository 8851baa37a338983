"""bench/data_scale.py's peer: Hugging Face ``datasets`` loading both sides as text, encoding and
filtering them with the same SentencePiece model and filter, saving to disk and reading back as a
trainer would. It runs as a child (``data_scale.py _hf_peer ...``), measured from outside."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from data_scale_corpus import MAX_LEN, MAX_RATIO
from data_scale_measure import last_json, measure, tail

SCRIPT = Path(__file__).resolve().with_name("data_scale.py")  # the script the child runs

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
    """``data_scale.py _hf_peer``: load, encode and filter, save, load back and read; JSON out."""
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
    """The peer in a child process, measured: its phases' times and peaks, pairs/s until saved."""
    out, cache = work / "hf_dataset", work / "hf_cache"
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HOME": str(work / "hf_home"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(SCRIPT), "_hf_peer", "--src", str(corpus / "train.en"),
           "--tgt", str(corpus / "train.de"), "--spm", str(spm_model), "--out", str(out), "--cache", str(cache),
           "--num-proc", str(workers)]
    rec = measure(cmd, work / "logs", "hf", env=env, timeout=timeout, interval=interval)
    sampler, spawned = rec.pop("_sampler"), rec.pop("_t0")
    if not rec["ok"]:
        return rec
    try:
        info = last_json(work / "logs" / "hf.stdout")
    except ValueError:  # JSONDecodeError included
        rec.update(ok=False, error="no JSON from the peer", stderr_tail=tail(work / "logs" / "hf.stderr"))
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
