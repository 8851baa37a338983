"""``transduce ablate --dry``: every Table 3 row trains and is scored, the table shows changed
cells only, and a second run skips the finished rows (resumable)."""

import json

import yaml

from transduce.cli import main
from transduce.config import RunConfig, apply_overrides
from transduce.training.ablate import table3_rows
from extra_helpers import need_extra

CONFIG = {
    "model": {"d_model": 16, "n_heads": 4, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32},
    "data": {"corpus": "toy", "toy_train_size": 60, "toy_valid_size": 8, "toy_test_size": 8, "vocab_size": 60,
             "max_tokens": 256},
    "train": {"warmup_steps": 2, "log_every": 1, "num_threads": 1, "eval_bleu": True, "max_steps": 1000},
}


def test_rows_are_scaled_to_the_base_model():
    rows = dict(table3_rows(RunConfig.from_dict(CONFIG)))
    assert rows["base"] == []
    assert rows["A_h1"] == ["model.n_heads=1"] and rows["A_h16"] == ["model.n_heads=16"]
    assert "A_h4" not in rows  # the base's own
    assert rows["B_dk1"] == ["model.head_dim=1"] and rows["B_dk2"] == ["model.head_dim=2"]  # d_k 4 / 4, 4 / 2
    assert rows["C_N2"] == ["model.n_encoder_layers=2", "model.n_decoder_layers=2"]
    assert rows["C_d32"] == ["model.d_model=32", "model.d_ff=64"]
    assert rows["D_ls0.0"] == ["train.label_smoothing=0.0"] and rows["E_learned"] == ["model.positions=learned"]
    assert "E_sinusoidal" not in rows  # the base's own


def test_a_base_with_other_positions_gets_the_papers_sinusoids_as_a_row():
    config = {**CONFIG, "model": {**CONFIG["model"], "positions": "relative"}}
    rows = dict(table3_rows(RunConfig.from_dict(config)))
    assert rows["E_sinusoidal"] == ["model.positions=sinusoidal"] and rows["E_learned"] == ["model.positions=learned"]


def test_rows_of_a_base_with_its_own_head_width():
    """With model.head_dim set, (A) keeps h * d_k (not d_model) and (B) shrinks the base's d_k."""
    config = {**CONFIG, "model": {**CONFIG["model"], "n_heads": 2, "head_dim": 64}}
    rows = dict(table3_rows(RunConfig.from_dict(config)))
    assert rows["A_h1"] == ["model.n_heads=1", "model.head_dim=128"]
    assert rows["A_h8"] == ["model.n_heads=8", "model.head_dim=16"]
    assert rows["B_dk16"] == ["model.head_dim=16"] and rows["B_dk32"] == ["model.head_dim=32"]
    for overrides in rows.values():  # every row's config is valid and keeps (A)'s width
        m = RunConfig.from_dict(apply_overrides(config, overrides)).model
        assert m.attention_width == 128 or overrides[0].startswith(("model.head_dim", "model.d_model"))


def test_ablate_dry_trains_every_row_and_resumes(tmp_path, capsys):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "ablate"
    assert main(["ablate", str(cfg), "--out", str(out), "--dry", "--no-plot"]) == 0
    table = capsys.readouterr().out.splitlines()
    results = json.loads((out / "table3.json").read_text())
    assert [r["row"] for r in results] == [row for row, _ in table3_rows(RunConfig.from_dict(CONFIG))]
    assert all(r["steps"] == 2 and r["val_ppl"] > 1 and r["val_bleu"] is not None for r in results)
    assert table[2].startswith("| base | 1 | 16 | 32 | 4 |")
    heads = next(line for line in table if line.startswith("| A_h1 "))
    assert heads.startswith("| A_h1 |  |  |  | 1 | 16 |  |  |  | 2 |")  # changed cells only: h, d_k
    narrow = next(line for line in table if line.startswith("| B_dk1 "))
    assert narrow.startswith("| B_dk1 |  |  |  |  | 1 |  |  |  | 2 |")
    assert results[0]["params"] > next(r for r in results if r["row"] == "B_dk1")["params"]
    assert results[0]["params"] != next(r for r in results if r["row"] == "C_d32")["params"]
    mtime = (out / "rows" / "base" / "result.json").stat().st_mtime_ns
    (out / "rows" / "E_learned" / "result.json").unlink()  # as if killed before that row finished
    assert main(["ablate", str(cfg), "--out", str(out), "--dry", "--no-plot"]) == 0
    assert (out / "rows" / "base" / "result.json").stat().st_mtime_ns == mtime  # done rows skipped
    again = json.loads((out / "table3.json").read_text())
    assert [{**r, "minutes": 0} for r in again] == [{**r, "minutes": 0} for r in results]  # the resumed row too


def test_ablation_plot(tmp_path):
    need_extra("plot", "matplotlib")
    from transduce.viz.ablation import plot_ablation
    rows = [{"row": "base", "val_ppl": 5.0, "val_bleu": 30.0}, {"row": "A_h1", "val_ppl": 6.0, "val_bleu": None}]
    out = plot_ablation(rows, tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
