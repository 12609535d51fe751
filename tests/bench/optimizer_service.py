"""Benchmark: how many links one optimizer process serves, and how fast a traffic change
reaches the router.

    .venv/bin/python tests/bench/optimizer_service.py [capacity] [reaction] [searching] [decision]
        [--links 100,300,1000] [--search-links 50,100,200] [--beside 0] [--seconds 20]
        [--steps 20]

(default: all four). A Kafka broker of its own runs on free ports.

capacity: links served by one process at one decision per second each (goal: 1,000). The
    service (`OptimizerService`, in this process) runs in dry-run mode: it decides and
    records every decision, but applies nothing, so this is the capacity of the service
    (Kafka in, policy, safety guards, state saved, decision records out), not of any router.
    A producer process emits each link's LinkMetrics window when it ends (10 windows/s per
    link); the links' SRTT alternates between 20 and 30 ms every second (each link at its own
    phase, so decisions are spread over the second), so GLOBECOM (gamma 10%) recomputes once
    a second per link (in a dry run nothing is applied, so the minimum interval between
    changes never holds one back). Figures over `--seconds` after a warm-up: decisions/s
    against the N/s offered, the lag of a decision (the wall clock when its record is
    produced minus the end of the window that caused it) p50/p99, the service process's CPU,
    and the link states saved (changelog records) with the time spent in transactions
    (states, decision records and offsets, committed together);
    "sustained" is >= 95% of the offered decisions and windows with a lag p99 under 1 s.
    `--workload steady` instead: each link's SRTT wobbles by 3% (within GLOBECOM's gamma),
    so it decides once, on its first window, as a settled network's links do; sustained is
    then >= 95% of the windows; `quiet`: by 1%, within the optimizer feed's deadband too.
    `--workload steady-feed` (or `deciding-feed`, `quiet-feed`): the workload's windows as
    the metrics job's optimizer feed holds them for GLOBECOM links ([metrics] optimizer_feed,
    streaming-jobs/README.md; its default deadband and heartbeat): a link's first window,
    each whose SRTT moved past the deadband (the steady workload's 3% switch, once a second at
    a link's own phase: 1.9 windows a second per link), and the heartbeat, one a second
    (`quiet-feed`: the heartbeats alone); the offered windows are those. The
    producer's windows are Avro made from a per-link template whose window times are
    rewritten (Python would otherwise spend a core encoding 10,000 windows/s); one rewritten
    window is checked to be byte for byte what the codec encodes.
reaction: time from a traffic change to the new buffer in the router's kernel (goal < 2 s,
    the policy's settling waits excluded: GLOBECOM has none). The testbed's router with its
    real agent over gNMI, the service in this process (min_change_interval 1 s, as in the
    example config), a simulated link (tests/simlink.py) whose windows follow the kernel's
    buffer. `--steps` times, every 4 s, the link's base RTT steps between 20 and 40 ms at a
    random point of a window; the time until the kernel's FIFO limit (read over netlink
    every 5 ms) is the buffer decided for it, p50/p99, broken down into step -> window out
    (the simulated link's window delivered to Kafka; the metrics job's own output latency,
    tests/bench/metrics_job.py, would come on top) -> decided (the policy returned it) ->
    applied (set and read back over gNMI, record produced); and kernel changed - decided.
searching: how many P4BS searches one process runs at once (goal: 200, decision lag p99 <
    1 s). `--search-links` links start together on windows whose loss and delay follow the
    buffer the service last decided for each (shared with the window producer: a dry run
    applies nothing), with the authors' trial timing; over `--seconds` from the first GP fit,
    the lag from the end of the window that ended a trial to the transaction holding its
    decision, p50/p99, fits/s, and the CPU of the service and its fit processes, beside one
    step fitted alone in the benchmark's process (the same run's reference). `--beside N`:
    N settled GLOBECOM links in the same process beside the searches (issue 41: 200
    searches beside 10,000 links), their windows as the optimizer feed holds them (the
    quiet workload: a heartbeat a second per link).
decision: the P4BS policy's decision at the end of a trial with its default search, the
    authors' grid (tests/bench/ax_decision.py's measurement: tell + GP fit + EI on the grid
    + max EI), which it adds to the reaction path; the service runs it in a fit process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import multiprocessing
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for simlink

from benchkit import fresh_topics, quantiles
from feedrule import heartbeat_offset_ns, heartbeat_within, holds_heartbeat, passes
from simlink import WINDOW_NS, LinkModel, SimulatedLink

from p4bs import paths
from p4bs.bus import RecordProducer, producer_config
from p4bs.config import Config, KafkaConfig, LinkConfig, OptimizerConfig, RouterConfig, load_config
from p4bs.progress import Progress
from p4bs_infra.procs import free_ports, wait_until
from p4bs_infra.services import KafkaBroker, wait_ready
from p4bs_infra.testbed import Testbed, TestbedPlan
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.drivers.linux_tc import LinuxTcDriver
from p4bs_optimizer.policies.base import Decision, Window
from p4bs_optimizer.service import OptimizerService
from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.transaction import Transaction
from p4bs_schemas.codec import codec
from p4bs_schemas.registry import STREAMS

CAPACITY_GOAL_LINKS = 1000
REACTION_GOAL_S = 2.0
PARTITIONS = 4
SRTTS_NS = (20_000_000, 30_000_000)  # alternating each second: GLOBECOM recomputes
# The capacity benchmark's workloads: the two SRTTs a link's windows alternate between each
# second. "deciding" (the figures before issue 41 are of it): GLOBECOM decides on every
# switch, once a second per link. "steady": the SRTT wobbles by 3%, within GLOBECOM's gamma
# (10%), so a link decides once, on its first window, as a settled network's links do.
# "quiet": as steady, but by 1%, within the optimizer feed's deadband (2%) too, so that the
# feed holds only its heartbeats.
WORKLOADS = {
    "deciding": SRTTS_NS,
    "steady": (20_000_000, 20_600_000),
    "quiet": (20_000_000, 20_200_000),
}
SWITCH_WINDOWS = 10  # windows between SRTT switches: one decision a second
# "<workload>-feed": the workload's windows that the optimizer feed holds. The service reads
# them from the link_metrics topic as it would from the feed's (the same records, and the
# same work per window), so the reference commit, which has no feed, reads the same ones.
# The config's defaults ([metrics] feed_deadband, feed_heartbeat), written here because the
# reference's config has neither.
FEED = "-feed"
FEED_DEADBAND = 0.02
FEED_HEARTBEAT_NS = 1_000_000_000
WARMUP_S = 10.0
STEP_EVERY_S = 4.0
BASE_RTTS_NS = (20_000_000, 40_000_000)
KERNEL_POLL_S = 0.005


class TimedService(OptimizerService):
    """The service, noting for each decision the end of the window that caused it, when the
    policy returned it, and when the transaction holding its record committed (with its
    outcome), through the service's `on_transaction` callback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, on_transaction=self._transaction, **kwargs)
        # (link, window end) -> when the policy returned its decisions on that window
        self.decided_at: dict[tuple[str, int], int] = {}
        # Per record: link, phase, buffer, window end, decided, committed (ns), outcome.
        self.records: list[tuple[str, str, int, int, int, int, str]] = []
        self.commit_s = 0.0  # in transactions: states, decision records and offsets
        self.states_written = 0

    def controller(
        self, link_id: str, partition: int, saved: LinkState | None = None
    ) -> LinkController | None:
        made = link_id not in self.controllers
        controller = super().controller(link_id, partition, saved)
        if made and controller is not None:
            decide = controller.policy.decide

            def timed(window: Window) -> list[Decision]:
                decisions = decide(window)
                if decisions:
                    self.decided_at[(link_id, window.window_end_ns)] = time.time_ns()
                return decisions

            controller.policy.decide = timed  # type: ignore[method-assign]
        return controller

    def _transaction(self, transaction: Transaction) -> None:
        self.states_written += transaction.states
        self.commit_s += transaction.seconds
        if not transaction.committed:
            return  # its records go in the next one
        now = time.time_ns()
        for r in transaction.decisions:
            link, end = r["link_id"], r["window_end_ns"] or 0
            decided = self.decided_at.get((link, end), 0)
            self.records.append(
                (link, r["phase"], r["buffer_bytes"], end, decided, now, r["outcome"])
            )


