"""Speculative decoding: greedy output identical to the model's own greedy search, sampled
tokens distributed as the model's own samples, caches cut back past rejections."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from inference_helpers import EOS, assert_same_search, layer_prefix_draft, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference import greedy_search
from transduce.inference.search.sampling import filter_logits
from transduce.inference.search.common import step_log_probs
from transduce.inference.search.speculative import DraftStats, Speculation, speculative_search

VOCAB = 40


def _assert_same(expected, got):
    assert_same_search(expected, got, log_probs=(0, 1e-4), trim=True)


@torch.inference_mode()
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("min_len", [0, 3])
def test_greedy_with_a_disagreeing_draft_equals_greedy_search(k, min_len):
    # two random models disagree often: rounds reject and cut both caches back
    model, draft = tiny_transformer(VOCAB, seed=0), tiny_transformer(VOCAB, seed=1, n_decoder_layers=1)
    src = random_sources([5, 3, 9, 1, 7, 2], VOCAB, seed=0)
    decode = DecodeConfig(max_len_a=1.0, max_len_b=6, min_len=min_len)
    spec = Speculation(draft)
    _assert_same(greedy_search(model, src, decode),
                 speculative_search(model, src, spec, replace(decode, draft_tokens=k)))
    assert 0 < spec.stats.acceptance < 1  # rejections happened


@torch.inference_mode()
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_model_as_its_own_draft_accepts_everything(k):
    model = tiny_transformer(VOCAB, seed=2)
    src = random_sources([6, 4, 8], VOCAB, seed=2)
    decode = DecodeConfig(max_len_a=0.0, max_len_b=20)
    spec = Speculation(model)
    out = speculative_search(model, src, spec, replace(decode, draft_tokens=k))
    _assert_same(greedy_search(model, src, decode), out)
    assert spec.stats.acceptance == 1.0
    # each target pass emits k + 1 tokens until a row ends
    assert spec.stats.tokens_per_round > min(k + 1, 20) / 2


@torch.inference_mode()
def test_rows_accepting_different_counts_match_each_alone():
    # a draft that is the model with a perturbed last decoder layer: agrees often, not always,
    # and differently per sentence
    model = tiny_transformer(VOCAB, seed=3)
    draft = tiny_transformer(VOCAB, seed=3)
    with torch.no_grad():
        draft.decoder_layers[-1].ffn.fc2.weight.mul_(1.5)
    src = random_sources([7, 2, 9, 4, 5], VOCAB, seed=3)
    decode = DecodeConfig(max_len_a=1.0, max_len_b=8)
    batched = speculative_search(model, src, Speculation(draft), decode)  # (4 tokens by default)
    _assert_same(greedy_search(model, src, decode), batched)
    accepted = []
    for i in range(src.shape[0]):
        n = int((src[i] != 0).sum())
        spec = Speculation(draft)
        alone = speculative_search(model, src[i:i + 1, :n], spec, decode)
        assert alone.hypothesis(0) == batched.hypothesis(i)
        accepted.append(spec.stats.acceptance)
    assert 0 < min(accepted) < max(accepted) <= 1


@torch.inference_mode()
def test_learned_positions_stop_at_the_last_position():
    model = tiny_transformer(VOCAB, seed=4, positions="learned", max_positions=12)
    draft = tiny_transformer(VOCAB, seed=5, positions="learned", max_positions=12, n_decoder_layers=1)
    src = random_sources([10, 3], VOCAB, seed=4)
    decode = DecodeConfig(max_len_a=2.0, max_len_b=10)  # limits beyond 12 positions: capped
    _assert_same(greedy_search(model, src, decode),
                 speculative_search(model, src, Speculation(draft), replace(decode, draft_tokens=8)))


def test_a_draft_with_another_vocabulary_is_refused():
    model, draft = tiny_transformer(VOCAB), tiny_transformer(VOCAB + 1)
    with pytest.raises(ConfigError, match="^draft: the draft's model.src_vocab_size is 41"):
        speculative_search(model, random_sources([3], VOCAB), Speculation(draft))
    with pytest.raises(ConfigError, match="decode.draft_tokens: must be positive"):
        DecodeConfig(draft_tokens=0)


def _two_token_probs(model, src, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Every two-token start (no specials) and its exact probability under ``model`` with EOS
    forbidden (min_len 3) and ``temperature``, by teacher forcing. -> (P, 2), (P,)."""
    vocab = model.config.tgt_vocab_size
    pairs = torch.cartesian_prod(torch.arange(3, vocab), torch.arange(3, vocab))     # (P, 2)
    tgt = torch.cat([torch.full((len(pairs), 1), 1), pairs], dim=1)                   # BOS + pair
    enc = model.encode(src).index_select(torch.zeros(len(pairs), dtype=torch.long))
    logits = model.decode(tgt, enc).logits                                             # (P, 3, V)
    logp = [filter_logits(step_log_probs(logits[:, j], model.config, j, 3), temperature) for j in range(2)]
    return pairs, (logp[0].gather(1, pairs[:, :1]) + logp[1].gather(1, pairs[:, 1:])).exp().squeeze(1)


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the cells expected at least 5 times, the others pooled."""
    expected = probs * counts.sum()
    big = expected >= 5
    chi2 = float((((counts[big] - expected[big]) ** 2) / expected[big]).sum())
    rest_e, rest_c = float(expected[~big].sum()), float(counts[~big].sum())
    return chi2 + ((rest_c - rest_e) ** 2 / rest_e if rest_e > 0 else 0.0)


@torch.inference_mode()
@pytest.mark.parametrize("threshold", [0.3, 0.9])
def test_a_draft_stopping_below_its_threshold_keeps_the_output(threshold):
    model, draft = tiny_transformer(VOCAB, seed=0), tiny_transformer(VOCAB, seed=1, n_decoder_layers=1)
    src = random_sources([5, 3, 9, 1, 7, 2], VOCAB, seed=0)
    decode = DecodeConfig(max_len_a=1.0, max_len_b=6, draft_tokens=8)
    spec = Speculation(draft)
    _assert_same(greedy_search(model, src, decode),
                 speculative_search(model, src, spec, replace(decode, draft_threshold=threshold)))
    full = Speculation(draft)
    speculative_search(model, src, full, decode)
    # the draft stopped early in some rounds: fewer proposals per round than K
    assert spec.stats.proposed / spec.stats.rounds < full.stats.proposed / full.stats.rounds
    assert spec.stats.acceptance > full.stats.acceptance  # the unsure proposals were the rejected ones


def test_a_threshold_outside_0_1_is_refused():
    with pytest.raises(ConfigError, match="decode.draft_threshold"):
        DecodeConfig(draft_threshold=1.0)


@torch.inference_mode()
@pytest.mark.parametrize("k, threshold", [(1, 0.0), (2, 0.0), (3, 0.5)])
def test_speculative_sampling_draws_from_the_models_distribution(k, threshold):
    vocab, rows, temperature = 8, 6000, 0.8
    # untied output layers give two spread-out, different distributions over 25 two-token starts
    model = tiny_transformer(vocab, seed=6, tie_output=False)
    draft = tiny_transformer(vocab, seed=7, n_decoder_layers=1, tie_output=False)
    src = random_sources([3], vocab, seed=6)
    decode = DecodeConfig(max_len_a=0.0, max_len_b=3, min_len=3, draft_tokens=k, draft_threshold=threshold)
    sample = lambda logp: filter_logits(logp, temperature)  # noqa: E731  (three tokens, no EOS)
    spec = Speculation(draft)
    out = speculative_search(model, src.expand(rows, -1), spec, decode, sample, torch.Generator().manual_seed(0))
    pairs, exact = _two_token_probs(model, src, temperature)
    index = {tuple(p.tolist()): i for i, p in enumerate(pairs)}
    counts = torch.zeros(len(pairs))
    for i in range(rows):
        counts[index[tuple(out.hypothesis(i)[:2])]] += 1
    assert _chi_square(counts, exact) < 51.2     # 24 degrees of freedom at most: p < 0.001 above
    # the test can tell: the same counts are far from the draft's own distribution
    assert _chi_square(counts, _two_token_probs(draft, src, temperature)[1]) > 500
    assert 0.2 < spec.stats.acceptance < 0.9
    if threshold:  # rows stopped offering early: the exactness above held with unequal offers
        assert spec.stats.proposed < 0.9 * spec.stats.rounds * k


@torch.inference_mode()
def test_stats_count_rounds_and_tokens():
    model = tiny_transformer(VOCAB, seed=8)
    src = random_sources([4], VOCAB, seed=8)
    spec = Speculation(model, stats=DraftStats())
    out = speculative_search(model, src, spec, DecodeConfig(max_len_a=0.0, max_len_b=9, min_len=9, draft_tokens=3))
    assert int(out.lengths[0, 0]) == 9 and EOS not in out.hypothesis(0)[:-1]
    assert spec.stats.tokens == 9 and spec.stats.rounds == 3  # 4 + 4 + 1 tokens


# ---- on a trained model: the toy word-for-word model of tests/interop, through the Translator --

@pytest.fixture(scope="module")
def toy_draft_dir(trained_dir, tmp_path_factory):
    return layer_prefix_draft(trained_dir, tmp_path_factory.mktemp("toy-draft"))


def test_translator_with_a_draft_translates_as_greedy_search(trained_dir, toy_draft_dir):
    from toy_model import toy_pairs
    from transduce.inference import Translator

    texts = [s for s, _ in toy_pairs(120, seed=99)]
    plain = Translator.load(trained_dir)
    expected = plain.translate_detailed(texts, beam=1)
    for k in (1, 2, 4, 8):
        with Translator.load(trained_dir, draft=toy_draft_dir) as tr:
            got = tr.translate_detailed(texts, draft_tokens=k)
            assert [t.best.tokens for t in got] == [t.best.tokens for t in expected]
            assert [t.best.ended for t in got] == [t.best.ended for t in expected]
            assert 0 < tr.speculation.stats.acceptance < 1
    # one sentence a batch: no row waits for another, so a step of the model keeps more tokens
    with Translator.load(trained_dir, draft=toy_draft_dir) as tr:
        got = tr.translate_detailed(texts[:20], batch_tokens=1, draft_tokens=4)
        assert [t.best.tokens for t in got] == [t.best.tokens for t in expected[:20]]
        assert tr.speculation.stats.tokens_per_round > 1.2


def test_translator_refuses_a_beam_attention_and_another_tokenizer(trained_dir, toy_draft_dir, model_dir):
    from transduce.inference import AttentionChoice, Translator

    tr = Translator.load(trained_dir, draft=toy_draft_dir)
    assert tr.decode.beam == 1  # the default settings become greedy (the model's are beam 4)
    with pytest.raises(ConfigError, match="^decode.beam: speculative decoding is greedy .*got beam 3"):
        tr.translate(["the dog"], beam=3)
    with pytest.raises(ConfigError, match="^attention: speculative decoding records no attention"):
        tr.translate_detailed(["the dog"], attention=AttentionChoice())
    with pytest.raises(ConfigError, match="^draft: .* has another tokenizer than"):
        Translator.load(trained_dir, draft=model_dir)


def test_sampling_through_the_translator_with_a_draft_is_seeded(trained_dir, toy_draft_dir):
    from transduce.inference import Translator

    with Translator.load(trained_dir, draft=toy_draft_dir) as tr:
        a = tr.sample(["the red dog runs", "a bird sings"], temperature=1.5, seed=3, draft_tokens=3)
        b = tr.sample(["the red dog runs", "a bird sings"], temperature=1.5, seed=3, draft_tokens=3)
    assert [t.best.tokens for t in a] == [t.best.tokens for t in b]
