"""Paired significance of two systems' translations of one test set: sacrebleu's own paired
bootstrap resampling (Koehn, 2004) and approximate randomization (Riezler & Maxwell, 2005), for
BLEU and chrF (``sacrebleu.significance.PairedTest``, as ``sacrebleu --paired-bs / --paired-ar``).

The other system is the baseline: ``p_value`` is the probability, under the test, of a
difference from it at least as large as the one observed. Each system's 95% confidence interval
is the bootstrap's (``mean`` +- ``ci``, sacrebleu's ``estimate_ci``). The resampling is seeded as
sacrebleu seeds it (``SACREBLEU_SEED``, 12345 unless set), so a result repeats.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import DataError

TESTS = {"paired_bootstrap": "bs", "approximate_randomization": "ar"}  # JSON name -> sacrebleu's test_type


def _metrics() -> dict[str, Any]:
    """The metrics compared, by their JSON names: sacrebleu's defaults, as :func:`~.metrics.score`."""
    from sacrebleu.metrics import BLEU, CHRF
    return {"bleu": BLEU(), "chrf": CHRF()}


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def _interval(result: Any) -> list[float] | None:
    return None if result.ci is None else [float(result.mean - result.ci), float(result.mean + result.ci)]


def paired_test(hyps: Sequence[str], other: Sequence[str], refs: Sequence[str], test: str,
                n_samples: int = 0) -> dict[str, Any]:
    """One paired test of ``hyps`` against the baseline ``other`` (both aligned with ``refs``).

    Args:
        test: ``paired_bootstrap`` or ``approximate_randomization``.
        n_samples: bootstrap resamples or randomization trials; 0: sacrebleu's defaults (1000 and
            10000). Approximate randomization's intervals come from 1000 bootstrap resamples.

    Returns:
        Per metric (``bleu``, ``chrf``): ``score``, ``other_score``, ``p_value``, ``ci95`` and
        ``other_ci95`` (``[low, high]``) and the bootstrap means; and the test's ``signature``.
    """
    from sacrebleu.significance import PairedTest

    if not len(hyps) == len(other) == len(refs):
        raise DataError(f"--compare: {len(hyps)} hypotheses, {len(other)} to compare with, {len(refs)} references")
    metrics = _metrics()
    paired = PairedTest([("other", list(other)), ("model", list(hyps))], metrics, [list(refs)],
                        test_type=TESTS[test], n_samples=n_samples, n_ar_confidence=0 if TESTS[test] == "ar" else -1)
    signatures, scores = paired()
    out: dict[str, Any] = {}
    for name, key in zip(metrics, [k for k in scores if k != "System"]):  # sacrebleu's names: BLEU, chrF2
        base, ours = scores[key]
        out[name] = {"score": float(ours.score), "other_score": float(base.score), "p_value": float(ours.p_value),
                     "ci95": _interval(ours), "other_ci95": _interval(base),
                     "mean": _float(ours.mean), "other_mean": _float(base.mean), "signature": str(signatures[key])}
    return out


def compare(hyps: Sequence[str], other: Sequence[str], refs: Sequence[str], n_samples: int = 0) -> dict[str, Any]:
    """Both paired tests (:func:`paired_test`) of ``hyps`` against ``other``: what ``transduce
    evaluate --compare`` adds to its JSON."""
    return {test: paired_test(hyps, other, refs, test, n_samples) for test in TESTS}
