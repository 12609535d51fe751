"""The dynamic scenarios' claims (eval/p4bs_eval/claims_dynamic.py, issue 39): the best fixed
buffer in hindsight, the per-phase oracle and each policy's captured fraction, on a small
run folder written here with two phases of unequal length, checked against the arithmetic
written out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from p4bs_eval.claims import build
from p4bs_eval.claims_dynamic import captured_fraction, phase_weighted_f
from p4bs_eval.claims_tables import markdown

REPEATS = range(1, 13)
# Phase f per policy: "calm" 40 s, then "busy" 80 s. fixed:5ms is best in calm, fixed:50ms
# in busy and over the run: best fixed (40 * -1.0 + 80 * -1.2) / 120 = -1.1333, per-phase
# oracle (40 * -0.5 + 80 * -1.2) / 120 = -0.9667, the oracle's margin 0.1667.
PHASE_F = {
    "fixed:5ms": (-0.5, -2.0),
    "fixed:50ms": (-1.0, -1.2),
    # (40 * -0.6 + 80 * -1.25) / 120 = -1.0333: captures (-1.0333 + 1.1333) / 0.1667 = 0.6
    "loss-delay-fit": (-0.6, -1.25),
    # -1.1: captures 0.2
    "bdp": (-0.9, -1.2),
    "bloated": (-1.1, -1.3),
    # the best fixed buffer's phases again: equivalent to it
    "p4bs": (-1.0, -1.2),
}
CALM, BUSY = (0.0, 40.0), (40.0, 120.0)


def _noise(policy: str, repeat: int) -> float:
    """What a policy's run adds to the repeat's traffic: +-0.004, zero over the repeats
    (P4BS's against the best fixed buffer's: their differences vary, TOST has a spread)."""
    return 0.004 * (1 if (repeat + len(policy) + (policy == "p4bs")) % 2 else -1)


def _row(policy: str, repeat: int) -> dict[str, Any]:
    traffic = 0.1 * math.sin(repeat)  # the repeat's traffic, the same for every policy
    calm, busy = (f + traffic + _noise(policy, repeat) for f in PHASE_F[policy])
    phases = [
        {"name": "calm", "start_s": CALM[0], "end_s": CALM[1], "f_mean": calm, "windows": 80},
        {"name": "busy", "start_s": BUSY[0], "end_s": BUSY[1], "f_mean": busy, "windows": 160},
    ]
    return {
        "point": "base",
        "policy": policy,
        "repeat": repeat,
        "seed": repeat,
        "f_mean": (40 * calm + 80 * busy) / 120,
        "phases": phases,
    }


def _folder(results: Path) -> None:
    folder = results / "dynamic"
    folder.mkdir(parents=True)
    (folder / "scenario.json").write_text(json.dumps({"name": "dynamic", "policies": []}))
    rows = [_row(p, r) for r in REPEATS for p in PHASE_F]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


# --- issue 39: two oracles and the captured fraction ---------------------------------------


def test_the_oracles_and_the_captured_fraction(tmp_path: Path) -> None:
    results = tmp_path / "eval" / "results"
    _folder(results)
    data = build(results, tmp_path)
    (oracles,) = data["oracles"]
    mean_traffic = sum(0.1 * math.sin(r) for r in REPEATS) / 12
    assert oracles["best_fixed"] == "fixed:50ms" and oracles["n"] == 12
    assert oracles["best_fixed_f"]["mean"] == pytest.approx(-1.1333333 + mean_traffic, abs=1e-6)
    assert [(p["phase"], p["policy"]) for p in oracles["per_phase"]] == [
        ("calm", "fixed:5ms"),
        ("busy", "fixed:50ms"),
    ]
    oracle = oracles["per_phase_oracle_f"]
    assert oracle["mean"] == pytest.approx(-0.9666667 + mean_traffic, abs=1e-6)
    by = {(c["claim"], c.get("policy"), c.get("against")): c for c in data["claims"]}
    assert not any(c.get("policy", "").startswith("fixed:") for c in data["claims"])
    ours = by[("captured-half", "loss-delay-fit", None)]
    assert ours["captured"]["mean"] == pytest.approx(0.6, abs=1e-6)
    assert ours["oracle_margin"] == pytest.approx(0.1666667, abs=1e-6)
    assert ours["captured"]["low"] < 0.6 < ours["captured"]["high"]
    assert (ours["verdict"], ours["met"]) == ("met", True)
    assert ours["bootstrap"] == {"samples": 10_000, "seed": 39}
    bdp = by[("captured-half", "bdp", None)]
    assert bdp["captured"]["mean"] == pytest.approx(0.2, abs=1e-6)
    assert bdp["verdict"] == "not met" and "met" not in bdp  # not a target claim
    above = by[("above-best-fixed", "loss-delay-fit", "fixed:50ms")]
    assert above["difference"]["mean"] == pytest.approx(0.1, abs=1e-6)
    assert (above["verdict"], above["met"], above["family"]) == ("best", True, "target")
    assert by[("above-best-fixed", "p4bs", "fixed:50ms")]["verdict"] == "equivalent"
    assert by[("above-best-fixed", "bloated", "fixed:50ms")]["verdict"] == "worse"
    below = by[("not-below-rule", "loss-delay-fit", "bloated")]
    assert (below["verdict"], below["met"]) == ("best", True)
    assert by[("not-below-rule", "loss-delay-fit", "bdp")]["met"] is True
    # loss-delay-fit's target family: above-best-fixed, not-below-rule x 2 and
    # ours-best-or-equivalent (2 p each: difference, equivalence), captured-half (1 p)
    assert data["holm_families"]["target"] == 9
    # bdp is above the best fixed buffer too (-1.1), though it captures only 0.2
    assert data["summary"]["above-best-fixed"] == {
        "best": 2,
        "equivalent": 1,
        "inconclusive": 0,
        "worse": 1,
        "met": 1,
    }


def test_the_cell_table_shows_both_oracles_and_every_policy(tmp_path: Path) -> None:
    """claims.md's table of a cell, as eval/README.md copies it: ours first, each policy's
    whole-run f, its difference to the best fixed buffer, the captured fraction and the
    verdicts; the fixed buffers' f smallest buffer first."""
    results = tmp_path / "eval" / "results"
    _folder(results)
    text = markdown(build(results, tmp_path))
    assert "### dynamic, base" in text
    assert "Best fixed buffer in hindsight: **fixed:50ms**" in text
    assert "Per-phase oracle (calm fixed:5ms, busy fixed:50ms)" in text
    assert text.index("Fixed buffers: fixed:5ms") < text.index("; fixed:50ms")
    table = text[text.index("### dynamic, base") :].splitlines()
    rows = [line.split(" | ") for line in table if line.startswith("| ")][1:]  # no header
    assert [cells[0] for cells in rows] == [
        "| loss-delay-fit", "| bdp", "| bloated", "| p4bs"]  # fmt: skip
    ours = next(cells for cells in rows if cells[0] == "| loss-delay-fit")
    assert ours[2].startswith("+0.100 [") and ours[3] == "best"
    assert ours[4].startswith("0.60 [") and ours[5] == "met"
    assert ours[6:] == ["best", "best |"]  # not below Bloated, nor BDP


