"""What must hold on a GPU before its timings count, called by ``bench/gpu.py`` (section ``checks``).

``decode_checks``: the static, CUDA-graphed searches (``transduce.inference.search.static_shapes``) against
the eager ones on small random models: tokens and lengths equal, scores within 1e-4 in fp32
(agreement under bf16 autocast reported); a graph captured, reused by a second batch of the same
padded shape, and seeing weights changed in place (fp32, and bf16 through the kept casts). Models
are prepared for decoding, as a Translator's, with bf16 casts kept.

``train_checks``: the graphed training step (``transduce.training.cuda_graphs``) against the same
step run eagerly over two bucket shapes in fp32 and bf16, the device-side skip of a NaN step,
and one compile for many batch shapes.

Each returns a dict of results with an overall pass flag; on a CPU they dry-run the code
(nothing is captured there, so the capture checks report it).
"""

from __future__ import annotations

from typing import Callable

import torch

from transduce.config import DecodeConfig, ModelConfig
from transduce.data.batch import Batch
from transduce.inference import SearchSpec, prepare_for_decoding
from transduce.inference.speed import STATIC_SEARCHES
from transduce.model import Transformer
from transduce.training.cuda_graphs import GraphedStep
from transduce.training.step import compile_model, forward_backward

from cuda_graph_setup import random_batch, tiny_setup  # bench/, on the path as bench/gpu.py puts it

PAD, BOS, EOS = 0, 1, 2


def _model(vocab: int, seed: int, device: str, **shape) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, dropout=0.0, tie_output=False, **shape)
    model = Transformer(cfg).to(device).eval()
    with torch.no_grad():
        model.output_proj.weight[EOS] *= 4.0  # some hypotheses end early, at different steps
    # as a Translator does (and eager searches then keep the graphs); bf16 autocast reads kept casts
    return prepare_for_decoding(model, cast=torch.bfloat16)


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
    return SearchSpec(decode, static=static).run(model, src)


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


def _check_weights_changed_in_place(model: Transformer, src: torch.Tensor, bf16: bool) -> dict:
    """Weights changed in place (as by an optimizer step): the kept graph reads the new ones
    (the parameters, and the fused projections and casts refreshed in place before it runs),
    as a graph captured afresh does; in fp32 it also equals the eager search."""
    decode = SEARCHES["beam4"]
    autocast = torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=bf16)
    with torch.inference_mode(), autocast:
        before = _search(model, src, decode, True)
    kept = list(model.__dict__.get(STATIC_SEARCHES, {}).values())
    with torch.no_grad():
        for p in model.decoder_layers.parameters():
            p.mul_(1.3)
    with torch.inference_mode(), autocast:
        graphed = _search(model, src, decode, True)  # the kept graph, before any eager search
        r = _compare(_search(model, src, decode, False), graphed)
        same_graph = list(model.__dict__.get(STATIC_SEARCHES, {}).values()) == kept
        model.__dict__.pop(STATIC_SEARCHES, None)
        fresh = _search(model, src, decode, True)   # captured now, with the new weights
    r["same_graph"] = same_graph
    r["output_changed"] = not torch.equal(before.scores, graphed.scores)
    r["fresh_graph_equal"] = bool(torch.equal(fresh.tokens, graphed.tokens) and torch.equal(fresh.lengths,
                                                                                           graphed.lengths))
    r["passed"] = (bf16 or (r["tokens_equal"] and r["lengths_equal"])) and r["same_graph"] \
        and r["output_changed"] and r["fresh_graph_equal"]
    return r


@torch.no_grad()
def decode_checks(device: str = "cuda") -> dict:
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
    out["weights_changed_in_place"] = _guarded(lambda: _check_weights_changed_in_place(model, src, False))
    out["weights_changed_in_place/bf16"] = _guarded(lambda: _check_weights_changed_in_place(model, src, True))
    out["auto_dispatch"] = {"passed": SearchSpec().uses_static(model, src) == cuda}
    out["passed"] = all(r["passed"] for r in out.values())
    return out


