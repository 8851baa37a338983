"""Collation: BOS/EOS, padding and the teacher-forcing shift."""

import numpy as np
import pytest
import torch

from transduce.config import ModelConfig
from transduce.config.model import IGNORE_LABEL
from transduce.data.batch import Batch, Specials, collate, pad, token_types
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def test_collate_adds_bos_eos_and_pads():
    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])])
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 8)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert len(batch) == 2


def test_collate_shifts_targets_by_one(toy_tokenizer, toy_pairs):
    kept = [(toy_tokenizer.encode(s, "src"), toy_tokenizer.encode(t, "tgt")) for s, t in toy_pairs[:64]]
    batch = collate(kept)
    labels = batch.tgt_out != PAD_ID
    assert int(labels.sum()) == batch.n_tgt_tokens
    assert int((batch.src != PAD_ID).sum()) == batch.n_src_tokens
    # teacher forcing: the decoder input at t + 1 is the label at t (except after EOS)
    inner = labels[:, :-1] & (batch.tgt_out[:, :-1] != EOS_ID)
    assert torch.equal(batch.tgt_in[:, 1:][inner], batch.tgt_out[:, :-1][inner])
    assert (batch.tgt_out == EOS_ID).sum() == len(kept)


def test_collate_custom_pad_and_to_device():
    batch = collate([([5], [6, 7])], Specials(pad=99, label_pad=99))
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and moved.src.device.type == "cpu"
    two = collate([([5], [6, 7]), ([5, 5, 5], [6])], Specials(pad=99, label_pad=99))
    assert two.src[0].tolist() == [5, EOS_ID, 99, 99]


def test_collate_with_a_shared_pad_keeps_the_eos_label():
    """GPT-2's one <|endoftext|> (here 9) begins, ends and pads: padded labels carry IGNORE_LABEL,
    so the EOS label is not mistaken for padding, and a padded batch keeps that."""
    cfg = ModelConfig(arch="decoder_only", src_vocab_size=10, tgt_vocab_size=10, n_encoder_layers=0,
                      pad_id=9, bos_id=9, eos_id=9)
    specials = Specials.of(cfg)
    assert specials == Specials(9, 9, 9, IGNORE_LABEL) and cfg.embedding_pad_id is None
    batch = collate([([], [5, 6, 7]), ([], [5])], specials).padded(3, 1, 6, specials)
    assert batch.tgt_in.tolist() == [[9, 5, 6, 7, 9, 9], [9, 5, 9, 9, 9, 9], [9, 9, 9, 9, 9, 9]]
    assert batch.tgt_out.tolist() == [[5, 6, 7, 9, -100, -100], [5, 9, -100, -100, -100, -100], [-100] * 6]
    assert int((batch.tgt_out != cfg.label_pad_id).sum()) == batch.n_tgt_tokens == 6


def test_collate_rejects_empty_batch():
    with pytest.raises(ValueError):
        collate([])


def test_collate_takes_arrays_as_lists():
    pairs = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])]
    arrays = [(np.array(s, np.uint16), np.array(t, np.uint16)) for s, t in pairs]
    a, b = collate(pairs), collate(arrays)
    assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("src", "tgt_in", "tgt_out"))




def test_token_types_are_berts_segments():
    """BOS a EOS is segment 0; a pair's b EOS (after the first EOS, BERT's [SEP]) segment 1; PAD 0."""
    ids = pad([[5, 6], [5, EOS_ID, 7, 8], [9, EOS_ID, 4]], bos=True, eos=True)
    assert ids[1].tolist() == [BOS_ID, 5, EOS_ID, 7, 8, EOS_ID]
    assert token_types(ids).tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0]]
