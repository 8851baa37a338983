"""Helpers for the inference tests: tiny random Transformers, random sources, a hand-built
Markov "model" whose token distributions we choose, and the one comparison of two searches. (A
uniquely named module rather than ``conftest`` imports, which clash with other test directories'
conftest modules.)"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transduce.config import model_preset
from transduce.inference import SearchOutput, SearchSpec
from transduce.model import Transformer

PAD, BOS, EOS, UNK = 0, 1, 2, 3


def tiny_transformer(vocab: int = 40, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    shape = dict(d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0)
    cfg = model_preset("tiny", src_vocab_size=vocab, tgt_vocab_size=vocab, **{**shape, **overrides})
    return Transformer(cfg).eval()


def random_sources(lengths: list[int], vocab: int = 40, seed: int = 0) -> Tensor:
    """(B, S) ids + EOS, right-padded; row i has lengths[i] tokens before EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS
    return src


# ---- comparing two searches -----------------------------------------------------------------

Tolerance = tuple[float, float]  # (rtol, atol), as torch.testing.assert_close takes them
EXACT: Tolerance = (0.0, 0.0)


def assert_same_search(want: SearchOutput, got: SearchOutput, scores: Tolerance | None = None,
                       log_probs: Tolerance | None = None, trim: bool = False) -> None:
    """Two searches found the same hypotheses: equal lengths and tokens, and ``scores`` and
    ``log_probs`` within their (rtol, atol) where given (None: not compared; a tolerance follows
    from the arithmetic of the two paths, CONTRIBUTING.md).

    Args:
        trim: compare the tokens over the narrower output's width (a search that stops sooner may
            pad its output less).
    """
    assert torch.equal(want.lengths, got.lengths), (want.lengths, got.lengths)
    width = min(want.tokens.shape[2], got.tokens.shape[2]) if trim else None
    assert torch.equal(want.tokens[:, :, :width], got.tokens[:, :, :width]), (want.tokens, got.tokens)
    for name, tolerance in (("scores", scores), ("log_probs", log_probs)):
        if tolerance is not None:
            rtol, atol = tolerance
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=rtol, atol=atol)


# ---- a hand-built model: next-token probabilities depend only on the previous token ---------

@dataclass
class _Config:
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS


@dataclass
class _Enc:
    memory: Tensor
    mask: Tensor

    def index_select(self, index: Tensor) -> "_Enc":
        return _Enc(self.memory.index_select(0, index), self.mask.index_select(0, index))


@dataclass
class _Cache:
    length: int = 0

    def reorder(self, index: Tensor, cross: bool = True) -> "_Cache":
        return _Cache(self.length)


@dataclass
class _Out:
    states: Tensor
    cache: _Cache | None
    cross_attentions: list[Tensor] | None = None


class MarkovModel(nn.Module):
    """P(y_t | y_<t, x) = table[y_{t-1}]: a transition table over a tiny vocabulary.

    ``table`` maps a previous token to {next token: probability}; unlisted tokens get a tiny
    probability so no log-prob is -inf.
    """

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 8):
        super().__init__()
        self.config = _Config()
        logp = torch.full((vocab, vocab), math.log(1e-6))
        for prev, row in table.items():
            for tok, p in row.items():
                logp[prev, tok] = math.log(p)
        self.register_buffer("logp", logp)
        self.output_proj = nn.Identity()  # decode(project=False) states are the logits themselves

    def encode(self, src: Tensor) -> _Enc:
        return _Enc(torch.zeros(*src.shape, 1), (src != PAD)[:, None, None, :])

    def new_cache(self) -> _Cache:
        return _Cache()

    def decode(self, tgt: Tensor, enc: _Enc, cache: _Cache | None = None, need_weights: bool = False,
               project: bool = True) -> _Out:
        logits = self.logp[tgt]                                           # (B, T, V)
        if cache is not None:
            cache.length += tgt.shape[1]
        cross = None
        if need_weights:
            s = enc.mask.shape[-1]
            w = enc.mask.float().expand(tgt.shape[0], 1, tgt.shape[1], s)
            cross = [w / w.sum(-1, keepdim=True)]
        return _Out(logits, cache, cross)


# ---- a saved model directory with a trained tokenizer ---------------------------------------

SENTENCES = [
    "the cat sat on the mat", "a dog runs in the park", "the bird sings a song",
    "my friend reads a book", "the sun is warm today", "we walk to the river",
    "a child plays with a ball", "the old man drinks tea", "she writes a long letter",
    "they eat bread and cheese",
]


def layer_prefix_draft(model_dir, out_dir, n_layers: int = 1):
    """A draft directory: the trained model with only its first ``n_layers`` decoder layers
    (a cheap, often agreeing draft), and the model's tokenizer."""
    import dataclasses

    from transduce.data.tokenizer import Tokenizer
    from transduce.model import Transformer, load_model, save_model

    model = load_model(model_dir)
    draft = Transformer(dataclasses.replace(model.config, n_decoder_layers=n_layers))
    draft.load_state_dict(model.state_dict(), strict=False)  # the deeper layers have no place
    save_model(draft.eval(), out_dir)
    Tokenizer.load(model_dir).save(out_dir)
    return out_dir


@dataclass(frozen=True)
class HangingSpec(SearchSpec):
    """A search that never ends: a stand-in for an endless loop in a decoding worker (a worker
    process imports it from here, as the test module put this directory on its sys.path)."""

    def run(self, model, src, prefix=None, speculation=None, constraints=None, inside=None):
        while True:
            time.sleep(0.1)


@dataclass(frozen=True)
class StallingSpec(SearchSpec):
    """The plain search, except in the worker whose pid is ``stall_pid``: there it never ends (a
    worker stuck on its batch, to be killed by the test while it holds it)."""

    stall_pid: int = 0

    def run(self, model, src, prefix=None, speculation=None, constraints=None, inside=None):
        import os

        while os.getpid() == self.stall_pid:
            time.sleep(0.1)
        return super().run(model, src, prefix, speculation, constraints, inside=inside)
