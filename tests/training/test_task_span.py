"""T5's span corruption (train.task span): the noise mask's statistics, exact reconstruction,
determinism per key, sentinels reserved by the tokenizer, and a tiny T5 whose loss falls."""

import numpy as np
import pytest
import torch

from transduce.config import RunConfig
from transduce.data.span_corruption import (corrupt, noise_span_count, random_spans_noise_mask, span_batch,
                                            span_generator, span_sentinels)
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transduce.errors import ConfigError
from transduce.model import Transformer, load_model
from transduce.training.loop import run_training

from resume_helpers import assert_resume_exact_and_average, assert_trains_with_perplexity

T5 = {"preset": "tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 2, "n_decoder_layers": 2,
      "norm": "pre", "norm_kind": "rms", "positions": "relative", "relative_buckets": 8, "relative_max_distance": 16,
      "bias": False, "scale_embeddings": False, "scale_attention": False, "activation": "geglu", "tie_output": False}
TRAIN = {"task": "span", "max_steps": 12, "save_every": 6, "eval_every": 6, "log_every": 3, "warmup_steps": 5,
         "threads": 1, "keep_last": 3, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3}
TOY = {"corpus": "toy", "toy_train_size": 300, "toy_valid_size": 30, "toy_test_size": 10, "vocab_size": 150,
       "tokenizer_algorithm": "unigram", "sentinels": 10, "max_tokens": 400, "max_len": 60}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _cfg(data=None, **train):
    return RunConfig.from_dict({"model": T5, "data": data or TOY, "train": {**TRAIN, **train}})


@pytest.mark.parametrize("length", [20, 57, 200])
def test_noise_mask_has_t5s_density_and_mean_span_length(length):
    rng = span_generator(3, 0, 0, 0)
    masks = [random_spans_noise_mask(length, rng) for _ in range(400)]
    spans = noise_span_count(length)
    assert spans == max(round(min(round(length * 0.15), length - round(length * 0.15)) / 3), 1)  # HF's count
    for m in masks:  # exactly round(0.15 L) noise tokens in exactly that many runs, kept tokens first
        starts = np.flatnonzero(m & ~np.concatenate([[False], m[:-1]]))
        assert m.sum() == round(length * 0.15) and len(starts) == spans and not m[0] and m[-1]
    # and over many draws: the density, and the mean span length L * 0.15 / spans (about 3)
    assert np.mean([m.mean() for m in masks]) == pytest.approx(0.15, abs=0.01)
    runs = [len(r) for m in masks for r in np.split(m, np.flatnonzero(np.diff(m)) + 1) if r[0]]
    assert np.mean(runs) == pytest.approx(round(length * 0.15) / spans) and 2.5 <= np.mean(runs) <= 3.5
    assert spans == 1 or len(set(runs)) > 1  # the partition is random, not even


@pytest.mark.parametrize("length", [0, 1, 2, 3, 9, 40])
def test_input_and_target_give_back_the_sentence(length):
    ids, sentinels = list(range(10, 10 + length)), [99, 98, 97, 96, 95]
    for k in range(20):
        mask = random_spans_noise_mask(length, span_generator(1, k))
        inputs, target = corrupt(ids, mask, sentinels)
        n = noise_span_count(length)
        assert [i for i in inputs if i in sentinels] == sentinels[:n] == [t for t in target if t in sentinels]
        # each sentinel of the input is replaced by what follows it in the target
        pieces, current = {s: [] for s in sentinels}, None
        for token in target:
            current = token if token in sentinels else current
            if token not in sentinels:
                pieces[current].append(token)
        assert [t for i in inputs for t in (pieces[i] if i in sentinels else [i])] == ids
        assert len(target) - n == int(mask.sum())


