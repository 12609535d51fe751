"""A chaos run of the whole loop, trimmed for CI (`p4bs chaos run` is the full one): the
exporter, a Kafka node, a Flink TaskManager, an optimizer instance and the router agent are
each killed (SIGKILL) and started again during one closed-loop run on the testbed."""

from __future__ import annotations

from pathlib import Path

import pytest

from p4bs import paths
from p4bs_loop.chaos import FAULTS, ChaosPlan, chaos_run, failed_checks, summary


def test_the_loop_through_a_fault_of_each_part_doubles_nothing_and_leaves_nothing(
    router_credentials: tuple[str, str], tmp_path: Path
) -> None:
    """Each part killed and restarted in turn; after each fault windows came again as fast
    as before it; no window and no decision twice; the router's buffer within the link's
    bounds; no process or namespace left. Then every window as the undisturbed computation
    has it: not yet (see the xfail's reason)."""
    # 180 s: after the TaskManager's failover the job took 75-86 s to come back here.
    plan = ChaosPlan(flows=10, duration_s=180, first_fault_s=20, fault_every_s=25, down_s=3)
    report = chaos_run(paths.default_config(), tmp_path, plan, progress=lambda _: None)
    print(summary(report))
    assert [f["part"] for f in report["faults"]] == list(FAULTS)
    assert all(f["recovered_after_s"] is not None for f in report["faults"])
    assert report["windows"]["doubled"] == [] and report["decisions"]["doubled"] == []
    assert report["router"]["within"], report["router"]
    assert report["leftovers"] == {"processes": [], "namespaces": []}
    assert report["windows"]["windows"] > 200  # 500 ms windows over most of 180 s
    failed = failed_checks(report)
    if failed:
        # streaming-jobs/README.md, "Sparse streams": live, decisions reach the job after
        # their window closed and are dropped (every run so far); after the TaskManager's
        # failover, the catch-up lost windows in 1 run of 2 (the interval source idled under
        # load while the decisions' watermark was ahead).
        pytest.xfail("open defects of the metrics job's sparse streams: " + "; ".join(failed))
