"""BERT's masking, the masked-LM and classification losses, and tiny encoders learning with them."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ModelConfig
from transduce.data.encoder_inputs import mask_tokens
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transduce.model import EncoderOnly
from transduce.training.encoder_tasks import classification_loss, masked_lm_loss

MASK = 49  # the last id of a 50-token vocabulary


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


def _ids(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """BOS, random ordinary tokens (UNK included), EOS, then some padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, MASK, (rows, width), generator=g)
    ids[:, 0] = BOS_ID
    lengths = torch.randint(width // 2, width, (rows,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        ids[i, n] = EOS_ID
        ids[i, n + 1:] = PAD_ID
    return ids


def test_masking_proportions_are_berts():
    ids = _ids(400, 500)
    inputs, labels = mask_tokens(ids, MASK, torch.Generator().manual_seed(0))
    selectable = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)
    selected = labels != PAD_ID
    n = int(selected.sum())
    assert abs(n / int(selectable.sum()) - 0.15) < 0.005  # about 6 standard deviations at this size
    masked = (inputs[selected] == MASK).float().mean()
    kept = (inputs[selected] == ids[selected]).float().mean()
    replaced = ((inputs[selected] != MASK) & (inputs[selected] != ids[selected])).float().mean()
    n_ordinary = MASK - 3
    assert abs(masked - 0.8) < 0.015
    # a random replacement draws the original token 1 time in n_ordinary: then it counts as kept
    assert abs(kept - (0.1 + 0.1 / n_ordinary)) < 0.01
    assert abs(replaced - 0.1 * (1 - 1 / n_ordinary)) < 0.01


def test_specials_are_never_selected_and_labels_mark_exactly_the_selected():
    ids = _ids(64, 40, seed=1)
    inputs, labels = mask_tokens(ids, MASK, torch.Generator().manual_seed(1), select=0.5)
    special = (ids == PAD_ID) | (ids == BOS_ID) | (ids == EOS_ID)
    assert torch.equal(inputs[special], ids[special])
    assert (labels[special] == PAD_ID).all()
    selected = labels != PAD_ID
    assert torch.equal(labels[selected], ids[selected])        # the original tokens
    assert torch.equal(inputs[~selected], ids[~selected])      # nothing changes elsewhere
    changed = inputs[selected & (inputs != MASK)]
    assert ((changed > EOS_ID) & (changed < MASK)).all()       # replacements are ordinary tokens
    assert selected.any() and (inputs == MASK).any()


def test_masking_is_a_pure_function_of_the_seed():
    ids = _ids(8, 30)
    a = mask_tokens(ids, MASK, torch.Generator().manual_seed(3))
    b = mask_tokens(ids, MASK, torch.Generator().manual_seed(3))
    c = mask_tokens(ids, MASK, torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], c[1])
    assert mask_tokens(ids, MASK, torch.Generator().manual_seed(0), select=0.0)[1].eq(PAD_ID).all()


def _encoder(**kw) -> EncoderOnly:
    torch.manual_seed(0)
    return EncoderOnly(ModelConfig(**{**dict(
        arch="encoder_only", src_vocab_size=MASK + 1, tgt_vocab_size=MASK + 1, d_model=64, n_heads=4,
        n_encoder_layers=2, d_ff=128, dropout=0.0, positions="learned", max_positions=64, activation="gelu",
        embed_norm=True, scale_embeddings=False), **kw}))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_masked_lm_loss_is_cross_entropy_at_the_selected_positions(smoothing):
    model = _encoder()
    ids = _ids(4, 20)
    inputs, labels = mask_tokens(ids, MASK, torch.Generator().manual_seed(0), select=0.3)
    states = model(inputs)
    out = masked_lm_loss(model, states, labels, smoothing)
    logits = model.mlm_logits(states)
    want = F.cross_entropy(logits.reshape(-1, MASK + 1), labels.reshape(-1), ignore_index=PAD_ID,
                           label_smoothing=smoothing, reduction="sum")
    torch.testing.assert_close(out.loss, want)
    assert int(out.n_tokens) == int((labels != PAD_ID).sum())


def test_classification_loss_is_cross_entropy():
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 2, 1, 0])
    out = classification_loss(logits, labels, 0.1)
    torch.testing.assert_close(out.loss, F.cross_entropy(logits, labels, label_smoothing=0.1, reduction="sum"))
    assert int(out.n_tokens) == 6


def _copy_batch(g: torch.Generator, batch: int = 32, half: int = 8) -> torch.Tensor:
    """BOS x x EOS with x random ordinary tokens: a masked token is predictable from its copy."""
    x = torch.randint(3, MASK, (batch, half), generator=g)
    bos, eos = torch.full((batch, 1), BOS_ID), torch.full((batch, 1), EOS_ID)
    return torch.cat([bos, x, x, eos], dim=1)


@pytest.mark.slow
def test_encoder_learns_masked_tokens_from_their_copies():
    model = _encoder().train()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        inputs, labels = mask_tokens(_copy_batch(g), MASK, g)
        out = masked_lm_loss(model, model(inputs), labels)
        opt.zero_grad()
        (out.loss / out.n_tokens).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        inputs, labels = mask_tokens(_copy_batch(g, batch=256), MASK, g)
        out = masked_lm_loss(model, model(inputs), labels)
    chance = math.log(MASK - 3)  # uniform over the ordinary tokens
    assert float(out.nll / out.n_tokens) < 0.25 * chance


@pytest.mark.slow
def test_encoder_learns_to_classify():
    """Class 1: the sentence holds token 3 somewhere; class 0: it does not."""
    model = _encoder(n_classes=2).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = _copy_batch(g, n)[:, :10].clone()
        ids[ids == 3] = 4
        labels = torch.randint(2, (n,), generator=g)
        where = torch.randint(1, 10, (n,), generator=g)
        ids[labels == 1, where[labels == 1]] = 3
        return ids, labels

    for _ in range(200):
        ids, labels = batch(32)
        out = classification_loss(model.classify(model(ids)), labels)
        opt.zero_grad()
        (out.loss / out.n_tokens).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        ids, labels = batch(512)
        accuracy = (model.classify(model(ids)).argmax(-1) == labels).float().mean()
    assert accuracy > 0.95
