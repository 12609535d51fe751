"""The figures of a claims.json row (claims.py, claims_dynamic.py): a paired comparison's
difference, tests and effect size, intervals and p-values as JSON keeps them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from p4bs_eval.stats import ALPHA, decide, paired_test


def paired_row(
    ours: Mapping[int, float],
    theirs: Mapping[int, float],
    rival: str,
    higher_is_better: bool,
    known_variance: float,
    margin_fraction: float,
) -> dict[str, Any]:
    """A paired claim's figures: the difference with its 95% interval, the rival's mean,
    the relative difference and Cohen's d_z, the equivalence margin (`margin_fraction` of
    |the rival's mean|), both p-values and the verdict of a family of one."""
    rival_mean = statistics.fmean(theirs.values())
    test = paired_test(ours, theirs, margin_fraction * abs(rival_mean), known_variance)
    d = test.difference
    return {
        "against": rival,
        "n": d.n,
        "difference": interval_row(d.mean, d.low, d.high),
        "rival_mean": round(rival_mean, 6),
        "relative": round(d.mean / abs(rival_mean), 6) if rival_mean else None,
        "effect_size_dz": rounded(test.effect_size),
        "higher_is_better": higher_is_better,
        "margin": round(test.margin, 6),
        "p_value": p_shown(test.p_difference),
        "p_equivalence": p_shown(test.p_equivalence),
        "verdict": decide(d.mean, test.p_difference, test.p_equivalence, ALPHA, higher_is_better),
        # No spread to test: the tests are decided by the sign alone (e.g. the policy kept
        # its rival's buffer in every run, and is equivalent to it by construction).
        **({"note": "the same difference in every repeat"} if d.n > 1 and test.sd == 0 else {}),
    }


def p_shown(value: float) -> float:
    """A p-value to 4 significant digits (small ones stay distinguishable)."""
    return float(f"{value:.4g}")


def interval_row(mean: float, low: float, high: float) -> dict[str, float | None]:
    """A mean and its interval; an unbounded end (one repeat) is null."""
    finite = [v if abs(v) != float("inf") else None for v in (low, high)]
    return {"mean": round(mean, 6), "low": rounded(finite[0]), "high": rounded(finite[1])}


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
