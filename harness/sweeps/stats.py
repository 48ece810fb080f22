"""The statistics of a sweep: a success rate's Wilson interval, spreads, and the tests that
say whether two cells differ (Fisher's exact test on successes, Mann-Whitney U on final
losses, Holm's correction over all pairs). scipy does the arithmetic."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Confidence of the success-rate intervals.
CONFIDENCE = 0.95
#: A corrected p-value below this is called a difference.
ALPHA = 0.05
#: Fewer finite final losses than this per cell and the losses are not compared.
MIN_LOSSES = 3


@dataclass(frozen=True, slots=True)
class Spread:
    """Median, quartiles and range of some runs' values."""

    median: float
    p25: float
    p75: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        """Plain data for sweep.json."""
        return asdict(self)


def spread(values: Sequence[float]) -> Spread | None:
    """The spread of ``values`` (None for none); quartiles by the inclusive method."""
    xs = sorted(values)
    if not xs:
        return None
    if len(xs) == 1:
        q1 = q3 = xs[0]
    else:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return Spread(statistics.median(xs), q1, q3, xs[0], xs[-1], len(xs))


def wilson(successes: int, runs: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a success rate; (0, 1) when there are no runs."""
    if runs == 0:
        return (0.0, 1.0)
    from scipy.stats import binomtest

    ci = binomtest(successes, runs).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def fisher(a_successes: int, a_runs: int, b_successes: int, b_runs: int) -> float:
    """Two-sided p-value of Fisher's exact test that two cells share a success rate."""
    from scipy.stats import fisher_exact

    table = [[a_successes, a_runs - a_successes], [b_successes, b_runs - b_successes]]
    return float(fisher_exact(table, alternative="two-sided").pvalue)


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the Mann-Whitney U test on two cells' final losses; None when
    either has fewer than `MIN_LOSSES` or every value is the same."""
    if len(a) < MIN_LOSSES or len(b) < MIN_LOSSES or len({*a, *b}) < 2:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (None stays None and is not counted)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[i] = running
    return adjusted


def finite(values: Sequence[float | None]) -> list[float]:
    """The values that are finite numbers."""
    return [v for v in values if v is not None and math.isfinite(v)]
