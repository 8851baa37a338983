"""An imported Hugging Face Marian model: transduce vs HF ``generate`` vs CTranslate2, on real text.

A local ``MarianMTModel`` directory (an OPUS-MT model, or ``--from-model`` to make one from a
trained transduce model with ``opus_mt_layout`` (bench/opus_mt_layout.py)) is imported with
``transduce import`` into a temporary directory; then every system translates all lines of
``--src`` with beam search (length penalty 0, ending a sentence once ``beam`` hypotheses
finished: HF's ``early_stopping=True``, our default ``stop``), and reports sentences/s, BLEU
against ``--ref`` and the share of outputs identical to HF's:

- ``hf generate``: MarianTokenizer + MarianMTModel.generate on the original directory, batches of
  ``--hf-batch`` sentences sorted by length;
- ``transduce``: :class:`~transduce.inference.Translator` on the imported directory;
- ``ctranslate2 float32``: ``transduce export --format ctranslate2`` of the imported directory.

Each system lives in its own worker process (see ``decode_speed.py``); systems are interleaved,
the median of ``--runs`` after a warm-up. Needs the ``bench`` extra. Usage:
    python bench/marian_import.py (MARIAN_DIR | --from-model MODEL_DIR) --src test.en [--ref test.de]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from decode_speed import Worker  # bench/ is the script's directory, so on sys.path
from translate_speed import ctranslate2_system, ours
from transduce.data.corpus import read_lines
from transduce.progress import progress_bar


def hf_generate(marian_dir: str, texts: list[str], beam: int, batch: int, threads: int) -> Callable[[], list[str]]:
    """MarianTokenizer + generate, sentences sorted by length into batches of ``batch``."""
    import transformers

    torch.set_num_threads(threads)
    tok = transformers.MarianTokenizer.from_pretrained(marian_dir)
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    lengths = [len(tok(t)["input_ids"]) if t else 0 for t in texts]
    order = sorted((i for i, t in enumerate(texts) if t), key=lengths.__getitem__)

    def run() -> list[str]:
        out = [""] * len(texts)
        for j in range(0, len(order), batch):
            index = order[j : j + batch]
            inputs = tok([texts[i] for i in index], return_tensors="pt", padding=True)
            with torch.inference_mode():   # ours: at most source tokens (EOS counted) + 50
                gen = model.generate(**inputs, num_beams=beam, length_penalty=0.0, early_stopping=True,
                                     do_sample=False, max_new_tokens=max(lengths[i] for i in index) + 50)
            for i, text in zip(index, tok.batch_decode(gen, skip_special_tokens=True)):
                out[i] = text
        return out
    return run


def make_marian(model_dir: str, out: str) -> str:
    """An OPUS-MT-like MarianMTModel directory from a trained transduce model."""
    from transduce.interop import export_model
    from opus_mt_layout import opus_mt_layout  # bench/, beside this script

    export_model(model_dir, "hf", os.path.join(out, "ours"))
    return str(opus_mt_layout(os.path.join(out, "ours"), os.path.join(out, "marian")))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("marian_dir", nargs="?", help="a local MarianMTModel directory")
    p.add_argument("--from-model", default=None, help="make the Marian directory from this transduce model")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", default=None, help="references, for BLEU")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--hf-batch", type=int, default=32, help="sentences per HF generate call")
    p.add_argument("--max-sentences", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--settle", type=float, default=1.0, help="seconds of idle before each timed run")
    args = p.parse_args(argv)
    if (args.marian_dir is None) == (args.from_model is None):
        p.error("give a MARIAN_DIR or --from-model MODEL_DIR")
    return args


def scores(times: dict[str, list[float]], outputs: dict[str, list[str]], refs: list[str] | None,
           n: int) -> dict[str, dict[str, Any]]:
    """Sentences/s (median run), the share of outputs identical to HF's, BLEU with references."""
    results: dict[str, dict[str, Any]] = {}
    for name, ts in times.items():
        out = outputs[name]
        r = {"sentences_per_s": round(n / statistics.median(ts), 1), "runs_s": [round(x, 3) for x in ts],
             "identical_to_hf": round(sum(a == b for a, b in zip(out, outputs["hf generate"])) / n, 4)}
        if refs is not None:
            import sacrebleu
            r["bleu"] = round(sacrebleu.corpus_bleu(out, [refs]).score, 2)
        results[name] = r
    for r in results.values():
        r["vs_hf_generate"] = round(r["sentences_per_s"] / results["hf generate"]["sentences_per_s"], 2)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    texts = list(read_lines(args.src))[: args.max_sentences]
    refs = list(read_lines(args.ref))[: args.max_sentences] if args.ref else None
    search = dict(beam=args.beam, lenpen=0.0, max_len_a=1.0, max_len_b=50, batch_tokens=4096)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        from transduce.interop import export_model
        from transduce.interop import import_hf

        marian_dir = args.marian_dir or make_marian(args.from_model, tmp)
        imported, ct2_dir = os.path.join(tmp, "imported"), os.path.join(tmp, "ct2")
        import_checks = import_hf(marian_dir, imported)
        export_model(imported, "ctranslate2", ct2_dir)
        t = args.threads
        workers = {"hf generate": Worker(hf_generate, marian_dir, texts, args.beam, args.hf_batch, t),
                   "transduce": Worker(ours, imported, texts, search, t),
                   "ctranslate2 float32": Worker(ctranslate2_system, imported, ct2_dir, texts, search,
                                                 "float32", t, 1)}
        try:
            outputs = {name: run()[1] for name, run in workers.items()}  # warm-up, and the outputs
            times: dict[str, list[float]] = {name: [] for name in workers}
            with progress_bar(args.runs * len(workers), unit="runs", desc="timing") as bar:  # stderr: JSON to stdout
                for _ in range(args.runs):
                    for name, run in workers.items():
                        time.sleep(args.settle)
                        times[name].append(run()[0])
                        bar.update()
        finally:
            for worker in workers.values():
                worker.close()
    results = scores(times, outputs, refs, len(texts))
    import transformers
    print(json.dumps({
        "date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": sys.version.split()[0],
        "marian": args.marian_dir or f"opus_mt_layout({Path(args.from_model).resolve()})", "src": args.src,
        "sentences": len(texts), "search": search, "import_checks": import_checks,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "results": results,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
