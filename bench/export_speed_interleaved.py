"""Eager float32 beside CTranslate2 float32 on a loaded machine: the two systems of
``export_speed.py`` (its own runners) alternated round by round in one process, timed by the
process's CPU time as well as wall time, so that other jobs on the machine move both alike.

Prints one JSON object: sentences per CPU second of each system (median of ``--rounds``), the
ratio eager / CTranslate2 of each round and their median, and the ratio of each system's fastest
round (``_best``: other jobs only ever add time, so on a noisy host the minima agree best from run
to run), by CPU time and by wall time, and,
with ``--ops``, the aten operators per decoder step of one eager run under ``torch.profiler``
(a count that does not depend on the load), and with ``--per-step``, the CPU microseconds of one
eager greedy step (``model.decode`` and the choice of the next tokens) with 1 row (the fixed
cost) and with 64 (minimum of 15 runs of 32 steps). With ``--base SRC`` (another checkout's
``src/``, e.g. ``git archive`` of the parent commit), that package's eager runner joins the rounds
as ``eager_base`` (imported as ``transduce_base`` from a copy), and its steps alternate with these:
before and after in one process. With ``--compiled``, ``eager_compiled`` (``runtime.compile``:
greedy search's step compiled) joins the rounds; its first (warm-up) run compiles.

Needs the ``export`` extra. Usage:
    python bench/export_speed_interleaved.py [--model DIR --src FILE | --shape demo] [--sentences 1000]
        [--beam 1] [--rounds 3] [--ops] [--per-step] [--base OTHER_CHECKOUT/src] [--compiled]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import importlib
import shutil

import export_speed as X
from transduce.data.tokenizer import Tokenizer

SYSTEMS = ("eager_fp32", "ct2_fp32")


def ops_per_step(run, texts: list[str], model) -> float:
    """aten operators per decoder step of one ``run(texts)`` under ``torch.profiler``."""
    steps = [0]
    decode = model.decode  # (search calls decode, not forward: count its calls)

    def counted(*args, **kwargs):
        steps[0] += 1
        return decode(*args, **kwargs)
    model.decode = counted
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run(texts)
    finally:
        del model.decode
    ops = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    return round(ops / max(steps[0], 1), 1)


def base_eager(src: Path, tmp: Path, model_dir: Path, out_len: int | None, batch_tokens: int, beam: int):
    """``export_speed.eager``'s runner over the transduce package of ``src`` (another checkout),
    copied into ``tmp`` as ``transduce_base`` (its imports of itself are relative), and its Translator."""
    shutil.copytree(src / "transduce", tmp / "base" / "transduce_base")
    sys.path.insert(0, str(tmp / "base"))
    inference = importlib.import_module("transduce_base.inference")
    tr = inference.Translator.load(model_dir, inference.Runtime(device="cpu"))

    def run(texts: list[str]) -> list[str]:
        if out_len is None:
            return tr.translate(texts, beam=beam, batch_tokens=batch_tokens)
        return [r.best.text for r in tr.translate_detailed(texts, beam=beam, max_len_a=0.0, max_len_b=out_len,
                                                           min_len=out_len, batch_tokens=batch_tokens)]
    return run, tr


def step_loop(translator, texts: list[str], rows: int, package: str = "transduce", steps: int = 32):
    """A function running ``steps`` greedy steps (``model.decode`` and the choice of the next
    tokens) of the first ``rows`` sentences with ``translator``, whose search helpers come from
    ``package`` (``transduce``, or ``transduce_base`` for ``--base``)."""
    best_tokens = importlib.import_module(f"{package}.inference.search.common").best_tokens
    new_cache = importlib.import_module(f"{package}.inference.speed").new_cache
    model, tok = translator.model, translator.tokenizer
    ids = [tok.encode(t, "src") + [model.config.eos_id] for t in texts[:rows]]
    width = max(len(r) for r in ids)
    src = torch.tensor([r + [model.config.pad_id] * (width - len(r)) for r in ids])

    @torch.no_grad()
    def loop() -> None:
        enc, cache = model.encode(src), new_cache(model)
        last = torch.full((len(ids), 1), model.config.bos_id)
        for step in range(steps):
            states = model.decode(last, enc, cache, project=False).states[:, -1]
            last = best_tokens(model, states, model.config, step, steps, 1)[1]
    return loop


def per_step_us(loops: dict, runs: int = 15, steps: int = 32) -> dict:
    """CPU microseconds of one step of each of ``loops`` (name: :func:`step_loop`), the minimum
    of ``runs`` runs, the loops alternated run by run."""
    times = {name: [] for name in loops}
    for loop in loops.values():
        loop()
    for _ in range(runs):
        for name, loop in loops.items():
            start = time.process_time()
            loop()
            times[name].append(time.process_time() - start)
    return {name: round(min(t) / steps * 1e6, 1) for name, t in times.items()}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    X.model_arguments(ap)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", action="store_true", help="also count aten operators per decoder step")
    ap.add_argument("--per-step", action="store_true", help="also time one greedy step of 1 and of 64 rows")
    ap.add_argument("--compiled", action="store_true",
                    help="also eager_compiled (runtime.compile, greedy) in the rounds; its warm-up run compiles")
    ap.add_argument("--base", type=Path, default=None,
                    help="another checkout's src/: its eager runner joins the rounds")
    return ap.parse_args()


def interleaved_rounds(runs: dict, texts: list[str], rounds: int) -> tuple[dict, dict]:
    """Each system once a round, in turn (reversed every other round): CPU and wall seconds per run."""
    systems = tuple(runs)
    cpu: dict[str, list[float]] = {n: [] for n in systems}
    wall: dict[str, list[float]] = {n: [] for n in systems}
    for r in range(rounds):
        for name in (systems if r % 2 == 0 else systems[::-1]):
            w, c = time.perf_counter(), time.process_time()
            runs[name](texts)
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return cpu, wall


def add_ratios(report: dict, pairs: list[tuple[str, str, str]], cpu: dict, wall: dict) -> None:
    """For each (suffix, a, b): a's speed over b's, round by round, their median and best against best."""
    for clock, times in (("cpu", cpu), ("wall", wall)):
        for suffix, a, b in pairs:
            ratios = [tb / ta for ta, tb in zip(times[a], times[b])]
            report[f"ratio{suffix}_{clock}"] = round(statistics.median(ratios), 3)
            report[f"ratio{suffix}_{clock}_rounds"] = [round(x, 3) for x in ratios]
            report[f"ratio{suffix}_{clock}_best"] = round(min(times[b]) / min(times[a]), 3)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    texts = X.source_texts(args)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = Path(args.model) if args.model else X.random_model_dir(tmp / "random", texts, args.shape)
        out_len = None if args.model else args.out_len
        tok = Tokenizer.load(model_dir)
        batch_tokens = int(64 * np.mean([len(tok.encode(t, "src")) + 1 for t in texts]))
        settings = argparse.Namespace(threads=1, batch_size=64, beam=args.beam, qat=None, calibrate=None)
        runs = {name: X.system(name, model_dir, tmp, tok, settings, out_len, batch_tokens)[1]()
                for name in SYSTEMS + (("eager_compiled",) if args.compiled else ())}
        if args.base:
            runs["eager_base"], base_translator = base_eager(args.base, tmp, model_dir, out_len, batch_tokens,
                                                             args.beam)
        outputs, warmup = {}, {}
        for name, run in runs.items():  # (also the warm-up)
            start = time.perf_counter()
            outputs[name] = run(texts)
            warmup[name] = round(time.perf_counter() - start, 1)
        systems = tuple(runs)
        cpu, wall = interleaved_rounds(runs, texts, args.rounds)
        report = {"benchmark": "export_speed_interleaved", "model": args.model or f"random ({args.shape} shape)",
                  "search": "greedy" if args.beam == 1 else f"beam {args.beam}", "sentences": len(texts),
                  "rounds": args.rounds, "threads": 1, "machine": X.machine(), "torch": torch.__version__}
        for name in systems:
            report[f"{name}_sentences_per_cpu_s"] = round(len(texts) / statistics.median(cpu[name]), 1)
        pairs = [("", "eager_fp32", "ct2_fp32")]
        if args.compiled:
            pairs += [("_compiled", "eager_compiled", "ct2_fp32"),
                      ("_compiled_over_eager", "eager_compiled", "eager_fp32")]
            report["same_output_compiled"] = outputs["eager_compiled"] == outputs["eager_fp32"]
            report["warmup_s"] = warmup
        if args.base:
            pairs += [("_base", "eager_base", "ct2_fp32"), ("_after_over_base", "eager_fp32", "eager_base")]
            report["same_output_as_base"] = outputs["eager_fp32"] == outputs["eager_base"]
        add_ratios(report, pairs, cpu, wall)
        if args.ops or args.per_step:
            from transduce.inference import Runtime, Translator
            translator = Translator.load(model_dir, Runtime(device="cpu"))
        if args.per_step:
            for rows, label in ((1, "1_row"), (64, "64_rows")):
                loops = {"eager": step_loop(translator, texts, rows)}
                if args.base:
                    loops["eager_base"] = step_loop(base_translator, texts, rows, "transduce_base")
                for name, us in per_step_us(loops).items():
                    report[f"{name}_step_us_{label}"] = us
        if args.ops:
            kwargs = {"beam": args.beam} if out_len is None else {
                "beam": args.beam, "max_len_a": 0.0, "max_len_b": out_len, "min_len": out_len}
            translator.translate(texts[:64], **kwargs)
            report["eager_aten_ops_per_step"] = ops_per_step(lambda t: translator.translate(t, **kwargs),
                                                             texts[:64], translator.model)
        with open("/proc/loadavg", encoding="utf-8") as f:
            report["loadavg"] = f.read().split()[:3]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
