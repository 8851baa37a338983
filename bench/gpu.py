"""One GPU in one run: training throughput (MFU), decoding speed and the Multi30k recipe's time
to BLEU, each against a peer measured in the same process, as JSON (issue #18).

Sections, in this order (each written to ``--out`` as soon as it is done, so a run stopped at
its time limit keeps what it measured):

- ``env``: the device, torch, and the matmul peak: a bf16 8192^3 ``torch.mm`` (the MFU basis).
- ``checks``: correctness on this device before any timing: the fused bf16 loss against
  autocast's projection then loss; the CUDA-graph decoding and training steps against eager
  (``bench/gpu_checks.py``).
- ``decode``: a random base-shape model (6+6, d 512, 32k vocabulary), 256 sentences of 24
  tokens, every output forced to 32 tokens (``min_len`` = max length): transduce eager,
  transduce with its static cache in CUDA graphs, and HF ``MarianMTModel.generate`` on the same
  shape; greedy and beam 4, fp32 and bf16 (ours: autocast, as ``Translator`` runs it; HF: the
  model in bf16, as its users load it). Sentences/s, median of the runs, and the ratios.
- ``multi30k``: ``configs/multi30k_en_de_gpu.yaml`` trained by ``bench/multi30k.py`` on this
  device: seconds of training to 38 and 39 greedy validation BLEU, and the test_2016_flickr
  scores of the final model (Moses-lc BLEU needs sacremoses).
- ``train``: one optimizer step (forward + backward + Adam, label smoothing 0.1, bf16 autocast)
  at the base shape (400 x 64 tokens) and big (200 x 64), 32k vocabulary: transduce as its
  trainer steps (fused projection + loss, fused Adam), the same with ``torch.compile``, HF
  ``MarianMTModel`` and ``nn.Transformer`` (``F.cross_entropy`` with label smoothing, torch's
  default Adam: what their users get). Target tokens/s and MFU (matmul FLOPs / s over the peak),
  systems interleaved run by run. Then the Multi30k recipe's small model, where per-step
  overhead rules: steps/s eager, compiled and in CUDA graphs, on one and on four length buckets.
- ``tensorrt``: fp16 TensorRT engines vs the bf16 model, greedy and beam 4, on a random base
  model and on the trained model of ``--model-dir`` (Multi30k test BLEU): ``bench/gpu_tensorrt.py``;
  ``{"skipped": ...}`` without the tensorrt package.

``--dry`` runs every section on the CPU with tiny shapes and a few steps (CI runs it), so the
script never reaches a GPU broken; its numbers mean nothing.

Usage:
    python bench/gpu.py [--out gpu.json] [--sections env,checks,decode,multi30k,train,tensorrt] [--model-dir M]
    python bench/gpu.py --dry
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import EOS, PAD, guarded, timed  # noqa: E402
from gpu_tensorrt import tensorrt_section  # noqa: E402
from gpu_train import BACKEND, train_section  # noqa: E402

from transduce.config import DecodeConfig, ModelConfig  # noqa: E402
from transduce.model import Transformer  # noqa: E402
from transduce.progress import progress_bar  # noqa: E402


DECODE = dict(layers=6, d=512, h=8, ff=2048, vocab=32000, sentences=256, src_len=24, out_len=32)
DRY_DECODE = dict(layers=2, d=64, h=4, ff=128, vocab=500, sentences=6, src_len=7, out_len=5)


def mm_peak(device: torch.device, dry: bool) -> float:
    """FLOP/s of a large matrix product on random data: bf16 8192^3 on a GPU (median of 10)."""
    n, dtype = (256, torch.float32) if dry else (8192, torch.bfloat16)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b)
    return 2 * n ** 3 / statistics.median(timed(lambda: torch.mm(a, b), device) for _ in range(10))


# ---- checks --------------------------------------------------------------------------------------


def check_fused_loss(device: torch.device, dry: bool) -> dict:
    """The fused projection + loss under bf16 autocast against autocast's F.linear then the loss."""
    from transduce.training.loss import label_smoothed_loss, projected_label_smoothed_loss
    n, d, v = (64, 32, 300) if dry else (4096, 512, 32000)
    torch.manual_seed(0)
    hidden = torch.randn(n, d, device=device)
    weight = (torch.randn(v, d, device=device) * 0.05)
    target = torch.randint(3, v, (1, n), device=device)
    target[0, n // 2:n // 2 + 7] = PAD
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    dtype = torch.bfloat16
    with torch.autocast(device.type, dtype=dtype):
        mine = projected_label_smoothed_loss(h1[None], w1, target, 0.1, PAD)
        ref = label_smoothed_loss(F.linear(h2[None], w2), target, 0.1, PAD)
    mine.loss.backward()
    ref.loss.backward()

    def rel(a, b):
        a, b = a.detach().float(), b.detach().float()
        return float((a - b).norm() / b.norm().clamp_min(1e-30))
    out = {"loss_rel": rel(mine.loss, ref.loss), "grad_hidden_rel": rel(h1.grad, h2.grad),
           "grad_weight_rel": rel(w1.grad, w2.grad)}
    out["ok"] = out["loss_rel"] < 1e-3 and out["grad_hidden_rel"] < 2e-2 and out["grad_weight_rel"] < 2e-2
    return out


def checks(device: torch.device, dry: bool) -> dict:
    from gpu_checks import decode_checks, train_checks
    return {"fused_loss_bf16": guarded(check_fused_loss, device, dry),
            "decode_graphs": guarded(decode_checks, str(device)), "train_graphs": guarded(train_checks, device)}


# ---- decoding ------------------------------------------------------------------------------------


def decode_section(device: torch.device, dry: bool, runs: int) -> dict:
    from transduce.inference import SearchSpec, prepare_for_decoding

    s = DRY_DECODE if dry else DECODE
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=s["vocab"], tgt_vocab_size=s["vocab"], d_model=s["d"], n_heads=s["h"],
                      n_encoder_layers=s["layers"], n_decoder_layers=s["layers"], d_ff=s["ff"], dropout=0.0,
                      share_embeddings=True, max_positions=512)
    # as a Translator keeps it (graphs too), with bf16 copies of the linear weights for autocast
    ours = prepare_for_decoding(Transformer(cfg).to(device).eval(), cast=torch.bfloat16)
    src = torch.randint(3, s["vocab"], (s["sentences"], s["src_len"] + 1), device=device)
    src[:, -1] = EOS
    hf = guarded(hf_decoder, s, device)
    results: dict[str, Any] = {"shape": {k: v for k, v in s.items()}}
    for precision in ("fp32", "bf16"):
        for beam in (1, 4):
            decode = DecodeConfig(beam=beam, lenpen=0.6, max_len_a=0.0, max_len_b=s["out_len"], min_len=s["out_len"])
            autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                        else contextlib.nullcontext())

            def ours_run(static: bool, beam=beam, decode=decode, autocast=autocast) -> Callable[[], Any]:
                def run():
                    with torch.inference_mode(), autocast:
                        return SearchSpec(decode, static=static).run(ours, src)
                return run
            systems: dict[str, Callable[[], Any]] = {"transduce eager": ours_run(False),
                                                     "transduce graphs": ours_run(True)}
            if not isinstance(hf, dict):
                systems["hf generate"] = hf(precision, beam)
            key = f"{'greedy' if beam == 1 else 'beam4'} {precision}"
            results[key] = measure(systems, device, runs, s["sentences"])
            with torch.inference_mode(), autocast:
                a, b = systems["transduce eager"](), systems["transduce graphs"]()
            same = (a.tokens.shape == b.tokens.shape) and bool((a.tokens == b.tokens).all())
            results[key]["graphs_equal_eager"] = same
            if not same and a.tokens.shape == b.tokens.shape:
                results[key]["graphs_token_agreement"] = round(float((a.tokens == b.tokens).float().mean()), 4)
    if isinstance(hf, dict):
        results["hf_error"] = hf
    return results


