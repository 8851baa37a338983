"""Guided alignment training: the subword reference, the loss against torch's soft-target
cross-entropy, a head that learns a reversed alignment, the AER metric, and bench/alignment.py."""

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transduce.config import model_preset
from transduce.evaluation.metrics import alignment_error_rate
from transduce.model import Transformer
from transduce.training.guided import alignment_targets, guided_alignment_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import alignment as bench_alignment  # noqa: E402


def test_alignment_targets_spread_a_word_link_over_its_subwords():
    src, tgt = ["▁the", "▁r", "ed", "▁dog"], ["▁der", "▁Hu", "nd", "▁rot"]  # words: the red dog / der Hund rot
    ref = alignment_targets([(0, 0), (1, 2), (2, 1), (9, 0)], src, tgt, s=5, t=6)      # (9, 0): beyond, ignored
    expected = torch.zeros(6, 5)
    expected[0, 0] = 1.0                        # der -> the
    expected[1, 3] = expected[2, 3] = 1.0       # Hu, nd -> dog
    expected[3, 1] = expected[3, 2] = 0.5       # rot -> r, ed
    torch.testing.assert_close(ref, expected)


def test_loss_is_torchs_soft_target_cross_entropy_on_linked_rows():
    torch.manual_seed(0)
    att = torch.softmax(torch.randn(2, 5, 4), dim=-1)                                   # (B, T, S)
    ref = torch.softmax(torch.randn(2, 5, 4), dim=-1)
    ref[:, 3:] = 0.0                                                                     # unlinked rows
    want = F.cross_entropy(att[:, :3].log().reshape(-1, 4), ref[:, :3].reshape(-1, 4), reduction="sum")
    torch.testing.assert_close(guided_alignment_loss(att, ref), want)


def test_guidance_teaches_one_head_a_reversed_alignment():
    """A head trained on the guided loss alone attends where the links say (here: reversed)."""
    torch.manual_seed(0)
    cfg = model_preset("tiny", src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=2, n_encoder_layers=1,
                       n_decoder_layers=2, d_ff=64, dropout=0.0, max_positions=32)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    src = torch.randint(4, 20, (8, 6))
    src[:, -1] = cfg.eos_id                                                              # (B, S)
    tgt_in = torch.cat([torch.full((8, 1), cfg.bos_id), torch.randint(4, 20, (8, 5))], dim=1)  # (B, T)
    ref = torch.zeros(8, 6, 6)
    ref[:, torch.arange(5), 4 - torch.arange(5)] = 1.0                                   # target t <- source 4-t

    def attention():
        return model.decode(tgt_in, model.encode(src), need_weights=True, project=False).cross_attentions[0][:, 1]

    def accuracy():
        with torch.no_grad():
            best = attention()[:, :5, :5].argmax(dim=-1)                                 # (B, 5)
        return (best == (4 - torch.arange(5))).float().mean()

    assert accuracy() < 0.5
    for _ in range(30):
        opt.zero_grad()
        guided_alignment_loss(attention(), ref).backward()
        opt.step()
    assert accuracy() > 0.9


def test_alignment_error_rate():
    sure = [[(0, 0), (1, 2)], [(0, 1)]]
    assert alignment_error_rate(sure, sure) == 0.0
    assert alignment_error_rate([[(0, 0), (1, 1)], []], sure) == pytest.approx(1 - 2 * 1 / (2 + 3))
    assert alignment_error_rate([[(0, 0), (1, 1)], []], sure, possible=[[(1, 1)], []]) == pytest.approx(1 - 3 / 5)
    assert alignment_error_rate([[]], [[]]) == 0.0


def test_the_toy_reference_links_are_the_lexicons():
    en = "Has their doctor waited quickly?"
    de = "Hat ihr Arzt schnell gewartet?"
    assert bench_alignment.lexicon_links(en, de) == [(0, 0), (2, 2), (3, 4), (4, 3)]
    # a lemma twice on a side is not annotated
    assert bench_alignment.lexicon_links("The dog sees the dog.", "Der Hund sieht den Hund.") == [(2, 2)]


def test_bench_dry_run_prints_its_figures(capsys):
    assert bench_alignment.main(["--dry", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("unguided_aer", "unguided_best_aer", "guided_aer"):
        assert 0.0 <= out[key] <= 1.0
    assert out["unguided_best_aer"] <= out["unguided_aer"] and out["reference_links"] > 0
