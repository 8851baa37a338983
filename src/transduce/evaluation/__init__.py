"""Evaluation: sacrebleu BLEU and chrF, and timed translation of a test set; perplexity of language
models and masked LMs, accuracy and macro-F1 of classifiers."""

from ..training.validation import corpus_bleu
from .heldout import accuracy, perplexity
from .metrics import evaluate, evaluate_files, score
from .task import EvalFiles, evaluate_model

__all__ = ["corpus_bleu", "score", "evaluate", "evaluate_files", "perplexity", "accuracy", "EvalFiles",
           "evaluate_model"]
