"""Ensembles: token log-probabilities averaged at every step of greedy and beam search."""

from __future__ import annotations

import shutil

import pytest
import torch

from inference_helpers import BOS, EOS, assert_same_search, random_sources, tiny_transformer
from transduce.checksums import record
from transduce.cli import main
from transduce.config import DecodeConfig, model_preset
from transduce.errors import ConfigError
from transduce.inference.search.beam import beam_search
from transduce.inference.search.ensemble import Ensemble
from transduce.inference.search import greedy_search
from transduce.inference.translator import Translator
from transduce.model import Transformer

SRC = random_sources([5, 2, 7, 4], seed=3)
DECODE = DecodeConfig(beam=4, lenpen=0.6, max_len_a=0.0, max_len_b=9)


def _wider(seed: int) -> Transformer:
    """Another shape: members need only share the vocabulary."""
    torch.manual_seed(seed)
    return Transformer(model_preset("tiny", src_vocab_size=40, tgt_vocab_size=40, d_model=48, n_heads=4,
                                    n_encoder_layers=1, n_decoder_layers=3, d_ff=96, dropout=0.0)).eval()


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_an_ensemble_of_one_is_the_model(search):
    model = tiny_transformer(seed=1)
    run = greedy_search if search == "greedy" else beam_search
    assert_same_search(run(model, SRC, DECODE), run(Ensemble([model]), SRC, DECODE), scores=(0, 1e-5))


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_two_identical_models_are_one(search):
    run = greedy_search if search == "greedy" else beam_search
    assert_same_search(run(tiny_transformer(seed=1), SRC, DECODE),
                       run(Ensemble([tiny_transformer(seed=1), tiny_transformer(seed=1)]), SRC, DECODE),
                       scores=(0, 1e-5))


@torch.no_grad()
def test_greedy_follows_the_mean_of_the_members_log_probabilities():
    """Reference: re-decode each member's whole prefix, average log-softmaxes, renormalise, argmax."""
    members = [tiny_transformer(seed=1), _wider(seed=2)]
    out = greedy_search(Ensemble(members), SRC, DECODE)
    for i in range(SRC.shape[0]):
        src = SRC[i : i + 1, : int((SRC[i] != 0).sum())]
        prefix, logp_sum = [BOS], 0.0
        for _ in range(DECODE.max_len_b):
            tgt = torch.tensor([prefix])
            mean = torch.stack([torch.log_softmax(m(src, tgt)[0, -1], -1) for m in members]).mean(0)
            logp = torch.log_softmax(mean, -1)
            logp[[0, 1]] = -float("inf")                                  # never PAD or BOS
            token = int(logp.argmax())
            prefix.append(token)
            logp_sum += float(logp[token])
            if token == EOS:
                break
        assert out.hypothesis(i) == prefix[1:]
        assert float(out.log_probs[i, 0]) == pytest.approx(logp_sum, abs=1e-4)


def test_cached_beam_equals_its_members_re_decoded():
    """Beam search over an ensemble (pooled caches, reordered together) ranks as a teacher-forced
    ensemble scores: each returned hypothesis' log-prob equals the ensemble's forward pass."""
    ensemble = Ensemble([tiny_transformer(seed=1), tiny_transformer(seed=4)])
    out = beam_search(ensemble, SRC, DecodeConfig(beam=3, nbest=3, lenpen=0.0, max_len_a=0.0, max_len_b=7))
    with torch.no_grad():
        for i in range(SRC.shape[0]):
            src = SRC[i : i + 1, : int((SRC[i] != 0).sum())]
            for k in range(3):
                hyp = out.hypothesis(i, k)
                tgt = torch.tensor([[BOS] + hyp[:-1]])
                logp = torch.log_softmax(ensemble(src, tgt)[0], -1)
                want = float(logp.gather(1, torch.tensor(hyp)[:, None]).sum())
                assert float(out.log_probs[i, k]) == pytest.approx(want, abs=1e-4)


def test_members_must_share_a_vocabulary():
    with pytest.raises(ConfigError, match="vocab_size=41"):
        Ensemble([tiny_transformer(vocab=40), tiny_transformer(vocab=41)])


def test_translator_and_cli(trained_dir, tmp_path, capsys):
    texts = ["the red dog sleeps", "a big cat sees the bird today"]
    one = Translator.load(trained_dir).translate(texts, beam=4)
    shutil.copytree(trained_dir, tmp_path / "copy")
    assert Translator.load([trained_dir, tmp_path / "copy"]).translate(texts, beam=4) == one
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["translate", str(trained_dir), str(tmp_path / "copy"), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text().splitlines() == one
    capsys.readouterr()
    # the ensemble in worker processes (each worker loads both members): the same translations
    assert main(["translate", str(trained_dir), str(tmp_path / "copy"), "--workers", "2",
                 "--input", str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out.splitlines() == one
    shutil.copytree(trained_dir, tmp_path / "other")
    (tmp_path / "other" / "tokenizer.yaml").write_text("joint: false\n")
    shutil.copy(tmp_path / "other" / "spm.model", tmp_path / "other" / "spm.src.model")
    shutil.copy(tmp_path / "other" / "spm.model", tmp_path / "other" / "spm.tgt.model")
    record(tmp_path / "other", ["tokenizer.yaml", "spm.src.model", "spm.tgt.model"])  # made so on purpose
    assert main(["translate", str(trained_dir), str(tmp_path / "other"), "--input", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err
    assert "one tokenizer" in err and err.count("\n") == 1
