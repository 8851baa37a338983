"""Prefix-constrained decoding: each output begins with its given target ids, the rest searched."""

from __future__ import annotations

import pytest
import torch

from inference_helpers import BOS, assert_same_search, random_sources, tiny_transformer
from transduce.cli import main
from transduce.config import DecodeConfig
from transduce.inference.search.beam import beam_search
from transduce.inference.search import greedy_search, prefix_ids
from transduce.inference.translator import Translator

SRC = random_sources([5, 2, 7, 4], seed=3)
PREFIXES = [[7, 9, 11], [], [12], [30, 31]]
DECODE = DecodeConfig(beam=3, nbest=3, lenpen=0.6, max_len_a=0.0, max_len_b=9)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_outputs_begin_with_the_prefix_and_no_prefix_is_plain_search(search):
    model = tiny_transformer(seed=1)
    forced = search(model, SRC, DECODE, prefix=prefix_ids(PREFIXES))
    plain = search(model, SRC, DECODE)
    for i, p in enumerate(PREFIXES):
        for k in range(forced.tokens.shape[1]):
            assert forced.hypothesis(i, k)[: len(p)] == p
        if not p:  # a sentence without a prefix is searched as if alone
            assert [plain.hypothesis(i, k) for k in range(plain.tokens.shape[1])] == \
                   [forced.hypothesis(i, k) for k in range(forced.tokens.shape[1])]
    assert prefix_ids([[], []]) is None
    again = search(model, SRC, DECODE, prefix=prefix_ids([[]] * 3 + [[5]]))
    assert again.hypothesis(0) == plain.hypothesis(0)


@torch.no_grad()
@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_scores_are_the_model_log_probability_of_prefix_and_continuation(search):
    model = tiny_transformer(seed=2)
    out = search(model, SRC, DECODE, prefix=prefix_ids(PREFIXES))
    for i in range(SRC.shape[0]):
        src = SRC[i : i + 1, : int((SRC[i] != 0).sum())]
        hyp = out.hypothesis(i)
        logp = torch.log_softmax(model(src, torch.tensor([[BOS] + hyp[:-1]]))[0], -1)
        assert float(out.log_probs[i, 0]) == pytest.approx(float(logp.gather(1, torch.tensor(hyp)[:, None]).sum()),
                                                           abs=1e-4)


def test_greedy_continuation_is_greedy_after_the_prefix():
    """Forcing then searching equals the uncached reference, which re-decodes the whole prefix."""
    model = tiny_transformer(seed=4)
    prefix = prefix_ids(PREFIXES)
    cached = greedy_search(model, SRC, DECODE, prefix=prefix)
    uncached = greedy_search(model, SRC, DECODE, use_cache=False, prefix=prefix)
    assert_same_search(uncached, cached)


def test_translator_and_cli(trained_dir, tmp_path, capsys):
    tr = Translator.load(trained_dir)
    texts = ["the red dog sleeps", "a big cat sees the bird today", "green tree"]
    prefixes = ["ein", "", "der blau"]
    got = tr.translate(texts, beam=4, prefix=prefixes)
    assert got[0].startswith("ein") and got[2].startswith("der blau")
    assert got[1] == tr.translate(texts[1:2], beam=4)[0]
    assert tr.translate(texts, beam=1, prefix=[""] * 3) == tr.translate(texts, beam=1)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "prefix.txt").write_text("\n".join(prefixes) + "\n")
    assert main(["translate", str(trained_dir), "--input", str(tmp_path / "in.txt"), "--prefix-file",
                 str(tmp_path / "prefix.txt"), "--output", str(tmp_path / "out.txt"), "--beam", "4"]) == 0
    assert (tmp_path / "out.txt").read_text().splitlines() == got
    (tmp_path / "short.txt").write_text("ein\n")
    assert main(["translate", str(trained_dir), "--input", str(tmp_path / "in.txt"), "--prefix-file",
                 str(tmp_path / "short.txt"), "--output", str(tmp_path / "bad.txt")]) == 2
    err = capsys.readouterr().err
    assert "fewer lines than the input" in err and err.count("\n") == 1
    assert not (tmp_path / "bad.txt").exists()
