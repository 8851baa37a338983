"""Per-task scores of a text-to-text model (T5, Raffel et al., 2020, Sec. 2.4; ``data.corpus: tsv``).

Each input names its task by its prefix, the text before the first ``:`` (:func:`task_of`):
``translate English to German: The dog runs.`` is task ``translate English to German``. A task
whose name starts with ``translate`` is scored by corpus BLEU (sacrebleu, as validation scores
translation), every other one by accuracy: the share of outputs equal to their target (exact
match, whitespace runs collapsed), as T5 scores classification tasks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

from ..errors import DataError
from .metrics import corpus_bleu

NO_PREFIX = "(no prefix)"  # the task of an input without a ":"


def task_of(text: str) -> str:
    """The task an input names: the text before its first ``:``, stripped (:data:`NO_PREFIX` if none)."""
    head, colon, _ = text.partition(":")
    return head.strip() if colon and head.strip() else NO_PREFIX


def metric_of(task: str) -> str:
    """``bleu`` for a translation task (its name starts with ``translate``), else ``acc``."""
    return "bleu" if task.startswith("translate") else "acc"


def task_scores(inputs: Sequence[str], hyps: Sequence[str], refs: Sequence[str],
                task: Callable[[str], str] = task_of, metric: Callable[[str], str] = metric_of
                ) -> dict[str, dict[str, float]]:
    """Each task's score over its lines: ``{task: {"bleu" or "acc": score, "n": lines}}``, tasks
    sorted by name (BLEU 0-100, accuracy 0-1). ``task`` names an input's task and ``metric`` a
    task's metric (a multilingual model's: its language pair, by the input's tag, and BLEU)."""
    if not len(inputs) == len(hyps) == len(refs):
        raise DataError(f"{len(inputs)} inputs, {len(hyps)} outputs and {len(refs)} targets: expected as many of each")
    lines: dict[str, list[int]] = defaultdict(list)
    for i, text in enumerate(inputs):
        lines[task(text)].append(i)
    out = {}
    for name in sorted(lines):
        idx, how = lines[name], metric(name)
        h, r = [hyps[i] for i in idx], [refs[i] for i in idx]
        score = corpus_bleu(h, r) if how == "bleu" else sum(map(_same, h, r)) / len(idx)
        out[name] = {how: score, "n": len(idx)}
    return out


def flat_scores(scores: dict[str, dict[str, float]], prefix: str = "val_") -> dict[str, float]:
    """:func:`task_scores` as one flat record, e.g. ``val_bleu/translate English to German``,
    ``val_acc/classify`` (what a run's validation logs)."""
    return {f"{prefix}{metric}/{task}": value for task, s in scores.items() for metric, value in s.items()
            if metric != "n"}


def _same(hyp: str, ref: str) -> bool:
    return hyp.split() == ref.split()
