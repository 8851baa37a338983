"""bench/data_scale.py's corpora: sizes (``0.1M``), Multi30k repeated with seeded perturbations
to any size, a seeded streaming sample, and the pair filter every system applies."""

from __future__ import annotations

import gzip
import random
import time
from pathlib import Path
from typing import Any

MAX_LEN, MAX_RATIO = 250, 3.0  # the pair filter: longer than MAX_LEN, or a length ratio above MAX_RATIO, is dropped


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
