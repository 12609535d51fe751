"""`p4bs demo`, shortened: it brings everything up, shows the link live, writes its report and
plot, and leaves no namespace or process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROUTER_PASSWORD, ROUTER_USER
from p4bs_infra.testbed import Testbed


def test_a_short_demo_reports_and_tears_everything_down(tmp_path: Path) -> None:
    before = set(Testbed._existing_namespaces())
    env = {"P4BS_ROUTER_USER": ROUTER_USER, "P4BS_ROUTER_PASSWORD": ROUTER_PASSWORD}
    argv = [sys.executable, "-m", "p4bs_cli", "demo", "--policy", "globecom", "--out"]
    argv += [str(tmp_path), "--groups", "10,20", "--every", "20", "--duration", "40"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
    )
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0
    assert "SRTT" in done.stdout and "buffer" in done.stdout  # the live lines
    report = (tmp_path / "report.md").read_text()
    assert "| utilisation, % |" in report and "applied" in report
    # Read back from InfluxDB, where the loop's sink wrote the windows and the decisions.
    stored = re.search(r"(\d+) link_metrics, (\d+) buffer_decisions points", report)
    assert stored and int(stored[1]) > 0 and int(stored[2]) > 0, report
    assert (tmp_path / "run.png").stat().st_size > 10_000
    assert set(Testbed._existing_namespaces()) == before
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert leftovers == []