def test_bloated_is_read_from_the_oracles_200ms_buffer_where_it_did_not_run(
    tmp_path: Path,
) -> None:
    """The dynamic suite runs 200 ms (Bloated's 2.5 MB) once, as an oracle buffer."""
    results = tmp_path / "eval" / "results"
    _folder(results)
    folder = results / "dynamic" / "results.jsonl"
    rows = [json.loads(line) for line in folder.read_text().splitlines()]
    for row in rows:
        if row["policy"] == "bloated":
            row["policy"] = "fixed:200ms"
    folder.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = build(results, tmp_path)
    by = {(c["claim"], c.get("policy"), c.get("against")): c for c in data["claims"]}
    below = by[("not-below-rule", "loss-delay-fit", "bloated (fixed:200ms)")]
    assert below["difference"]["mean"] == pytest.approx(-1.0333333 + 1.2333333, abs=1e-6)
    assert (below["verdict"], below["met"]) == ("best", True)
    assert data["oracles"][0]["best_fixed"] == "fixed:50ms"


def test_a_captured_fraction_of_noise_is_inconclusive() -> None:
    """An oracle no better than the best fixed buffer leaves nothing to capture; a margin
    the repeats do not show leaves the interval unbounded, and the claim undecided."""
    flat = captured_fraction({1: 0.1, 2: 0.2}, {1: 0.0, 2: 0.0}, {1: 0.0, 2: -0.01})
    assert flat["captured"] is None and flat["p_value"] == 1.0
    policy = {r: 0.02 for r in REPEATS}
    best = {r: 0.0 for r in REPEATS}
    oracle = {r: (0.5 if r % 2 else -0.45) for r in REPEATS}  # mean 0.025, sd 0.5
    noisy = captured_fraction(policy, best, oracle)
    assert noisy["captured"]["mean"] == pytest.approx(0.8)
    assert noisy["captured"]["low"] is None and noisy["p_value"] > 0.05


def test_phase_weighted_f_needs_every_phase() -> None:
    row = _row("bdp", 1)
    assert phase_weighted_f(row) == pytest.approx(row["f_mean"])
    row["phases"][1]["f_mean"] = None
    assert phase_weighted_f(row) is None
    assert phase_weighted_f({"f_mean": -1.0}) is None


def _rewrite(results: Path, change: Any) -> None:
    path = results / "dynamic" / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        if row["policy"].startswith("fixed:"):
            change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_runs_without_phases_leave_their_repeat_or_the_oracle_out(tmp_path: Path) -> None:
    """Fixed-buffer rows without per-phase figures in repeat 1: the oracle pairs over the
    other 11. A phase without f in every fixed run: no per-phase oracle, the captured
    fraction undecided, the best fixed buffer and the paired claims still there."""
    results = tmp_path / "results"
    _folder(results)
    _rewrite(results, lambda row: row.pop("phases") if row["repeat"] == 1 else None)
    data = build(results, tmp_path)
    assert data["oracles"][0]["per_phase_oracle_f"] is not None
    (ours,) = [
        c
        for c in data["claims"]
        if c["claim"] == "captured-half" and c["policy"] == "loss-delay-fit"
    ]
    assert ours["n"] == 11 and ours["captured"]["mean"] == pytest.approx(0.6, abs=0.01)

    def no_calm_f(row: dict[str, Any]) -> None:
        if "phases" in row:
            row["phases"][0]["f_mean"] = None

    _rewrite(results, no_calm_f)
    data = build(results, tmp_path)
    (oracles,) = data["oracles"]
    assert oracles["best_fixed"] == "fixed:50ms" and oracles["per_phase_oracle_f"] is None
    captured = [c for c in data["claims"] if c["claim"] == "captured-half"]
    assert captured and {(c["captured"] is None, c["verdict"]) for c in captured} == {
        (True, "inconclusive")
    }
    assert any(c["claim"] == "above-best-fixed" for c in data["claims"])
