"""Data pipeline: text -> tokenizer -> filtered id pairs -> token-budget batches.

Modules: ``tokenizer`` (SentencePiece, fixed special ids), ``corpus`` (reading, validation,
encoding, collation), ``batching`` (pure functions of lengths), ``toy`` (the embedded offline
language pair) and ``multi30k`` (download and locate Multi30k task 1).
"""

from transduce.data.batching import BatchPlan, token_budget_batches
from transduce.data.corpus import Batch, FilterStats, collate, encode_chunk, read_lines, read_parallel
from transduce.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer",
    "Batch", "FilterStats", "collate", "encode_chunk", "read_lines", "read_parallel",
    "BatchPlan", "token_budget_batches",
]