# ---- capacity ------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    """An Avro long: zigzag, then 7 bits a byte, low first."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class WindowTemplate:
    """A link's LinkMetrics window at one SRTT, encoded once; `bytes_for(end_ns)` rewrites
    its window start and end (same-length varints for any time near the template's)."""

    def __init__(self, link: LinkConfig, srtt_ns: int, end_ns: int) -> None:
        self.record = LinkModel().window(link, 100_000, end_ns)
        self.record["srtt_ns"] = srtt_ns
        encoded = codec(STREAMS["link_metrics"]).encode(self.record)
        start, end = _varint(end_ns - WINDOW_NS), _varint(end_ns)
        assert encoded.count(start) == 1 and encoded.count(end) == 1, "times not unique"
        i = encoded.index(start)
        j = encoded.index(end, i + len(start))
        self.head, self.middle, self.tail = (
            encoded[:i],
            encoded[i + len(start) : j],
            encoded[j + len(end) :],
        )
        self.length = len(start)

    def bytes_for(self, end_ns: int) -> bytes:
        start, end = _varint(end_ns - WINDOW_NS), _varint(end_ns)
        assert len(start) == len(end) == self.length
        return self.head + start + self.middle + end + self.tail


def bench_links(base: LinkConfig, count: int) -> tuple[LinkConfig, ...]:
    return tuple(
        dataclasses.replace(base, interface=f"eth{i}", policy="globecom", policy_options={})
        for i in range(count)
    )


