"""`eval/claims.json` (`p4bs eval claims`): every claim the evaluation checks, with its
verdict, n, effect size and confidence interval, made from the run summaries committed under
eval/results (never raw captures):

- offline evaluations, `*offline.json` (written by `p4bs eval offline` beside its report):
  per cell and policy, each seed's whole-run mean f, search time and f after settling, and
  its share of windows per measured buffer, with the surface's standard error per buffer:
  an offline difference's interval counts that error too (`offline_report.surface_variance`);
- live evaluations, a folder's `results.jsonl` with its `scenario.json` (as `p4bs eval run`
  writes them): per point, policy and repeat, the run's figures.

The claims, per cell (a point of a CCA x N sweep), each paired claim with the verdict of
stats.py (`best`, `equivalent` within the margin, `inconclusive`, `worse`), its p-values
before and after Holm's adjustment across its family, its effect size and interval:
- `p4bs-highest-f` (P4BS Fig. 11): P4BS's whole-run mean f against the best static rule's;
  the paper's claim is reproduced where `best`.
- `ours-best-or-equivalent` (this project's policy, loss-delay-fit): against the best of
  the static rules and P4BS; met when `best` or `equivalent` (an inconclusive one never).
- offline only: `ours-near-oracle`, its mean f after settling within 5% of the oracle's
  (the best measured fixed buffer), and `ours-search-time`, its median search time (first
  decision to settled) at most 20 s.
- `offline-matches-live`, per cell and policy measured both ways: whether the offline
  simulator's mean whole-run f lies inside the live runs' 95% interval (how far the
  simulator can be trusted, cell by cell). A dynamic scenario's offline runs (on its
  oracle buffers' surfaces: `scenario` in the offline.json) are checked against that
  scenario's live runs only, and make no other claim.
- live, where the runs had short flows: `p4bs-lowest-fct` (P4BS Fig. 14), P4BS's median
  short-flow FCT against the static rules' (lower is better), and `ours-fct` the same for
  loss-delay-fit, which optimises f, not FCT (met when `best`).
- live, where RED or CoDel ran: `ours-vs-aqm` (f) and `ours-fct-vs-aqm` (median FCT),
  loss-delay-fit against the better of the two, verdicts without a target (family `other`).
- live, where the scenario ran fixed-buffer oracle policies (`fixed:<ms>ms`): the dynamic
  claims of claims_dynamic.py.

The Holm families: `target` (every claim on loss-delay-fit with a test: what the project
claims of its policy, across the whole suite of one claims.json), `paper` (P4BS's claims),
`other` (the dynamic claims on the other policies) and `tuned` (loss-delay-fit's claims on
a scenario its registration's plan lists in `tuned_on`: marked `tuned_on`, counted apart in
the summary, never held-out evidence). Given registrations (registration.py),
rows of a registered scenario made at other policy code are refused and listed as `flagged`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from p4bs_eval.claim_rows import interval_row, p_shown, paired_row
from p4bs_eval.claims_dynamic import OTHER, OURS, TARGET, captured_verdict, dynamic_claims
from p4bs_eval.offline_report import surface_variances
from p4bs_eval.registration import (
    Registration,
    check_together,
    registration_of,
    screen_rows,
)
from p4bs_eval.report import load_results
from p4bs_eval.scenario import AQM_POLICIES
from p4bs_eval.stats import (
    ALPHA,
    BEST,
    EQUIVALENT,
    MARGIN_FRACTION,
    VERDICTS,
    KnownVariance,
    decide,
    holm,
    mean_ci,
)

STATIC_RULES = ("bdp", "stanford", "tiny", "bloated", "bscl", "adt")
P4BS = "p4bs"
ORACLE_TOLERANCE = 0.05  # ours' f after settling within 5% of the oracle's
SEARCH_BUDGET_S = 20.0
# What a target claim needs to be met: only these verdicts (never `inconclusive`).
TARGETS = {"best": (BEST,), "best-or-equivalent": (BEST, EQUIVALENT)}
PAPER = "paper"  # the Holm family of P4BS's claims (the others: claims_dynamic.py)
TUNED = "tuned"  # target claims on scenarios a registration says the policy was tuned on


def versus(
    by_policy: Mapping[str, Mapping[int, float]],
    policy: str,
    rivals: Sequence[str],
    higher_is_better: bool = True,
    known_variance: KnownVariance | None = None,
    margin_fraction: float = MARGIN_FRACTION,
) -> dict[str, Any] | None:
    """`policy` against the best of `rivals` by mean, paired by seed: the difference
    (policy - rival), its tests and its verdict alone (`settle_verdicts` decides it again
    in its family); None when either side is missing."""
    present = [r for r in rivals if by_policy.get(r)]
    if not by_policy.get(policy) or not present:
        return None
    pick = max if higher_is_better else min
    rival = pick(present, key=lambda r: statistics.fmean(by_policy[r].values()))
    return paired_row(
        by_policy[policy],
        by_policy[rival],
        rival,
        higher_is_better,
        known_variance(policy, rival) if known_variance else 0.0,
        margin_fraction,
    )


# Paired claims: name, policy, its rivals, its Holm family, its target (None: no target,
# the verdict reported as it is: the paper's claims, and ours against AQM, which the
# fig14-again plan added as a descriptive comparison).
ClaimSpec = tuple[str, str, Sequence[str], str, str | None]
F_CLAIMS: tuple[ClaimSpec, ...] = (
    ("p4bs-highest-f", P4BS, STATIC_RULES, PAPER, None),
    ("ours-best-or-equivalent", OURS, (*STATIC_RULES, P4BS), TARGET, "best-or-equivalent"),
    ("ours-vs-aqm", OURS, AQM_POLICIES, OTHER, None),
)
FCT_CLAIMS: tuple[ClaimSpec, ...] = (
    ("p4bs-lowest-fct", P4BS, STATIC_RULES, PAPER, None),
    ("ours-fct", OURS, (*STATIC_RULES, P4BS), TARGET, "best"),
    ("ours-fct-vs-aqm", OURS, AQM_POLICIES, OTHER, None),
)


def paired_claims(
    source: str,
    cell: str,
    by_policy: Mapping[str, Mapping[int, float]],
    claims: Sequence[ClaimSpec],
    metric: str,
    higher_is_better: bool = True,
    known_variance: KnownVariance | None = None,
    margin_fraction: float = MARGIN_FRACTION,
) -> list[dict[str, Any]]:
    """Each claim's policy against the best of its rivals on `metric` in one cell."""
    found = []
    for name, policy, rivals, family, target in claims:
        compared = versus(
            by_policy, policy, rivals, higher_is_better, known_variance, margin_fraction
        )
        if compared is not None:
            found.append(
                {
                    "claim": name,
                    "source": source,
                    "cell": cell,
                    "metric": metric,
                    "policy": policy,
                    **compared,
                    "family": family,
                    **({"target": target} if target else {}),
                }
            )
    return found


