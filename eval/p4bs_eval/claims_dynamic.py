"""The dynamic scenarios' claims (`p4bs eval claims`, issue 39): in a live run folder whose
scenario ran fixed-buffer oracle policies (`fixed:<ms>ms`: no optimizer, the router's
initial buffer that value), per cell:

- the best fixed buffer in hindsight: the fixed:* policy with the highest mean whole-run f;
- the per-phase oracle: per phase the fixed:* policy with the highest mean f in that phase
  (chosen by the mean over repeats, as the best fixed is), its phase f stitched together
  weighted by the phases' durations, per repeat so that it pairs with the policies';
- per other policy, its captured fraction (policy - best fixed) / (per-phase oracle - best
  fixed), on each run's phase-weighted f for all three terms (so that a phase's settling
  time, left out of its f, is left out of each), with a 95% percentile interval of a paired
  bootstrap over the repeats (BOOTSTRAP_SAMPLES resamples, seed BOOTSTRAP_SEED).

The claims, per policy: `above-best-fixed` (its whole-run f against the best fixed buffer's,
paired: best / equivalent / inconclusive / worse), `captured-half` (the captured fraction at
least CAPTURED_BAR, by the bootstrap's one-sided p) and `not-below-rule` (against `bloated`
and `bdp` where they ran, Bloated as `fixed:200ms` where only that ran: met when best or
equivalent). loss-delay-fit's are target claims
(family `target`, with `met`), the other policies' describe them (family `other`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from p4bs_eval.claim_rows import interval_row, p_shown, paired_row, rounded
from p4bs_eval.scenario import FIXED_PREFIX, fixed_buffer_ms
from p4bs_eval.stats import mean_ci

OURS = "loss-delay-fit"
RULES_NOT_BELOW = ("bloated", "bdp")
# A rule that is a fixed buffer is read from the oracle's run of that buffer where the rule
# itself did not run (the dynamic suite runs fixed:200ms, Bloated's 2.5 MB at 100 Mbit/s, once).
RULE_AS_FIXED = {"bloated": "fixed:200ms"}
CAPTURED_BAR = 0.5
BOOTSTRAP_SAMPLES = 10_000
BOOTSTRAP_SEED = 39
TARGET, OTHER = "target", "other"  # Holm families (claims.py)

# point -> policy -> repeat -> its row
Cells = dict[str, dict[str, dict[int, Mapping[str, Any]]]]


def phase_weighted_f(row: Mapping[str, Any]) -> float | None:
    """The run's phases' f weighted by their durations; None when a phase has no f (no
    window) or the row has no phases."""
    return _weighted(row.get("phases") or [])


def _weighted(phases: Sequence[Mapping[str, Any]]) -> float | None:
    """The phases' f_mean weighted by their durations (None if one has none)."""
    if not phases or any(p.get("f_mean") is None for p in phases):
        return None
    durations = [float(p["end_s"]) - float(p["start_s"]) for p in phases]
    total = sum(d * float(p["f_mean"]) for d, p in zip(durations, phases, strict=True))
    return total / sum(durations)


def _cells(rows: Sequence[Mapping[str, Any]]) -> Cells:
    cells: Cells = {}
    for row in rows:
        if "error" not in row and row.get("f_mean") is not None:
            repeat = int(row.get("seed", row["repeat"]))
            cells.setdefault(row["point"], {}).setdefault(row["policy"], {})[repeat] = row
    return cells


def _mean_f(runs: Mapping[int, Mapping[str, Any]]) -> float:
    return statistics.fmean(r["f_mean"] for r in runs.values())


