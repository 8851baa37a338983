"""Evaluation: sacrebleu BLEU and chrF, and timed translation of a test set."""

from .metrics import corpus_bleu, evaluate, evaluate_files, score

__all__ = ["corpus_bleu", "score", "evaluate", "evaluate_files"]