def variant_of(
    index: int, link: int, switch_windows: int = SWITCH_WINDOWS, flip_index: int | None = None
) -> int:
    """Which of its two SRTTs link number `link` has in window `index`: each link switches
    every `switch_windows` at its own phase, and from window `flip_index` on has the other
    one, but for the links whose own switch falls in that window (there the two would cancel
    out): so that every link's SRTT switches in the flip window."""
    flipped = (
        flip_index is not None and index >= flip_index and (flip_index + link) % switch_windows != 0
    )
    return ((index + link) // switch_windows + flipped) % 2


class FeedRule:
    """Whether the optimizer feed holds a GLOBECOM link's window (tests/feedrule.py, the
    metrics job's rule) of the workload's SRTTs: its first, an SRTT move past the deadband
    (between the two, known in advance), its heartbeat (at the link's own offset in the
    second)."""

    def __init__(self, srtts_ns: tuple[int, int]) -> None:
        link = bench_links(load_config(paths.example_config()).links[0], 1)[0]
        end_ns = 1_700_000_000_000_000_000
        while holds_heartbeat(LinkModel().window(link, 100_000, end_ns), FEED_HEARTBEAT_NS):
            end_ns += WINDOW_NS  # a window without the heartbeat: that is checked apart
        records = [LinkModel().window(link, 100_000, end_ns) | {"srtt_ns": s} for s in srtts_ns]
        self.moved = [
            [
                passes(a, b, alert=False, deadband=FEED_DEADBAND, heartbeat_ns=FEED_HEARTBEAT_NS)
                for b in records
            ]
            for a in records
        ]

    @staticmethod
    def offsets_ns(links: tuple[LinkConfig, ...]) -> list[int]:
        """Each link's heartbeat offset in the second."""
        return [heartbeat_offset_ns(link.id, FEED_HEARTBEAT_NS) for link in links]

    def holds(self, previous: int | None, variant: int, end_ns: int, offset_ns: int) -> bool:
        """For a window ending at `end_ns` of SRTT `variant` after one of `previous` (None:
        the link's first), of the link whose heartbeat offset is `offset_ns`."""
        heartbeat = heartbeat_within(end_ns - WINDOW_NS, end_ns, offset_ns, FEED_HEARTBEAT_NS)
        return previous is None or heartbeat or self.moved[previous][variant]

    def windows_per_s(self, links: int) -> float:
        """The feed's windows a second of `links` links once past their first (a cycle of
        the workload is two switches, two seconds)."""
        cycle = 2 * SWITCH_WINDOWS
        offsets = self.offsets_ns(bench_links(load_config(paths.example_config()).links[0], links))
        held = sum(
            self.holds(
                variant_of(index - 1, i), variant_of(index, i), index * WINDOW_NS, offsets[i]
            )
            for i in range(links)
            for index in range(cycle, 2 * cycle)
        )
        return held / (cycle * WINDOW_NS / 1e9)


def held_windows(
    links: int,
    first_end_ns: int,
    stop_ns: int,
    period_ns: int = WINDOW_NS,
    switch_windows: int = SWITCH_WINDOWS,
    srtts_ns: tuple[int, int] = SRTTS_NS,
    feed: bool = False,
    flip_from_ns: int | None = None,
) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """Per window end from `first_end_ns` to `stop_ns`, one per `period_ns`: the links
    (number, SRTT variant) whose window is sent, every link's (each switching its SRTT every
    `switch_windows` at its own phase, all at once in the window ending at `flip_from_ns`),
    or with `feed` only those the optimizer feed holds. A tick of the feed looks only at
    the links that can have one held: those whose heartbeat falls in it, whose SRTT switches
    in it, and every link at the first and at the flip (a window of 10,000 links' every
    100 ms took the producer ~40 ms, late by as much for the last ones)."""
    rule = FeedRule(srtts_ns) if feed else None
    specs = bench_links(load_config(paths.example_config()).links[0], links)
    offsets = FeedRule.offsets_ns(specs)
    slots = FEED_HEARTBEAT_NS // period_ns  # ticks in a heartbeat period
    beating: list[list[int]] = [[] for _ in range(slots)]  # tick within the period -> links
    for i, offset in enumerate(offsets):
        for tick in range(slots):
            end = tick * period_ns
            if heartbeat_within(end - period_ns, end, offset, FEED_HEARTBEAT_NS):
                beating[tick].append(i)
    switching: list[list[int]] = [[] for _ in range(switch_windows)]  # index % sw -> links
    for i in range(links):
        switching[-i % switch_windows].append(i)
    everyone = range(links)
    flip_index = None if flip_from_ns is None else flip_from_ns // period_ns
    end_ns = first_end_ns
    while end_ns <= stop_ns:
        index = end_ns // period_ns
        first = end_ns == first_end_ns
        if rule is None or first or index == flip_index:
            candidates: Iterable[int] = everyone
        else:
            candidates = sorted({*beating[index % slots], *switching[index % switch_windows]})
        sent = []
        for i in candidates:
            variant = variant_of(index, i, switch_windows, flip_index)
            previous = None if first else variant_of(index - 1, i, switch_windows, flip_index)
            if rule is None or rule.holds(previous, variant, end_ns, offsets[i]):
                sent.append((i, variant))
        yield end_ns, sent
        end_ns += period_ns


def produce_windows(
    bootstrap: str,
    topic: str,
    links: int,
    first_end_ns: int,
    seconds: float,
    period_ns: int = WINDOW_NS,
    switch_windows: int = SWITCH_WINDOWS,
    srtts_ns: tuple[int, int] = SRTTS_NS,
    feed: bool = False,
    flip_from_ns: int | None = None,
) -> None:
    """In its own process: the windows of `held_windows`, each as it ends."""
    specs = bench_links(load_config(paths.example_config()).links[0], links)
    templates = [[WindowTemplate(s, srtt, first_end_ns) for srtt in srtts_ns] for s in specs]
    check_end = first_end_ns + 7 * WINDOW_NS
    expected = dict(templates[0][0].record, window_start_ns=check_end - WINDOW_NS)
    expected["window_end_ns"] = check_end
    assert templates[0][0].bytes_for(check_end) == codec(STREAMS["link_metrics"]).encode(expected)
    headers = codec(STREAMS["link_metrics"]).headers
    producer = Producer(producer_config(bootstrap, "bench-windows"))
    keys = [s.id.encode() for s in specs]
    stop_ns = first_end_ns + int(seconds * 1e9)
    ticks = held_windows(
        links, first_end_ns, stop_ns, period_ns, switch_windows, srtts_ns, feed, flip_from_ns
    )
    for end_ns, sent in ticks:
        time.sleep(max(0.0, (end_ns - time.time_ns()) / 1e9))  # windows come out as they end
        for i, variant in sent:
            value = templates[i][variant].bytes_for(end_ns)
            while True:
                try:
                    producer.produce(topic, value, keys[i], headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    producer.flush(30)


def capacity_config(bootstrap: str, topics: dict[str, str], links: int) -> Config:
    base = load_config(paths.example_config())
    local = RouterConfig("r1", "linux-tc", None, None, None, None, 5_000_000_000, 4)
    return dataclasses.replace(
        base,
        kafka=KafkaConfig(bootstrap=bootstrap, partitions=PARTITIONS, topics=topics),
        routers=(local,),
        links=bench_links(base.links[0], links),
        optimizer=OptimizerConfig(group=f"bench-{uuid.uuid4().hex[:8]}"),
    )


def bench_capacity(
    bootstrap: str,
    links: int,
    seconds: float,
    figures: dict[str, Any] | None = None,
    workload: str = "deciding",
) -> bool:
    """Prints the figures of `links` served by one process under `workload` (WORKLOADS);
    `figures`, if given, gets them too. True if sustained: 95% of the decisions offered
    (deciding) and of the windows, lag p99 under 1 s."""
    topics = fresh_topics(bootstrap, PARTITIONS)
    config = capacity_config(bootstrap, topics, links)
    first_end_ns = (time.time_ns() // WINDOW_NS + 30) * WINDOW_NS  # the producer starts
    total_s = WARMUP_S + seconds + 2
    srtts_ns = WORKLOADS[workload.removesuffix(FEED)]
    feed = workload.endswith(FEED)
    producer = multiprocessing.get_context("spawn").Process(
        target=produce_windows,
        args=(bootstrap, topics["link_metrics"], links, first_end_ns, total_s),
        kwargs={"srtts_ns": srtts_ns, "feed": feed},
    )
    producer.start()
    service = TimedService(config, dry_run=True)
    measured: dict[str, float] = {}

    async def run() -> None:
        loop = asyncio.get_running_loop()
        start = first_end_ns / 1e9 + WARMUP_S
        loop.call_later(start - time.time(), mark, "start")
        loop.call_later(start + seconds - time.time(), mark, "end")
        loop.call_later(start + seconds + 0.5 - time.time(), service.stop)
        await service.run()

    def mark(name: str) -> None:
        measured[name] = time.time_ns()
        measured[f"{name}_cpu"] = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        measured[f"{name}_windows"] = service.stats.windows
        measured[f"{name}_saves"] = service.states_written
        measured[f"{name}_save_s"] = service.commit_s
        # The service's CPU by part (p4bs_optimizer_cpu_seconds); code before issue 41,
        # measured as a reference (optimizer_cpu.py), has none.
        for part, ns in getattr(service.stats, "cpu_ns", {}).items():
            measured[f"{name}_cpu_{part}"] = ns / 1e9

    try:
        asyncio.run(run())
    finally:
        producer.join(total_s + 30)
        if producer.is_alive():
            producer.kill()
    begin, end = measured["start"], measured["end"]
    inside = [r for r in service.records if begin <= r[5] < end]
    lags = [(r[5] - r[3]) / 1e9 for r in inside if r[3]]
    rate = len(inside) / seconds
    windows = (measured["end_windows"] - measured["start_windows"]) / seconds
    cpu = (measured["end_cpu"] - measured["start_cpu"]) / seconds
    saves = (measured["end_saves"] - measured["start_saves"]) / seconds
    save_s = (measured["end_save_s"] - measured["start_save_s"]) / seconds
    p50, p99 = quantiles(lags) if lags else (float("nan"), float("nan"))
    offered_windows = FeedRule(srtts_ns).windows_per_s(links) if feed else 10 * links
    if not workload.startswith("deciding"):  # no decisions after the first: the windows say it
        sustained = windows >= 0.95 * offered_windows
    else:
        sustained = rate >= 0.95 * links and p99 < 1.0 and windows >= 0.95 * offered_windows
    outcomes = {r[6] for r in inside}
    parts = {
        key.removeprefix("end_cpu_"): (value - measured.get(f"start_cpu_{key[8:]}", 0.0)) / seconds
        for key, value in measured.items()
        if key.startswith("end_cpu_")
    }
    print(
        f"  {links:5d} links, {workload}: {rate:7.1f} decisions/s"
        + (f" (offered {links}/s, {rate / links:.0%})" if workload.startswith("deciding") else "")
        + f"; windows {windows:7.0f}/s (offered {offered_windows:.0f}/s); lag p50 "
        f"{p50 * 1e3:6.1f} ms p99 {p99 * 1e3:6.1f} ms; service CPU {cpu:.2f} s/s"
        + (" (" + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + ")" if parts else "")
        + f"; {saves:.0f} states saved/s ({save_s:.2f} s/s of wall time in transactions); "
        f"outcomes {sorted(outcomes)}; "
        f"{'sustained' if sustained else 'NOT sustained'}",
        flush=True,
    )
    if figures is not None:
        figures.update(
            links=links, workload=workload, decisions_per_s=rate, windows_per_s=windows,
            offered_windows_per_s=offered_windows, lag_p50_s=p50,
            lag_p99_s=p99, cpu_s_per_s=cpu, cpu_parts=parts or None, states_per_s=saves,
            sustained=sustained,
        )  # fmt: skip
    return sustained


# ---- reaction ------------------------------------------------------------------------------


class KernelWatch:
    """Reads the router's FIFO limit from the kernel over netlink every KERNEL_POLL_S in a
    thread of its own, noting each change (wall clock ns, bytes)."""

    def __init__(self, testbed: Testbed) -> None:
        self.router = RouterConfig(
            "kernel", "linux-tc", f"netns:{testbed.ns['rtr']}", None, None, None, 5_000_000_000, 1
        )
        self.interface = testbed.plan.egress
        self.changes: list[tuple[int, int]] = []
        self.latest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), name="kernel")

    async def _watch(self) -> None:
        async with LinuxTcDriver(self.router) as driver:
            while not self._stop.is_set():
                value = await driver.get_buffer(self.interface, 0)
                if value != self.latest:
                    self.changes.append((time.time_ns(), value))
                    self.latest = value
                await asyncio.sleep(KERNEL_POLL_S)  # the sampling period

    def __enter__(self) -> KernelWatch:
        self._thread.start()
        if not wait_until(lambda: self.latest > 0, 10):
            raise RuntimeError("no reading from the router's kernel")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def first(self, value: int, after_ns: int) -> int | None:
        return next((t for t, v in self.changes if t > after_ns and v == value), None)


def reaction_config(bootstrap: str, topics: dict[str, str], testbed: Testbed) -> Config:
    base = load_config(paths.example_config())
    plan = testbed.plan
    router = dataclasses.replace(
        base.routers[0],
        address=f"{plan.router_address}:{plan.gnmi_port}",
        ca_file=str(testbed.pki / "ca.pem"),
    )
    link = dataclasses.replace(base.links[0], policy="globecom", policy_options={})
    return dataclasses.replace(
        base,
        kafka=KafkaConfig(bootstrap=bootstrap, partitions=PARTITIONS, topics=topics),
        routers=(router,),
        links=(link,),
        optimizer=OptimizerConfig(group=f"bench-{uuid.uuid4().hex[:8]}"),
    )


def bench_reaction(bootstrap: str, steps: int, work: Path) -> bool:
    os.environ.setdefault("P4BS_ROUTER_USER", "bench")
    os.environ.setdefault("P4BS_ROUTER_PASSWORD", "bench-password")
    plan = TestbedPlan.from_config(load_config(paths.example_config()))
    plan = dataclasses.replace(plan, name=f"o{uuid.uuid4().hex[:6]}", state_dir=work / "testbed")
    testbed = Testbed(plan)
    testbed.up()
    try:
        return _reaction(bootstrap, steps, work, testbed)
    finally:
        testbed.down()


def _reaction(bootstrap: str, steps: int, work: Path, testbed: Testbed) -> bool:
    topics = fresh_topics(bootstrap, PARTITIONS)
    config = reaction_config(bootstrap, topics, testbed)
    model = LinkModel(base_rtt_ns=BASE_RTTS_NS[0])
    sent: list[tuple[int, int, int]] = []  # wall clock after delivery, base RTT, window end
    service = TimedService(config)
    rng = random.Random(1)
    rows: list[tuple[float, float, float, float, float]] = []

    def on_sent(record: dict[str, Any]) -> None:
        sent.append((time.time_ns(), int(record["rtt_min_ns"]), int(record["window_end_ns"])))

    async def steps_then_stop() -> None:
        await _until(lambda: any(r[6] == "applied" for r in service.records), 60)
        for step in range(steps):
            await asyncio.sleep(STEP_EVERY_S + rng.random() * WINDOW_NS / 1e9)  # pacing
            model.base_rtt_ns = BASE_RTTS_NS[(step + 1) % 2]
            rows.append(await _one_step(time.time_ns(), model.base_rtt_ns))
        service.stop()

    async def _one_step(stepped: int, base_rtt_ns: int) -> tuple[float, float, float, float, float]:
        def window_out() -> tuple[int, int, int] | None:
            """The first window with the new base RTT."""
            return next((w for w in sent if w[0] > stepped and w[1] == base_rtt_ns), None)

        def decision() -> tuple[str, str, int, int, int, int, str] | None:
            """The first change applied for that window or a later one."""
            first = window_out()
            if first is None:
                return None
            return next(
                (r for r in service.records if r[3] >= first[2] and r[6] == "applied"), None
            )

        await _until(lambda: decision() is not None, 10)
        first, applied = window_out(), decision()
        assert first is not None and applied is not None
        out = first[0]
        await _until(lambda: kernel.first(applied[2], stepped) is not None, 5)
        kernel_ns = kernel.first(applied[2], stepped)
        assert kernel_ns is not None
        decided, recorded = applied[4], applied[5]
        return (
            (kernel_ns - stepped) / 1e9,
            (out - stepped) / 1e9,
            (decided - out) / 1e9,
            (recorded - decided) / 1e9,
            (kernel_ns - decided) / 1e9,
        )

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(steps_then_stop())
        await service.run()
        await task

    producer = RecordProducer(bootstrap, topics, client_id="simlink")
    with KernelWatch(testbed) as kernel:
        link = SimulatedLink(config.links[0], producer, lambda: kernel.latest, model, on_sent)
        with link:
            asyncio.run(main())
    columns = list(zip(*rows, strict=True))
    names = (
        "step -> kernel",
        "step -> window out",
        "window out -> decided",
        "decided -> applied",
        "decided -> kernel",
    )
    print(f"  {len(rows)} steps of the base RTT between 20 and 40 ms, GLOBECOM, gNMI:")
    for name, column in zip(names, columns, strict=True):
        p50, p99 = quantiles(list(column))
        print(f"    {name:<22} p50 {p50 * 1e3:7.1f} ms   p99 {p99 * 1e3:7.1f} ms")
    p50, p99 = quantiles(list(columns[0]))
    print(f"  goal: < {REACTION_GOAL_S:g} s; p99/goal = {p99 / REACTION_GOAL_S:.2f}", flush=True)
    return p99 < REACTION_GOAL_S


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.005)


