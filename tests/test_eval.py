"""`p4bs eval`, shortened GLOBECOM scenario through the whole pipeline: the fixed 200 ms
buffer against GLOBECOM's resizing, with the direction of the paper's main claim asserted
(mean RTT at least 3x lower, utilisation at least 90%), then the report and plots."""

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


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_resizing_cuts_the_rtt_at_full_utilisation_and_the_report_says_so(
    tmp_path: Path,
) -> None:
    before = _namespaces()
    scenario = tmp_path / "short.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    env = {"P4BS_ROUTER_USER": ROUTER_USER, "P4BS_ROUTER_PASSWORD": ROUTER_PASSWORD}
    done = subprocess.run(
        [sys.executable, "-m", "p4bs.cli", "eval", "run", str(scenario), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **env},
    )
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0
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
        [sys.executable, "-m", "p4bs.cli", "eval", "report", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (out / "report.md").read_text() == report, again.stdout
    assert _namespaces() == before
