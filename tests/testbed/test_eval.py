"""`p4bs eval`, shortened scenarios through the whole pipeline, asserting only what one run
shows with a wide margin (claims that need repeats live in the evaluation, eval/README.md):
GLOBECOM's resizing against the fixed 200 ms buffer (mean RTT at least 3x lower, utilisation
at least 90%), then the report and plots; P4BS's search on the authors' grid within the
link's buffer limits, beside the vendors' 200 ms buffer."""

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
title = "P4BS against the 200 ms buffer, short"
duration = "80s"
warmup = "10s"
buffer = "200ms"
policies = ["p4bs", "bloated"]
reports = ["heatmap"]

[link]
sla = { max_queue_delay = "50ms", max_loss = 0.01 }

[[groups]]
flows = 50
cca = "cubic"
rtt = "20ms"
"""


def _p4bs_eval(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`p4bs eval ...` as an operator runs it, with the router credentials set."""
    env = {"P4BS_ROUTER_USER": ROUTER_USER, "P4BS_ROUTER_PASSWORD": ROUTER_PASSWORD}
    done = subprocess.run(
        [sys.executable, "-m", "p4bs_cli", "eval", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **env},
    )
    print(done.stdout[-4000:], done.stderr[-4000:])
    return done


def _eval_run(scenario_text: str, tmp_path: Path) -> Path:
    scenario = tmp_path / "short.toml"
    scenario.write_text(scenario_text)
    out = tmp_path / "run"
    assert _p4bs_eval("run", scenario, "--out", out).returncode == 0
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
    assert _p4bs_eval("report", out).returncode == 0
    assert (out / "report.md").read_text() == report
    # Resuming a finished folder runs nothing (no testbed, no stack) and reports the same.
    resumed = _p4bs_eval("run", tmp_path / "short.toml", "--resume", out)
    assert resumed.returncode == 0
    assert "2 runs finished, 0 to run" in resumed.stdout
    assert (out / "report.md").read_text() == report
    assert _namespaces() == before


def test_p4bs_searches_the_authors_grid_within_the_link_buffer_limits(tmp_path: Path) -> None:
    """50 Cubic flows, 20 ms: P4BS bound-searches from the BDP, then makes its trials from
    the lower bound on the authors' grid (1.5 ms of line rate: 18,750 B at 100 Mbit/s),
    never past the link's buffer.max (200 ms: 2.5 MB). Whether its search settles within
    80 s, and whether its mean f beats a rule's, takes repeats to say (issue 17's
    protocol); one run asserts neither."""
    before = _namespaces()
    out = _eval_run(P4BS_SCENARIO, tmp_path)
    rows = {r["policy"]: r for r in map(json.loads, (out / "results.jsonl").open())}
    p4bs = rows["p4bs"]
    assert p4bs["utilisation"] >= 0.9
    decisions = [json.loads(line) for line in (out / p4bs["run_dir"] / "decisions.jsonl").open()]
    phases = [d["phase"] for d in decisions]
    assert phases[:1] == ["bound_search"] and "optimise" in phases, phases
    assert all(32 * 1024 <= d["buffer_bytes"] <= 2_500_000 for d in decisions), decisions
    trials = [d["buffer_bytes"] for d in decisions if d["phase"] == "optimise"]
    assert all((b - trials[0]) % 18_750 == 0 for b in trials), trials
    report = (out / "report.md").read_text()
    assert "p4bs's mean f" in report
    assert (out / "heatmap.png").stat().st_size > 10_000
    assert _namespaces() == before
