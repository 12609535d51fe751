"""The closed loop on the testbed: real TCP flows through the Linux router, the data plane model
on the taps, Kafka, the metrics job and the optimizer driving the router agent over gNMI."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from p4bs import paths
from p4bs.bus import RecordConsumer
from p4bs.closed_loop import ClosedLoop
from p4bs.config import FlowGroup
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import Testbed, TestbedPlan, sender_group
from p4bs_infra.traffic import Scenario, TrafficRun

RATE_BPS = 100_000_000


@pytest.fixture
def testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """50 Cubic flows of 20 ms base RTT behind a 200 ms buffer."""
    group = FlowGroup(name="cubic", flows=50, cca="cubic", start_ns=0, rtt_ns=None)
    built = Testbed(
        unique_plan(
            groups=[sender_group(0, group)],
            extra_delay_max_ns=0,
            buffer_bytes=RATE_BPS // 8 // 5,
        )
    )
    built.up()
    yield built
    built.down()


def _decisions(loop: ClosedLoop) -> list[dict[str, Any]]:
    consumer = RecordConsumer(
        loop.config.kafka.bootstrap, "test-reader", ["buffer_decisions"], loop.topics
    )
    records = []
    try:
        while (received := consumer.poll(2.0)) is not None:
            records.append(received.record)
    finally:
        consumer.close()
    return records


def test_globecom_brings_rtt_to_base_and_keeps_the_link_busy(
    testbed: Testbed, stack: Stack, tmp_path: Path
) -> None:
    """Within 30 s of traffic the RTT through the router is within 20% of the idle RTT and
    the link is at least 90% busy (measured by a probe and the router, not by p4bs)."""
    base = tomllib.loads((paths.home() / "config" / "testbed.toml").read_text())
    loop = ClosedLoop(
        base, testbed, tmp_path / "loop", bootstrap=stack.kafka.bootstrap, policy="globecom"
    )
    loop.start()
    try:
        scenario = Scenario(duration_s=45, warmup_s=30)
        summary = TrafficRun(testbed, tmp_path / "run", scenario).run(progress=lambda _: None)
    finally:
        loop.stop()
    decisions = _decisions(loop)
    applied = [d for d in decisions if d["outcome"] == "applied"]
    print(summary["router"], summary["probe"], [(d["phase"], d["buffer_bytes"]) for d in applied])
    assert applied and all(d["phase"] == "recompute" for d in applied), decisions
    # The last decision was in force through the measured part (the last 15 s).
    assert summary["router"]["limit_bytes"] == [applied[-1]["buffer_bytes"]]
    assert summary["router"]["throughput_bps"] >= 0.9 * RATE_BPS
    probe = summary["probe"]
    assert probe["loaded_rtt_p50_ns"] <= 1.2 * probe["idle_rtt_ns"]
    assert summary["long_flows"]["flows_seen"] == 50
