"""A chaos run of the whole loop, trimmed for CI (`p4bs chaos run` is the full one): the
exporter, a Kafka node, a Flink TaskManager, an optimizer instance and the router agent are
each killed (SIGKILL) and started again during one closed-loop run on the testbed."""

from __future__ import annotations

from pathlib import Path

from p4bs import paths
from p4bs_loop.chaos import FAULTS, ChaosPlan, chaos_run, failed_checks, summary


def test_the_loop_through_a_fault_of_each_part_loses_and_doubles_nothing(
    router_credentials: tuple[str, str], tmp_path: Path
) -> None:
    """Each part killed and restarted in turn: every window as the undisturbed computation
    over the same records has it, once; no decision twice; the router's buffer within the
    link's bounds; no process or namespace left. What each fault cost is printed."""
    # 180 s: after the TaskManager's failover the job took 45-86 s to come back here.
    plan = ChaosPlan(flows=10, duration_s=180, first_fault_s=20, fault_every_s=25, down_s=3)
    report = chaos_run(paths.default_config(), tmp_path, plan, progress=lambda _: None)
    print(summary(report))
    assert [f["part"] for f in report["faults"]] == list(FAULTS)
    assert report["windows"]["windows"] > 200  # 500 ms windows over most of 180 s
    assert failed_checks(report) == []