# ---- searching -----------------------------------------------------------------------------

SEARCH_GOAL_LINKS = 200
SEARCH_LAG_GOAL_S = 1.0
SEARCH_WARMUP_S = 20.0  # the service and its fit processes start before the windows begin
FIT_PHASES = ("optimise", "settled")  # decisions that follow a GP fit (or its stop)


def search_links(base: LinkConfig, count: int, first: int = 0) -> tuple[LinkConfig, ...]:
    """P4BS links on interfaces eth<first> on (after the bench_links beside them)."""
    return tuple(
        dataclasses.replace(base, interface=f"eth{i}", policy="p4bs", policy_options={})
        for i in range(first, first + count)
    )


def search_windows(
    bootstrap: str, topic: str, buffers: Any, first_end_ns: int, seconds: float, first: int
) -> None:
    """In its own process: each search link's window as it ends (search_links from
    `first`), at the buffer the service last decided for it (`buffers`, shared with the
    service: a dry run applies nothing), with loss falling and delay rising with that
    buffer, and noise on f."""
    base = load_config(paths.example_config()).links[0]
    specs = search_links(base, len(buffers), first)
    model = LinkModel(loss_scale_bytes=60_000, f_noise=0.01, seed=1)
    producer = RecordProducer(bootstrap, {"link_metrics": topic}, client_id="bench-search")
    end_ns, stop_ns = first_end_ns, first_end_ns + int(seconds * 1e9)
    while end_ns <= stop_ns:
        time.sleep(max(0.0, (end_ns - time.time_ns()) / 1e9))  # windows come out as they end
        for i, link in enumerate(specs):
            producer.produce("link_metrics", model.window(link, buffers[i], end_ns))
        end_ns += WINDOW_NS
    producer.flush(30)


