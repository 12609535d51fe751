"""A chaos run of the whole loop, trimmed for CI (`p4bs chaos run` is the full one): the
exporter, a Kafka node, a Flink TaskManager, an optimizer instance and the router agent are
each killed (SIGKILL) and started again during one closed-loop run on the testbed. And one
poison record in each topic of a running loop: nothing halts, control goes on, a link whose
metrics stop falls back."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from poison import metrics_window, raw_avro
from test_closed_loop import cubic_testbed

from p4bs import paths
from p4bs.bus import RecordConsumer, client_settings, read_stream
from p4bs_infra.procs import alive
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import TestbedPlan
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.chaos import FAULTS, ChaosPlan, chaos_run, failed_checks, summary
from p4bs_loop.closed_loop import ClosedLoop
from p4bs_schemas.intervals import NO_COUNTS


# 423 s here on a quiet machine (558 s under load): near pytest's 600 s default.
@pytest.mark.timeout(900)
def test_the_loop_through_a_fault_of_each_part_loses_and_doubles_nothing(
    router_credentials: tuple[str, str], tmp_path: Path
) -> None:
    """Each part killed and restarted in turn: every window as the undisturbed computation
    over the same records has it, once; no decision twice; the router's buffer within the
    link's bounds; no process or namespace left. What each fault cost is printed."""
    # The TaskManager, killed 45 s in, took 45-86 s to come back here: the live job may end
    # its catch-up after the traffic's 100 s (chaos_run waits for it, CATCH_UP_S).
    plan = ChaosPlan(flows=10, duration_s=100, first_fault_s=15, fault_every_s=15, down_s=3)
    report = chaos_run(paths.example_config(), tmp_path, plan, progress=lambda _: None)
    print(summary(report))
    assert [f["part"] for f in report["faults"]] == list(FAULTS)
    assert report["windows"]["windows"] > 150  # 500 ms windows over most of 100 s
    assert failed_checks(report) == []


# ---- one poison record in each topic of the loop (issue 38) ----------------------------------

POISON_STEP_BYTES = 100_000  # the step policy's buffer: neither the testbed's nor the safe one
UNKNOWN_LINK = "r9:xe-9/9/9"
WRITTEN_ONLY = {"buffer_decisions", "sla_alerts", "dead_letters"}  # the loop reads none


@dataclasses.dataclass
class PoisonRun:
    """The loop on the testbed with one link under the step policy (one decision, `at` after
    the traffic's start), a short stale limit, and its traffic running in a thread."""

    loop: ClosedLoop
    traffic: threading.Thread
    link_id: str
    injected_ns: int = 0


def _raw(loop: ClosedLoop) -> Producer:
    return Producer(client_settings(loop.config.kafka))


def _decided(run: PoisonRun, phase: str, buffer: int, since_ns: int) -> dict[str, Any] | None:
    """The link's decision of `phase` and `buffer`, applied after `since_ns`, if one is."""
    for d in read_stream(run.loop.config.kafka, "buffer_decisions", run.loop.topics, idle_s=3):
        if (d["link_id"], d["phase"], d["buffer_bytes"]) == (run.link_id, phase, buffer) and (
            d["outcome"] == "applied" and d["ts_ns"] > since_ns
        ):
            return d
    return None


def _all_up(loop: ClosedLoop, *, exporter: bool = True) -> None:
    for name in ("optimizer", "metrics-job"):
        assert loop.processes[name].poll() is None, f"{name} exited: {loop.log_tail(name)}"
    if exporter:
        assert loop.exporter is not None and loop.exporter.pid is not None
        assert alive(loop.exporter.pid), "the exporter exited"


def _first_window_after(loop: ClosedLoop, since_ns: int, timeout_s: float) -> bool:
    """Whether the metrics job writes a window of data that ended after `since_ns`."""
    group = f"poison-watch-{uuid.uuid4().hex[:6]}"
    consumer = RecordConsumer(loop.config.kafka, group, ["link_metrics"], loop.topics)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            received = consumer.poll(0.5)
            if received is not None and received.record["window_end_ns"] > since_ns:
                return True
        return False
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def poison_run(
    unique_plan: Callable[..., TestbedPlan], stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PoisonRun]:
    work = tmp_path_factory.mktemp("poison")
    with cubic_testbed(unique_plan, (10, 0)) as testbed:
        loop = ClosedLoop(
            tomllib.loads(paths.example_config().read_text()),
            testbed,
            work / "loop",
            bootstrap=stack.kafka.bootstrap,
            policy="step",
            policy_options={"buffer": POISON_STEP_BYTES, "at": "20s"},
            sections={"optimizer": {"stale_after": "10s"}},
        )
        loop.start(progress=lambda _: None)
        traffic = threading.Thread(
            target=TrafficRun(testbed, work / "traffic", Scenario(duration_s=45)).run,
            args=(lambda _: None,),
            name="traffic",
        )
        traffic.start()
        try:
            yield PoisonRun(loop, traffic, testbed.plan.link_id)
        finally:
            traffic.join()
            loop.stop()


