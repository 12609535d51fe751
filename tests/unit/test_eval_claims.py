"""`p4bs eval claims` (eval/p4bs_eval/claims.py): each claim's verdict from offline and live
summaries, the paired difference checked against a straightforward computation, the verdicts
Holm-adjusted across their family (issue 39)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from p4bs_cli.main import main
from p4bs_eval.claims import build, versus

# Three seeds; loss-delay-fit beats everyone, P4BS beats BDP but not BSCL (inconclusive).
F = {
    "loss-delay-fit": {1: -0.60, 2: -0.62, 3: -0.61},
    "p4bs": {1: -0.70, 2: -0.64, 3: -0.72},
    "bscl": {1: -0.66, 2: -0.69, 3: -0.70},
    "bdp": {1: -0.90, 2: -0.91, 3: -0.95},
}
# Median short-flow FCT, ms: P4BS 9-11 ms below BSCL, the best rule; ours 40-60 ms above P4BS.
FCT = {
    "loss-delay-fit": {1: 290.0, 2: 310.0, 3: 300.0},
    "p4bs": {1: 250.0, 2: 250.0, 3: 250.0},
    "bscl": {1: 260.0, 2: 261.0, 3: 259.0},
    "bdp": {1: 400.0, 2: 380.0, 3: 390.0},
}


def test_versus_is_the_paired_difference_to_the_best_rival_by_mean() -> None:
    found = versus(F, "p4bs", ("bdp", "bscl"))
    assert found is not None and found["against"] == "bscl"
    diffs = [F["p4bs"][s] - F["bscl"][s] for s in (1, 2, 3)]
    half = 4.302653 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, 2)
    mean = statistics.fmean(diffs)
    assert found["difference"]["mean"] == pytest.approx(mean, abs=1e-6)
    assert found["difference"]["low"] == pytest.approx(mean - half, abs=1e-5)
    assert found["difference"]["high"] == pytest.approx(mean + half, abs=1e-5)
    assert (found["n"], found["verdict"]) == (3, "inconclusive")
    assert versus(F, "adt", ("bdp",)) is None


def _offline(folder: Path) -> None:
    policies = {
        p: {
            "f_mean": {str(s): f for s, f in v.items()},
            "search_s": {str(s): (18.0 if p == "loss-delay-fit" else None) for s in v},
            "f_after_settling": {
                str(s): (f if p == "loss-delay-fit" else None) for s, f in v.items()
            },
        }
        for p, v in F.items()
    }
    cells = {
        "cca=cubic,flows=25": {"oracle": {"buffer_bytes": 437_500, "f": -0.6}, "policies": policies}
    }
    (folder / "offline.json").write_text(json.dumps({"source": "x", "seeds": 3, "cells": cells}))


def _live(folder: Path) -> None:
    (folder / "scenario.json").write_text(json.dumps({"name": "v"}))
    rows = [
        {
            "point": "cca=cubic,flows=25",
            "policy": p,
            "repeat": s,
            "seed": s,
            "f_mean": f,
            "fct_p50_ms": FCT[p][s],
        }
        for p, v in F.items()
        for s, f in v.items()
    ]
    rows.append({**rows[0], "f_mean": None, "error": "failed"})  # a failed run, redone below
    rows.append(rows[0])
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_claims_from_offline_and_live_summaries(tmp_path: Path) -> None:
    results = tmp_path / "eval" / "results"
    (results / "surface").mkdir(parents=True)
    (results / "live").mkdir()
    _offline(results / "surface")
    _live(results / "live")
    summary = json.loads((results / "surface" / "offline.json").read_text())
    bdp = summary["cells"]["cca=cubic,flows=25"]["policies"]["bdp"]["f_mean"]
    bdp.update({seed: f - 1.0 for seed, f in bdp.items()})  # the simulator 1.0 too low
    (results / "surface" / "offline.json").write_text(json.dumps(summary))
    data = build(results, tmp_path)
    by = {(c["claim"], c["source"]): c for c in data["claims"]}
    offline, live = "eval/results/surface/offline.json", "eval/results/live/results.jsonl"
    for source in (offline, live):
        assert by[("p4bs-highest-f", source)]["verdict"] == "inconclusive"  # against bscl
        ours = by[("ours-best-or-equivalent", source)]
        # Alone (p 0.014) best; in its family of 6 hypotheses (this claim offline and live,
        # ours-fct live: each a p of difference and of equivalence) not: never met then.
        assert ours["against"] == "bscl" and ours["p_value"] == pytest.approx(0.01424, abs=1e-4)
        # ranked second of six (ours-fct's p 0.013 first): at least 5 p, monotone
        assert ours["p_adjusted"] >= 5 * ours["p_value"] > 0.05
        assert (ours["verdict"], ours["met"], ours["registered"]) == ("inconclusive", False, False)
    near = by[("ours-near-oracle", offline)]
    assert near["gap"] == pytest.approx((-0.6 - (-0.61)) / 0.6, abs=1e-6)
    assert near["verdict"] == "met"
    assert by[("ours-search-time", offline)]["median_search_s"] == 18.0
    assert ("ours-near-oracle", live) not in by
    fct = by[("p4bs-lowest-fct", live)]
    assert (fct["against"], fct["verdict"]) == ("bscl", "best")  # reproduced
    assert fct["difference"]["mean"] == pytest.approx(-10.0)
    ours_fct = by[("ours-fct", live)]
    assert (ours_fct["against"], ours_fct["verdict"]) == ("p4bs", "inconclusive")
    assert ours_fct["met"] is False
    assert data["summary"]["p4bs-highest-f"] == {
        "best": 0,
        "equivalent": 0,
        "inconclusive": 2,
        "worse": 0,
    }
    assert data["holm_families"] == {"paper": 6, "target": 6}
    checks = {c["policy"]: c for c in data["claims"] if c["claim"] == "offline-matches-live"}
    assert set(checks) == set(F) and checks["bdp"]["verdict"] == "outside"
    assert {checks[p]["verdict"] for p in F if p != "bdp"} == {"inside"}
    assert checks["p4bs"]["offline_f"] == pytest.approx(checks["p4bs"]["live_f"]["mean"])


def test_ours_against_the_better_aqm_on_f_and_on_fct(tmp_path: Path) -> None:
    """Where RED and CoDel ran, loss-delay-fit against the better of the two: by mean f
    (higher) for ours-vs-aqm, by median FCT (lower) for ours-fct-vs-aqm; no target."""
    f = {"loss-delay-fit": -0.60, "red": -0.75, "codel": -0.64}
    fct = {"loss-delay-fit": 300.0, "red": 180.0, "codel": 220.0}
    phase = {"loss-delay-fit": 1, "red": 2, "codel": 0}  # each policy's noise, out of step
    rows = [
        {"point": "n25", "policy": p, "repeat": r, "seed": r,
         "f_mean": f[p] - 0.01 * ((r + phase[p]) % 3), "fct_p50_ms": fct[p] + 2.0 * (r % 2)}
        for p in f
        for r in range(1, 11)
    ]  # fmt: skip
    folder = tmp_path / "results" / "aqm"
    folder.mkdir(parents=True)
    (folder / "scenario.json").write_text(json.dumps({"name": "aqm"}))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    by = {c["claim"]: c for c in build(tmp_path / "results", tmp_path)["claims"]}
    on_f, on_fct = by["ours-vs-aqm"], by["ours-fct-vs-aqm"]
    assert (on_f["against"], on_f["verdict"], on_f["family"]) == ("codel", "best", "other")
    assert on_f["difference"]["mean"] == pytest.approx(0.039)
    assert (on_fct["against"], on_fct["verdict"]) == ("red", "worse")  # 120 ms longer
    assert "met" not in on_f and "met" not in on_fct


def test_a_dynamic_scenarios_offline_runs_are_checked_against_its_own_live_runs(
    tmp_path: Path,
) -> None:
    """An offline.json of a dynamic scenario (its `scenario` named) is matched with that
    scenario's live folder only, though another folder has the same cell, and makes no
    claim of its own; a sweep's (no scenario) with every folder of its cells."""
    results = tmp_path / "results"
    for name in ("dyn", "other"):
        (results / name).mkdir(parents=True)
        _live(results / name)
        (results / name / "scenario.json").write_text(json.dumps({"name": name}))
    _offline(results / "dyn")
    summary = json.loads((results / "dyn" / "offline.json").read_text())
    (results / "dyn" / "offline.json").write_text(json.dumps(summary | {"scenario": "dyn"}))
    claims = build(results, tmp_path)["claims"]
    checks = {c["source"] for c in claims if c["claim"] == "offline-matches-live"}
    assert checks == {"results/dyn/offline.json against results/dyn/results.jsonl"}
    assert not any(c["source"] == "results/dyn/offline.json" for c in claims)
    (results / "dyn" / "offline.json").write_text(json.dumps(summary))  # a sweep's
    claims = build(results, tmp_path)["claims"]
    checks = {c["source"] for c in claims if c["claim"] == "offline-matches-live"}
    assert len(checks) == 2


