"""Evaluation: sacrebleu BLEU and chrF, and timed translation of a test set; held-out loss and
perplexity of language models and masked LMs, accuracy and macro-F1 of classifiers. A run's
validation takes its BLEU and held-out loss from here, never the other way round."""

from .heldout import accuracy, perplexity
from .metrics import corpus_bleu, evaluate, evaluate_files, score
from .task import EvalFiles, evaluate_model

__all__ = ["corpus_bleu", "score", "evaluate", "evaluate_files", "perplexity", "accuracy", "EvalFiles",
           "evaluate_model"]