def train_checks(device: str | torch.device = "cuda", n_steps: int = 6) -> dict[str, object]:
    """The checks that need a GPU: graphed steps against eager ones, the device-side skip, and
    one compile for many shapes. Returns pass/fail and the max differences, for ``bench/gpu.py``
    (``device="cpu"`` dry-runs the code: nothing is captured there, so the graph checks fail).

    Two copies of a small model (dropout 0) take ``n_steps`` steps on the same batches of two
    bucket shapes (fp32 and bf16), one through CUDA graphs, one eagerly; then a step whose loss is
    NaN must leave the graphed model's parameters as they were.
    """
    dev = torch.device(device)
    out: dict[str, object] = {}
    for precision in ("fp32", "bf16"):
        runs = {}
        for graphs in (True, False):
            model, opt, cfg, pad_id = tiny_setup(dev, precision)
            step = GraphedStep(model, opt, cfg, pad_id, dev, graphs=graphs)
            losses = []
            for i in range(n_steps):
                length = (16, 24)[i % 2]
                batch = _on(random_batch(2048 // length, length, 2048 // length - 3, 300, seed=i), dev)
                losses.append(step(batch, 1e-3, batch.n_tgt_tokens).tolist())
            runs[graphs] = (model, step, losses)
        (gm, gstep, gl), (em, _, el) = runs[True], runs[False]
        tol = 1e-4 if precision == "fp32" else 2e-2
        out.update({f"{precision}_{k}": v for k, v in _compare_training(gm, em, gl, el, tol).items()})
        out[f"{precision}_graphs_captured"] = len(gstep.captured)
        out[f"{precision}_graphed_matches_eager"] = gstep.graphs and len(gstep.captured) == 2 \
            and out[f"{precision}_losses_match"] and out[f"{precision}_params_match"]
        before = [p.detach().clone() for p in gm.parameters()]
        batch = _on(random_batch(128, 16, 100, 300, seed=99), dev)
        metrics = gstep(batch, 1e-3, float("nan")).tolist()  # a NaN normaliser: NaN loss and gradients
        unchanged = all(torch.equal(p, q) for p, q in zip(gm.parameters(), before))
        out[f"{precision}_nan_step_skipped"] = metrics[3] == 0.0 and unchanged
    out.update(_compile_check(dev))
    out["all_passed"] = all(v for k, v in out.items() if k.endswith(("_matches_eager", "_skipped", "_once")))
    return out


def _on(batch: Batch, device: torch.device) -> Batch:
    """``batch`` on ``device``, through pinned memory on CUDA (as the Trainer copies it)."""
    return (batch.pin_memory() if device.type == "cuda" else batch).to(device)


def _compare_training(graphed: torch.nn.Module, eager: torch.nn.Module, graphed_losses: list, eager_losses: list,
             tol: float) -> dict[str, object]:
    """Loss and parameter differences of two runs. Key biases are reported apart: their gradient
    is zero in exact arithmetic (softmax ignores a shift of all scores), so Adam turns rounding
    noise into steps of size lr whose signs any change of kernel order can flip."""
    loss_diff = max(abs(a[0] - b[0]) / max(abs(b[0]), 1e-9) for a, b in zip(graphed_losses, eager_losses))
    diffs = {name: (p - q).abs().max().item() for (name, p), q in zip(graphed.named_parameters(), eager.parameters())}
    param_diff = max(d for n, d in diffs.items() if not n.endswith("k_proj.bias"))
    return {"loss_rel_diff": loss_diff, "param_max_diff": param_diff, "losses_match": loss_diff < tol,
            "params_match": param_diff < tol * 10,
            "k_bias_max_diff": max(d for n, d in diffs.items() if n.endswith("k_proj.bias"))}


def _compile_check(device: torch.device) -> dict[str, object]:
    """The compiled model on four batch shapes: how many graphs dynamo compiled (inductor on
    CUDA; on a CPU dry run the graphs are only counted, not compiled)."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def counting_inductor(gm, example_inputs):
        graphs.append(len(example_inputs))
        return compile_fx(gm, example_inputs) if device.type == "cuda" else gm.forward

    model, _, _, pad_id = tiny_setup(device)
    torch._dynamo.reset()
    compiled = compile_model(model, backend=counting_inductor)
    precision = "bf16" if device.type == "cuda" else "fp32"
    after_first = 0
    for i, length in enumerate((16, 24, 32, 40)):
        batch = _on(random_batch(64, length, 60, 300, seed=i), device)
        forward_backward(compiled, [batch], 0.1, pad_id, batch.n_tgt_tokens, precision, device)
        after_first = after_first or len(graphs)
    # (a graph break compiles a model as more than one graph; what matters is that none is added per shape)
    return {"compile_graphs_first_shape": after_first, "compile_graphs_4_shapes": len(graphs),
            "compile_once": len(graphs) == after_first}