def per_phase_oracle(
    fixed: Mapping[str, Mapping[int, Mapping[str, Any]]],
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Per phase the fixed policy with the highest mean phase f over the repeats, and per
    repeat the stitched f (phases weighted by duration); repeats where a chosen policy's
    phase has no f are left out."""
    phased = [r["phases"] for runs in fixed.values() for r in runs.values() if r.get("phases")]
    names = [p["name"] for p in phased[0]] if phased else []
    chosen = []
    for i, name in enumerate(names):
        means = {}
        for policy, runs in fixed.items():
            values = [r["phases"][i]["f_mean"] for r in runs.values() if _phase_f(r, i)]
            if values:
                means[policy] = statistics.fmean(values)
        best = max(means, key=lambda p: means[p])
        chosen.append({"phase": name, "policy": best, "f_mean": round(means[best], 6)})
    repeats = set.intersection(*(set(fixed[c["policy"]]) for c in chosen))
    stitched = {}
    for repeat in sorted(repeats):
        picked = [fixed[c["policy"]][repeat] for c in chosen]
        if not all(_phase_f(run, i) for i, run in enumerate(picked)):
            continue  # a chosen buffer's run of this repeat has no f in its phase
        if (f := _weighted([run["phases"][i] for i, run in enumerate(picked)])) is not None:
            stitched[repeat] = f
    return chosen, stitched


def _phase_f(row: Mapping[str, Any], i: int) -> bool:
    phases = row.get("phases") or []
    return i < len(phases) and phases[i].get("f_mean") is not None


def captured_fraction(
    policy: Mapping[int, float], best_fixed: Mapping[int, float], oracle: Mapping[int, float]
) -> dict[str, Any]:
    """(policy - best fixed) / (oracle - best fixed) of the means over the repeats all
    three have, with the percentile interval and the one-sided p-values of a paired
    bootstrap: resampling repeats keeps each repeat's three values together. A resample
    whose oracle margin is not above 0 has no fraction: it counts against both sides of
    the bar, and more than 2.5% of them leave the interval unbounded."""
    shared = sorted(policy.keys() & best_fixed.keys() & oracle.keys())
    gained = np.array([policy[r] - best_fixed[r] for r in shared])
    margin = np.array([oracle[r] - best_fixed[r] for r in shared])
    found: dict[str, Any] = {"n": len(shared), "oracle_margin": None, "captured": None}
    if len(shared) < 2 or margin.mean() <= 0:
        return found | {
            "p_value": 1.0,
            "note": "the per-phase oracle gains nothing over "
            "the best fixed buffer in the mean (or fewer than 2 repeats)",
        }
    estimate = float(gained.mean() / margin.mean())
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(
        0, len(shared), size=(BOOTSTRAP_SAMPLES, len(shared))
    )
    margins = margin[picks].mean(axis=1)
    valid = margins > 0
    fractions = gained[picks].mean(axis=1)[valid] / margins[valid]
    invalid = int((~valid).sum())
    below = (int((fractions < CAPTURED_BAR).sum()) + invalid + 1) / (BOOTSTRAP_SAMPLES + 1)
    above = (int((fractions >= CAPTURED_BAR).sum()) + invalid + 1) / (BOOTSTRAP_SAMPLES + 1)
    bounded = invalid <= 0.025 * BOOTSTRAP_SAMPLES
    low, high = np.percentile(fractions, [2.5, 97.5]) if bounded else (-np.inf, np.inf)
    return found | {
        "oracle_margin": rounded(float(margin.mean())),
        "captured": interval_row(estimate, float(low), float(high)),
        # two-sided (each side at alpha / 2, as a paired difference's): the side of the
        # estimate, doubled
        "p_value": p_shown(min(1.0, 2 * (below if estimate >= CAPTURED_BAR else above))),
    }


def captured_verdict(claim: Mapping[str, Any], alpha: float) -> str:
    """`met` when the adjusted p shows the fraction at least the bar, `not met` when it
    shows it below, else `inconclusive`."""
    captured = claim.get("captured")
    if captured is None or claim["p_adjusted"] > alpha:
        return "inconclusive"
    return "met" if captured["mean"] >= CAPTURED_BAR else "not met"


def dynamic_claims(
    source: str, rows: Sequence[Mapping[str, Any]], margin_fraction: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The dynamic claims of a folder's rows, and per cell its oracles; nothing for a cell
    without fixed:* policies."""
    claims: list[dict[str, Any]] = []
    oracles: list[dict[str, Any]] = []
    for cell, by_policy in _cells(rows).items():
        fixed = {p: runs for p, runs in by_policy.items() if p.startswith(FIXED_PREFIX)}
        if not fixed:
            continue
        best = max(fixed, key=lambda p: _mean_f(fixed[p]))
        whole = {p: {r: row["f_mean"] for r, row in runs.items()} for p, runs in by_policy.items()}
        phased = {
            p: {r: f for r, row in runs.items() if (f := phase_weighted_f(row)) is not None}
            for p, runs in by_policy.items()
        }
        chosen, stitched = per_phase_oracle(fixed) if all(phased[p] for p in fixed) else ([], {})
        best_ci = mean_ci(list(whole[best].values()))
        oracle_ci = mean_ci(list(stitched.values())) if stitched else None
        oracles.append(
            {
                "source": source,
                "cell": cell,
                "best_fixed": best,
                "best_fixed_f": interval_row(best_ci.mean, best_ci.low, best_ci.high),
                "best_fixed_phased_f": _mean_row(phased[best]),
                "per_phase": chosen,
                "per_phase_oracle_f": interval_row(oracle_ci.mean, oracle_ci.low, oracle_ci.high)
                if oracle_ci
                else None,
                "n": best_ci.n,
                "fixed_f": {  # every oracle buffer's whole-run f, smallest buffer first
                    p: _mean_row(whole[p]) for p in sorted(fixed, key=_buffer_ms)
                },
            }
        )
        for policy in sorted(by_policy.keys() - fixed.keys()):
            family = TARGET if policy == OURS else OTHER
            common = {"source": source, "cell": cell, "policy": policy, "family": family}
            target = {"target": "best"} if policy == OURS else {}
            compared = paired_row(whole[policy], whole[best], best, True, 0.0, margin_fraction)
            claims.append(
                {"claim": "above-best-fixed", **common, "metric": "f_mean", **compared, **target}
            )
            policy_ci = mean_ci(list(whole[policy].values()))
            claims.append(
                {
                    "claim": "captured-half",
                    **common,
                    "f": interval_row(policy_ci.mean, policy_ci.low, policy_ci.high),
                    "bar": CAPTURED_BAR,
                    **captured_fraction(phased[policy], phased[best], stitched),
                    "bootstrap": {"samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED},
                    **({"target": f"at least {CAPTURED_BAR:g}"} if policy == OURS else {}),
                }
            )
            for rule in RULES_NOT_BELOW:
                ran = rule if rule in whole else RULE_AS_FIXED.get(rule)
                if ran in whole and rule != policy:
                    shown = rule if ran == rule else f"{rule} ({ran})"
                    row = paired_row(whole[policy], whole[ran], shown, True, 0.0, margin_fraction)
                    claims.append(
                        {
                            "claim": "not-below-rule",
                            **common,
                            "metric": "f_mean",
                            **row,
                            **({"target": "best-or-equivalent"} if policy == OURS else {}),
                        }
                    )
    return claims, oracles


def _buffer_ms(policy: str) -> float:
    return fixed_buffer_ms(policy) or 0.0


def _mean_row(values: Mapping[int, float]) -> dict[str, float | None] | None:
    if not values:
        return None
    ci = mean_ci(list(values.values()))
    return interval_row(ci.mean, ci.low, ci.high)
