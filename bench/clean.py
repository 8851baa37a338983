"""``transduce clean`` measured (issue 58): each rule's precision and recall on injected noise,
language identification accuracy and speed, and rule-based throughput and peak memory.

- ``noise``: Multi30k en-de training data with ``--rate`` (25%) injected noise made from its own
  files, seeded, written outside the repo (``--out``): ``train.en``, ``train.de`` and ``labels``
  (one word a line: ``clean`` or the noise kind). Kinds, in equal parts: ``shuffled`` (a German
  line of another pair), ``wrong_lang`` (the French or the Czech side in the German's place),
  ``copy`` (the English side as the target), ``duplicate`` (an earlier pair again, half of them
  re-cased or re-punctuated), ``truncated`` (the German cut to 25-55% of its words).
- ``score``: clean the noised corpus with ``transduce clean`` and score each rule: of the pairs
  it removed, the share that was injected noise (precision) and of its target kind; of its target
  kind, the share it removed (recall); and every kind's recall by any rule.
- ``langid``: accuracy and sentences/s of py3langid (all 97 languages; restricted to en/de/fr/cs),
  pycld2 and lingua (where installed) on the Multi30k test sentences in en, de, fr and cs.
- ``speed``: pairs/s and peak RSS of ``clean`` with ``--workers`` processes on ``--size`` pairs made
  as bench/data_scale.py makes its corpus (Multi30k repeated, perturbed), rule-based alone and with
  language identification.

Prints one JSON object. Usage:
    python bench/clean.py all --m30 ../shared/data/multi30k --work /tmp/clean-bench   # (or TRANSDUCE_MULTI30K)
    python bench/clean.py speed --size 4.5M --work /tmp/clean-bench
    python bench/clean.py all --dry          # seconds: 3,000 pairs of noise, 20K pairs of speed
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_scale import generate_corpus, parse_size  # noqa: E402

from transduce.config.clean import CleanConfig  # noqa: E402
from transduce.data.clean import clean_files  # noqa: E402

KINDS = ("shuffled", "wrong_lang", "copy", "duplicate", "truncated")
TARGETS = {"lang": "wrong_lang", "copy": "copy", "duplicate": "duplicate", "near_duplicate": "duplicate",
           "ratio": "truncated"}  # each rule's noise kind; the others target none of the injected kinds


def _read(m30: Path, split: str, lang: str, limit: int | None = None) -> list[str]:
    with gzip.open(m30 / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def _noisy(pair: tuple[str, str], kind: str, sides: dict[str, list[str]], i: int, rng: random.Random,
           kept: list[tuple[str, str]]) -> tuple[str, str]:
    en, de = pair
    if kind == "shuffled":
        return en, sides["de"][rng.randrange(len(sides["de"]))]
    if kind == "wrong_lang":
        return en, sides[rng.choice(("fr", "cs"))][i]
    if kind == "copy":
        return en, en
    if kind == "duplicate":
        s, t = kept[rng.randrange(len(kept))]
        if rng.random() < 0.5:
            s, t = s.lower(), t.rstrip(".") + (" ." if t.endswith(".") else "")
        return s, t
    words = de.split()
    return en, " ".join(words[:max(1, round(len(words) * rng.uniform(0.25, 0.55)))])


def make_noise(m30: Path, out: Path, rate: float, seed: int, limit: int | None) -> dict[str, Any]:
    """The noised corpus in ``out`` (train.en, train.de, labels); its counts per kind."""
    sides = {lang: _read(m30, "train", lang, limit) for lang in ("en", "de", "fr", "cs")}
    rng = random.Random(seed)
    pairs = list(zip(sides["en"], sides["de"]))
    n_noise = round(len(pairs) * rate / (1 - rate))
    rows: list[tuple[str, str, str]] = []
    noise_at = set(rng.sample(range(len(pairs) + n_noise), n_noise))
    kept: list[tuple[str, str]] = []
    clean = iter(enumerate(pairs))
    for k in range(len(pairs) + n_noise):
        if k in noise_at and kept:
            i = rng.randrange(len(pairs))
            kind = rng.choice(KINDS)
            rows.append((*_noisy(pairs[i], kind, sides, i, rng, kept), kind))
        else:
            i, pair = next(clean, (None, None))
            if pair is None:
                continue
            kept.append(pair)
            rows.append((*pair, "clean"))
    out.mkdir(parents=True, exist_ok=True)
    for col, name in enumerate(("train.en", "train.de", "labels")):
        (out / name).write_text("".join(f"{r[col]}\n" for r in rows), encoding="utf-8")
    counts = {kind: sum(r[2] == kind for r in rows) for kind in ("clean", *KINDS)}
    return {"pairs": len(rows), "counts": counts}


def score(noise_dir: Path, out: Path, cfg: CleanConfig, workers: int) -> dict[str, Any]:
    """Clean the noised corpus; each rule's precision and recall against the labels."""
    labels = (noise_dir / "labels").read_text(encoding="utf-8").split("\n")[:-1]
    t0 = time.monotonic()
    report = clean_files(noise_dir / "train.en", noise_dir / "train.de", out, cfg, "en", "de", workers)
    seconds = time.monotonic() - t0
    removed = [json.loads(line) for line in (out / "removed.jsonl").open(encoding="utf-8")]
    by_rule: dict[str, list[str]] = {}
    for r in removed:
        by_rule.setdefault(r["rule"], []).append(labels[r["line"] - 1])
    rules = {}
    for rule, kinds in by_rule.items():
        target = TARGETS.get(rule)
        row = {"removed": len(kinds), "precision_noise": round(sum(k != "clean" for k in kinds) / len(kinds), 4),
               "clean_removed": sum(k == "clean" for k in kinds), "target": target}
        if target:
            total = labels.count(target)
            row["precision_target"] = round(kinds.count(target) / len(kinds), 4)
            row["recall_target"] = round(kinds.count(target) / total, 4) if total else None
        rules[rule] = row
    caught = {kind: sum(labels[r["line"] - 1] == kind for r in removed) for kind in ("clean", *KINDS)}
    recall = {kind: round(caught[kind] / max(1, labels.count(kind)), 4) for kind in ("clean", *KINDS)}
    return {"summary": report.summary(), "seconds": round(seconds, 2), "rules": rules,
            "recall_by_kind_any_rule": recall}


