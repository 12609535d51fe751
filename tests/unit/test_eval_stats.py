"""The evaluation's statistics against computations written out by hand: Student-t intervals,
paired differences over the repeats both policies ran, the t-tests and TOST on them, Holm's
adjustment, and the verdicts they support (issue 39: best / equivalent / inconclusive / worse)."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy.stats import t as student_t

from p4bs_eval.stats import (
    BEST,
    EQUIVALENT,
    INCONCLUSIVE,
    WORSE,
    compare_in_cell,
    decide,
    holm,
    mean_ci,
    paired_difference,
    paired_test,
)


def verdict_alone(ours: dict[int, float], theirs: dict[int, float], **kw: float) -> str:
    """The verdict of one comparison, a family of its own, margin 0 unless given."""
    test = paired_test(ours, theirs, kw.pop("margin", 0.0), **kw)
    return decide(test.difference.mean, test.p_difference, test.p_equivalence)


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
    assert verdict_alone(ours, theirs) == BEST
    assert verdict_alone(ours, theirs, known_variance=0.01**2) == INCONCLUSIVE
    (compared,) = [
        c
        for c in compare_in_cell({"a": ours, "b": theirs}, known_variance=lambda p, q: 1e-4)
        if c.policy == "a"
    ]
    assert compared.verdict == INCONCLUSIVE


def test_one_run_decides_nothing() -> None:
    one = mean_ci([-1.5])
    assert (one.mean, one.low, one.high) == (-1.5, -math.inf, math.inf)
    assert verdict_alone({1: 5.0}, {1: 1.0}, margin=100.0) == INCONCLUSIVE
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
    assert diff.low > 0 and verdict_alone(ours, theirs) == BEST
    test = paired_test(ours, theirs, 0.0)
    assert decide(0.75, test.p_difference, 1.0, higher_is_better=False) == WORSE


def test_only_repeats_both_ran_are_paired() -> None:
    diff = paired_difference({1: 3.0, 2: 5.0, 3: 100.0}, {1: 1.0, 2: 2.0})
    assert (diff.n, diff.mean) == (2, 2.5)
    with pytest.raises(ValueError, match="no repeat in common"):
        paired_difference({1: 1.0}, {2: 1.0})


def test_best_alone_is_the_95_percent_interval_excluding_zero() -> None:
    """With a family of one, the two-sided p of the difference is <= 0.05 exactly when the
    95% interval excludes 0: each direction's one-sided test runs at alpha / 2."""
    for ours, theirs in (
        ({1: 1.1, 2: 1.3, 3: 1.2}, {1: 1.0, 2: 1.0, 3: 1.0}),
        ({1: 1.1, 2: 0.9, 3: 1.2}, {1: 1.0, 2: 1.0, 3: 1.0}),
    ):
        test = paired_test(ours, theirs, 0.0)
        excludes = test.difference.low > 0 or test.difference.high < 0
        assert (test.p_difference <= 0.05) == excludes
    # t = mean / (sd / sqrt n) = 0.2 / (0.1 / sqrt 3) = 3.4641, 2 df: two-sided p 0.07418
    test = paired_test({1: 1.1, 2: 1.3, 3: 1.2}, {1: 1.0, 2: 1.0, 3: 1.0}, 0.0)
    assert test.p_difference == pytest.approx(2 * 0.0370900, abs=1e-5)
    assert test.effect_size == pytest.approx(0.2 / 0.1)


# --- issue 39: verdicts that mean one thing each (TOST, Holm) ---------------------------------


def test_tost_decides_equivalence_within_the_margin_and_not_beyond() -> None:
    """Paired differences around +0.5% of the rival's mean over 12 repeats: equivalent at
    a 2% margin, not at 0.25% (then inconclusive: neither shown better nor within); a
    difference of 5% is not equivalent at 2% but best; an inconclusive one is never best."""
    rival = {r: -2.0 for r in range(1, 13)}
    noise = [0.004, -0.003, 0.002, -0.004, 0.003, -0.002, 0.001, -0.001, 0.0, 0.002, -0.002, 0.0]
    near = {r: -2.0 + 0.01 + noise[r - 1] for r in rival}
    within = paired_test(near, rival, margin=0.02 * 2.0)
    # By hand: TOST's larger p is the upper test, t = (mean - margin) / se, 11 df.
    diffs = [near[r] - rival[r] for r in rival]
    se = statistics.stdev(diffs) / math.sqrt(12)
    upper = student_t.cdf((statistics.fmean(diffs) - 0.04) / se, 11)
    assert within.p_equivalence == pytest.approx(upper, rel=1e-6)
    assert within.p_equivalence < 0.001
    # +0.01 is shown too: 0.5% above, best takes precedence over equivalent.
    assert decide(0.01, within.p_difference, within.p_equivalence) == BEST
    flat = {r: -2.0 + noise[r - 1] for r in rival}  # no difference at all
    same = paired_test(flat, rival, margin=0.04)
    assert decide(same.difference.mean, same.p_difference, same.p_equivalence) == EQUIVALENT
    narrow = paired_test(flat, rival, margin=0.0001)
    assert narrow.p_equivalence > 0.05
    assert decide(0.0, narrow.p_difference, narrow.p_equivalence) == INCONCLUSIVE
    below = {r: -2.1 + noise[r - 1] for r in rival}  # 5% below
    far = paired_test(below, rival, margin=0.04)
    assert far.p_equivalence > 0.99
    assert decide(far.difference.mean, far.p_difference, far.p_equivalence) == WORSE
    # Slightly below, but shown within the margin: equivalent, not worse.
    assert decide(-0.01, 0.001, 0.001) == EQUIVALENT


def test_holm_adjusts_the_textbook_example() -> None:
    """Holm (1979), as on Wikipedia's page: p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05;
    sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06 (stop), 0.04 x 1 -> 0.06."""
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [a <= 0.05 for a in adjusted] == [True, False, False, True]
    assert holm([]) == [] and holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])


def test_a_best_of_one_comparison_need_not_survive_a_family() -> None:
    """Issue 39: Reno 25's p = 0.0025 alone is best; among 26 verdicts it is not."""
    assert decide(0.1, 0.0025, 1.0) == BEST
    adjusted = holm([0.0025] + [0.5] * 25)
    assert adjusted[0] == pytest.approx(0.065)
    assert decide(0.1, adjusted[0], 1.0) == INCONCLUSIVE


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


def test_the_same_difference_in_every_repeat_is_decided_by_its_size() -> None:
    """No spread (a policy on its rival's buffer in every run): equivalent when 0 lies
    within the margin; a constant non-zero difference is shown."""
    same = paired_test({1: -0.5, 2: -0.6, 3: -0.7}, {1: -0.5, 2: -0.6, 3: -0.7}, margin=0.01)
    assert (same.p_difference, same.p_equivalence, same.effect_size) == (1.0, 0.0, None)
    assert decide(0.0, same.p_difference, same.p_equivalence) == EQUIVALENT
    shifted = paired_test({1: 1.0, 2: 2.0}, {1: 0.5, 2: 1.5}, margin=0.01)
    assert (shifted.p_difference, shifted.p_equivalence) == (0.0, 1.0)
