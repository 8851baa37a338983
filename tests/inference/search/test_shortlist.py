"""The vocabulary shortlist: built from co-occurrence, saved with the model, and exact when it
holds the whole vocabulary (greedy and beam search unchanged); a real one keeps the output in it."""

from __future__ import annotations

import math

import pytest
import torch

from inference_helpers import EXACT, SENTENCES, assert_same_search, random_sources, tiny_transformer
from transduce.cli import main
from transduce.config import DecodeConfig
from transduce.errors import ConfigError
from transduce.inference import SearchSpec, Translator
from transduce.inference.search.shortlist import FILE, Shortlist, build_shortlist

V = 40


def test_build_ranks_by_association_not_frequency():
    # source 5 always comes with target 7; target 9 is in every sentence (frequent, not specific)
    pairs = [([5], [7, 9]), ([5], [7, 9]), ([6], [8, 9]), ([6, 10], [8, 9, 11])]
    shortlist = build_shortlist(pairs, 12, 12, k=2, frequent=1)
    assert shortlist.table[5].tolist() == [7, 9]
    assert shortlist.table[6].tolist() == [8, 9]
    assert shortlist.table[10].tolist() == [11, 8] and shortlist.table[0].tolist() == [-1, -1]  # 0: never seen
    assert shortlist.frequent.tolist() == [9]
    union = shortlist.union(torch.tensor([[5, 2, 0]]), (0, 1, 2))
    assert union.tolist() == [0, 1, 2, 7, 9]


def test_save_load_round_trip(tmp_path):
    shortlist = build_shortlist([([4, 5], [6, 7])], 8, 8, k=3, frequent=2)
    shortlist.save(tmp_path)
    back = Shortlist.load(tmp_path)
    assert torch.equal(back.table, shortlist.table) and torch.equal(back.frequent, shortlist.frequent)
    assert Shortlist.load(tmp_path / "nowhere") is None


@pytest.mark.parametrize("beam", [1, 4])
def test_a_full_shortlist_changes_nothing(beam, one_thread):
    model = tiny_transformer(vocab=V, seed=3)
    src = random_sources([5, 9, 3, 7], vocab=V, seed=1)
    full = Shortlist(torch.full((V, 1), -1), torch.arange(V))
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_b=12)
    want = SearchSpec(decode).run(model, src)
    got = SearchSpec(DecodeConfig(beam=beam, nbest=beam, max_len_b=12, shortlist=True)).run(model, src, shortlist=full)
    # the same logits, but from another matmul kernel (F.linear on the selected rows): sums in another order
    assert_same_search(want, got, scores=(1e-5, 1e-5), log_probs=(1e-5, 1e-5))
    unused = SearchSpec(decode).run(model, src, shortlist=Shortlist(torch.full((V, 1), -1), torch.tensor([5])))
    assert_same_search(want, unused, scores=EXACT)  # decode.shortlist off: the shortlist is not read


@pytest.mark.parametrize("beam", [1, 3])
def test_a_short_shortlist_keeps_the_output_in_it(beam, one_thread):
    model = tiny_transformer(vocab=V, seed=3)
    src = random_sources([5, 9], vocab=V, seed=2)
    table = torch.full((V, 2), -1)
    table[src[0, 0]] = torch.tensor([11, 12])
    shortlist = Shortlist(table, torch.tensor([20, 21, 22]))
    out = SearchSpec(DecodeConfig(beam=beam, max_len_b=8, shortlist=True)).run(model, src, shortlist=shortlist)
    allowed = set(shortlist.union(src, (0, 1, 2)).tolist())
    assert set(out.tokens.flatten().tolist()) <= allowed
    assert {11, 12} <= allowed and 30 not in allowed


@torch.no_grad()
def _greedy(model, src: torch.Tensor, allowed: torch.Tensor, max_len: int) -> list[int]:
    """Greedy search by hand over the full vocabulary, every id outside ``allowed`` at -inf: the
    tokens without BOS and EOS."""
    cfg = model.config
    blocked = torch.ones(cfg.tgt_vocab_size, dtype=torch.bool)
    blocked[allowed] = False
    enc, out = model.encode(src), [cfg.bos_id]
    while len(out) <= max_len and out[-1] != cfg.eos_id:
        logits = model.decode(torch.tensor([out]), enc).logits[0, -1]                  # (V,)
        out.append(int(logits.masked_fill(blocked, -math.inf).argmax()))
    return [t for t in out[1:] if t != cfg.eos_id]


def test_cli_builds_it_and_translate_uses_it(model_dir, tmp_path, capsys, one_thread):
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(s.upper() for s in SENTENCES) + "\n", encoding="utf-8")
    with Translator.load(model_dir) as translator:
        with pytest.raises(ConfigError, match="decode.shortlist"):
            translator.translate(SENTENCES[:1], shortlist=True)
    assert main(["shortlist", str(model_dir), "--src", str(src), "--tgt", str(tgt), "--k", "2",
                 "--frequent", "2"]) == 0
    assert FILE in capsys.readouterr().out
    try:
        with Translator.load(model_dir) as translator:
            model, shortlist, changed = translator.model, Shortlist.load(model_dir), 0
            cfg = model.config
            for sentence in SENTENCES:  # one at a time: a batch's union is its sentences' together
                got = translator.translate_detailed([sentence], beam=1, max_len_a=0, max_len_b=10, shortlist=True)[0]
                ids = torch.tensor([got.source_tokens + [cfg.eos_id]])                     # (1, S)
                allowed = shortlist.union(ids, (cfg.pad_id, cfg.bos_id, cfg.eos_id))
                assert len(allowed) < cfg.tgt_vocab_size / 2
                assert got.best.tokens == _greedy(model, ids, allowed, 10)
                changed += got.best.tokens != _greedy(model, ids, torch.arange(cfg.tgt_vocab_size), 10)
            assert changed  # the shortlist excludes what the full search picks
        short = tmp_path / "short.src"
        short.write_text(SENTENCES[0] + "\n", encoding="utf-8")
        assert main(["shortlist", str(model_dir), "--src", str(short), "--tgt", str(tgt)]) == 2
        assert "different numbers of lines" in capsys.readouterr().err
    finally:
        (model_dir / FILE).unlink(missing_ok=True)  # the session's model directory, shared