def langid(m30: Path, limit: int | None) -> dict[str, Any]:
    """Accuracy and sentences/s of the identifiers installed, on Multi30k's test sentences."""
    langs = ("en", "de", "fr", "cs")
    data = [(lang, s) for lang in langs for s in _read(m30, "test_2016_flickr", lang, limit)]
    out: dict[str, Any] = {"sentences": len(data)}

    def run(name: str, fn) -> None:
        t0 = time.perf_counter()
        ok = sum(fn(s) == lang for lang, s in data)
        out[name] = {"accuracy": round(ok / len(data), 4), "per_s": round(len(data) / (time.perf_counter() - t0))}

    from transduce.data.clean_rules import identifier
    run("py3langid_all", lambda s, m=identifier(()): m.classify(s)[0])
    run("py3langid_en_de_fr_cs", lambda s, m=identifier(langs): m.classify(s)[0])
    try:
        import pycld2
        run("pycld2", lambda s: pycld2.detect(s)[2][0][1])
    except ImportError:
        out["pycld2"] = "not installed"
    try:
        from lingua import Language, LanguageDetectorBuilder
        codes = {Language.ENGLISH: "en", Language.GERMAN: "de", Language.FRENCH: "fr", Language.CZECH: "cs"}
        detector = LanguageDetectorBuilder.from_languages(*codes).build()
        run("lingua_en_de_fr_cs", lambda s: codes.get(detector.detect_language_of(s)))
    except ImportError:
        out["lingua"] = "not installed"
    return out


def speed(m30: Path, work: Path, n: int, workers: int) -> dict[str, Any]:
    """Pairs/s of rule-based cleaning (and with language identification) on ``n`` generated pairs."""
    corpus = work / f"corpus_{n}"
    made = generate_corpus(m30, n, corpus) if not (corpus / "train.de").exists() else {"pairs": n, "reused": True}
    out: dict[str, Any] = {"corpus": made, "workers": workers, "cores": len(os.sched_getaffinity(0)),
                           "load_average": os.getloadavg()}
    for name, cfg in (("rules", CleanConfig(rules=("-lang",))), ("rules_near_duplicate",
                                                                 CleanConfig(rules=("-lang", "+near_duplicate"))),
                      ("rules_and_lang", CleanConfig())):
        if name != "rules" and n > 1_000_000:
            continue  # with language identification: measured on the smaller sizes
        t0 = time.monotonic()
        report = clean_files(corpus / "train.en", corpus / "train.de", work / f"out_{name}_{n}", cfg, "en", "de",
                             workers)
        seconds = time.monotonic() - t0
        out[name] = {"pairs_per_s": round(report.pairs / seconds), "seconds": round(seconds, 1),
                     "summary": report.summary(), "dedup_forgets": report.dedup_forgets}
    usage = (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    out["peak_rss_mb"] = {"main": round(usage[0].ru_maxrss / 1024), "largest_worker": round(usage[1].ru_maxrss / 1024)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("noise", "score", "langid", "speed", "all"))
    ap.add_argument("--m30", default=os.environ.get(  # Multi30k's raw files: ../shared/data/multi30k beside the repo
        "TRANSDUCE_MULTI30K", str(Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k")))
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--rate", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="1M", help="pairs for speed (bench/data_scale.py's corpus; 4.5M its largest)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--near-duplicate", action="store_true", help="score with the near_duplicate rule on")
    ap.add_argument("--dry", action="store_true", help="a few seconds: 3,000 pairs of noise, 20K of speed")
    args = ap.parse_args(argv)
    m30 = Path(args.m30)
    work = Path(args.work or tempfile.mkdtemp(prefix="clean-bench-"))
    limit, size = (3000, 20_000) if args.dry else (None, parse_size(args.size))
    result: dict[str, Any] = {"dry": args.dry}
    if args.what in ("noise", "score", "all"):
        noise_dir = work / f"noise_{args.seed}"
        result["noise"] = make_noise(m30, noise_dir, args.rate, args.seed, limit)
        result["noise"]["dir"] = str(noise_dir)
    if args.what in ("score", "all"):
        out = work / f"cleaned_{args.seed}_{int(time.time())}"
        rules = ("+near_duplicate",) if args.near_duplicate else ("+duplicate",)  # "+duplicate": the default list
        result["score"] = score(noise_dir, out, CleanConfig(rules=rules), args.workers)
        result["score"]["out"] = str(out)
    if args.what in ("langid", "all"):
        result["langid"] = langid(m30, 100 if args.dry else None)
    if args.what in ("speed", "all"):
        result["speed"] = speed(m30, work, size, args.workers)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
