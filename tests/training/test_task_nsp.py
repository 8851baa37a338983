"""BERT's next-sentence prediction (model.nsp): pair batches, the pretraining loss, a tiny run
that learns it, and the BertForPreTraining export."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig, RunConfig
from transduce.data.batch import token_types
from transduce.data.encoder_inputs import masking_generator, next_sentence_batch
from transduce.data.prepared import TokenPairs
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transduce.errors import ConfigError
from transduce.evaluation.heldout import next_sentence_accuracy
from transduce.model import EncoderOnly, load_model
from transduce.training.loop import run_training
from transduce.training.step import forward_backward

MODEL = {"arch": "encoder_only", "d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 0,
         "d_ff": 64, "max_positions": 40, "norm": "post", "positions": "learned", "activation": "gelu",
         "scale_embeddings": False, "embed_norm": True, "type_vocab_size": 2, "nsp": True}
TRAIN = {"max_steps": 300, "save_every": 300, "eval_every": 300, "log_every": 100, "warmup_steps": 10,
         "num_threads": 1, "label_smoothing": 0.0, "schedule": "constant", "lr": 3e-3, "seed": 3}
TOPICS = [[f"{c}{v}" for v in "aeiou"] for c in "bdgkmpst"]  # 8 topics of 5 words each


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _documents(n_docs: int, seed: int) -> list[str]:
    """Documents of 4 lines, each line 3-6 words of its document's topic: a line's successor shares
    its topic, a random line mostly does not (7 times in 8)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_docs):
        words = TOPICS[rng.randrange(len(TOPICS))]
        lines += [" ".join(rng.choice(words) for _ in range(rng.randint(3, 6))) for _ in range(4)]
    return lines


def _pairs(rows):
    return TokenPairs.from_rows(rows, rows, np.dtype(np.int32), np.dtype(np.int32))


def test_config_needs_masked_lm_head_and_two_token_types():
    for bad in (dict(type_vocab_size=0), dict(n_classes=2)):
        with pytest.raises(ConfigError, match="model.nsp"):
            ModelConfig(**{**MODEL, **bad})
    with pytest.raises(ConfigError, match="model.nsp"):
        ModelConfig(nsp=True)  # encoder_decoder


def test_pairs_are_next_lines_or_random_ones_masked_with_labels():
    rows = [[10 + i, 40 + i, 70 + i] for i in range(20)]
    batch = next_sentence_batch(_pairs(rows), list(range(20)), 30, 99, masking_generator(1, 0, 0, 0))
    labels = batch.next_labels.tolist()
    assert set(labels) == {0, 1} and labels[-1] == 1  # the last line has no next
    assert batch.src[:, 0].eq(BOS_ID).all() and batch.src.shape == (20, 9)
    original = torch.where(batch.tgt_out != PAD_ID, batch.tgt_out, batch.src)  # masking undone
    types = token_types(original)
    for i, label in enumerate(labels):
        first, second = original[i, 1:4].tolist(), original[i, 5:8].tolist()
        assert first == rows[i] and original[i, 4] == original[i, 8] == EOS_ID
        assert (i + 1 < len(rows) and second == rows[i + 1]) == (label == 0)
        assert types[i].tolist() == [0] * 5 + [1] * 4
    assert batch.n_tgt_tokens == int((batch.tgt_out != PAD_ID).sum()) > 0


def test_long_pairs_are_cut_longest_first_to_the_room():
    rows = [list(range(3, 30)), list(range(3, 8))] * 2
    batch = next_sentence_batch(_pairs(rows), [0], 20, 99, masking_generator(0, 0, 0, 0))
    assert batch.src.shape == (1, 22)  # BOS + 20 + EOS


