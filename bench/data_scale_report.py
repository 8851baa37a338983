"""bench/data_scale.py's derived figures: ratios against the peer, the smallest size and the
baseline, the issue's targets as booleans (``verdicts``), and the plot of RSS and time against size."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _get(d: dict, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def derive(results: list[dict[str, Any]], state_mb: float | None) -> dict[str, Any]:
    """Ratios against the peer and the smallest size, and the issue's targets as booleans."""
    base = results[0]
    base_pps = _get(base, "transduce", "prepare", "pairs_per_s")
    base_rss = _get(base, "transduce", "train", "peak_rss_mb")
    per_size, verdicts = {}, {}
    for r in results:
        pps = _get(r, "transduce", "prepare", "pairs_per_s")
        hf_pps = _get(r, "hf", "pairs_per_s")
        rss = _get(r, "transduce", "train", "peak_rss_mb")
        d = {
            "prepare_vs_hf_pairs_per_s": round(pps / hf_pps, 2) if pps and hf_pps else None,
            "prepare_pairs_per_s_vs_smallest": round(pps / base_pps, 3) if pps and base_pps else None,
            "train_rss_vs_smallest_pct": round(100 * (rss / base_rss - 1), 1) if rss and base_rss else None,
            "train_rss_beyond_model_state_mb": round(rss - state_mb, 1) if rss and state_mb else None,
            "first_step_vs_baseline": _ratio(_get(r, "transduce", "train", "first_step_s"),
                                             _get(r, "baseline", "train", "first_step_s")),
            "train_rss_vs_baseline": _ratio(rss, _get(r, "baseline", "train", "peak_rss_mb")),
        }
        per_size[r["label"]] = d
        first = _get(r, "transduce", "train", "first_step_s")
        resumed = _get(r, "transduce", "resume", "first_step_s")
        verdicts[r["label"]] = {
            "prepare_at_least_1_5x_hf": None if d["prepare_vs_hf_pairs_per_s"] is None
            else d["prepare_vs_hf_pairs_per_s"] >= 1.5,
            "prepare_linear_within_20pct": None if d["prepare_pairs_per_s_vs_smallest"] is None
            else abs(d["prepare_pairs_per_s_vs_smallest"] - 1) <= 0.20,
            "train_rss_within_10pct_of_smallest": None if d["train_rss_vs_smallest_pct"] is None
            else d["train_rss_vs_smallest_pct"] <= 10.0,
            "train_rss_under_1_5gb_beyond_model_state": None if d["train_rss_beyond_model_state_mb"] is None
            else d["train_rss_beyond_model_state_mb"] < 1536,
            "first_step_within_10s": None if first is None else first <= 10.0,
            "first_step_after_resume_within_10s": None if resumed is None else resumed <= 10.0,
        }
    flat = [v for vs in verdicts.values() for v in vs.values()]
    return {"per_size": per_size, "verdicts": verdicts,
            "all_targets_met": None if any(v is None for v in flat) else all(flat)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def plot(results: list[dict[str, Any]], path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))

    def series(ax, keys: tuple[str, ...], label: str, marker: str) -> None:
        pts = [(r["pairs"], _get(r, *keys)) for r in results]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=label)

    series(ax1, ("transduce", "train", "peak_rss_mb"), "transduce train (prepared)", "o")
    series(ax1, ("baseline", "train", "peak_rss_mb"), "today's train (in memory)", "s")
    series(ax1, ("transduce", "prepare", "peak_rss_mb"), "transduce prepare", "^")
    series(ax1, ("hf", "peak_rss_mb"), "datasets (map+save+load)", "v")
    series(ax2, ("transduce", "prepare", "wall_s"), "transduce prepare", "^")
    series(ax2, ("hf", "seconds_to_saved"), "datasets through save_to_disk", "v")
    series(ax2, ("transduce", "train", "first_step_s"), "first step, prepared", "o")
    series(ax2, ("baseline", "train", "first_step_s"), "first step, today's", "s")
    for ax, ylabel in ((ax1, "peak RSS, process tree (MB)"), (ax2, "time (s)")):
        ax.set_xscale("log")
        ax.set_xlabel("corpus size (pairs)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax2.set_yscale("log")
    fig.suptitle("transduce data path at scale (2-core CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