def test_span_batch_is_a_pair_layout_and_deterministic_per_key():
    rows = [np.arange(10, 70), np.arange(80, 92)]  # 60 tokens: 3 spans placed at random; 12: 1 span, at the end
    a, b = (span_batch(rows, [99, 98, 97], span_generator(1, 0, 0, 4)) for _ in range(2))
    c = span_batch(rows, [99, 98, 97], span_generator(1, 0, 0, 5))
    assert all(torch.equal(x, y) for x, y in ((a.src, b.src), (a.tgt_in, b.tgt_in), (a.tgt_out, b.tgt_out)))
    assert not torch.equal(a.src, c.src)
    assert a.tgt_in[:, 0].eq(BOS_ID).all() and a.tgt_out[:, 0].eq(99).all() and a.src[0, -1] == EOS_ID
    assert torch.equal(a.tgt_in[:, 1:], torch.where(a.tgt_out[:, :-1] == EOS_ID, PAD_ID, a.tgt_out[:, :-1]))
    assert a.n_tgt_tokens == int((a.tgt_out != PAD_ID).sum()) and a.n_src_tokens == int((a.src != PAD_ID).sum())
    # one generator per row: a row is corrupted the same way whatever batch it is in
    alone = span_batch(rows[1:], [99, 98, 97], [span_generator(7)])
    pair = span_batch(rows, [99, 98, 97], [span_generator(6), span_generator(7)])
    n = int((alone.src != PAD_ID).sum())
    assert torch.equal(alone.src[0, :n], pair.src[1, :n])


def test_tokenizer_reserves_sentinels_as_t5s_last_ids(tmp_path):
    lines = [f"the dog {w} the ball" for w in ("sees", "has", "wants")] * 20
    tok = Tokenizer.train(lines, lines, tmp_path, 40, model_type="unigram", sentinels=5)
    v = tok.src_vocab_size  # (the text is too small to fill 40: SentencePiece's smaller vocabulary + 5)
    assert tok.pieces(range(v - 5, v)) == [f"<extra_id_{n}>" for n in (4, 3, 2, 1, 0)]
    assert v - 3 in tok.encode("the dog <extra_id_2> ball")  # a sentinel is segmented whole
    assert span_sentinels(tok, np.array([20])) == [v - 1, v - 2, v - 3, v - 4, v - 5]
    with pytest.raises(ConfigError, match="data.sentinels: train.task span needs 10 sentinels"):
        span_sentinels(tok, np.array([200]))


def test_span_is_an_encoder_decoder_task():
    assert _cfg().task == "span"
    with pytest.raises(ConfigError, match="train.task"):
        RunConfig.from_dict({"model": {"arch": "decoder_only"}, "train": {"task": "span"}})
    files = RunConfig.from_dict({"model": T5, "train": {"task": "span"},
                                 "data": {"corpus": "files", "train_tgt": "x.txt", "sentinels": 10}})
    assert files.task == "span"  # monolingual text needs no *_src


def test_a_tiny_t5_learns_span_corruption(tmp_path):
    trainer, metrics = run_training(_cfg(max_steps=40, eval_every=40, save_every=40), tmp_path / "run")
    assert_trains_with_perplexity(metrics, tmp_path / "run")
    # a uniform guess over the 150 ids has perplexity 150; the toy corpus's few words make the
    # dropped spans far more predictable than that within 40 steps, on any seed and kernel set-up
    assert metrics["val_ppl"] < 40
    assert isinstance(load_model(tmp_path / "run" / "model"), Transformer)
    torch.manual_seed(123)  # validation corrupts each sentence by its own key: no global random state
    assert trainer.validate() == {k: metrics[k] for k in ("val_loss", "val_ppl")}


def test_span_resume_is_exact_and_checkpoints_average(tmp_path):
    assert_resume_exact_and_average(_cfg, tmp_path, Transformer, "encoder_layers.0.ffn.fc1.weight")


def test_too_few_sentinels_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="data.sentinels"):
        run_training(_cfg({**TOY, "sentinels": 0}), tmp_path / "run")
