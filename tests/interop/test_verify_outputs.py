"""How export verification compares searched outputs (export/verify.py, check_same_outputs): equal
outputs and ties a runtime within the logit tolerance may break the other way pass (a greedy
output may then go on elsewhere); any other difference fails, whichever output the eager model
scores higher, beam or greedy, finished or cut at the length limit. Each format's own test runs its
runtime against a corrupted eager model (test_export_hf, test_export_ct2, test_export_onnx)."""

import pytest
import torch

from transduce.config import ModelConfig
from transduce.interop.base import ExportError
from transduce.interop.verify import (LOGIT_TOL, TOKEN_TOL, check_same_outputs, probe_targets, search_ids,
                                     sequence_log_prob, token_log_probs)
from transduce.model import load_model
from transduce.model.transformer import Transformer
from verify_helpers import MAX_LEN, TIE, assert_each_difference_fails, corrupted, many_probes, near_tie

V = 24
EOS = 2


def _model(**options):
    torch.manual_seed(0)
    return Transformer(ModelConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1,
                                   n_decoder_layers=1, d_ff=32, dropout=0.0, **options)).eval()


def _ranked(model, src_row, candidates):
    """``candidates`` with their log-probs under ``model``, best last."""
    return sorted((sequence_log_prob(model, src_row, c), c) for c in candidates)


def test_a_beam_output_the_eager_model_scores_higher_fails():
    """What a wrong conversion can give: its beam searched elsewhere and found what the eager
    model likes better than its own beam output. Not a tie, so not accepted, either way round."""
    model = _model()
    src = torch.tensor([[5, 6, 7, 8, EOS]])
    scores = _ranked(model, src[0], [[t, u, EOS] for t in range(4, V) for u in range(4, V)])
    (low, worse), (high, better) = scores[0], scores[-1]
    assert high - low > 0.1
    for want, got in (([worse], [better]), ([better], [worse])):
        with pytest.raises(ExportError, match=r"probe output for probe 0 is .*\(log-prob difference "):
            check_same_outputs("probe", model, src, want, got, beam=True)
    assert check_same_outputs("probe", model, src, [better], [better + [0, 0]], beam=True) == 0  # pads stripped


def test_two_outputs_cut_at_the_length_limit_are_held_to_the_tie_too():
    """Both without EOS, same length: a difference fails unless a tie. A runtime that normalises
    over the tokens search may emit alone (``renormalized``, CTranslate2) ranks its beam by scores
    higher by the mass it left out, and only that much more is allowed."""
    model = _model()
    src = torch.tensor([[9, 4, 11, EOS]])
    scores = _ranked(model, src[0], [[t, u] for t in range(4, V) for u in range(4, V)])
    top, best = scores[-2]  # (the best is far ahead of all others)

    def allowance(c):  # the tie, and the mass PAD and BOS have at each step of both hypotheses
        return TOKEN_TOL * 4 + sum(-float(token_log_probs(model, src[0], h).logsumexp(1).sum()) for h in (best, c))

    near = next(c for s, c in reversed(scores) if TOKEN_TOL * 4 < abs(top - s) <= allowance(c))
    far = next(c for s, c in scores if abs(top - s) > allowance(c))
    for got in (near, far):
        with pytest.raises(ExportError, match="verification failed"):
            check_same_outputs("probe", model, src, [best], [got], beam=True)
    assert check_same_outputs("probe", model, src, [best], [near], beam=True, renormalized=True) == 1
    with pytest.raises(ExportError, match="verification failed"):
        check_same_outputs("probe", model, src, [best], [far], beam=True, renormalized=True)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_corrupted_model_fails_greedy_and_beam(trained_dir, beam):
    """The trained model (a random one's outputs hardly depend on its input) against a copy with
    one output row times 1.5, as eager model: every probe whose output differs fails."""
    model = load_model(trained_dir).eval()
    src = many_probes(model)
    broken = corrupted(model, src)
    want, got = search_ids(broken, src, beam, MAX_LEN), search_ids(model, src, beam, MAX_LEN)
    assert_each_difference_fails("corrupted", broken, src, want, got, beam=beam > 1)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_near_tie_broken_the_other_way_passes(beam):
    """Two tokens with one output row and biases TIE apart: the eager model and a "runtime" whose
    biases differ by 2 * TIE (logits within LOGIT_TOL) pick different ones wherever one of them
    is best. With tied embeddings the outputs differ only there, by a tie the scores show."""
    model = _model(output_bias=True)
    src = many_probes(model)
    eager, runtime = near_tie(model, src, -TIE), near_tie(model, src, TIE)
    tgt = probe_targets(eager, src.shape[0])
    with torch.no_grad():
        assert (eager(src, tgt) - runtime(src, tgt)).abs().max() <= LOGIT_TOL
    want, got = search_ids(eager, src, beam, MAX_LEN), search_ids(runtime, src, beam, MAX_LEN)
    differ = sum(w != g for w, g in zip(want, got))
    assert differ >= 5
    assert check_same_outputs("tie", eager, src, want, got, beam=beam > 1) == differ


def test_a_greedy_output_that_goes_on_elsewhere_after_a_near_tie_passes():
    """Untied embeddings: after the tied tokens the two greedy searches read different inputs and
    part, so whole-sentence scores differ by far more than a tie; each token of the runtime's
    output is still within TOKEN_TOL of the eager model's best after the same prefix."""
    model = _model(output_bias=True, share_embeddings=False, tie_output=False)
    src = many_probes(model)
    eager, runtime = near_tie(model, src, -TIE), near_tie(model, src, TIE)
    want, got = search_ids(eager, src, 1, MAX_LEN), search_ids(runtime, src, 1, MAX_LEN)
    parted = [i for i, (w, g) in enumerate(zip(want, got))
              if abs(sequence_log_prob(eager, src[i], g) - sequence_log_prob(eager, src[i], w))
              > TOKEN_TOL * (len(w) + len(g))]
    assert len(parted) >= 3
    assert check_same_outputs("tie", eager, src, want, got) >= len(parted)
    i = parted[0]
    with pytest.raises(ExportError, match="verification failed"):  # beam: the greedy path rule is greedy's only
        check_same_outputs("tie", eager, src[i:i + 1], want[i:i + 1], got[i:i + 1], beam=True)
