"""bench/family.py at a tiny shape: it runs, and both sides of each race do the same work."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from extra_helpers import need_extra

need_extra("export", "transformers")

_PATH = Path(__file__).resolve().parents[1] / "bench" / "family.py"
_spec = importlib.util.spec_from_file_location("bench_family", _PATH)
family = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(family)

TINY = family.SHAPES["tiny"]


def test_the_benchmark_runs_and_its_twins_agree(capsys):
    family.main(["--shape", "tiny", "--runs", "1", "--steps", "1", "--sample-batch", "3", "--prompt-len", "4",
                 "--new-tokens", "5", "--threads", "1"])
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {"lm", "mlm", "sample", "greedy", "t5", "t5-decode"}
    decode = out["results"].pop("t5-decode")
    for section in out["results"].values():
        assert section["max_logit_diff"] < 1e-4
        assert section["transduce"]["tokens_per_s"] > 0 and section["hf"]["tokens_per_s"] > 0
        assert section["ratio_ours_vs_hf"] > 0
    assert out["results"]["sample"]["greedy_rows_equal"] == out["results"]["greedy"]["greedy_rows_equal"] == 3
    assert decode["greedy_rows_equal"] == 3
    for search in ("greedy", "beam4"):
        assert decode[search]["transduce"]["sentences_per_s"] > 0 and decode[search]["hf"]["sentences_per_s"] > 0


def _our_loss(model, batch):
    sums = family.forward_backward(model.eval(), [batch], 0.0, family.PAD, 1.0, "fp32", torch.device("cpu"))
    return float(sums[0]) / batch.n_tgt_tokens


def test_both_sides_train_on_the_same_labels():
    """Without dropout, our trainer's loss on a batch equals the Hugging Face twin's on the
    inputs the benchmark gives it (the LM's labels are not shifted twice; the MLM scores the
    same masked positions)."""
    ours, hf = family.lm_pair(TINY)
    batch = family.text_batch(TINY)
    labels = family.hf_labels(batch.tgt_out)
    want = hf.eval()(input_ids=batch.tgt_in, labels=labels, shift_labels=labels).loss.detach()
    assert _our_loss(ours, batch) == pytest.approx(want.item(), rel=1e-5)

    ours, hf = family.mlm_pair(TINY)
    batch = family.masked_batch(family.text_batch(TINY), ours.mask_id, torch.Generator().manual_seed(0))
    want = hf.eval()(input_ids=batch.src, attention_mask=(batch.src != family.PAD).long(),
                     labels=family.hf_labels(batch.tgt_out)).loss.detach()
    assert batch.n_tgt_tokens > 0
    assert _our_loss(ours, batch) == pytest.approx(want.item(), rel=1e-5)


def test_a_training_step_changes_the_weights():
    ours, hf = family.lm_pair(TINY)
    batch = family.text_batch(TINY)
    before = ours.output_proj.weight.detach().clone()
    family.our_step(ours, batch)()
    assert not torch.equal(before, ours.output_proj.weight)
