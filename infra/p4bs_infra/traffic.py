"""Running traffic through the testbed and recording the ground truth of a scenario.

`TrafficRun(testbed, run_dir, scenario).run()` starts the recorders (the router's FIFO at
`qdisc_hz` over netlink, the senders' per-flow TCP state with `ss` at `ss_hz`, a ping probe
at `ping_hz` whose first `idle_pings` samples precede all traffic), the long-flow
groups (trafficgen's bulk flows, each group from its own address with its congestion
control, connected before the traffic starts, sending from its start time and, with a stop
time, reset then: a group joins and leaves on schedule whatever the queue),
optional short flows (Poisson arrivals, at a rate that may change at given times; FCT per
flow) and an optional VoIP-like UDP stream, waits for the scenario's duration, stops
everything it started and writes
`summary.json` next to the raw files:

    qdisc.jsonl  ss.jsonl  ping.jsonl  bulk-<group>-<k>[-client].jsonl  fct.jsonl  voip-*.jsonl
    delay-wire.json  summary.json  [tap-before.pcap  tap-after.pcap]  [aqm.jsonl]

With an AQM (the testbed plan's `aqm`) the bottleneck is the delay wire's queue: its samples
over the run are in aqm.jsonl, and the summary's router figures describe that queue.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from p4bs_infra import procs
from p4bs_infra.testbed import SENDER_NET, SenderGroup, Testbed, TestbedError, in_ns
from p4bs_infra.trafficgen import LOG_UNIFORM

BULK_BASE_PORT = 5201
# Flows per bulk client: one process's event loop feeds at most this many.
BULK_MAX_FLOWS = 100
# How long the bulk clients may take to connect their flows before the traffic starts (a
# Python start on a loaded machine, then one RTT of the idle link: ~1 s).
BULK_CONNECT_S = 30.0
# The traffic starts this long after the go file is written: the clients poll it every 10 ms.
BULK_GO_LEAD_S = 0.2
FCT_PORT = 8080
VOIP_PORT = 4000
SHORT_FLOW_SOURCE = f"{SENDER_NET}.2"


@dataclass
class ShortFlows:
    rate_per_s: float = 5.0
    min_size_bytes: int = 15_000
    max_size_bytes: int = 2_500_000
    # "log-uniform" between the bounds, or a flow-size CDF of trafficgen.SIZE_CDFS
    # ("websearch"), which has bounds of its own.
    sizes: str = LOG_UNIFORM


@dataclass
class Voip:
    pps: float = 50.0
    size_bytes: int = 172


@dataclass
class Scenario:
    duration_s: float
    long_flows: bool = True
    short_flows: ShortFlows | None = None
    voip: Voip | None = None
    qdisc_hz: float = 50.0
    ss_hz: float = 5.0
    ping_hz: float = 10.0
    idle_pings: int = 10  # probe samples taken before any traffic: the idle RTT
    warmup_s: float = 0.0  # left out of summary.json (slow start, the queue filling)
    # Capture both taps to tap-before.pcap / tap-after.pcap (ns timestamps), keeping this many
    # bytes of each frame; None: no capture.
    capture_snaplen: int | None = None
    # After the long flows end, the probe and the captures go on this long: closing
    # handshakes and the data plane's idle timeouts land in the captures too.
    tail_s: float = 0.0
    # The short flows' arrivals and sizes: runs with one seed get the same ones.
    seed: int = 1
    # When a long-flow group's senders stop (by group name), s after the traffic starts;
    # a group not listed sends to the end.
    stops_s: dict[str, float] = field(default_factory=dict)
    # (from_s, flows per second): the short flows' rate from then on (0 pauses them).
    short_flow_rate_changes: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class LongFlowBatch:
    """One bulk client: up to BULK_MAX_FLOWS of a group's flows, to a server on a port of its
    own, sending from `start_s` to `stop_s` after the traffic starts."""

    name: str
    port: int
    group: SenderGroup
    flows: int
    start_s: float
    stop_s: float


def long_flow_schedule(
    groups: list[SenderGroup], duration_s: float, stops_s: dict[str, float]
) -> list[LongFlowBatch]:
    """Every group's batches in the order they start; a group sends from its start to its
    stop (the traffic's end if it has none or a later one)."""
    batches = []
    port = BULK_BASE_PORT
    for group in groups:
        remaining, k = group.flows, 0
        stop_s = min(stops_s.get(group.name, duration_s), duration_s)
        while remaining > 0:
            flows = min(remaining, BULK_MAX_FLOWS)
            batches.append(
                LongFlowBatch(f"{group.name}-{k}", port, group, flows, group.start_ns / 1e9, stop_s)
            )
            remaining -= flows
            port += 1
            k += 1
    return sorted(batches, key=lambda b: b.start_s)


@dataclass
class _Started:
    name: str
    pidfile: Path
    waits: bool = False  # ends by itself (a client); the rest is stopped at the end


@dataclass
class TrafficRun:
    testbed: Testbed
    run_dir: Path
    scenario: Scenario
    _started: list[_Started] = field(default_factory=list)

    def _start(self, role: str, name: str, argv: list[str], waits: bool = False) -> None:
        pidfile = self.run_dir / "pids" / f"{name}.pid"
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        procs.start_detached(
            in_ns(self.testbed.ns[role], *argv), pidfile, self.run_dir / "logs" / f"{name}.log"
        )
        self._started.append(_Started(name, pidfile, waits))

    def _tool(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "p4bs_infra.trafficgen", *args]

    def _wait_listening(self, port: int, udp: bool = False) -> None:
        flag = "-Hlun" if udp else "-Hltn"

        def listening() -> bool:
            out = subprocess.run(
                in_ns(self.testbed.ns["rcv"], "ss", flag, f"sport = :{port}"),
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            return bool(out.strip())

        if not procs.wait_until(listening, 15):
            raise TestbedError(f"nothing listens on receiver port {port}; see {self.run_dir}/logs")

    def run(self, progress: Callable[[str], None] = print) -> dict[str, Any]:
        """Runs the scenario to its end; always stops what it started."""
        s, p = self.scenario, self.testbed.plan
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise TestbedError(f"run directory {self.run_dir} is not empty")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "scenario.json").write_text(json.dumps(asdict(s), indent=2))
        recording_from_ns = time.time_ns()
        try:
            self._start(
                "rtr",
                "qdisc-log",
                self._tool(
                    "qdisc-log",
                    "--dev",
                    p.egress,
                    "--hz",
                    str(s.qdisc_hz),
                    "--out",
                    str(self.run_dir / "qdisc.jsonl"),
                ),
            )
            self._start(
                "snd",
                "ss-log",
                self._tool(
                    "ss-log",
                    "--dst",
                    p.receiver,
                    "--hz",
                    str(s.ss_hz),
                    "--out",
                    str(self.run_dir / "ss.jsonl"),
                ),
            )
            probe = self.run_dir / "ping.jsonl"
            self._start(
                "snd",
                "ping-log",
                self._tool(
                    "ping-log", "--dst", p.receiver, "--hz", str(s.ping_hz), "--out", str(probe)
                ),
            )
            if s.capture_snaplen is not None:
                self._start_captures(s.capture_snaplen)
            batches = long_flow_schedule(p.groups, s.duration_s, s.stops_s) if s.long_flows else []
            for batch in batches:
                self._start(
                    "rcv",
                    f"bulk-server-{batch.name}",
                    self._tool(
                        "bulk-server",
                        "--port",
                        str(batch.port),
                        "--out",
                        str(self.run_dir / f"bulk-{batch.name}.jsonl"),
                    ),
                )
            if s.short_flows:
                self._start("rcv", "fct-server", self._tool("fct-server", "--port", str(FCT_PORT)))
            if s.voip:
                self._start(
                    "rcv",
                    "voip-recv",
                    self._tool(
                        "voip-recv",
                        "--port",
                        str(VOIP_PORT),
                        "--out",
                        str(self.run_dir / "voip-recv.jsonl"),
                    ),
                )
            for batch in batches:
                self._wait_listening(batch.port)
            if s.short_flows:
                self._wait_listening(FCT_PORT)
            if s.voip:
                self._wait_listening(VOIP_PORT, udp=True)
            if not procs.wait_until(
                lambda: _count_lines(probe) >= s.idle_pings, 10 + s.idle_pings / s.ping_hz
            ):
                raise TestbedError(f"the ping probe got no idle samples; see {self.run_dir}/logs")

            go = self._start_bulk_clients(batches, progress)
            start_ns = time.time_ns() + round(BULK_GO_LEAD_S * 1e9)
            go.with_suffix(".tmp").write_text(str(start_ns))
            go.with_suffix(".tmp").rename(go)  # whole when a client reads it
            time.sleep(max(0.0, (start_ns - time.time_ns()) / 1e9))  # the traffic's start
            began = time.monotonic()
            self._write_timeline(start_ns)
            self._start_side_traffic(began)
            self._wait_clients(began + s.duration_s + 30)
            time.sleep(s.tail_s)  # the scenario's own schedule
        finally:
            for started in reversed(self._started):
                procs.stop(started.pidfile, timeout_s=5)
            if self.testbed.wire_stats.exists():
                shutil.copy(self.testbed.wire_stats, self.run_dir / "delay-wire.json")
            if p.aqm is not None:
                _copy_samples(
                    self.testbed.aqm_log,
                    self.run_dir / "aqm.jsonl",
                    recording_from_ns,
                    time.time_ns(),
                )
        summary = summarise(self.run_dir, p.rate_bps)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _start_captures(self, snaplen: int) -> None:
        """tcpdump on both taps, armed before any traffic; stopped (and flushed) at the end."""
        p = self.testbed.plan
        for side, interface in (("before", p.tap_before), ("after", p.tap_after)):
            name = f"capture-{side}"
            argv = [
                "tcpdump", "-n", "-q", "-i", interface, "-s", str(snaplen), "-B", "32768",
                "--time-stamp-precision=nano", "-w", str(self.run_dir / f"tap-{side}.pcap"),
            ]  # fmt: skip
            self._start("tap", name, argv)
            log = self.run_dir / "logs" / f"{name}.log"
            if not procs.wait_until(partial(_says, log, "listening on"), 15):
                raise TestbedError(f"tcpdump on {interface} did not start: {procs.log_tail(log)}")

    def _start_bulk_clients(
        self, batches: list[LongFlowBatch], progress: Callable[[str], None]
    ) -> Path:
        """Every group's clients, each told its start and stop: they connect now, then send
        on schedule from the traffic's start, which the returned go file is to give. Returns
        once all are connected (TestbedError if one is not within BULK_CONNECT_S)."""
        s, p = self.scenario, self.testbed.plan
        go = self.run_dir / "bulk-go"
        outs = []
        for batch in batches:
            group = batch.group
            if batch.start_s >= min(s.duration_s, batch.stop_s):
                progress(f"group {group.name} starts after its stop or the end: skipped")
                continue
            progress(
                f"{batch.flows} {group.cca} flows of group {group.name}: "
                f"{batch.start_s:g}-{batch.stop_s:g} s"
            )
            out = self.run_dir / f"bulk-{batch.name}-client.jsonl"
            self._start(
                "snd",
                f"bulk-{batch.name}",
                self._tool(
                    "bulk-client",
                    "--server",
                    p.receiver,
                    "--port",
                    str(batch.port),
                    "--bind",
                    group.address,
                    "--flows",
                    str(batch.flows),
                    "--cca",
                    group.cca,
                    "--go",
                    str(go),
                    "--start",
                    str(batch.start_s),
                    "--stop",
                    str(batch.stop_s),
                    "--out",
                    str(out),
                ),
                waits=True,
            )
            outs.append(out)
        if not procs.wait_until(lambda: all(_count_lines(o) >= 1 for o in outs), BULK_CONNECT_S):
            late = [out.name for out in outs if _count_lines(out) < 1]
            raise TestbedError(f"bulk clients not connected in {BULK_CONNECT_S:g} s: {late}")
        for out in outs:
            if "error" in (record := json.loads(out.read_text().splitlines()[0])):
                raise TestbedError(f"{out.name}: {record['error']}")
        return go

    def _write_timeline(self, start_ns: int) -> None:
        s = self.scenario
        timeline = {
            "traffic_start_ns": start_ns,
            "steady_from_ns": start_ns + round(s.warmup_s * 1e9),
            "end_ns": start_ns + round(s.duration_s * 1e9),
        }
        (self.run_dir / "timeline.json").write_text(json.dumps(timeline, indent=2) + "\n")

    def _start_side_traffic(self, began: float) -> None:
        s, p = self.scenario, self.testbed.plan
        if s.short_flows:
            self._start(
                "snd",
                "fct-client",
                self._tool(
                    "fct-client",
                    "--server",
                    p.receiver,
                    "--port",
                    str(FCT_PORT),
                    "--bind",
                    SHORT_FLOW_SOURCE,
                    "--rate",
                    str(s.short_flows.rate_per_s),
                    "--min-size",
                    str(s.short_flows.min_size_bytes),
                    "--max-size",
                    str(s.short_flows.max_size_bytes),
                    "--duration",
                    str(s.duration_s),
                    "--seed",
                    str(s.seed),
                    "--sizes",
                    s.short_flows.sizes,
                    "--rate-changes",
                    ",".join(f"{t:g}:{rate:g}" for t, rate in s.short_flow_rate_changes),
                    "--out",
                    str(self.run_dir / "fct.jsonl"),
                ),
                waits=True,
            )
        if s.voip:
            self._start(
                "snd",
                "voip-send",
                self._tool(
                    "voip-send",
                    "--dst",
                    p.receiver,
                    "--port",
                    str(VOIP_PORT),
                    "--bind",
                    SHORT_FLOW_SOURCE,
                    "--pps",
                    str(s.voip.pps),
                    "--size",
                    str(s.voip.size_bytes),
                    "--duration",
                    str(s.duration_s),
                    "--out",
                    str(self.run_dir / "voip-send.jsonl"),
                ),
                waits=True,
            )

    def _wait_clients(self, deadline: float) -> None:
        clients = [c for c in self._started if c.waits]

        def finished() -> bool:
            return all(procs.running_pid(c.pidfile) is None for c in clients)

        procs.wait_until(finished, max(0.0, deadline - time.monotonic()), 0.2)


def _says(log: Path, text: str) -> bool:
    return text in log.read_text()


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _copy_samples(source: Path, target: Path, from_ns: int, to_ns: int) -> None:
    """The JSON lines of `source` stamped in [from_ns, to_ns]: the run's share of a log the
    wire keeps for the testbed's lifetime."""
    rows = [r for r in _jsonl(source) if from_ns <= r["ts_ns"] <= to_ns]
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` by nearest rank (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def jain_index(values: list[float]) -> float | None:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all are equal."""
    if not values or not any(values):
        return None
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def _router_figures(qdisc: list[dict[str, Any]], rate_bps: int) -> dict[str, Any] | None:
    """The bottleneck's figures from its FIFOs' samples: throughput and drops summed over
    the queues, the backlog of all of them at each sample, and each queue's own figures
    ("queues", by tc handle "major:"). `limit_bytes` are the first queue's (q0, the lowest
    handle), which the single-queue policies size. A queue made during the run (a flow
    class) counts from its first sample, when it had sent nothing yet."""
    by_handle: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for q in qdisc:
        by_handle[q["handle"]].append(q)
    timestamps = sorted({q["ts_ns"] for q in qdisc})
    if len(timestamps) < 2:
        return None
    seconds = (timestamps[-1] - timestamps[0]) / 1e9
    backlog_at: dict[int, int] = defaultdict(int)
    for q in qdisc:
        backlog_at[q["ts_ns"]] += q["backlog_bytes"]
    queues = {}
    for handle, samples in sorted(by_handle.items()):
        first, last = samples[0], samples[-1]
        queues[f"{handle >> 16:x}:"] = {
            "throughput_bps": (last["sent_bytes"] - first["sent_bytes"]) * 8 / seconds,
            "drops": last["drops"] - first["drops"],
            "backlog_mean_bytes": statistics.fmean(q["backlog_bytes"] for q in samples),
            "limit_bytes": sorted({q["limit_bytes"] for q in samples}),
        }
    backlog = list(backlog_at.values())
    return {
        "samples": len(timestamps),
        "sample_hz": (len(timestamps) - 1) / seconds if seconds else None,
        "throughput_bps": sum(q["throughput_bps"] for q in queues.values()),
        "drops": sum(q["drops"] for q in queues.values()),
        "backlog_mean_bytes": statistics.fmean(backlog),
        "queue_delay_mean_ns": statistics.fmean(backlog) * 8e9 / rate_bps,
        "limit_bytes": next(iter(queues.values()))["limit_bytes"],
        "queues": queues,
    }


def _aqm_figures(
    aqm: list[dict[str, Any]], qdisc: list[dict[str, Any]], rate_bps: int
) -> dict[str, Any] | None:
    """The router figures of a run whose bottleneck is the wire's AQM queue, from its samples
    (the shape of the FIFO's, the queue named "aqm"), plus its drops split into the AQM's and
    the byte limit's, its mean sojourn, and the router FIFO in front ("router_fifo", which
    should hold nothing: its htb runs above line rate)."""
    router = _router_figures(aqm, rate_bps)
    if router is None:  # fewer than two samples
        return None
    first, last = aqm[0], aqm[-1]
    sent = last["sent_packets"] - first["sent_packets"]
    router["queues"] = {"aqm": router["queues"].pop("0:")}
    router["aqm"] = {
        "kind": last["kind"],
        "aqm_drops": last["aqm_drops"] - first["aqm_drops"],
        "overflow_drops": last["overflow_drops"] - first["overflow_drops"],
        "sojourn_mean_ns": (last["sojourn_sum_ns"] - first["sojourn_sum_ns"]) / sent
        if sent
        else None,
    }
    fifo = _router_figures(qdisc, rate_bps)
    if fifo:
        router["router_fifo"] = {
            "drops": fifo["drops"],
            "backlog_mean_bytes": fifo["backlog_mean_bytes"],
            "backlog_max_bytes": max(q["backlog_bytes"] for q in qdisc),
        }
    return router


def summarise(run_dir: Path, rate_bps: int) -> dict[str, Any]:
    """The scenario's steady-state figures from its raw files: what tests and reports read.

    Time series (router, ss, VoIP) count from the end of the warm-up on; the bulk flows', FCT
    and delay wire figures cover the whole run.
    """
    timeline = json.loads((run_dir / "timeline.json").read_text())
    steady = timeline["steady_from_ns"]
    out: dict[str, Any] = {"timeline": timeline}
    qdisc = [q for q in _jsonl(run_dir / "qdisc.jsonl") if q["ts_ns"] >= steady]
    # An AQM run's bottleneck is the wire's queue: without its samples, no router figures
    # (the router's FIFO, in front of it, is not the bottleneck).
    if (run_dir / "aqm.jsonl").exists():
        aqm = [q for q in _jsonl(run_dir / "aqm.jsonl") if q["ts_ns"] >= steady]
        router = _aqm_figures(aqm, qdisc, rate_bps)
    else:
        router = _router_figures(qdisc, rate_bps)
    if router:
        out["router"] = router
    ss = [r for r in _jsonl(run_dir / "ss.jsonl") if r["ts_ns"] >= steady]
    # A long flow is one that moved data (the short flows have a port of their own).
    bulk = {(r["src"], r["sport"]) for r in ss if r.get("bytes_acked", 0) >= 1_000_000}
    long_flows: dict[tuple[str, int], list[int]] = defaultdict(list)
    min_rtt: dict[tuple[str, int], int] = {}
    retrans: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in ss:
        if r.get("rtt_ns") and (r["src"], r["sport"]) in bulk and r["dport"] < FCT_PORT:
            flow = (r["src"], r["sport"])
            long_flows[flow].append(r["rtt_ns"])
            retrans[flow].append(r["retrans"])
            if "minrtt_ns" in r:
                min_rtt[flow] = r["minrtt_ns"]
    if long_flows:
        per_flow = [statistics.fmean(v) for v in long_flows.values()]
        out["long_flows"] = {
            "flows_seen": len(per_flow),
            "rtt_mean_ns": statistics.fmean(per_flow),
            "rtt_p50_ns": percentile([x for v in long_flows.values() for x in v], 0.5),
            # The lowest RTT each flow ever saw: its propagation delay, the "base RTT".
            "min_rtt_mean_ns": statistics.fmean(min_rtt.values()) if min_rtt else None,
            "retransmissions": sum(v[-1] - v[0] for v in retrans.values()),
        }
    probe = _jsonl(run_dir / "ping.jsonl")
    idle = [r["rtt_ns"] for r in probe if r["ts_ns"] < timeline["traffic_start_ns"]]
    loaded = [r["rtt_ns"] for r in probe if steady <= r["ts_ns"] <= timeline["end_ns"]]
    if idle and loaded:
        out["probe"] = {
            "idle_rtt_ns": statistics.median(idle),
            "loaded_rtt_mean_ns": statistics.fmean(loaded),
            "loaded_rtt_p50_ns": statistics.median(loaded),
            "loaded_samples": len(loaded),
        }
    streams: list[float] = []
    groups: dict[str, float | str] = {}
    for path in sorted(run_dir.glob("bulk-*-client.jsonl")):
        batch = path.name.removeprefix("bulk-").removesuffix("-client.jsonl")
        client = _jsonl(path)
        if failed := [r["error"] for r in client if "error" in r]:
            groups[batch] = f"error: {failed[0]}"
            continue
        flows = [f for f in _jsonl(run_dir / f"bulk-{batch}.jsonl") if f.get("bytes")]
        if not flows:
            continue
        span_ns = max(f["last_ns"] for f in flows) - min(f["first_ns"] for f in flows)
        groups[batch] = sum(f["bytes"] for f in flows) * 8e9 / max(span_ns, 1)
        streams += [f["bytes"] * 8e9 / max(f["last_ns"] - f["first_ns"], 1) for f in flows]
    if groups:
        out["bulk"] = {"groups_bps": groups, "streams": len(streams), "jain": jain_index(streams)}
    fct = _jsonl(run_dir / "fct.jsonl")
    if fct:
        ok = [f["fct_ns"] for f in fct if f.get("ok")]
        out["short_flows"] = {
            "flows": len(fct),
            "completed": len(ok),
            "fct_p50_ns": percentile(ok, 0.5),
            "fct_p90_ns": percentile(ok, 0.9),
            "fct_p99_ns": percentile(ok, 0.99),
        }
    sent = _jsonl(run_dir / "voip-send.jsonl")
    if sent:
        # The sender keeps an absolute schedule: sequence numbers tell what was due when.
        stream = sent[-1]
        first = max(0, math.ceil((steady - stream["start_ns"]) * stream["pps"] / 1e9))
        received = [r for r in _jsonl(run_dir / "voip-recv.jsonl") if r["seq"] >= first]
        delays = [r["recv_ns"] - r["send_ns"] for r in sorted(received, key=lambda r: r["seq"])]
        jitter = 0.0
        for a, b in itertools.pairwise(delays):  # RFC 3550 interarrival jitter
            jitter += (abs(b - a) - jitter) / 16
        total = stream["sent"] - first
        out["voip"] = {
            "sent": total,
            "received": len(received),
            "loss": 1 - len(received) / total if total else None,
            "delay_p50_ns": percentile(delays, 0.5),
            "delay_p99_ns": percentile(delays, 0.99),
            "jitter_ns": jitter,
        }
    wire = run_dir / "delay-wire.json"
    if wire.exists():
        out["delay_wire"] = json.loads(wire.read_text())["directions"]
    return out
