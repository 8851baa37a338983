"""Random tiny Hugging Face Longformer directories with RoBERTa's byte-level BPE, as from the hub
(no hub access here): for the Longformer import tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from bert_fixtures import SHAPE, perturbed_and_saved

# Windows of 4, 6 and 8 tokens (2, 3 and 4 each side) on short probes, so that the band, the global
# rows and the edges are all exercised; one case with a window per layer.
CASES = {
    "LongformerForMaskedLM": dict(attention_window=4),
    "LongformerForMaskedLM-untied": dict(attention_window=4, tie_word_embeddings=False),
    "LongformerForMaskedLM-per-layer": dict(attention_window=[4, 8]),
    "LongformerModel": dict(attention_window=6),
}


def build_longformer(where: Path, case: str, roberta_tokenizer: Path, seed: int = 0):
    """A random tiny transformers Longformer of ``case`` saved in ``where`` with the tokenizer
    files; weights 10x transformers' initial scale (attention far from uniform, so that which keys
    a token sees shows in its output), LayerNorms and biases perturbed so that none is the
    identity. Returns the model (eval)."""
    import transformers
    from transduce.data.hf_tokenizer import HFTokenizer

    shutil.copytree(roberta_tokenizer, where)
    config = transformers.LongformerConfig(
        vocab_size=HFTokenizer.from_hf_dir(where).vocab_size, **SHAPE, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, sep_token_id=2, max_position_embeddings=42, type_vocab_size=1, initializer_range=0.2,
        **CASES[case])
    torch.manual_seed(seed)
    return perturbed_and_saved(getattr(transformers, case.split("-")[0])(config).eval(), where)
