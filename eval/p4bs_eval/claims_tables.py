"""claims.md beside claims.json (`p4bs eval claims`): the registrations, each claim's
verdict counts, and per cell of a folder with the oracle's fixed buffers the table issue 39
asks eval/README.md for: both oracles, every policy's whole-run mean f with its 95%
interval, its difference to the best fixed buffer, its captured fraction and the verdicts
(after Holm), so that the README's per-scenario tables are copied, not typed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from p4bs_eval.claims_dynamic import OURS

NONE = "n/a"


def markdown(data: Mapping[str, Any]) -> str:
    lines = ["# Claims: what eval/claims.json says (`p4bs eval claims` writes both)", ""]
    lines += _registrations(data)
    lines += _counts(data["summary"])
    for oracle in data["oracles"]:
        here = [
            c
            for c in data["claims"]
            if c.get("source") == oracle["source"] and c.get("cell") == oracle["cell"]
        ]
        lines += cell_table(oracle, here)
    return "\n".join(lines) + "\n"


def _registrations(data: Mapping[str, Any]) -> list[str]:
    if not data["registrations"]:
        return ["No registration given: every folder's rows used, none `registered`.", ""]
    lines = ["| registration | commit | policy tree | repeats | margin |", "|---|---|---|---|---|"]
    for r in data["registrations"]:
        plan = r["plan"]
        lines.append(
            f"| {r['name']} | {r['code_commit'][:7]} | {r['policy_tree'][:7]} | "
            f"{plan['repeats']} | {plan['margin']:g} |"
        )
    flagged = len(data["flagged"])
    return [*lines, "", f"Rows refused by a registration (`flagged`): {flagged}.", ""]


def _counts(summary: Mapping[str, Mapping[str, int]]) -> list[str]:
    lines = ["| claim | verdicts |", "|---|---|"]
    for claim, verdicts in summary.items():
        shown = ", ".join(f"{kind} {n}" for kind, n in verdicts.items())
        lines.append(f"| `{claim}` | {shown} |")
    return [*lines, ""]


def interval(row: Mapping[str, Any] | None, signed: bool = False, digits: int = 3) -> str:
    """`mean [low, high]`; an unbounded end is shown as such."""
    if row is None or row.get("mean") is None:
        return NONE
    sign = "+" if signed else ""

    def shown(value: float | None, end: str) -> str:
        return end if value is None else f"{value:{sign}.{digits}f}"

    return f"{shown(row['mean'], NONE)} [{shown(row['low'], '-inf')}, {shown(row['high'], 'inf')}]"


def cell_table(oracle: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """One cell: its oracles, then a row per policy (ours first, then by name)."""
    folder = oracle["source"].split("/")[-2]
    phases = ", ".join(f"{p['phase']} {p['policy']}" for p in oracle["per_phase"])
    fixed = "; ".join(f"{p} {interval(f)}" for p, f in oracle.get("fixed_f", {}).items())
    tuned = any(c.get("tuned_on") for c in claims)
    lines = [
        f"### {folder}, {oracle['cell']}" + (" (tuned on: not held out)" if tuned else ""),
        "",
        f"Best fixed buffer in hindsight: **{oracle['best_fixed']}**, whole-run f "
        f"{interval(oracle['best_fixed_f'])} ({oracle['n']} repeats). Per-phase oracle "
        f"({phases or NONE}): {interval(oracle['per_phase_oracle_f'])}. Fixed buffers: {fixed}.",
        "",
    ]
    header = [
        "| policy | f, whole run | minus best fixed | verdict | captured fraction | verdict "
        "| vs Bloated | vs BDP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    by_policy: dict[str, dict[str, Mapping[str, Any]]] = {}
    for claim in claims:
        kind = claim["claim"]
        if kind == "not-below-rule":
            kind = f"{kind} {claim['against'].split(' ')[0]}"
        by_policy.setdefault(claim["policy"], {})[kind] = claim
    for policy in sorted(by_policy, key=lambda p: (p != OURS, p)):
        mine = by_policy[policy]
        if "above-best-fixed" not in mine:
            continue
        above, captured = mine["above-best-fixed"], mine.get("captured-half", {})
        rules = [
            mine.get(f"not-below-rule {rule}", {}).get("verdict", NONE)
            for rule in ("bloated", "bdp")
        ]
        rows.append(
            f"| {policy} | {interval(captured.get('f'))} | "
            f"{interval(above['difference'], signed=True)} | {above['verdict']} | "
            f"{interval(captured.get('captured'), digits=2)} | {captured.get('verdict', NONE)} | "
            f"{rules[0]} | {rules[1]} |"
        )
    if not rows:
        return [*lines, "Only the oracle's fixed buffers ran here.", ""]
    return [*lines, *header, *rows, ""]
