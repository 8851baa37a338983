"""Greedy search, beam search and sampling on id tensors: equivalences and designed cases."""

from __future__ import annotations

import math

import pytest
import torch

from inference_helpers import EOS, PAD, assert_same_search, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.inference import AttentionChoice, beam_search, greedy_search, length_penalty, max_lengths, sample

A, B, C = 4, 5, 6


def test_length_penalty_values():
    assert length_penalty(1, 0.0) == 1.0
    assert math.isclose(length_penalty(10, 0.6), (15 / 6) ** 0.6)
    assert length_penalty(torch.tensor([1, 7]), 1.0).tolist() == pytest.approx([1.0, 2.0])

@torch.inference_mode()
@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_max_length_is_respected_per_sentence(model, search):
    src = random_sources([6, 2, 4], seed=6)
    a, b = 0.5, 2
    limit = max_lengths(src, model.config, a, b)
    assert limit.tolist() == [math.floor(a * n + b) for n in (7, 3, 5)]
    if search == "greedy":
        out = greedy_search(model, src, DecodeConfig(max_len_a=a, max_len_b=b, min_len=100))
    elif search == "beam":
        out = beam_search(model, src, DecodeConfig(beam=3, lenpen=0.6, max_len_a=a, max_len_b=b, min_len=100, nbest=3))
    else:
        out = sample(model, src, seed=0, decode=DecodeConfig(max_len_a=a, max_len_b=b, min_len=100))
    # EOS is forbidden, so every hypothesis runs exactly to its own limit, PAD after it.
    assert torch.equal(out.lengths, limit[:, None].expand_as(out.lengths))
    for i, n in enumerate(limit.tolist()):
        assert torch.all(out.tokens[i, :, n:] == PAD)
        assert torch.all(out.tokens[i, :, :n] > EOS)  # no PAD, BOS or EOS inside

@torch.inference_mode()
def test_attention_rows_are_distributions_over_real_source_tokens(model):
    src = random_sources([6, 2], seed=7)
    plain = beam_search(model, src, DecodeConfig(beam=3, max_len_b=4, nbest=3))
    out = beam_search(model, src, DecodeConfig(beam=3, max_len_b=4, nbest=3), attention=AttentionChoice(-1, 1))
    assert torch.equal(plain.tokens, out.tokens)
    assert out.attention.shape == (*out.tokens.shape, src.shape[1])
    n = int(out.lengths[1, 0])
    rows = out.attention[1, 0, :n]
    torch.testing.assert_close(rows.sum(-1), torch.ones(n))
    assert torch.all(rows[:, 3:] == 0)  # sentence 1 has 3 real source positions
    greedy = greedy_search(model, src, DecodeConfig(max_len_b=4), attention=AttentionChoice(-1, None))
    torch.testing.assert_close(greedy.attention[0, 0, :2].sum(-1), torch.ones(2))

@pytest.mark.parametrize("v,k", [(8000, 8), (6400, 1), (37000, 10), (8003, 8), (40, 8)])
def test_topk_rows_matches_topk(v, k):
    from transduce.inference.search.common import topk_rows
    x = torch.randn(7, v, generator=torch.Generator().manual_seed(v))
    x[:, :3] = -math.inf
    values, index = topk_rows(x, k)
    expected = x.topk(k, dim=1)
    assert torch.equal(values, expected.values)
    assert torch.equal(x.gather(1, index), values)


@pytest.mark.parametrize("k", [1, 4])
def test_topk_rows_with_ties_returns_distinct_columns_of_the_top_values(k):
    """Rows of few distinct values (ties within and across blocks): the same values as ``topk``,
    and the columns returned are distinct and hold them."""
    x = torch.randint(0, 3, (5, 8000), generator=torch.Generator().manual_seed(k)).float()
    from transduce.inference.search.common import topk_rows
    values, index = topk_rows(x, k)
    assert torch.equal(values, x.topk(k, dim=1).values)
    assert torch.equal(x.gather(1, index), values)
    assert all(len(set(row)) == k for row in index.tolist())