def test_pretraining_loss_is_masked_lm_plus_mean_next_sentence_loss():
    torch.manual_seed(0)
    model = EncoderOnly(ModelConfig(**{**MODEL, "src_vocab_size": 100, "tgt_vocab_size": 100, "dropout": 0.0}))
    rows = [list(range(3 + i, 12 + i)) for i in range(8)]
    batch = next_sentence_batch(_pairs(rows), list(range(8)), 30, model.mask_id, masking_generator(0, 0, 0, 1))
    batch = batch.padded(10, batch.src.size(1), batch.src.size(1))  # dummy rows are ignored
    sums = forward_backward(model, [batch], 0.0, PAD_ID, 1.0, "fp32", torch.device("cpu"))
    states = model(batch.src, token_types(batch.src))
    keep = batch.tgt_out != PAD_ID
    mlm = F.cross_entropy(model.mlm_logits(states[keep]), batch.tgt_out[keep], reduction="sum")
    nsp = F.cross_entropy(model.next_sentence_logits(states[:8]), batch.next_labels[:8])
    torch.testing.assert_close(sums[1], mlm.detach())
    torch.testing.assert_close(sums[0], (mlm + nsp * int(keep.sum())).detach())


def _nsp_accuracy(model: EncoderOnly, tok, lines: list[str]) -> float:
    rows = [tok.encode(line, "src") for line in lines]
    return next_sentence_accuracy(model, _pairs(rows), seed=9, batch_size=50)


def test_nsp_learns_whether_the_second_line_follows(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(_documents(150, 0)) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(_documents(10, 1)) + "\n")
    data = {"corpus": "files", "train_tgt": str(tmp_path / "train.txt"), "valid_tgt": str(tmp_path / "valid.txt"),
            "vocab_size": 60, "max_tokens": 400, "max_len": 16}
    cfg = RunConfig.from_dict({"model": {**MODEL, "dropout": 0.0}, "data": data, "train": TRAIN})
    run_training(cfg, tmp_path / "run")
    model = load_model(tmp_path / "run" / "model").eval()
    assert model.config.nsp
    accuracy = _nsp_accuracy(model, Tokenizer.load(tmp_path / "run" / "model"), _documents(100, 2))
    assert accuracy == _nsp_accuracy(model, Tokenizer.load(tmp_path / "run" / "model"), _documents(100, 2))
    assert accuracy > 0.7  # chance is 0.5 (a topic-blind model's); the task's ceiling about 0.94
    _classifier_starts_from_the_nsp_model(tmp_path, model)


def _classifier_starts_from_the_nsp_model(tmp_path, nsp_model: EncoderOnly) -> None:
    """A classifier fine-tuned from the NSP model keeps its encoder and its next-sentence pooler
    (BERT's fine-tuning reuses the pooler); a learning rate of ~0 leaves them as they were."""
    rng = random.Random(4)
    rows = [(" ".join(rng.choice(TOPICS[t]) for _ in range(4)), f"t{t}") for t in (0, 1) * 40]
    for name in ("train", "valid"):
        (tmp_path / f"{name}.tsv").write_text("".join(f"{text}\t{label}\n" for text, label in rows))
    data = {"corpus": "files", "train_src": str(tmp_path / "train.tsv"), "valid_src": str(tmp_path / "valid.tsv"),
            "max_tokens": 400, "max_len": 16}
    model = {**MODEL, "nsp": False, "n_classes": 2}
    train = {**TRAIN, "max_steps": 1, "save_every": 1, "eval_every": 1, "lr": 1e-12,
             "init_from": str(tmp_path / "run" / "model")}
    run_training(RunConfig.from_dict({"model": model, "data": data, "train": train}), tmp_path / "cls")
    classifier = load_model(tmp_path / "cls" / "model")
    start = dict(nsp_model.named_parameters())
    for name, p in classifier.named_parameters():
        want = start[name.replace("cls_head.pooler", "nsp_head.pooler")] if not name.startswith(
            "cls_head.classifier") else None
        if want is not None:
            torch.testing.assert_close(p, want, rtol=0, atol=1e-6)
