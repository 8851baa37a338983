"""``transduce ablate``: the paper's Table 3 (model variations) for any config.

Each row is the base config with a few keys overridden, trained for the same budget (the
config's ``train.max_steps`` / ``train.max_minutes``), and scored by its final validation:
perplexity per target token and greedy BLEU. Rows are scaled to the base model (Table 3's values
are for d_model 512, h 8, N 6):

- (A) heads with d_k * h fixed: h / 4, h / 2, 2h, 4h (those that divide d_model, or the attention
  width h * d_k when the base sets ``model.head_dim``);
- (B) a smaller d_k alone, h fixed: d_k / 4 and d_k / 2 (the paper's 16 and 32 of 64), through
  ``model.head_dim``; here d_v = d_k shrinks with it (the paper keeps d_v at 64);
- (C) model size: N / 2 and 2N layers, d_model / 2 and 2 d_model (d_ff with it), d_ff / 2 and 2 d_ff;
- (D) dropout 0 and 0.2, label smoothing 0 and 0.2;
- (E) learned positions instead of sinusoids (and, for a base with other positions, such as the Multi30k
  recipe's relative bias, sinusoids too: the paper's base).

The data is prepared once (``OUT/prepared``, unless ``data.prepared`` names it) and every row
trains in its own run directory ``OUT/rows/ID``: a finished row (its ``result.json``)
is skipped, an unfinished one resumed with the trainer's own resume, so a killed ablation
continues where it stood.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from ..config import ModelConfig, RunConfig, load_run_config
from ..data.prepare import prepared_for_run
from ..viz.ablation import plot_ablation
from .loop import run_training

DRY_STEPS = 2  # --dry: every row trains this many steps
COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "dropout", "ls", "positions")


def _cells(cfg: RunConfig) -> dict[str, Any]:
    m = cfg.model
    return {"N": m.n_encoder_layers, "d_model": m.d_model, "d_ff": m.d_ff, "h": m.n_heads, "d_k": m.d_head,
            "dropout": m.dropout, "ls": cfg.train.label_smoothing, "positions": m.positions}


def _heads_rows(m: ModelConfig) -> list[tuple[str, list[str]]]:
    """Rows (A) and (B): h with the attention width h * d_k fixed, then a smaller d_k alone."""
    rows = []
    for h in (m.n_heads // 4, m.n_heads // 2, m.n_heads * 2, m.n_heads * 4):
        if h >= 1 and h != m.n_heads and m.attention_width % h == 0:
            keep = [] if m.head_dim is None else [f"model.head_dim={m.attention_width // h}"]
            rows.append((f"A_h{h}", [f"model.n_heads={h}"] + keep))
    for d_k in sorted({m.d_head // 4, m.d_head // 2} - {0, m.d_head}):
        rows.append((f"B_dk{d_k}", [f"model.head_dim={d_k}"]))
    return rows


def table3_rows(base: RunConfig) -> list[tuple[str, list[str]]]:
    """The rows (id, overrides) for ``base``: its own row first, then (A), (B), (C), (D), (E)."""
    m = base.model
    rows: list[tuple[str, list[str]]] = [("base", []), *_heads_rows(m)]
    for n in (max(1, m.n_encoder_layers // 2), m.n_encoder_layers * 2):
        if n != m.n_encoder_layers:
            rows.append((f"C_N{n}", [f"model.n_encoder_layers={n}", f"model.n_decoder_layers={n}"]))
    for scale in (0.5, 2.0):
        d, ff = int(m.d_model * scale), int(m.d_ff * scale)
        if d % m.n_heads == 0 or m.head_dim is not None:
            rows.append((f"C_d{d}", [f"model.d_model={d}", f"model.d_ff={ff}"]))
    rows += [(f"C_ff{int(m.d_ff * s)}", [f"model.d_ff={int(m.d_ff * s)}"]) for s in (0.5, 2.0)]
    rows += [(f"D_drop{p}", [f"model.dropout={p}"]) for p in (0.0, 0.2) if p != m.dropout]
    rows += [(f"D_ls{e}", [f"train.label_smoothing={e}"]) for e in (0.0, 0.2) if e != base.train.label_smoothing]
    rows += [(f"E_{p}", [f"model.positions={p}"]) for p in ("sinusoidal", "learned") if p != m.positions]
    return rows


def run_row(config: str | None, overrides: list[str], row_dir: Path) -> dict[str, Any]:
    """Train one row in ``row_dir`` (resuming an unfinished run) unless it is done; its result."""
    done = row_dir / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    cfg = load_run_config(config, overrides)
    resume = (row_dir / "checkpoints").is_dir()
    trainer, metrics = run_training(cfg, row_dir, resume=resume)
    params = sum(p.numel() for p in trainer.model.parameters())
    result = {"cells": _cells(cfg), "steps": trainer.state.step, "minutes": trainer.elapsed() / 60,
              "val_ppl": metrics.get("val_ppl"), "val_bleu": metrics.get("val_bleu"), "params": params}
    atomic_write_text(done, json.dumps(result, indent=1))
    return result


def ablate(config: str | None, out: Path, overrides: list[str] = (), dry: bool = False, plot: bool = True
           ) -> list[dict[str, Any]]:
    """Train and score every Table 3 row of ``config`` under ``out``; the rows' results, base first.
    Writes ``table3.json``, ``table3.md`` and, with ``plot`` (the ``plot`` extra), ``table3.png``."""
    overrides = list(overrides)
    if dry:
        overrides += [f"train.max_steps={DRY_STEPS}", f"train.eval_every={DRY_STEPS}", f"train.save_every={DRY_STEPS}"]
    base = load_run_config(config, overrides)
    if base.data.prepared is None:  # every row trains on the same data: prepare it once
        out.mkdir(parents=True, exist_ok=True)
        overrides.append(f"data.prepared={prepared_for_run(base.data, out, base.train.seed).root.resolve()}")
    results = []
    for row_id, row in table3_rows(base):
        results.append({"row": row_id, "overrides": row, **run_row(config, overrides + row, out / "rows" / row_id)})
    atomic_write_text(out / "table3.json", json.dumps(results, indent=1))
    atomic_write_text(out / "table3.md", format_table(results))
    if plot:
        plot_ablation(results, out / "table3.png")
    return results


def format_table(results: list[dict[str, Any]]) -> str:
    """A Markdown table laid out as the paper's Table 3: the base row in full, the others' changed cells only."""
    head = ["", *COLUMNS, "steps", "params", "PPL (dev)", "BLEU (dev)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = results[0]["cells"]
    for r in results:  # (.get: a row run before a column was added has no cell for it)
        cells = [str(r["cells"].get(k, "")) if r is results[0] or r["cells"].get(k) != base.get(k) else ""
                 for k in COLUMNS]
        ppl = "" if r["val_ppl"] is None else f"{r['val_ppl']:.2f}"
        bleu = "" if r["val_bleu"] is None else f"{r['val_bleu']:.1f}"
        lines.append("| " + " | ".join([r["row"], *cells, str(r["steps"]), f"{r['params'] / 1e6:.2f}M", ppl, bleu])
                     + " |")
    return "\n".join(lines) + "\n"