def test_offline_claims_count_the_surface_s_own_error(tmp_path: Path) -> None:
    """loss-delay-fit's lead over BSCL, outside the seeds' noise, is within what the surface
    knows of the two buffers they sit on (standard error 0.05 each): the interval widens to
    t * sqrt(s^2 / n + 0.05^2 + 0.05^2) and takes 0 in."""
    results = tmp_path / "eval" / "results"
    (results / "surface").mkdir(parents=True)
    _offline(results / "surface")
    data = build(results, tmp_path)
    (plain,) = [c for c in data["claims"] if c["claim"] == "ours-best-or-equivalent"]
    assert plain["against"] == "bscl" and plain["difference"]["low"] > 0
    summary = json.loads((results / "surface" / "offline.json").read_text())
    cell = summary["cells"]["cca=cubic,flows=25"]
    cell["surface_se"] = {"100000": 0.05, "200000": 0.05}
    for policy, data_of in cell["policies"].items():
        data_of["exposure"] = {"100000" if policy == "loss-delay-fit" else "200000": 1.0}
    (results / "surface" / "offline.json").write_text(json.dumps(summary))
    (widened,) = [
        c for c in build(results, tmp_path)["claims"] if c["claim"] == "ours-best-or-equivalent"
    ]
    diffs = [F["loss-delay-fit"][s] - F["bscl"][s] for s in (1, 2, 3)]
    half = 4.302653 * math.sqrt(statistics.variance(diffs) / 3 + 2 * 0.05**2)  # t(0.975, 2)
    assert widened["difference"]["high"] == pytest.approx(statistics.fmean(diffs) + half, abs=1e-5)
    assert widened["difference"]["low"] < 0 and widened["verdict"] == "inconclusive"
    assert widened["met"] is False


def test_the_command_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    (results / "surface").mkdir(parents=True)
    _offline(results / "surface")
    out = tmp_path / "claims.json"
    assert main(["eval", "claims", "--results", str(results), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["ours-best-or-equivalent"] == {
        "best": 1,
        "equivalent": 0,
        "inconclusive": 0,
        "worse": 0,
        "met": 1,
    }
    assert summary["p4bs-lowest-fct"] == summary["ours-fct"] == {"not measured": 1}
    shown = "ours-best-or-equivalent: best 1, equivalent 0, inconclusive 0, worse 0, met 1"
    assert shown in capsys.readouterr().out
    assert main(["eval", "claims", "--results", str(tmp_path / "none")]) == 2
