"""Dynamic int8 quantisation of the eager model."""

from __future__ import annotations

import torch
from torch import nn

from transduce.cli import main
from transduce.inference.speed.cpu import quantize_dynamic_int8
from transduce.inference.translator import Translator
from toy_model import toy_pairs


def test_linears_become_int8_and_original_is_untouched(trained_dir):
    tr = Translator.load(trained_dir)
    q = quantize_dynamic_int8(tr.model)
    n_linear = sum(isinstance(m, nn.Linear) for m in tr.model.modules())
    kinds = [m._get_name() for m in q.modules()]
    assert kinds.count("DynamicQuantizedLinear") == n_linear > 0
    assert not any(isinstance(m, nn.Linear) for m in q.modules())
    assert isinstance(tr.model.output_proj, nn.Linear)  # a copy was quantised


@torch.no_grad()
def test_int8_translations_stay_close(trained_dir):
    tr = Translator.load(trained_dir)
    pairs = toy_pairs(40, seed=3)
    want = tr.translate([s for s, _ in pairs], beam=1)
    src = torch.tensor([tr.tokenizer.encode("the red dog sleeps", "src") + [2]])
    tgt = torch.tensor([[1] + tr.tokenizer.encode("der rot Hund", "tgt")])
    logits = tr.model(src, tgt)
    tr.model = quantize_dynamic_int8(tr.model)
    got = tr.translate([s for s, _ in pairs], beam=1)
    assert sum(g == w for g, w in zip(got, want)) >= 0.85 * len(want)
    assert (tr.model(src, tgt) - logits).abs().max() < 0.1 * logits.abs().max()  # per-tensor int8 error


def test_translate_cli_int8(trained_dir, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the red dog sleeps\na big cat\n", encoding="utf-8")
    args = ["translate", str(trained_dir), "--input", str(tmp_path / "in.txt"), "--device", "cpu", "--beam", "1"]
    assert main(args + ["--output", str(tmp_path / "fp32.txt")]) == 0
    assert main(args + ["--int8", "--output", str(tmp_path / "int8.txt")]) == 0
    lines = (tmp_path / "int8.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(lines)
