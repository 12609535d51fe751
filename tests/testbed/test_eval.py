"""`p4bs eval`, shortened scenarios through the whole pipeline, with the direction of the
papers' main claims asserted: GLOBECOM's resizing against the fixed 200 ms buffer (mean RTT
at least 3x lower, utilisation at least 90%), then the report and plots; P4BS's search
against the static rules (its mean f at least the best rule's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROUTER_PASSWORD, ROUTER_USER

SCENARIO = """
title = "GLOBECOM, short"
duration = "40s"
warmup = "25s"
buffer = "200ms"
policies = ["none", "globecom"]
reports = ["sweep", "timeseries"]

[[groups]]
flows = 20
cca = "cubic"
rtt = "20ms"
"""


P4BS_SCENARIO = """
title = "P4BS against the static rules, short"
duration = "80s"
warmup = "10s"
buffer = "200ms"
policies = ["p4bs", "bdp", "stanford", "bloated"]
reports = ["heatmap"]

[link]
sla = { max_queue_delay = "50ms", max_loss = 0.01 }

[[groups]]
flows = 50
cca = "cubic"
rtt = "20ms"
"""


def _eval_run(scenario_text: str, tmp_path: Path) -> Path:
    scenario = tmp_path / "short.toml"
    scenario.write_text(scenario_text)
    out = tmp_path / "run"
    env = {"P4BS_ROUTER_USER": ROUTER_USER, "P4BS_ROUTER_PASSWORD": ROUTER_PASSWORD}
    done = subprocess.run(
        [sys.executable, "-m", "p4bs_cli", "eval", "run", str(scenario), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **env},
    )
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0
    return out


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_resizing_cuts_the_rtt_at_full_utilisation_and_the_report_says_so(
    tmp_path: Path,
) -> None:
    before = _namespaces()
    out = _eval_run(SCENARIO, tmp_path)
    rows = {r["policy"]: r for r in map(json.loads, (out / "results.jsonl").open())}
    fixed, resized = rows["none"], rows["globecom"]
    assert fixed["decisions_applied"] == 0 and resized["decisions_applied"] >= 1
    assert fixed["rtt_mean_ms"] >= 3 * resized["rtt_mean_ms"], (fixed, resized)
    assert resized["utilisation"] >= 0.9
    assert resized["windows"] > 0 and resized["f_mean"] is not None  # p4bs's own metrics
    report = (out / "report.md").read_text()
    assert "| base | globecom | 1 |" in report
    assert "globecom cuts the long flows' mean RTT" in report
    assert (out / "sweep.png").stat().st_size > 10_000
    assert len(list(out.glob("timeseries-*.png"))) == 2
    # The report is regenerated from the folder alone.
    (out / "report.md").unlink()
    again = subprocess.run(
        [sys.executable, "-m", "p4bs_cli", "eval", "report", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (out / "report.md").read_text() == report, again.stdout
    assert _namespaces() == before


def test_p4bs_search_beats_the_static_rules_on_mean_f(tmp_path: Path) -> None:
    """50 Cubic flows, 20 ms: the BDP rule loses ~2.4%, the Stanford rule ~4.8% and the
    vendors' 200 ms queues for 200 ms; P4BS searches [C RTT_min / sqrt(N), C d-hat] and
    settles where f (loss and delay against the SLA) is highest."""
    before = _namespaces()
    out = _eval_run(P4BS_SCENARIO, tmp_path)
    rows = {r["policy"]: r for r in map(json.loads, (out / "results.jsonl").open())}
    best_rule = max(("bdp", "stanford", "bloated"), key=lambda p: rows[p]["f_mean"])
    assert rows["p4bs"]["f_mean"] >= rows[best_rule]["f_mean"], (rows["p4bs"], rows[best_rule])
    assert rows["p4bs"]["utilisation"] >= 0.9
    decisions = [
        json.loads(line) for line in (out / rows["p4bs"]["run_dir"] / "decisions.jsonl").open()
    ]
    assert [d["phase"] for d in decisions][:1] == ["bound_search"]
    assert "settled" in {d["phase"] for d in decisions}
    assert "p4bs's mean f" in (out / "report.md").read_text()
    assert "is at or above the best other policy's" in (out / "report.md").read_text()
    assert (out / "heatmap.png").stat().st_size > 10_000
    assert _namespaces() == before
