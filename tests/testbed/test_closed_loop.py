"""The closed loop on the testbed: real TCP flows through the Linux router, the data plane model
on the taps, Kafka, the metrics job and the optimizer driving the router agent over gNMI, or
over NETCONF as a Junos router."""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_junos import _config as junos_config
from test_junos import _temporal as junos_temporal

from p4bs import paths
from p4bs.bus import read_stream
from p4bs.config import FlowGroup
from p4bs.yang import yang_model
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import Testbed, TestbedPlan, sender_group
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.closed_loop import ClosedLoop, ClosedLoopError
from p4bs_optimizer.drivers.junos import temporal_us

RATE_BPS = 100_000_000
JOIN_S = 65  # the P4BS test's second group joins then: its first search settled 19-22 s in here
JOINING_FLOWS = 30


@contextmanager
def cubic_testbed(
    plan: Callable[..., TestbedPlan], *groups: tuple[int, int], rtts_ns: tuple[int, ...] = ()
) -> Iterator[Testbed]:
    """A testbed of Cubic flow groups ((flows, start s) each) behind a 200 ms buffer, every
    flow at the testbed's 20 ms base RTT, or group i at `rtts_ns[i]`."""
    senders = [
        sender_group(
            i,
            FlowGroup(f"g{i}", flows, "cubic", start_s * 10**9, rtts_ns[i] if rtts_ns else None),
        )
        for i, (flows, start_s) in enumerate(groups)
    ]
    built = Testbed(plan(groups=senders, extra_delay_max_ns=0, buffer_bytes=RATE_BPS // 8 // 5))
    built.up()
    try:
        yield built
    finally:
        built.down()


def _decisions(loop: ClosedLoop) -> list[dict[str, Any]]:
    return read_stream(loop.config.kafka.bootstrap, "buffer_decisions", loop.topics)


def _session_commands(leader: int) -> list[list[str]]:
    """The command lines of the processes in the session `leader` started."""
    commands = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # Fields after the command (which may hold spaces) end with ')': state, ppid,
            # pgrp, session.
            session = int(stat.read_text().rpartition(")")[2].split()[3])
            if session == leader:
                commands.append((stat.parent / "cmdline").read_bytes().decode().split("\0"))
        except (OSError, ValueError):  # the process ended meanwhile
            continue
    return commands


def _applied_before_the_end(
    applied: list[dict[str, Any]], summary: dict[str, Any]
) -> list[dict[str, Any]]:
    """The decisions applied by a second before the end of the traffic: in time for the
    router's samples to see them. The loop outlives the traffic, and once the flows stop a
    policy may still apply a buffer (GLOBECOM a larger one, as N falls) that no sample saw."""
    held_by = summary["timeline"]["end_ns"] - 10**9
    return [d for d in applied if d["ts_ns"] <= held_by]


def _globecom_held_its_buffers_and_brought_the_rtt_down(
    loop: ClosedLoop, summary: dict[str, Any]
) -> list[dict[str, Any]]:
    """GLOBECOM's decisions were applied, and through the measured part (the last 15 s) the
    router held them, the last one among them (N may still grow by a few flows early in it);
    the link was at least 90% busy with the RTT within 20% of the idle RTT. The decisions
    applied, in order."""
    decisions = _decisions(loop)
    applied = [d for d in decisions if d["outcome"] == "applied"]
    print(summary["router"], summary["probe"], [(d["phase"], d["buffer_bytes"]) for d in applied])
    assert applied and all(d["phase"] == "recompute" for d in applied), decisions
    limits = set(summary["router"]["limit_bytes"])
    assert _applied_before_the_end(applied, summary)[-1]["buffer_bytes"] in limits
    assert limits <= {d["buffer_bytes"] for d in applied}
    assert summary["router"]["throughput_bps"] >= 0.9 * RATE_BPS
    probe = summary["probe"]
    assert probe["loaded_rtt_p50_ns"] <= 1.2 * probe["idle_rtt_ns"]
    return applied


@pytest.fixture
def junos_testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """50 Cubic flows; the router's agent plays a Junos router (NETCONF, candidate, commit
    confirmed)."""
    with cubic_testbed(functools.partial(unique_plan, netconf_dialect="junos"), (50, 0)) as built:
        yield built


def test_globecom_over_junos_netconf_sizes_the_scheduler_end_to_end(
    junos_testbed: Testbed, stack: Stack, tmp_path: Path
) -> None:
    """GLOBECOM on 50 Cubic flows with the optimizer driving a Junos router: each decision
    is a confirmed commit of `buffer-size temporal`, which the router's FIFO follows; within
    30 s of traffic the RTT through the router is within 20% of the idle RTT and the link at
    least 90% busy (measured by a probe and the router, not by p4bs). The loop over gNMI,
    the testbed's default, is test_eval's, test_monitoring's and test_dashboard's."""
    testbed = junos_testbed
    base = tomllib.loads((paths.example_config()).read_text())
    loop = ClosedLoop(
        base, testbed, tmp_path / "loop", bootstrap=stack.kafka.bootstrap, policy="globecom"
    )
    assert loop.config.routers[0].driver == "netconf-junos"
    loop.start()
    try:
        # The loop's metrics job runs in a JVM with the loop's options (faster start-up).
        jvm_args = loop.config.flink.jvm_args.split()
        assert jvm_args
        javas = [c for c in _session_commands(loop.processes["metrics-job"].pid) if "java" in c[0]]
        assert javas and all(set(jvm_args) <= set(c) for c in javas), javas
        scenario = Scenario(duration_s=45, warmup_s=30)
        summary = TrafficRun(testbed, tmp_path / "run", scenario).run(progress=lambda _: None)
    finally:
        loop.stop()
    applied = _globecom_held_its_buffers_and_brought_the_rtt_down(loop, summary)
    assert summary["long_flows"]["flows_seen"] == 50
    # The router's running configuration holds the last decision as whole µs of the link.
    running = junos_config(testbed)
    yang_model("junos").validate(running)
    assert junos_temporal(running) == str(temporal_us(applied[-1]["buffer_bytes"], RATE_BPS))
    log = testbed.agent_log.read_text()
    assert log.count("commit confirmed by session") >= len(applied)
    assert "rolled back" not in log.replace("rolled back unless confirmed", "")


@pytest.fixture
def joining_testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """10 Cubic flows, then JOINING_FLOWS more after JOIN_S, time for the first search to
    settle (the loop starts the traffic once the job's windows flow, so the search starts at
    once). The paper's z-score (lag 50 of the loop's 500 ms windows, threshold 10) missed
    10 more flows once in CI; with 30 more (N 10 -> 40, about 16 times the loss) its first
    window after the join read z -23.4 here."""
    with cubic_testbed(unique_plan, (10, 0), (JOINING_FLOWS, JOIN_S)) as built:
        yield built


def test_p4bs_searches_settles_and_searches_again_when_flows_join(
    joining_testbed: Testbed, stack: Stack, tmp_path: Path
) -> None:
    base = tomllib.loads((paths.example_config()).read_text())
    loop = ClosedLoop(
        base, joining_testbed, tmp_path / "loop", bootstrap=stack.kafka.bootstrap, policy="p4bs"
    )
    loop.start()
    try:
        scenario = Scenario(duration_s=JOIN_S + 30, warmup_s=10)
        summary = TrafficRun(joining_testbed, tmp_path / "run", scenario).run(
            progress=lambda _: None
        )
    finally:
        loop.stop()
    decisions = [d for d in _decisions(loop) if d["policy"] == "p4bs"]
    start_ns = summary["timeline"]["traffic_start_ns"]
    print(
        [
            (d["phase"], d["trial"], d["buffer_bytes"], (d["ts_ns"] - start_ns) / 1e9)
            for d in decisions
        ]
    )
    print(summary["router"], summary["probe"])
    joined_ns = start_ns + JOIN_S * 10**9
    before = [d for d in decisions if d["ts_ns"] < joined_ns]
    after = [d for d in decisions if d["ts_ns"] >= joined_ns]
    phases = [d["phase"] for d in before]
    assert "optimise" in phases and "settled" in phases, phases
    assert phases.index("bound_search") < phases.index("optimise") < phases.index("settled")
    # A trial whose windows came too late is decided again under its number.
    trials = list(dict.fromkeys(d["trial"] for d in before if d["phase"] == "optimise"))
    assert trials == list(range(1, len(trials) + 1)) and 3 <= len(trials) <= 8
    # Every buffer within the link's limits; the trials on the authors' grid from the first
    # (1.5 ms of line rate: 18,750 B at 100 Mbit/s).
    low, high = loop.config.links[0].min_buffer_bytes, loop.config.links[0].max_buffer_bytes
    assert all(low <= d["buffer_bytes"] <= high for d in decisions), decisions
    tried = [d["buffer_bytes"] for d in before if d["phase"] == "optimise"]
    assert all((b - tried[0]) % (RATE_BPS * 3 // 2 // 8000) == 0 for b in tried), tried
    # The joining flows move f: the change detector flags it and the search starts again.
    restart = [d for d in after if d["phase"] == "bound_search"]
    assert restart and "change detected" in restart[0]["reason"], (
        after,
        _f_and_z_after(loop, start_ns, joined_ns),
    )


def _f_and_z_after(loop: ClosedLoop, start_ns: int, joined_ns: int) -> list[tuple[float, ...]]:
    """(s into the traffic, f, z) of the link's windows in the 5 s after `joined_ns`: what
    the change detector saw. Read only when the assertion above fails (its message)."""
    return [
        (round((w["window_end_ns"] - start_ns) / 1e9, 1), round(w["f"], 3), round(w["zscore"], 1))
        for w in read_stream(loop.config.kafka.bootstrap, "link_metrics", loop.topics)
        if joined_ns <= w["window_end_ns"] < joined_ns + 5 * 10**9
    ]


RTT_GROUPS_NS = (20_000_000, 100_000_000)


@pytest.fixture
def two_rtt_testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """5 Cubic flows at 20 ms and 5 at 100 ms base RTT."""
    with cubic_testbed(unique_plan, (5, 0), (5, 0), rtts_ns=RTT_GROUPS_NS) as built:
        yield built


def _flow_queues(testbed: Testbed) -> dict[str, set[str]]:
    """The router's u32 filters on the bottleneck: source address -> the classes (htb
    flowids) its flows are sent to."""
    out = subprocess.run(
        ["tc", "-n", testbed.ns["rtr"], "filter", "show", "dev", testbed.plan.egress],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    queues: dict[str, set[str]] = {}
    flowid = None
    for line in out.splitlines():
        if found := re.search(r"flowid (\S+)", line):
            flowid = found.group(1)
        elif (found := re.search(r"match ([0-9a-f]{8})/ffffffff at 12", line)) and flowid:
            source = str(ipaddress.IPv4Address(int(found.group(1), 16)))
            queues.setdefault(source, set()).add(flowid)
    return queues


def test_jenks_puts_each_rtt_group_in_its_own_queue_sized_by_stanford(
    two_rtt_testbed: Testbed, stack: Stack, tmp_path: Path
) -> None:
    """Gomez et al.: the flows' RTTs split by Jenks into two queues, each sized by the
    Stanford rule on its own flows; each queue then gets its equal share of the link,
    whatever its flows' RTT."""
    testbed = two_rtt_testbed
    base = tomllib.loads((paths.example_config()).read_text())
    loop = ClosedLoop(
        base,
        testbed,
        tmp_path / "loop",
        bootstrap=stack.kafka.bootstrap,
        policy="jenks",
        policy_options={"queues": 2},
    )
    loop.start()
    try:
        scenario = Scenario(duration_s=60, warmup_s=35)
        summary = TrafficRun(testbed, tmp_path / "run", scenario).run(progress=lambda _: None)
        queues = _flow_queues(testbed)
    finally:
        loop.stop()
    applied = [d for d in _decisions(loop) if d["outcome"] == "applied"]
    print([(d["queue"], d["buffer_bytes"], d["reason"]) for d in applied])
    print(summary["router"], queues)
    assert {d["queue"] for d in applied} == {0, 1}
    assert all(d["phase"] == "separate" for d in applied)
    # Separated before the measured part, and there each group's flows all in one queue,
    # its buffers those decided last.
    assert min(d["ts_ns"] for d in applied) < summary["timeline"]["steady_from_ns"]
    short, long = (group.address for group in testbed.plan.groups)
    assert queues == {short: {"1:10"}, long: {"1:11"}}, queues
    last = {d["queue"]: d["buffer_bytes"] for d in _applied_before_the_end(applied, summary)}
    # Stanford on each queue's flows: C/2 * RTT / sqrt(5), RTT at least the base RTT. The
    # taps' RTT can be a fraction of a percent below the configured base (seen: 19.97 ms for
    # 20 ms, a buffer 0.16% under the floor): 2% of slack below it.
    for queue, rtt_ns in enumerate(RTT_GROUPS_NS):
        floor = RATE_BPS / 2 / 8 * rtt_ns / 1e9 / 5**0.5
        assert 0.98 * floor <= last[queue] <= 3 * floor, (queue, last)
    router = summary["router"]
    assert router["queues"]["10:"]["limit_bytes"] == [last[0]]
    assert router["queues"]["11:"]["limit_bytes"] == [last[1]]
    assert router["throughput_bps"] >= 0.9 * RATE_BPS
    shares = [router["queues"][q]["throughput_bps"] for q in ("10:", "11:")]
    assert min(shares) >= 0.8 * max(shares), shares


def test_a_loop_whose_exporter_cannot_start_stops_at_once_with_its_log(
    unique_plan: Callable[..., TestbedPlan], stack: Stack, tmp_path: Path
) -> None:
    """The exporter's metrics port taken (by another exporter, or a leaked endpoint): the
    loop says so within seconds, not after waiting 240 s for windows that cannot come."""
    with cubic_testbed(unique_plan, (2, 0)) as testbed:
        base = tomllib.loads(paths.example_config().read_text())
        loop = ClosedLoop(
            base, testbed, tmp_path / "loop", bootstrap=stack.kafka.bootstrap, policy="globecom"
        )
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            loop.metrics_addresses["exporter"] = f"127.0.0.1:{taken.getsockname()[1]}"
            began = time.monotonic()
            with pytest.raises(ClosedLoopError, match=r"(?s)the exporter exited.*in use"):
                loop.start(progress=lambda _: None)
        assert time.monotonic() - began < 60
        assert all(process.poll() is not None for process in loop.processes.values())