@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_search_works_with_gradients_enabled(search):
    """A model straight from training (grad mode on) decodes like one under inference_mode."""
    model = tiny_transformer(seed=12)
    src = random_sources([4, 2], seed=12)
    fns = {"greedy": lambda: greedy_search(model, src, DecodeConfig(max_len_b=5)),
           "beam": lambda: beam_search(model, src, DecodeConfig(beam=2, max_len_b=5, nbest=2)),
           "sample": lambda: sample(model, src, seed=1, decode=DecodeConfig(max_len_b=5))}
    assert torch.is_grad_enabled()
    out = fns[search]()
    with torch.inference_mode():
        expected = fns[search]()
    assert torch.equal(out.tokens, expected.tokens)
    assert not out.scores.requires_grad

@pytest.mark.parametrize("rows", [1, 3, 1000])
def test_scoring_in_row_blocks_changes_nothing(model, monkeypatch, rows):
    """best_tokens projects and scores SCORE_ROWS rows at a time on CPU; any block size gives
    the same search (values to float rounding, the same tokens)."""
    import transduce.inference.search.common as search_module

    src = random_sources([5, 3, 7, 2])
    want = beam_search(model, src, DecodeConfig(beam=3, nbest=3, max_len_b=6))
    monkeypatch.setattr(search_module, "SCORE_ROWS", rows)
    got = beam_search(model, src, DecodeConfig(beam=3, nbest=3, max_len_b=6))
    assert_same_search(want, got, scores=(1.3e-6, 1e-5))  # assert_close's float32 defaults
    states = torch.randn(10, model.config.d_model)
    values, tokens = search_module.best_tokens(model, states, model.config, step=0, min_len=1, k=4)
    logp = search_module.step_log_probs(model.output_proj(states), model.config, 0, 1)
    ref = logp.topk(4, dim=1)
    torch.testing.assert_close(values, ref.values)
    assert torch.equal(tokens, ref.indices)
    assert bool((tokens != model.config.eos_id).all())  # min_len forbids EOS at step 0


def test_a_model_without_bos_in_its_softmax_normalises_over_the_other_ids():
    """model.bos_in_softmax false (an imported T5, whose BOS is PAD's row again): forced
    decoding, the shortlist and ensembles read log-probs normalised without BOS's logit, equal to
    a log-softmax over the other ids; true (every other model): exactly torch's log-softmax."""
    import transduce.inference.search.common as common
    from transduce.inference.search.ensemble import Ensemble
    from transduce.inference.search.forced import force_decode

    without = tiny_transformer(bos_in_softmax=False)
    bos = without.config.bos_id
    keep = torch.tensor([i for i in range(without.config.tgt_vocab_size) if i != bos])
    logits = without.output_proj(torch.randn(6, without.config.d_model)).detach()
    got = common.output_log_softmax(logits, without.config)
    torch.testing.assert_close(got[:, keep], torch.log_softmax(logits[:, keep], dim=-1))
    assert bool((got[:, bos] == -math.inf).all())
    assert torch.equal(common.output_log_softmax(logits, tiny_transformer().config), torch.log_softmax(logits, -1))

    src, tgt = random_sources([5, 3, 7]), random_sources([4, 6, 2], seed=1)
    with torch.no_grad():
        full = without(src, torch.cat([torch.full((3, 1), bos), tgt[:, :-1]], dim=1))   # (B, T, V)
    want = torch.log_softmax(full[..., keep], dim=-1).gather(2, (tgt - (tgt > bos).long())[..., None])[..., 0]
    torch.testing.assert_close(force_decode(without, src, tgt).token_log_probs, want.masked_fill(tgt == PAD, 0.0))

    states = torch.randn(5, without.config.d_model)
    vocab = common.BatchVocab.restrict(without.output_proj, torch.arange(without.config.tgt_vocab_size),
                                       without.config)
    with torch.no_grad():
        ref = common.best_tokens(without, states, without.config, step=1, min_len=0, k=3)
        short = common.best_tokens(without, states, without.config, step=1, min_len=0, k=3, vocab=vocab)
        torch.testing.assert_close(short[0], ref[0])
        torch.testing.assert_close(Ensemble([without]).output_proj(states),
                                   common.output_log_softmax(without.output_proj(states), without.config))


def test_bos_in_softmax_false_needs_a_bos_of_its_own():
    from transduce.config import model_preset
    from transduce.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model\.bos_in_softmax: false needs a BOS of its own"):
        model_preset("tiny", src_vocab_size=40, tgt_vocab_size=40, bos_in_softmax=False, bos_id=2)
