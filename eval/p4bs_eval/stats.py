"""The evaluation's statistics: a metric's mean over repeats with its Student-t confidence
interval, and the paired difference between two policies that saw the same traffic in each
repeat (a repeat's seed fixes its traffic), with the tests and the verdict it supports.

Four verdicts, each meaning one thing (`decide`):
- `best`: the paired difference is shown in the policy's favour (t-test over the repeats,
  each direction one-sided at alpha / 2, so that with a family of one it is the 95% interval
  excluding 0);
- `equivalent`: not shown better, but shown within +-margin of its rival by two one-sided
  tests (TOST, each at alpha);
- `worse`: shown against it and not shown within the margin;
- `inconclusive`: none of these. One repeat gives an unbounded interval and decides nothing.
Across a family of verdicts (`holm`) every p-value is Holm-adjusted before the decision.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

ALPHA = 0.05
CONFIDENCE = 1 - ALPHA
# The equivalence margin unless a registration states one: 2% of |the rival's mean|.
MARGIN_FRACTION = 0.02
BEST, EQUIVALENT, INCONCLUSIVE, WORSE = "best", "equivalent", "inconclusive", "worse"
VERDICTS = (BEST, EQUIVALENT, INCONCLUSIVE, WORSE)


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


@dataclass(frozen=True)
class PairedTest:
    """ours - theirs over the repeats both ran: the 95% interval, the p-value of a
    difference (two-sided: each one-sided test at alpha / 2) and the TOST p-value of
    equivalence within +-margin (the larger of its two one-sided tests' p)."""

    difference: Interval
    sd: float  # of the paired differences (0 with one repeat)
    margin: float
    p_difference: float
    p_equivalence: float

    @property
    def effect_size(self) -> float | None:
        """Cohen's d_z: the mean difference in standard deviations of the differences."""
        return self.difference.mean / self.sd if self.sd > 0 else None


def paired_test(
    ours: Mapping[int, float],
    theirs: Mapping[int, float],
    margin: float,
    known_variance: float = 0.0,
) -> PairedTest:
    """The t-tests of ours - theirs (n - 1 degrees of freedom, the standard error counting
    `known_variance` as `mean_ci` does)."""
    difference = paired_difference(ours, theirs, CONFIDENCE, known_variance)
    shared = sorted(ours.keys() & theirs.keys())
    n, mean = difference.n, difference.mean
    if n == 1:
        return PairedTest(difference, 0.0, margin, 1.0, 1.0)
    sd = statistics.stdev(ours[r] - theirs[r] for r in shared)
    se = math.sqrt(sd**2 / n + known_variance)
    if se == 0:  # the same difference in every repeat, and nothing else known of it
        shown = 0.0 if mean != 0 else 1.0
        return PairedTest(difference, sd, margin, shown, 0.0 if abs(mean) < margin else 1.0)
    df = n - 1
    p_difference = float(2 * student_t.sf(abs(mean) / se, df))
    above_lower = float(student_t.sf((mean + margin) / se, df))  # H0: difference <= -margin
    below_upper = float(student_t.cdf((mean - margin) / se, df))  # H0: difference >= margin
    return PairedTest(difference, sd, margin, p_difference, max(above_lower, below_upper))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: the k-th smallest of m p-values times (m - k + 1), kept
    monotone and at most 1; a hypothesis is rejected at alpha when its adjusted p <= alpha."""
    m = len(p_values)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def decide(
    mean_difference: float,
    p_difference: float,
    p_equivalence: float,
    alpha: float = ALPHA,
    higher_is_better: bool = True,
) -> str:
    """The verdict of (adjusted) p-values: a difference shown in the policy's favour is
    `best`; else one shown within the margin `equivalent`; else one shown against it
    `worse`; else `inconclusive`."""
    favoured = mean_difference > 0 if higher_is_better else mean_difference < 0
    if p_difference <= alpha and favoured:
        return BEST
    if p_equivalence <= alpha:
        return EQUIVALENT
    if p_difference <= alpha:
        return WORSE
    return INCONCLUSIVE


@dataclass(frozen=True)
class Comparison:
    """One policy of a cell against the best of the others (by mean)."""

    policy: str
    against: str
    test: PairedTest
    verdict: str

    @property
    def difference(self) -> Interval:
        return self.test.difference


def compare_in_cell(
    by_policy: Mapping[str, Mapping[int, float]],
    higher_is_better: bool = True,
    known_variance: KnownVariance | None = None,
    margin_fraction: float = MARGIN_FRACTION,
) -> list[Comparison]:
    """Each policy of a cell (metric per repeat) against the best other policy by mean, the
    equivalence margin `margin_fraction` of |its mean|; the verdicts Holm-adjusted across
    the cell's pairs (a family of their p-values of difference and of equivalence; the best
    and the second are each other's rival: one pair, tested once, its difference mirrored)."""
    means = {policy: statistics.fmean(v.values()) for policy, v in by_policy.items() if v}
    tested: dict[frozenset[str], PairedTest] = {}
    pairs = []
    for policy in means:
        others = [p for p in means if p != policy]
        if not others:
            continue
        pick = max if higher_is_better else min
        rival = pick(others, key=lambda p: means[p])
        key = frozenset((policy, rival))
        if key not in tested:
            extra = known_variance(policy, rival) if known_variance else 0.0
            margin = margin_fraction * abs(means[rival])
            tested[key] = paired_test(by_policy[policy], by_policy[rival], margin, extra)
            pairs.append((policy, rival, tested[key]))
        else:
            pairs.append((policy, rival, _mirrored(tested[key])))
    keys = list(tested)
    adjusted = holm(
        [tested[k].p_difference for k in keys] + [tested[k].p_equivalence for k in keys]
    )
    found = []
    for policy, rival, test in pairs:
        i = keys.index(frozenset((policy, rival)))
        verdict = decide(
            test.difference.mean, adjusted[i], adjusted[len(keys) + i], ALPHA, higher_is_better
        )
        found.append(Comparison(policy, rival, test, verdict))
    return found


def _mirrored(test: PairedTest) -> PairedTest:
    """theirs - ours: the same tests of the same pair, the difference's sign turned."""
    d = test.difference
    return PairedTest(
        Interval(-d.mean, -d.high, -d.low, d.n),
        test.sd,
        test.margin,
        test.p_difference,
        test.p_equivalence,
    )