def offline_claims(path: Path, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Claims from one `offline.json`."""
    source = str(path)
    found: list[dict[str, Any]] = []
    for cell, data in summary["cells"].items():
        policies = data["policies"]
        by_policy = {
            p: {int(seed): f for seed, f in v["f_mean"].items()} for p, v in policies.items()
        }
        # The surface's own error, as the offline report counts it (older files lack it).
        se = data.get("surface_se", {})
        exposure = {p: v.get("exposure", {}) for p, v in policies.items()}
        found += paired_claims(
            source,
            cell,
            by_policy,
            F_CLAIMS,
            "f_mean",
            known_variance=surface_variances(exposure, se),
        )
        ours = policies.get(OURS)
        if ours is None:
            continue
        oracle_f = data["oracle"]["f"]
        after = [f for f in ours["f_after_settling"].values() if f is not None]
        searched = [s for s in ours["search_s"].values() if s is not None]
        if after:
            mean_after = statistics.fmean(after)
            gap = (oracle_f - mean_after) / abs(oracle_f)
            found.append(
                {
                    "claim": "ours-near-oracle",
                    "source": source,
                    "cell": cell,
                    "n": len(after),
                    "f_after_settling": round(mean_after, 6),
                    "oracle_f": oracle_f,
                    "gap": round(gap, 6),
                    "verdict": "met" if gap <= ORACLE_TOLERANCE else "not met",
                }
            )
        settled_all = len(searched) == len(ours["search_s"])
        median = statistics.median(searched) if searched else None
        found.append(
            {
                "claim": "ours-search-time",
                "source": source,
                "cell": cell,
                "n": len(searched),
                "median_search_s": median,
                "verdict": "met"
                if settled_all and median is not None and median <= SEARCH_BUDGET_S
                else "not met",
            }
        )
    return found


def _per_cell(
    rows: Sequence[Mapping[str, Any]], key: str
) -> dict[str, dict[str, dict[int, float]]]:
    """point -> policy -> seed -> the rows' `key` (runs without it left out)."""
    cells: dict[str, dict[str, dict[int, float]]] = {}
    for row in rows:
        if row.get(key) is None or "error" in row:
            continue
        seed = int(row.get("seed", row["repeat"]))
        cells.setdefault(row["point"], {}).setdefault(row["policy"], {})[seed] = row[key]
    return cells


def live_claims(
    source: str, rows: Sequence[Mapping[str, Any]], margin_fraction: float = MARGIN_FRACTION
) -> list[dict[str, Any]]:
    """Claims from one live run folder's rows (keyed by point, then policy and seed)."""
    found = []
    for cell, by_policy in _per_cell(rows, "f_mean").items():
        found += paired_claims(
            source, cell, by_policy, F_CLAIMS, "f_mean", margin_fraction=margin_fraction
        )
    for cell, by_policy in _per_cell(rows, "fct_p50_ms").items():
        found += paired_claims(
            source, cell, by_policy, FCT_CLAIMS, "fct_p50_ms", False, None, margin_fraction
        )
    return found


def shown_path(path: Path, root: Path) -> Path:
    """`path` relative to `root` when inside it: claims.json names the committed files."""
    return path.relative_to(root) if path.is_relative_to(root) else path


def simulator_checks(
    offline: Mapping[str, Mapping[str, Mapping[int, float]]],
    live: Mapping[str, Mapping[str, Mapping[int, float]]],
    sources: tuple[str, str],
) -> list[dict[str, Any]]:
    """Per cell and policy in both: the offline mean f against the live 95% interval."""
    found = []
    for cell in sorted(offline.keys() & live.keys()):
        for policy in sorted(offline[cell].keys() & live[cell].keys()):
            simulated = statistics.fmean(offline[cell][policy].values())
            measured = mean_ci(list(live[cell][policy].values()))
            inside = measured.low <= simulated <= measured.high
            found.append(
                {
                    "claim": "offline-matches-live",
                    "source": f"{sources[0]} against {sources[1]}",
                    "cell": cell,
                    "policy": policy,
                    "n": measured.n,
                    "offline_f": round(simulated, 6),
                    "live_f": interval_row(measured.mean, measured.low, measured.high),
                    "verdict": "inside" if inside else "outside",
                }
            )
    return found


def tuned_on(claim: Mapping[str, Any]) -> dict[str, Any]:
    """What marks a claim of a scenario its registration says the policy was tuned on: a
    target claim leaves the `target` family for `tuned` (not held-out evidence, and not
    weighing on the held-out verdicts' Holm adjustment)."""
    return {"tuned_on": True} | ({"family": TUNED} if claim.get("family") == TARGET else {})


def settle_verdicts(claims: Sequence[dict[str, Any]], alpha: float = ALPHA) -> dict[str, int]:
    """Holm's adjustment within each family over every p-value its claims hold (a paired
    claim's p of a difference and of equivalence, a captured fraction's p), then each
    claim's verdict from its adjusted p-values, and `met` for a target claim: only its
    target's verdicts. Returns each family's number of hypotheses."""
    sizes = {}
    for family in sorted({c["family"] for c in claims if "family" in c}):
        members = [c for c in claims if c.get("family") == family]
        keyed = [(c, key) for c in members for key in ("p_value", "p_equivalence") if key in c]
        adjusted = holm([c[key] for c, key in keyed])
        for (claim, key), p in zip(keyed, adjusted, strict=True):
            claim[key.replace("p_value", "p") + "_adjusted"] = p_shown(p)
        for claim in members:
            if "p_equivalence" in claim:  # a paired comparison
                claim["verdict"] = decide(
                    claim["difference"]["mean"],
                    claim["p_adjusted"],
                    claim["p_equivalence_adjusted"],
                    alpha,
                    claim["higher_is_better"],
                )
                if "target" in claim:
                    claim["met"] = claim["verdict"] in TARGETS[claim["target"]]
            else:  # a captured fraction against its bar
                claim["verdict"] = captured_verdict(claim, alpha)
                if "target" in claim:
                    claim["met"] = claim["verdict"] == "met"
        sizes[family] = len(keyed)
    return sizes


def summarise(claims: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per claim, how many of each verdict: a paired claim's four kinds all shown (zeros
    too), and for a target claim how many are met."""
    counts: dict[str, dict[str, int]] = {}
    for claim in claims:
        by_verdict = counts.setdefault(
            claim["claim"] + (" (tuned on)" if claim.get("tuned_on") else ""), {}
        )
        if "p_equivalence" in claim:
            for kind in VERDICTS:
                by_verdict.setdefault(kind, 0)
        by_verdict[claim["verdict"]] = by_verdict.get(claim["verdict"], 0) + 1
        if "met" in claim and "p_equivalence" in claim:
            by_verdict["met"] = by_verdict.get("met", 0) + claim["met"]
    return counts


def build(
    results_dir: Path, root: Path, registrations: Sequence[Registration] = ()
) -> dict[str, Any]:
    """Every claim from the summaries under `results_dir` (paths shown relative to `root`);
    a registered scenario's rows screened against the registration that names it
    (`screen_rows`), with its margin in force. RegistrationError where the registrations
    cannot be read together (`check_together`)."""
    check_together(registrations)
    alpha = registrations[0].alpha if registrations else ALPHA
    claims: list[dict[str, Any]] = []
    flagged: list[dict[str, Any]] = []
    oracles: list[dict[str, Any]] = []
    # By source: its scenario (None: a sweep's cells, which live folders of any scenario
    # share), then cell -> policy -> seed -> whole-run mean f.
    offline: dict[str, tuple[str | None, dict[str, dict[str, dict[int, float]]]]] = {}
    live: dict[str, tuple[str | None, dict[str, dict[str, dict[int, float]]]]] = {}
    for folder in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*offline.json")):
            summary = json.loads(path.read_text())
            if summary.get("scenario") is None:
                # A dynamic scenario's offline runs are predictions to check against its
                # live runs, not claims: its oracles and verdicts come from the live runs.
                found = offline_claims(shown_path(path, root), summary)
                claims += [{**claim, "registered": False} for claim in found]
            cells = {
                cell: {
                    p: {int(seed): f for seed, f in v["f_mean"].items()}
                    for p, v in data["policies"].items()
                }
                for cell, data in summary["cells"].items()
            }
            offline[str(shown_path(path, root))] = (summary.get("scenario"), cells)
        if (folder / "results.jsonl").exists() and (folder / "scenario.json").exists():
            scenario, all_rows = load_results(folder)
            source = str(shown_path(folder / "results.jsonl", root))
            registration = registration_of(scenario, registrations)
            rows, refused = screen_rows(source, scenario, all_rows, registration, root)
            registered = registration is not None  # it names this folder's scenario
            margin_fraction = registration.margin if registration else MARGIN_FRACTION
            flagged += refused
            found = live_claims(source, rows, margin_fraction)
            dynamic, cell_oracles = dynamic_claims(source, rows, margin_fraction)
            oracles += cell_oracles
            planned = registration.plan.repeats if registration else 0
            tuned = registration is not None and scenario.get("name") in registration.plan.tuned_on
            claims += [
                {**claim, "registered": registered}
                | ({"planned_repeats": planned} if claim.get("n", planned) < planned else {})
                | (tuned_on(claim) if tuned else {})
                for claim in found + dynamic
            ]
            live[source] = (scenario.get("name"), _per_cell(rows, "f_mean"))
    for off_source, (off_scenario, off_cells) in offline.items():
        for live_source, (live_scenario, live_cells) in live.items():
            if off_scenario in (None, live_scenario):
                claims += simulator_checks(off_cells, live_cells, (off_source, live_source))
    for name in ("p4bs-lowest-fct", "ours-fct"):
        if not any(c["claim"] == name for c in claims):
            claims.append(
                {
                    "claim": name,
                    "source": None,
                    "verdict": "not measured",
                    "note": "no committed live summary has short flows yet (Fig. 14: "
                    "eval/scenarios/p4bs-fig14.toml, >= 600 short flows per point)",
                }
            )
    families = settle_verdicts(claims, alpha)
    return {
        "made_by": "p4bs eval claims",
        "registrations": [registration.identity() for registration in registrations],
        "confidence": 1 - alpha,
        "alpha": alpha,
        "margin_fraction": MARGIN_FRACTION,  # an unregistered folder's; a registered one's plan's
        "holm_families": families,
        "summary": summarise(claims),
        "flagged": flagged,
        "oracles": oracles,
        "claims": claims,
    }
