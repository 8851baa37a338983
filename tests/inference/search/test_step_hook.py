"""The per-step hook (streaming): what a search reports as settled is never taken back, is a
prefix of its final output, and the hook changes no output."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import EOS, random_sources, tiny_transformer
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference.search import SearchSpec, Speculation
from transduce.inference.search.constraints import constraint_ids

VOCAB = 40


class Recorder:
    """Collects each row's settled tokens after every step."""

    def __init__(self, batch: int):
        self.seen: list[list[list[int]]] = [[] for _ in range(batch)]

    def __call__(self, ids, tokens, settled) -> None:
        for row, i in enumerate(ids.tolist()):
            self.seen[i].append(tokens[row, : int(settled[row])].tolist())


def _final(out, row: int) -> list[int]:
    return out.hypothesis(row, 0)


GREEDY = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=6)


@torch.inference_mode()
@pytest.mark.parametrize("decode, draft, phrases", [
    (GREEDY, False, None),
    (GREEDY, True, None),  # speculative decoding: a disagreeing draft, so rounds commit different counts
    (DecodeConfig(beam=4, nbest=1, max_len_a=1.0, max_len_b=6), False, None),
    (DecodeConfig(beam=3, nbest=1, lenpen=0.0, stop="best_finished", max_len_a=1.0, max_len_b=6), False, None),
    (DecodeConfig(beam=4, nbest=1, max_len_a=1.0, max_len_b=6), False, [[[5]], [[7, 8]], [], [[9]], [], [[6]]]),
], ids=["greedy", "speculative", "beam", "beam-best-finished", "constrained"])
def test_settled_tokens_grow_into_the_unchanged_output(decode, draft, phrases):
    model = tiny_transformer(VOCAB, seed=0)
    src = random_sources([5, 3, 9, 1, 7, 2], VOCAB, seed=0)
    speculation = Speculation(tiny_transformer(VOCAB, seed=1, n_decoder_layers=1)) if draft else None
    spec = SearchSpec(decode, static=False)
    ids = None if phrases is None else constraint_ids(phrases)
    plain = spec.run(model, src, speculation=speculation, constraints=ids)
    hook = Recorder(src.shape[0])
    out = spec.run(model, src, speculation=speculation, constraints=ids, on_step=hook)
    assert torch.equal(out.tokens, plain.tokens) and torch.equal(out.lengths, plain.lengths)
    grew = 0
    for row, seen in enumerate(hook.seen):
        final = _final(out, row)
        for before, after in zip(seen, seen[1:]):
            assert after[: len(before)] == before or len(after) < len(before)  # extended, never rewritten
        assert all(final[: len(s)] == s for s in seen)  # every report is a prefix of the output
        if decode.beam == 1:  # greedy and speculative settle every token: the last report is the output
            assert seen[-1] == final
        grew += sum(len(b) > len(a) for a, b in zip(seen, seen[1:]))
    assert grew > src.shape[0]  # it streamed: reports grew step by step, not only at the end


def test_sampling_and_static_do_not_stream():
    model = tiny_transformer(VOCAB, seed=0)
    src = random_sources([3], VOCAB, seed=0)
    with pytest.raises(ConfigError, match="stream"):
        SearchSpec(temperature=1.0).run(model, src, on_step=lambda *a: None)
    with pytest.raises(ConfigError, match="stream"):
        SearchSpec(static=True).run(model, src, on_step=lambda *a: None)
    assert EOS == model.config.eos_id
