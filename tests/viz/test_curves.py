"""Learning-curve plots of a run's metrics."""

import json

from extra_helpers import need_extra


def test_plot_run(tmp_path):
    need_extra("plot", "matplotlib")
    from transduce.viz.curves import plot_run
    lines = [{"step": s, "loss": 5 - s / 10, "lr": 1e-3, "ppl": 3.0} for s in range(1, 20)]
    lines += [{"step": 10, "val_loss": 3.0, "val_bleu": 12.0}, {"step": 19, "val_loss": 2.5, "val_bleu": 20.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    out = plot_run(tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