class SearchingService(TimedService):
    """The service, telling the window producer the buffer each search link's decisions set
    (through the service's `on_record` callback)."""

    def __init__(self, config: Config, buffers: Any) -> None:
        super().__init__(config, dry_run=True, on_record=self._recorded)
        self.buffers = buffers
        searching = [link for link in config.links if link.policy == "p4bs"]
        self.index = {link.id: i for i, link in enumerate(searching)}

    def _recorded(self, record: dict[str, Any]) -> None:
        if (
            record["outcome"] == "dry_run"
            and record["queue"] == 0
            and record["link_id"] in self.index
        ):
            # The simulated link is the router: the decision is in force from now on, for
            # the windows the producer makes and for the buffer the service gives them.
            link_id, buffer = record["link_id"], record["buffer_bytes"]
            self.buffers[self.index[link_id]] = buffer
            self.controllers[link_id].state.buffer_changed(record["ts_ns"], buffer)

    def cpu_s(self) -> float:
        """CPU seconds of this process and its fit processes so far."""
        pids = [os.getpid(), *self.fits.pids()]
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total


def bench_searching(bootstrap: str, links: int, seconds: float, beside: int = 0) -> bool:
    """`links` P4BS searches starting together in one process, `beside` settled GLOBECOM
    links with them (the quiet-feed windows: a heartbeat a second); the lag of the
    decisions that follow a fit, over `seconds` from the first fit on."""
    topics = fresh_topics(bootstrap, PARTITIONS)
    base = capacity_config(bootstrap, topics, beside)
    config = dataclasses.replace(
        base, links=(*base.links, *search_links(base.links[0], links, beside))
    )
    buffers = multiprocessing.get_context("spawn").Array("q", [100_000] * links, lock=False)
    first_end_ns = (time.time_ns() // WINDOW_NS) * WINDOW_NS + int(SEARCH_WARMUP_S * 1e9)
    total_s = seconds + 40  # the bound searches come first
    producers = [
        multiprocessing.get_context("spawn").Process(
            target=search_windows,
            args=(bootstrap, topics["link_metrics"], buffers, first_end_ns, total_s, beside),
        )
    ]
    if beside:
        producers.append(
            multiprocessing.get_context("spawn").Process(
                target=produce_windows,
                args=(bootstrap, topics["link_metrics"], beside, first_end_ns, total_s),
                kwargs={"srtts_ns": WORKLOADS["quiet"], "feed": True},
            )
        )
    for producer in producers:
        producer.start()
    service = SearchingService(config, buffers)
    marks: dict[str, float] = {}

    def fitted() -> list[tuple[str, str, int, int, int, int, str]]:
        return [r for r in service.records if r[1] in FIT_PHASES and r[3]]

    async def run() -> None:
        async def measure() -> None:
            while not fitted():
                await asyncio.sleep(0.05)  # polling the records, not a synchronisation
            marks["start"], marks["start_cpu"] = time.time_ns(), service.cpu_s()
            marks["start_tx"], marks["start_commit_s"] = (
                service.stats.transactions,
                service.commit_s,
            )
            marks["searching"] = sum(
                getattr(c.policy, "phase", None) == "optimise" for c in service.controllers.values()
            )
            await asyncio.sleep(seconds)  # the measured span
            marks["end"], marks["end_cpu"] = time.time_ns(), service.cpu_s()
            marks["end_tx"], marks["end_commit_s"] = service.stats.transactions, service.commit_s
            service.stop()

        task = asyncio.get_running_loop().create_task(measure())
        await service.run()
        await task

    try:
        asyncio.run(run())
    finally:
        for producer in producers:
            producer.join(total_s + SEARCH_WARMUP_S + 30)
            if producer.is_alive():
                producer.kill()
    inside = [r for r in fitted() if marks["start"] <= r[5] < marks["end"]]
    lags = [(r[5] - r[3]) / 1e9 for r in inside]
    p50, p99 = quantiles(lags) if lags else (float("nan"), float("nan"))
    # Where the lag goes: until the policy returned the decision (the window's way to the
    # service, and its turn), then until its record committed (the transactions).
    to_decided = quantiles([(r[4] - r[3]) / 1e9 for r in inside if r[4]] or [float("nan")])
    to_committed = quantiles([(r[5] - r[4]) / 1e9 for r in inside if r[4]] or [float("nan")])
    cpu = (marks["end_cpu"] - marks["start_cpu"]) / seconds
    transactions = marks["end_tx"] - marks["start_tx"]
    commit_ms = (marks["end_commit_s"] - marks["start_commit_s"]) * 1e3 / max(transactions, 1)
    sustained = bool(lags) and p99 < SEARCH_LAG_GOAL_S
    # Whether the searches decide in step: the decisions that follow a fit, by the window
    # that caused them (a burst of them waits for its fits, one after another on the loop).
    if inside:
        per_window = collections.Counter(r[3] for r in inside)
        slowest = max(inside, key=lambda r: r[5] - r[3])
        print(
            f"    in step: {len(per_window)} windows caused them, the largest 5 "
            f"{[n for _, n in per_window.most_common(5)]} decisions; the slowest decision's "
            f"window caused {per_window[slowest[3]]}",
            flush=True,
        )
    print(
        f"  {links:4d} links"
        + (f" beside {beside:,} settled GLOBECOM links" if beside else "")
        + f": {marks['searching']:.0f} in Bayesian optimisation at the first "
        f"fit; {len(inside) / seconds:5.1f} fits/s; lag window end -> decision committed p50 "
        f"{p50 * 1e3:6.1f} ms p99 {p99 * 1e3:6.1f} ms (to decided p50/p99 "
        f"{to_decided[0] * 1e3:.0f}/{to_decided[1] * 1e3:.0f} ms, then to committed "
        f"{to_committed[0] * 1e3:.0f}/{to_committed[1] * 1e3:.0f} ms; {transactions / seconds:.1f} "
        f"transactions/s of {commit_ms:.0f} ms on average); CPU {cpu:.2f} s/s "
        f"(service and fit processes); {'sustained' if sustained else 'NOT sustained'}",
        flush=True,
    )
    return sustained


def fit_alone(repeats: int = 9) -> float:
    """The reference: one P4BS step (fit, EI, suggestion) in this process, median s."""
    from p4bs_optimizer.policies.bayes import Observation, SearchSpec, plan

    times = []
    for seed in range(repeats):
        spec = SearchSpec(
            62_500,
            2_500_000,
            seed,
            tuple(Observation(b, -b / 2_500_000 - 0.05, 0.01) for b in (125_000, 625_000)),
            18_750,
            None,
        )
        began = time.perf_counter()
        plan(spec)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:])  # the first imports numpy and scipy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "parts", nargs="*", default=["capacity", "reaction", "searching", "decision"]
    )
    parser.add_argument("--links", default="100,300,1000")
    parser.add_argument("--search-links", default="50,100,200")
    parser.add_argument(
        "--beside", type=int, default=0, help="searching: settled GLOBECOM links beside"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured, per N")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--bootstrap", help="a running broker's, instead of one of its own")
    parser.add_argument("--json", type=Path, help="capacity: a JSON line per N, appended")
    parser.add_argument(
        "--workload",
        choices=sorted([*WORKLOADS, *(w + FEED for w in WORKLOADS)]),
        default="deciding",
        help="capacity's windows",
    )
    args = parser.parse_args()
    capacity_links = [int(x) for x in args.links.split(",")] * ("capacity" in args.parts)
    search_links = [int(x) for x in args.search_links.split(",")] * ("searching" in args.parts)
    steps = len(capacity_links) + len(search_links)
    steps += sum(part in args.parts for part in ("reaction", "decision"))
    # Each step starts a service and measures for about --seconds; the first guess of the
    # time left, until one has been timed.
    progress = Progress(steps, first_guess_s=args.seconds + 60)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"optimizer service benchmark ({os.cpu_count()} CPUs, load average {load})", flush=True)
    work = Path(tempfile.mkdtemp(prefix="p4bs-bench-optimizer-"))
    broker = None if args.bootstrap else KafkaBroker(work, *free_ports(2))
    ok = True
    try:
        if broker is not None:
            broker.start()
            wait_ready(broker, 90)
        bootstrap = args.bootstrap if broker is None else broker.bootstrap
        if "capacity" in args.parts:
            print(
                f"capacity, dry run (decided and recorded, not applied), GLOBECOM, 10 windows/s "
                f"per link, workload {args.workload} ("
                + (
                    "1 decision/s per link"
                    if args.workload.startswith("deciding")
                    else "no decisions"
                )
                + f"); goal {CAPACITY_GOAL_LINKS:,} links:"
            )
            results = {}
            for n in capacity_links:
                with progress.step(f"capacity: {n:,} links"):
                    figures: dict[str, Any] = {}
                    results[n] = bench_capacity(bootstrap, n, args.seconds, figures, args.workload)
                    if args.json:
                        with args.json.open("a") as out:
                            out.write(json.dumps(figures) + "\n")
            at_goal = results.get(CAPACITY_GOAL_LINKS)
            if at_goal is not None:
                print(
                    f"  {CAPACITY_GOAL_LINKS:,} links at 1 decision/s: "
                    f"{'sustained' if at_goal else 'NOT sustained'}"
                )
            ok = ok and all(results.values())
        if "reaction" in args.parts:
            print("reaction: traffic change -> new buffer in the router's kernel")
            with progress.step(f"reaction: {args.steps} steps"):
                ok = bench_reaction(bootstrap, args.steps, work) and ok
        if "searching" in args.parts:
            alone = fit_alone()
            print(
                "searching: P4BS searches (the authors' grid, fitted on the service's loop) "
                "starting together in one process, dry run; one step alone (fit, EI, "
                "suggestion) here: "
                f"{alone * 1e3:.0f} ms; goal {SEARCH_GOAL_LINKS} links, p99 < "
                f"{SEARCH_LAG_GOAL_S:g} s:"
            )
            for n in search_links:
                with progress.step(f"searching: {n} links"):
                    ok = bench_searching(bootstrap, n, args.seconds, args.beside) and ok
        if "decision" in args.parts:
            print("P4BS decision latency (the authors' grid, numpy GP), same run:")
            with progress.step(f"decision: {args.trials} trials"):
                from ax_decision import print_policy_decision

                print_policy_decision(args.trials)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
