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
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_scale_corpus import MAX_LEN, MAX_RATIO, generate_corpus, parse_size, sample_lines, size_label  # noqa: E402
from data_scale_measure import kill_all, last_json, measure  # noqa: E402
from data_scale_peer import hf_peer, run_hf  # noqa: E402
from data_scale_report import derive, plot  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SETTINGS = dict(device="cpu", log_every=10, eval_every=100000, save_every=50, eval_bleu=False,
                      threads=2, warmup_steps=4000, keep_last=2)


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
                rec.update(last_json(work / "logs" / f"tokenizer_{name}.stdout"))
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

    rec["hf"] = hf_size(n, args, sdir, corpus, tok_dir)
    rec["baseline"] = baseline_size(n, args, sdir, config, tok_dir, baseline_src, kw)
    if not args.keep:
        shutil.rmtree(sdir, ignore_errors=True)
    return rec


def hf_size(n: int, args: argparse.Namespace, sdir: Path, corpus: Path, tok_dir: Path) -> dict[str, Any]:
    """The Hugging Face datasets peer at one size (or why it was skipped)."""
    if args.no_hf:
        return {"ok": False, "skipped": "--no-hf"}
    if not _importable("datasets"):
        return {"ok": False, "skipped": "datasets is not installed (pip install datasets)"}
    rec = run_hf(corpus, tok_dir / "spm.model", sdir, args.workers, args.child_timeout, args.sample_ms / 1000, n)
    if not args.keep:
        shutil.rmtree(sdir / "hf_dataset", ignore_errors=True)
        shutil.rmtree(sdir / "hf_cache", ignore_errors=True)
    return rec


def baseline_size(n: int, args: argparse.Namespace, sdir: Path, config: Path, tok_dir: Path,
                  baseline_src: Path | None, kw: dict[str, Any]) -> dict[str, Any]:
    """Today's in-memory path at one size (or why it was skipped)."""
    if baseline_src is None:
        return {"ok": False, "skipped": "no --baseline-rev"}
    if n not in args.baseline_sizes:
        return {"ok": False, "skipped": "size not in --baseline-sizes (the in-memory path holds every pair "
                                        "as Python lists; ~20 GB at 4.5M pairs)"}
    run = sdir / "run_old"
    shutil.copytree(tok_dir, run / "tokenizer")
    old_env = {**os.environ, "PYTHONPATH": str(baseline_src)}
    return train_pair(old_env, config, run, [], args.steps, args.resume_steps, sdir / "logs", "old", **kw)


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


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


def parse_args() -> argparse.Namespace:
    """The command line, with the defaults that depend on ``--dry`` filled in and the inputs checked."""
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
    if args.workdir and (ROOT in args.workdir.resolve().parents or args.workdir.resolve() == ROOT):
        ap.error("--workdir: corpora must not be written into the repository")
    return args


def baseline_tree(rev: str | None, work: Path, report: dict[str, Any]) -> Path | None:
    """``src`` of the baseline revision, unpacked in ``work`` (None without one, or if git fails)."""
    if not rev:
        return None
    baseline_src = work / "baseline_src"
    baseline_src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True)
    if archive.returncode != 0:
        report["baseline_error"] = archive.stderr.decode(errors="replace").strip()
        return None
    subprocess.run(["tar", "-x", "-C", str(baseline_src)], input=archive.stdout, check=True)
    return baseline_src / "src"


def shared_tokenizer(args: argparse.Namespace, work: Path, baseline_src: Path | None,
                     report: dict[str, Any]) -> tuple[Path, int, float]:
    """One tokenizer for every system, trained on a sample of the largest corpus: its folder, its
    vocabulary size and the training model's state in MB (weights, gradients, Adam's two moments)."""
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
    return tok_dir, vocab, state_mb


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("_hf_peer", "_train_tok"):
        (hf_peer if sys.argv[1] == "_hf_peer" else train_tokenizer_child)(sys.argv[2:])
        return
    args = parse_args()
    TRAIN_SETTINGS["save_every"] = args.steps
    work = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="data_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    cleanup = not args.keep
    atexit.register(kill_all)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report: dict[str, Any] = {"environment": environment(args), "workdir": str(work) if args.keep else None,
                              "settings": {"sizes": args.sizes, "vocab": args.vocab, "steps": args.steps,
                                           "resume_steps": args.resume_steps, "max_tokens": args.max_tokens,
                                           "workers": args.workers, "model": "tiny", "max_len": MAX_LEN,
                                           "max_ratio": MAX_RATIO, "baseline_rev": args.baseline_rev,
                                           "baseline_sizes": sorted(args.baseline_sizes), "dry": args.dry}}
    try:
        baseline_src = baseline_tree(args.baseline_rev, work, report)
        tok_dir, vocab, state_mb = shared_tokenizer(args, work, baseline_src, report)
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
        kill_all()
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
