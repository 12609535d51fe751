"""The evaluation's statistics against computations written out by hand: Student-t intervals,
paired differences over the repeats both policies ran, and the verdicts they support."""

from __future__ import annotations

import math

import pytest

from p4bs_eval.stats import (
    BEST,
    TIED,
    WORSE,
    Interval,
    compare_in_cell,
    mean_ci,
    paired_difference,
    verdict,
)


def test_the_interval_is_the_student_t_one() -> None:
    ci = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, sample sd sqrt(2.5), t(0.975, 4 df) = 2.776445 (tables)
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert ci.mean == 3.0 and ci.n == 5
    assert ci.low == pytest.approx(3 - half, abs=1e-5)
    assert ci.high == pytest.approx(3 + half, abs=1e-5)
    wide = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.99)  # t(0.995, 4) = 4.604095
    assert wide.half_width == pytest.approx(4.604095 * math.sqrt(2.5) / math.sqrt(5), abs=1e-5)


def test_a_known_variance_adds_to_the_mean_s() -> None:
    """An offline evaluation's surface error: var(mean) = s^2 / n + v, same t."""
    ci = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0], known_variance=0.3)
    assert ci.half_width == pytest.approx(2.776445 * math.sqrt(2.5 / 5 + 0.3), abs=1e-5)
    # A difference the seeds show every time, but smaller than what the surface knows.
    ours, theirs = {1: 1.01, 2: 1.011, 3: 1.01, 4: 1.011}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert verdict(paired_difference(ours, theirs)) == BEST
    assert verdict(paired_difference(ours, theirs, known_variance=0.01**2)) == TIED
    (compared,) = [
        c
        for c in compare_in_cell({"a": ours, "b": theirs}, known_variance=lambda p, q: 1e-4)
        if c.policy == "a"
    ]
    assert compared.verdict == TIED


def test_one_run_decides_nothing() -> None:
    one = mean_ci([-1.5])
    assert (one.mean, one.low, one.high) == (-1.5, -math.inf, math.inf)
    assert verdict(paired_difference({1: 5.0}, {1: 1.0})) == TIED
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])


def test_pairing_removes_what_the_repeats_share() -> None:
    """Traffic that differs a lot between repeats but the same for both policies: alone,
    the intervals overlap; paired, one policy is better every time."""
    ours = {1: 10.0, 2: 20.0, 3: 30.0, 4: 15.0}
    theirs = {1: 9.0, 2: 19.0, 3: 29.5, 4: 14.5}
    alone, other = mean_ci(list(ours.values())), mean_ci(list(theirs.values()))
    assert alone.low < other.high  # unpaired: no verdict
    diff = paired_difference(ours, theirs)
    assert diff.mean == pytest.approx(0.75)
    assert diff.low > 0 and verdict(diff) == BEST
    assert verdict(diff, higher_is_better=False) == WORSE


def test_only_repeats_both_ran_are_paired() -> None:
    diff = paired_difference({1: 3.0, 2: 5.0, 3: 100.0}, {1: 1.0, 2: 2.0})
    assert (diff.n, diff.mean) == (2, 2.5)
    with pytest.raises(ValueError, match="no repeat in common"):
        paired_difference({1: 1.0}, {2: 1.0})


def test_a_verdict_needs_the_interval_to_exclude_zero() -> None:
    assert verdict(Interval(0.5, 0.1, 0.9, 3)) == BEST
    assert verdict(Interval(0.5, -0.1, 1.1, 3)) == TIED
    assert verdict(Interval(-0.5, -0.9, -0.1, 3)) == WORSE
    assert verdict(Interval(-0.5, -0.9, -0.1, 3), higher_is_better=False) == BEST


def test_each_policy_is_compared_with_the_best_other() -> None:
    f = {
        "p4bs": {1: -1.0, 2: -1.2, 3: -0.9},
        "bdp": {1: -1.5, 2: -1.6, 3: -1.4},
        "bloated": {1: -2.0, 2: -2.1, 3: -1.9},
    }
    found = {c.policy: c for c in compare_in_cell(f)}
    assert found["p4bs"].against == "bdp" and found["p4bs"].verdict == BEST
    assert found["bdp"].against == "p4bs" and found["bdp"].verdict == WORSE
    assert found["p4bs"].difference.mean == pytest.approx((0.5 + 0.4 + 0.5) / 3)
    # Lower is better (an FCT): the best other is the smallest mean.
    fct = {"a": {1: 100.0, 2: 110.0}, "b": {1: 120.0, 2: 150.0}, "c": {1: 300.0, 2: 200.0}}
    low = {c.policy: c for c in compare_in_cell(fct, higher_is_better=False)}
    assert low["a"].against == "b" and low["c"].against == "a"
