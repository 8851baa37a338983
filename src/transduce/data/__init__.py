"""Data pipeline: text -> tokenizer -> prepared token files -> token-budget batches.

Modules: ``tokenizer`` (SentencePiece, fixed special ids), ``corpus`` (reading, validation,
encoding, filtering), ``prepare`` (a config's corpus into a prepared directory, in worker
processes), ``prepared`` (that directory's format: written once, opened memory-mapped),
``epoch_batches`` (each epoch's token-budget batches: pure functions of lengths), ``batch``
(collation into padded tensors) and ``encoder_inputs`` (BERT's masking, classification
batches): the modules here that import torch, so this package does not import them; ``toy``
(the embedded offline language pair) and ``multi30k`` (download and locate Multi30k task 1).
"""

from transduce.data.epoch_batches import BatchPlan, token_budget_batches
from transduce.data.corpus import FilterStats, encode_chunk, read_lines, read_parallel
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer",
    "FilterStats", "encode_chunk", "read_lines", "read_parallel",
    "BatchPlan", "token_budget_batches",
]