def hf_decoder(s: dict, device: torch.device) -> Callable[[str, int], Callable[[], Any]]:
    """``make(precision, beam)`` -> a run of HF generate on a random Marian of the shape."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    pad = s["vocab"] - 1
    cfg = MarianConfig(vocab_size=s["vocab"], d_model=s["d"], encoder_layers=s["layers"], decoder_layers=s["layers"],
                       encoder_attention_heads=s["h"], decoder_attention_heads=s["h"], encoder_ffn_dim=s["ff"],
                       decoder_ffn_dim=s["ff"], activation_function="relu", max_position_embeddings=512,
                       pad_token_id=pad, eos_token_id=EOS, decoder_start_token_id=pad, dropout=0.0,
                       scale_embedding=True, share_encoder_decoder_embeddings=True)
    models = {"fp32": MarianMTModel(cfg).to(device).eval()}
    models["bf16"] = MarianMTModel(cfg).to(device).eval().to(torch.bfloat16)
    models["bf16"].load_state_dict(models["fp32"].state_dict())
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, s["vocab"] - 1, (s["sentences"], s["src_len"] + 1), generator=g).to(device)
    src[:, -1] = EOS
    mask = torch.ones_like(src)

    def make(precision: str, beam: int) -> Callable[[], Any]:
        model = models[precision]

        def run():
            with torch.inference_mode():
                return model.generate(input_ids=src, attention_mask=mask, num_beams=beam, do_sample=False,
                                      max_new_tokens=s["out_len"], min_new_tokens=s["out_len"])
        return run
    return make


def measure(systems: dict[str, Callable[[], Any]], device: torch.device, runs: int, sentences: int) -> dict:
    """Sentences/s of each system, median of ``runs`` interleaved runs after one warm-up each."""
    for fn in systems.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in systems}
    with progress_bar(runs * len(systems), unit="runs", desc="timing") as bar:  # stderr: the JSON goes to stdout
        for _ in range(runs):
            for k, fn in systems.items():
                times[k].append(timed(fn, device))
                bar.update()
    out = {k: {"sentences_per_s": round(sentences / statistics.median(ts), 1)} for k, ts in times.items()}
    if "hf generate" in out:
        for k in systems:
            if k != "hf generate":
                out[k]["vs_hf"] = round(out[k]["sentences_per_s"] / out["hf generate"]["sentences_per_s"], 2)
    if "transduce eager" in out and "transduce graphs" in out:
        out["transduce graphs"]["vs_eager"] = round(
            out["transduce graphs"]["sentences_per_s"] / out["transduce eager"]["sentences_per_s"], 2)
    return out


# ---- Multi30k ------------------------------------------------------------------------------------


def multi30k_section(device: torch.device, dry: bool, run_dir: Path) -> dict:
    """The GPU recipe through bench/multi30k.py: time to 38/39 greedy val BLEU, test scores."""
    root = os.environ.get("TRANSDUCE_MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k"))
    if not Path(root, "train.en.gz").is_file():
        return {"skipped": f"no Multi30k at {root} (set TRANSDUCE_MULTI30K)"}
    cmd = [sys.executable, str(ROOT / "bench" / "multi30k.py"), "--config", str(ROOT / "configs" /
           "multi30k_en_de_gpu.yaml"), "--out", str(run_dir), "--device", device.type,
           "--set", f"train.device={device.type}"]
    if dry:
        cmd += ["--max-test", "16", "--set", "train.max_steps=4", "--set", "train.eval_every=2",
                "--set", "train.save_every=2", "--set", "data.vocab_size=300", "--set", "train.warmup_steps=2",
                "--set", "decode.beam=2", "--set", "decode.max_len_b=5", "--set", "train.max_minutes=5",
                "--set", "train.precision=bf16", "--set", "model.n_encoder_layers=1",
                "--set", "model.n_decoder_layers=1"]
    env = dict(os.environ, TRANSDUCE_MULTI30K=root,
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "rc": proc.returncode,
                "stderr_tail": proc.stderr[-2000:]}
    result = json.loads(proc.stdout)
    curve = result.get("curve", [])
    reached = {}
    for target in (38, 39):
        hit = next((p for p in curve if (p.get("val_bleu") or 0) >= target), None)
        reached[f"seconds_to_val_bleu_{target}"] = None if hit is None else round(hit["minutes"] * 60, 1)
    return {"wall_s": round(time.perf_counter() - t0, 1), **reached, **result}


# ---- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (CI): checks the script, not speed")
    ap.add_argument("--out", help="also write the JSON here (rewritten after each section)")
    ap.add_argument("--sections", default="env,checks,decode,multi30k,train,tensorrt")
    ap.add_argument("--model-dir", default=None, help="tensorrt: a trained Multi30k en->de model directory")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per system (interleaved)")
    ap.add_argument("--steps", type=int, default=5, help="training steps per timed run")
    ap.add_argument("--run-dir", default=None, help="the Multi30k run directory (default: a temporary one)")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.dry else "cuda")
    BACKEND["name"] = "eager" if args.dry else "inductor"
    if not args.dry and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device (use --dry on a CPU)", file=sys.stderr)
        return 2
    runs, steps = (1, 1) if args.dry else (args.runs, args.steps)
    sections = args.sections.split(",")
    report: dict[str, Any] = {"date": datetime.date.today().isoformat(), "dry": args.dry,
                              "command": "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])}

    def save() -> None:
        if args.out:
            tmp = Path(args.out + ".tmp")
            tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
            tmp.replace(args.out)

    peak = None
    for name in sections:
        t0 = time.perf_counter()
        if name == "env":
            peak = mm_peak(device, args.dry)
            report["env"] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                             "torch": torch.__version__, "cuda": torch.version.cuda,
                             "mm_peak_tflops": round(peak / 1e12, 1)}
        elif name == "checks":
            report["checks"] = checks(device, args.dry)
        elif name == "decode":
            report["decode"] = guarded(decode_section, device, args.dry, runs)
        elif name == "train":
            peak = peak or mm_peak(device, args.dry)
            report["train"] = train_section(device, args.dry, runs, steps, peak)
        elif name == "multi30k":
            run_dir = Path(args.run_dir) if args.run_dir else Path(
                __import__("tempfile").mkdtemp(prefix="gpu_m30k_")) / "run"
            report["multi30k"] = guarded(multi30k_section, device, args.dry, run_dir)
        elif name == "tensorrt":
            report["tensorrt"] = guarded(tensorrt_section, device, runs, args.model_dir, measure, guarded)
        else:
            print(f"bench/gpu.py: unknown section {name!r}", file=sys.stderr)
            return 2
        report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 1)
        save()
        print(f"[gpu.py] {name} done in {report['section_seconds'][name]} s", file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
