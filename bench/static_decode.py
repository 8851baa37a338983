"""Static-shape, CUDA-graphed decoding (``transduce.inference.static``) on a GPU: checks and an A/B.

``gpu_checks()`` compares the graphed searches with the eager ones on random models (tokens and
lengths equal, scores within 1e-4 in fp32; agreement under bf16 autocast), checks that a graph
was captured, is reused by a second batch of the same padded shape, and sees weights changed in
place. ``ab_timings()`` times eager vs graphed greedy and beam 4 in fp32 and bf16 on a
base-sized random model forced to ``out_len`` tokens. Models are prepared for decoding, as a
Translator's. Both return dicts; the CLI prints them as JSON.

Usage:
    python bench/static_decode.py [--checks] [--timings] [--sentences 64] [--out-len 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

from transduce.config import DecodeConfig, ModelConfig
from transduce.inference import beam_search, greedy_search, prepare_for_decoding
from transduce.inference.fast import STATIC_SEARCHES
from transduce.inference.static import use_static
from transduce.model import Transformer

PAD, BOS, EOS = 0, 1, 2


def _model(vocab: int, seed: int, device: str, **shape) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, dropout=0.0, tie_output=False, **shape)
    model = Transformer(cfg).to(device).eval()
    with torch.no_grad():
        model.output_proj.weight[EOS] *= 4.0  # some hypotheses end early, at different steps
    return prepare_for_decoding(model)  # as a Translator does (and eager searches then keep the graphs)


def _sources(lengths: list[int], vocab: int, seed: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS
    return src.to(device)


def _compare(eager, graphed) -> dict:
    same = eager.tokens.shape == graphed.tokens.shape and bool((eager.tokens == graphed.tokens).all())
    rows = (eager.tokens == graphed.tokens).flatten(1).all(1) if eager.tokens.shape == graphed.tokens.shape \
        else torch.zeros(1, dtype=torch.bool)
    finite = torch.isfinite(eager.scores)
    return {"tokens_equal": same, "lengths_equal": bool((eager.lengths == graphed.lengths).all()),
            "rows_agree": float(rows.float().mean()),
            "max_score_diff": float((eager.scores - graphed.scores)[finite].abs().max()) if same else None}


def _captured(model: Transformer) -> list[bool]:
    return [s.graph is not None for s in model.__dict__.get(STATIC_SEARCHES, {}).values()]


SEARCHES = {
    "greedy": DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5),
    "beam4": DecodeConfig(beam=4, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=5),
    "beam4_best_finished_minlen": DecodeConfig(beam=4, nbest=3, lenpen=0.0, stop="best_finished", min_len=3,
                                               max_len_a=0.5, max_len_b=4),
}
MODELS = {"sinusoidal_post": dict(positions="sinusoidal", norm="post"),
          "learned_pre": dict(positions="learned", norm="pre", max_positions=128),
          "rope_pre": dict(positions="rope", norm="pre")}


def _search(model, src, decode: DecodeConfig, static: bool):
    if decode.beam == 1:
        return greedy_search(model, src, decode, static=static)
    return beam_search(model, src, decode, static=static)


def _guarded(check: Callable[[], dict]) -> dict:
    """``check()``, or its error as a failed result (one broken case leaves the others to run)."""
    try:
        return check()
    except Exception as e:  # noqa: BLE001 (reported, not raised: the run's other results still count)
        return {"passed": False, "error": f"{type(e).__name__}: {e}"[:1000]}


def _check_search(model: Transformer, src: torch.Tensor, decode: DecodeConfig, cuda: bool) -> dict:
    """fp32: graphed equals eager, was captured, and a second batch of the same shape reuses it."""
    with torch.inference_mode():
        eager = _search(model, src, decode, False)
        graphed = _search(model, src, decode, True)
        again = _search(model, src.flip(0), decode, True)  # same padded shape: the same graph
    r = _compare(eager, graphed)
    r["captured"] = (bool(_captured(model)) and all(_captured(model))) if cuda else None
    r["replay_again_equal"] = bool(torch.equal(again.tokens.flip(0), graphed.tokens))
    r["passed"] = r["tokens_equal"] and r["lengths_equal"] and r["captured"] is not False \
        and r["replay_again_equal"] and r["max_score_diff"] is not None and r["max_score_diff"] < 1e-4
    return r


def _check_bf16(model: Transformer, src: torch.Tensor, decode: DecodeConfig, cuda: bool) -> dict:
    """bf16 autocast: captured and runs; agreement with eager reported, not required (bf16
    rounding differs between the two paths and may flip near-ties)."""
    with torch.inference_mode(), torch.autocast(src.device.type, dtype=torch.bfloat16):
        eager = _search(model, src, decode, False)
        graphed = _search(model, src, decode, True)
    r = _compare(eager, graphed)
    r["captured"] = (bool(_captured(model)) and all(_captured(model))) if cuda else None
    r["passed"] = r["captured"] is not False and bool(torch.isfinite(graphed.scores).all())
    return r


def _check_weights_changed_in_place(model: Transformer, src: torch.Tensor) -> dict:
    """Weights changed in place (as by an optimizer step): the kept graph reads the new ones."""
    decode = SEARCHES["beam4"]
    with torch.inference_mode():
        before = _search(model, src, decode, True)
    kept = list(model.__dict__.get(STATIC_SEARCHES, {}).values())
    with torch.no_grad():
        for p in model.decoder_layers.parameters():
            p.mul_(1.3)
    with torch.inference_mode():
        graphed = _search(model, src, decode, True)  # the kept graph, before any eager search
        r = _compare(_search(model, src, decode, False), graphed)
    r["same_graph"] = list(model.__dict__.get(STATIC_SEARCHES, {}).values()) == kept
    r["output_changed"] = not torch.equal(before.scores, graphed.scores)
    r["passed"] = r["tokens_equal"] and r["lengths_equal"] and r["same_graph"] and r["output_changed"]
    return r


@torch.no_grad()
def gpu_checks(device: str = "cuda") -> dict:
    """Graphed vs eager decoding on small random models; a dict of results, ``passed`` overall
    (runs on CPU too, without capture: a dry run)."""
    out: dict = {}
    cuda = torch.device(device).type == "cuda"
    shape = dict(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=256)
    src = _sources([3, 17, 1, 9, 25, 6, 12, 4, 30, 2], 500, 1, device)
    for m_name, extra in MODELS.items():
        model = _model(500, 0, device, **shape, **extra)
        for s_name, decode in SEARCHES.items():
            out[f"{m_name}/{s_name}/fp32"] = _guarded(lambda: _check_search(model, src, decode, cuda))
            out[f"{m_name}/{s_name}/bf16"] = _guarded(lambda: _check_bf16(model, src, decode, cuda))
    model = _model(500, 0, device, **shape, **MODELS["sinusoidal_post"])
    out["weights_changed_in_place"] = _guarded(lambda: _check_weights_changed_in_place(model, src))
    out["auto_dispatch"] = {"passed": use_static(model, src, None, None) == cuda}
    out["passed"] = all(r["passed"] for r in out.values())
    return out


def _time(run, runs: int) -> float:
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def ab_timings(device: str = "cuda", sentences: int = 64, src_len: int = 24, out_len: int = 32,
               runs: int = 5) -> dict:
    """Sentences/s of eager vs graphed greedy and beam 4, fp32 and bf16 autocast, on a base-sized
    random model (6+6 layers, d_model 512, 8k vocabulary) forced to ``out_len`` tokens."""
    model = _model(8000, 0, device, d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048)
    src = _sources([src_len] * sentences, 8000, 2, device)
    out: dict = {"sentences": sentences, "src_len": src_len, "out_len": out_len, "device": torch.cuda.get_device_name()}
    for beam in (1, 4):
        decode = DecodeConfig(beam=beam, lenpen=0.6, max_len_a=0.0, max_len_b=out_len, min_len=out_len)
        for bf16 in (False, True):
            name = f"{'greedy' if beam == 1 else f'beam{beam}'}/{'bf16' if bf16 else 'fp32'}"
            out[name] = _guarded(lambda: _ab(model, src, decode, bf16, runs))
    return out


def _ab(model: Transformer, src: torch.Tensor, decode: DecodeConfig, bf16: bool, runs: int) -> dict:
    """Sentences/s, eager and graphed, and the ratio."""
    row: dict = {}
    for static in (False, True):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            seconds = _time(lambda: _search(model, src, decode, static), runs)
        row["graphed" if static else "eager"] = round(src.shape[0] / seconds, 1)
    row["speedup"] = round(row["graphed"] / row["eager"], 2)
    row["passed"] = True
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", action="store_true")
    parser.add_argument("--timings", action="store_true")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--out-len", type=int, default=32)
    args = parser.parse_args()
    result = {}
    if args.checks or not args.timings:
        result["checks"] = gpu_checks()
    if args.timings or not args.checks:
        result["timings"] = ab_timings(sentences=args.sentences, out_len=args.out_len)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