def test_a_poison_record_in_each_topic_halts_nothing_and_a_stale_link_falls_back(
    poison_run: PoisonRun,
) -> None:
    """While the loop runs, each topic it reads but the links topic (below) gets bytes that
    are not Avro and records that are Avro but wrong (a NaN f, negative counts, a link nobody
    has): every process stays up; the link's decision after them is applied on the router;
    the optimizer dead-letters the windows with their reasons; when the link's metrics stop
    (the exporter killed), it falls back to its safe buffer after stale_after."""
    run, loop = poison_run, poison_run.loop
    link = next(x for x in loop.config.links if x.id == run.link_id)
    assert _first_window_after(loop, 0, 120), "no window from the loop"
    run.injected_ns = time.time_ns()
    raw, key = _raw(loop), run.link_id.encode()
    counters = {**COUNTERS, "ts_ns": run.injected_ns, "packets": -5}
    poison: dict[str, list[bytes]] = {
        "link_counters": [b"\x00\xffnot avro", raw_avro("LinkCounters", counters)],
        "link_metrics": [
            b"\x00\xffnot avro",
            raw_avro("LinkMetrics", metrics_window(run.link_id, run.injected_ns, math.nan)),
            raw_avro("LinkMetrics", metrics_window(UNKNOWN_LINK, run.injected_ns, -0.1)),
        ],
        "optimizer_state": [b"\x00\xffnot avro"],  # read when the optimizer takes a link
    }
    # The loop reads these and the links topic (below); decisions, alerts and dead letters
    # are for the sinks, the dashboard and operators; its optimizer reads link_metrics, so
    # the optimizer feed is not written.
    assert loop.config.metrics.optimizer_stream == "link_metrics"
    unread = WRITTEN_ONLY | {"optimizer_feed"}
    assert set(poison) | {"links"} == set(loop.config.kafka.topics) - unread
    for stream, values in poison.items():
        for value in values:
            raw.produce(loop.topics[stream], value, key)
    assert raw.flush(30) == 0
    step = None
    deadline = time.monotonic() + 90
    while step is None and time.monotonic() < deadline:
        _all_up(loop)
        step = _decided(run, "static", POISON_STEP_BYTES, run.injected_ns)
    assert step is not None, f"no decision after the poison: {loop.log_tail('optimizer')}"
    group = loop.config.optimizer.group
    letters = [
        d["error"]
        for d in read_stream(loop.config.kafka, "dead_letters", loop.topics, idle_s=3)
        if d["source_topic"] == loop.topics["link_metrics"] and d["consumer"] == group
    ]
    assert any("LinkMetrics.f: nan is not a finite number" in e for e in letters), letters
    assert any("undecodable" in e for e in letters), letters
    loop.kill("exporter")
    killed_ns = time.time_ns()
    fallback = None
    deadline = time.monotonic() + 90
    while fallback is None and time.monotonic() < deadline:
        _all_up(loop, exporter=False)
        fallback = _decided(run, "fallback", link.safe_buffer_bytes, killed_ns)
    assert fallback is not None, f"no fallback: {loop.log_tail('optimizer')}"


def test_the_links_topic_s_poison_and_an_interval_far_ahead_halt_nothing(
    poison_run: PoisonRun,
) -> None:
    """After the first test (the exporter killed): the links topic gets bytes that are not
    Avro and a spec whose max_loss is 0, the counters' topic an interval of a link nobody
    has dated 30 days ahead, in the link's partition; the exporter starts again and the
    job's windows come after them, and the optimizer stays up."""
    loop = poison_run.loop
    raw, key = _raw(loop), poison_run.link_id.encode()
    spec = {**SPEC, "link_id": poison_run.link_id, "ts_ns": time.time_ns(), "max_loss": 0.0}
    for value in (b"\x00\xffnot avro", raw_avro("LinkSpec", spec)):
        raw.produce(loop.topics["links"], value, key)
    ahead = {**COUNTERS, "ts_ns": time.time_ns() + 30 * 86_400 * 10**9}
    raw.produce(loop.topics["link_counters"], raw_avro("LinkCounters", ahead), key)
    assert raw.flush(30) == 0
    injected_ns = time.time_ns()
    loop.restart("exporter")
    assert _first_window_after(loop, injected_ns, 90), loop.log_tail("metrics-job")
    _all_up(loop)


COUNTERS: dict[str, Any] = {
    "link_id": UNKNOWN_LINK, "ts_ns": 0, "interval_ns": 100_000_000,
    "seq": 0, **dict.fromkeys(NO_COUNTS, 0), "part": 0, "complete": True, "flow_events": [],
    "flows": [], "flow_index": [], "offset_ns": [], "rtt_ns": [],
}  # fmt: skip
SPEC: dict[str, Any] = {
    "link_id": "", "ts_ns": 0, "removed": False, "capacity_bps": 100_000_000,
    "max_queue_delay_ns": 10_000_000, "max_loss": 0.01, "weight_loss": 1.0,
    "weight_delay": 1.0, "config": "{}",
}  # fmt: skip
