"""The evaluation's statistics: a metric's mean over repeats with its Student-t confidence
interval, and the paired difference between two policies that saw the same traffic in each
repeat (a repeat's seed fixes its traffic), with the verdict it supports.

A policy is `best` in a cell only when the confidence interval of its paired difference to
the best other policy excludes 0 in its favour, `worse` when it excludes 0 against it, and
`tied` otherwise; one repeat gives an unbounded interval, so one run never decides.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

CONFIDENCE = 0.95
BEST, TIED, WORSE = "best", "tied", "worse"


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided confidence interval over n values."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def shown(self, fmt: str) -> str:
        """`mean [low, high]`, each in `fmt` (e.g. ".3f", "+.1f")."""
        return f"{self.mean:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"


def mean_ci(
    values: Sequence[float], confidence: float = CONFIDENCE, known_variance: float = 0.0
) -> Interval:
    """The mean of `values` with the Student-t interval (n - 1 degrees of freedom), its
    variance the repeats' plus `known_variance`: one the repeats cannot show (an offline
    evaluation's seeds all draw on the same few measured runs per buffer)."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    n = len(values)
    if n == 1:
        return Interval(mean, -math.inf, math.inf, 1)
    t = float(student_t.ppf((1 + confidence) / 2, n - 1))
    half = t * math.sqrt(statistics.variance(values) / n + known_variance)
    return Interval(mean, mean - half, mean + half, n)


# (policy, rival) -> a variance their paired difference has beyond the repeats' (mean_ci)
KnownVariance = Callable[[str, str], float]


def paired_difference(
    ours: Mapping[int, float],
    theirs: Mapping[int, float],
    confidence: float = CONFIDENCE,
    known_variance: float = 0.0,
) -> Interval:
    """ours - theirs over the repeats both have (keyed by repeat: the same traffic)."""
    shared = sorted(ours.keys() & theirs.keys())
    if not shared:
        raise ValueError("no repeat in common")
    return mean_ci([ours[r] - theirs[r] for r in shared], confidence, known_variance)


def verdict(difference: Interval, higher_is_better: bool = True) -> str:
    """What a paired difference (ours - theirs) says of ours."""
    low, high = (
        (difference.low, difference.high)
        if higher_is_better
        else (-difference.high, -difference.low)
    )
    if low > 0:
        return BEST
    if high < 0:
        return WORSE
    return TIED


@dataclass(frozen=True)
class Comparison:
    """One policy of a cell against the best of the others (by mean)."""

    policy: str
    against: str
    difference: Interval
    verdict: str


def compare_in_cell(
    by_policy: Mapping[str, Mapping[int, float]],
    higher_is_better: bool = True,
    known_variance: KnownVariance | None = None,
) -> list[Comparison]:
    """Each policy of a cell (metric per repeat) against the best other policy by mean."""
    means = {policy: statistics.fmean(v.values()) for policy, v in by_policy.items() if v}
    found = []
    for policy in means:
        others = [p for p in means if p != policy]
        if not others:
            continue
        pick = max if higher_is_better else min
        rival = pick(others, key=lambda p: means[p])
        extra = known_variance(policy, rival) if known_variance else 0.0
        difference = paired_difference(by_policy[policy], by_policy[rival], known_variance=extra)
        found.append(Comparison(policy, rival, difference, verdict(difference, higher_is_better)))
    return found
