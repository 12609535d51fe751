"""`p4bs eval`, shortened scenarios through the whole pipeline, asserting only what one run
shows with a wide margin (claims that need repeats live in the evaluation, eval/README.md):
GLOBECOM's resizing against the fixed 200 ms buffer (mean RTT at least 3x lower, utilisation
at least 90%), what `--keep-into` kept after each run, then the report and plots. P4BS's
search live is test_closed_loop's; its report lines and heatmap are test_eval_report's."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROUTER_PASSWORD, ROUTER_USER
from p4bs_infra.testbed import Testbed

SCENARIO = """
title = "GLOBECOM, short"
duration = "40s"
# 30 s: 20 Cubic flows fill the fixed 200 ms buffer in ~7-10 s (eval/README.md, "fill"), and
# GLOBECOM's first change must be in force before the measured 10 s: the metrics job's
# windows reached the optimizer 22-25 s after the traffic began in CI here (a 15 s warm-up
# failed).
warmup = "30s"
buffer = "200ms"
policies = ["none", "globecom"]
reports = ["sweep", "timeseries"]

[[groups]]
flows = 20
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
    kept = tmp_path / "kept"
    assert _p4bs_eval("run", scenario, "--out", out, "--keep-into", kept).returncode == 0
    return out


def test_resizing_cuts_the_rtt_at_full_utilisation_and_the_report_says_so(
    tmp_path: Path,
) -> None:
    before = set(Testbed._existing_namespaces())
    out = _eval_run(SCENARIO, tmp_path)
    rows = {r["policy"]: r for r in map(json.loads, (out / "results.jsonl").open())}
    fixed, resized = rows["none"], rows["globecom"]
    assert fixed["decisions_applied"] == 0 and resized["decisions_applied"] >= 1
    assert fixed["rtt_mean_ms"] >= 3 * resized["rtt_mean_ms"], (fixed, resized)
    assert resized["utilisation"] >= 0.9
    assert resized["windows"] > 0 and resized["f_mean"] is not None  # p4bs's own metrics
    # Kept after each run: every row, and each run's windows as the metrics job gave them.
    kept = tmp_path / "kept"
    assert (kept / "results.jsonl").read_text() == (out / "results.jsonl").read_text()
    assert (kept / "report.md").read_text() == (out / "report.md").read_text()
    for row in rows.values():
        with gzip.open(kept / row["run_dir"] / "link_metrics.jsonl.gz", "rt") as windows:
            assert windows.read() == (out / row["run_dir"] / "link_metrics.jsonl").read_text()
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
    assert set(Testbed._existing_namespaces()) == before
