"""A chaos run of the whole loop on the testbed: during one closed-loop run, each of the
exporter, one Kafka broker, a Flink TaskManager, an optimizer instance and the router agent
is killed with SIGKILL once, then started again. Afterwards it checks what an operator needs
to trust the loop through such faults, and reports what each one cost.

The run: a stack of its own (three KRaft nodes, three replicas with two in sync; a Flink
JobManager and two TaskManagers), a testbed, the closed loop with the metrics job on that
cluster and two optimizer instances in one group, long flows for the run's duration. The
faults come one at a time, `fault_every_s` apart from `first_fault_s` on; each part stays
down `down_s`.

The checks:
- every window of the undisturbed computation (the metrics job run bounded, afterwards, on
  the loop's topics into topics of its own) appears once in what the live job wrote (read
  committed), with the same values, up to the live job's event time at the end; the live
  job gets `CATCH_UP_S` after the traffic to write its last window;
- every decision once (no two for one link, queue and window);
- the router's buffer (sampled 50 times a second by the traffic run) never left the link's
  bounds;
- nothing is left behind: every process the run started has exited, and the testbed's
  namespaces are gone.

Per fault, reported: how long after the kill the next window and the next decision came,
how long until a window came as fast again as before the first fault, and how many windows
the live job did not write (the exporter's downtime is lost at its source; the undisturbed
computation has the same gap).

Found by it (streaming-jobs/README.md, "Event time comes from the interval records only"):
the metrics job dropped the applied decisions as late, and after the TaskManager's failover
the decisions' watermark could move event time past the interval records of the catch-up.
Both went with LinkMetrics v3 (the job no longer reads the decisions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import threading
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyflink.table import TableResult

from p4bs import paths
from p4bs.bus import RecordConsumer, ensure_topics, read_stream
from p4bs.config import FlowGroup, load_config
from p4bs.progress import bar, duration_text
from p4bs_infra import procs
from p4bs_infra.services import FlinkTaskManager
from p4bs_infra.stack import Stack, StackSettings
from p4bs_infra.testbed import Testbed
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_jobs.flink_env import flink_configuration
from p4bs_jobs.metrics import run_metrics_job
from p4bs_loop.closed_loop import ClosedLoop, own_testbed_plan

FAULTS = ("exporter", "broker", "taskmanager", "optimizer", "agent")
KAFKA_NODES = 3
# How long after the traffic the live job may take to write its last window: a failover's
# restart took up to 85 s here, and the catch-up after it some more.
CATCH_UP_S = 180.0
# The live job's watermark trails the newest record by this much (the config's default is
# 200 ms). The software data plane merges its two taps by time within 50 ms; under a chaos
# run's load it fell further behind (the kernel dropped frames from a full ring). An RTT
# sample older than an interval already closed is sent in a record of its own, stamped with
# its old interval, and whether that record is late for its window depended on when a
# watermark was emitted, which differs between the live job and the bounded reference job
# over the same records: windows' RTT samples differed (334 against 1096 in one run).
OUT_OF_ORDERNESS = "1s"


@dataclasses.dataclass(frozen=True)
class ChaosPlan:
    flows: int = 20
    duration_s: float = 150.0
    first_fault_s: float = 30.0
    fault_every_s: float = 20.0
    down_s: float = 5.0
    policy: str = "globecom"
    initial_buffer_ms: float = 100.0

    def __post_init__(self) -> None:
        last = self.first_fault_s + (len(FAULTS) - 1) * self.fault_every_s + self.down_s
        if last >= self.duration_s:
            raise ValueError(
                f"the last fault ends {last:.0f} s into the traffic: the run must be longer "
                f"than that (duration {self.duration_s:.0f} s)"
            )


@dataclasses.dataclass
class FaultTimes:
    part: str
    what: str = ""  # which process (pid, name)
    killed_ns: int = 0
    restarted_ns: int = 0


class Arrivals(threading.Thread):
    """Reads a topic of the loop (read committed) as it is written: each record with the
    wall-clock time it became readable."""

    def __init__(self, loop: ClosedLoop, stream: str) -> None:
        super().__init__(name=f"arrivals-{stream}", daemon=True)
        group = f"chaos-watch-{uuid.uuid4().hex[:6]}"
        self.consumer = RecordConsumer(loop.config.kafka, group, [stream], loop.topics)
        self.seen: list[tuple[int, dict[str, Any]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            received = self.consumer.poll(0.2)
            if received is not None:
                self.seen.append((time.time_ns(), received.record))

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        self.consumer.close()


def chaos_stack(state_dir: Path) -> Stack:
    """Three Kafka nodes and a Flink cluster of two TaskManagers, on free loopback ports."""
    return Stack(
        StackSettings.on_free_ports(
            state_dir,
            kafka_brokers=KAFKA_NODES,
            replication_factor=KAFKA_NODES,
            flink_taskmanagers=2,
        )
    )


# How long the JobManager's REST API may take to answer: busy after a Kafka node's fault, it
# once let a 10 s request time out (in CI, when the TaskManager to kill was looked up).
REST_TIMEOUT_S = 60.0


def _rest(stack: Stack, path: str) -> Any:
    assert stack.flink is not None
    with urllib.request.urlopen(f"{stack.flink.rest}{path}", timeout=REST_TIMEOUT_S) as reply:
        return json.loads(reply.read())


class Faults:
    """Kills and restarts each part, keeping when."""

    def __init__(self, stack: Stack, testbed: Testbed, loop: ClosedLoop) -> None:
        self.stack, self.testbed, self.loop = stack, testbed, loop
        self.times: list[FaultTimes] = []
        self.pids: set[int] = set()  # every process killed or started here

    def _taskmanager(self) -> FlinkTaskManager:
        """A TaskManager running the job (one with a slot taken)."""
        busy = {t["id"] for t in _rest(self.stack, "/taskmanagers")["taskmanagers"]
                if t["freeSlots"] < t["slotsNumber"]}  # fmt: skip
        managers = [s for s in self.stack.services if isinstance(s, FlinkTaskManager)]
        return next((tm for tm in managers if tm.name in busy), managers[0])

    def kill(self, part: str) -> FaultTimes:
        fault = FaultTimes(part)
        loop = self.loop
        if part == "exporter":
            assert loop.exporter is not None and loop.exporter.pid is not None
            fault.what = f"p4bs-exporter pid {loop.exporter.pid}"
            self.pids.add(loop.exporter.pid)
            fault.killed_ns = time.time_ns()
            loop.kill("exporter")
        elif part == "optimizer":
            name = loop.optimizers[0]
            fault.what = f"{name} pid {loop.processes[name].pid}"
            self.pids.add(loop.processes[name].pid)
            fault.killed_ns = time.time_ns()
            loop.kill(name)
        else:
            pid = self._pid(part)
            fault.what = f"{part} pid {pid}"
            self.pids.add(pid)
            fault.killed_ns = time.time_ns()
            os.kill(pid, signal.SIGKILL)
            procs.wait_until(lambda: not procs.alive(pid), 30)
        self.times.append(fault)
        return fault

    def _pid(self, part: str) -> int:
        if part == "broker":
            pid = self.stack.brokers[1].pid
        elif part == "taskmanager":
            pid = self._taskmanager().pid
        else:
            pid = procs.running_pid(self.testbed.agent_pidfile)
        if pid is None:
            raise RuntimeError(f"no running {part} to kill")
        return pid

    def _keep(self, pid: int | None) -> None:
        """A process started here, for the check that nothing is left."""
        if pid is not None:
            self.pids.add(pid)

    def restart(self, fault: FaultTimes) -> None:
        part, loop = fault.part, self.loop
        if part == "exporter":
            loop.restart("exporter")
            assert loop.exporter is not None
            self._keep(loop.exporter.pid)
        elif part == "optimizer":
            loop.restart(loop.optimizers[0])
            self._keep(loop.processes[loop.optimizers[0]].pid)
        elif part == "broker":
            self.stack.brokers[1].start()
            self._keep(self.stack.brokers[1].pid)
        elif part == "taskmanager":
            for tm in self.stack.services:
                if isinstance(tm, FlinkTaskManager) and tm.pid is None:
                    tm.start()
                    self._keep(tm.pid)
        else:
            self.testbed.restart_agent()
            self._keep(procs.running_pid(self.testbed.agent_pidfile))
        fault.restarted_ns = time.time_ns()


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of a metrics record are the same: floats to 1e-9 (relative; the
    live and the bounded job may sum in another order), anything else exactly."""
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def _window_key(window: dict[str, Any]) -> tuple[str, int]:
    return window["link_id"], window["window_start_ns"]


def compare_windows(
    live: list[dict[str, Any]], reference: list[dict[str, Any]], closed_until_ns: int
) -> dict[str, Any]:
    """The live job's windows against the undisturbed computation's, per link and window,
    up to `closed_until_ns` (the live job's event time at the end: it never closed the
    windows after it, which the bounded run closes at its input's end)."""
    reference = [w for w in reference if w["window_end_ns"] <= closed_until_ns]
    counts: dict[tuple[str, int], int] = {}
    for w in live:
        counts[_window_key(w)] = counts.get(_window_key(w), 0) + 1
    want = {_window_key(w): w for w in reference}
    got = {_window_key(w): w for w in live}
    differing = []
    for k in sorted(set(want) & set(got)):
        wrong = {f: (got[k][f], v) for f, v in want[k].items() if not same_value(got[k][f], v)}
        if wrong:
            differing.append({"window": list(k), "fields": wrong})
    return {
        "windows": len(want),
        "missing": sorted(set(want) - set(got)),
        "unexpected": sorted(set(got) - set(want)),
        "doubled": sorted(k for k, n in counts.items() if n > 1),
        "differing": differing,
    }


def _first_after_s(arrivals: list[int], killed_ns: int) -> float | None:
    """How long after the kill the first arrival came, s."""
    later = [t for t in arrivals if t > killed_ns]
    return round((min(later) - killed_ns) / 1e9, 1) if later else None


def fault_costs(
    faults: list[FaultTimes],
    windows: list[tuple[int, dict[str, Any]]],
    decisions: list[tuple[int, dict[str, Any]]],
    window_ns: int,
) -> list[dict[str, Any]]:
    """Per fault: how long after the kill the next window and the next decision came; when
    a window of a later time came as fast again as before the first fault (its latency at
    most twice the median before, plus 1 s); and how many windows ending between the kill
    and that recovery never came."""
    first_kill = min(f.killed_ns for f in faults)
    before = [arrived - w["window_end_ns"] for arrived, w in windows if arrived < first_kill]
    fast_ns = 2 * (statistics.median(before) if before else 0) + 1_000_000_000
    written = {w["window_end_ns"] for _, w in windows}
    costs = []
    for fault in faults:
        killed = fault.killed_ns
        recovered = min(
            (t for t, w in windows
             if t > killed and w["window_end_ns"] > killed
             and t - w["window_end_ns"] <= fast_ns),
            default=None,
        )  # fmt: skip
        until = recovered // window_ns * window_ns if recovered is not None else killed
        # Not past the last window written: after it the traffic, and the exporter, stopped.
        until = min(until, max(written, default=until))
        expected = range((killed // window_ns + 1) * window_ns, until + 1, window_ns)
        costs.append(
            {
                "part": fault.part,
                "what": fault.what,
                "down_s": round((fault.restarted_ns - killed) / 1e9, 1),
                "next_window_after_s": _first_after_s([t for t, _ in windows], killed),
                "next_decision_after_s": _first_after_s([t for t, _ in decisions], killed),
                "recovered_after_s": None
                if recovered is None
                else round((recovered - killed) / 1e9, 1),
                "windows_missing": sum(end not in written for end in expected),
            }
        )
    return costs


def leftovers(pids: set[int], testbed: Testbed) -> dict[str, Any]:
    """What of the run is still there: live processes among those it started, namespaces."""
    return {
        "processes": sorted(pid for pid in pids if procs.alive(pid)),
        "namespaces": sorted(n for n in Testbed._existing_namespaces()
                             if n.startswith(testbed.plan.name + "-")),
    }  # fmt: skip


def _reference_topics(loop: ClosedLoop) -> dict[str, str]:
    outputs = {s: f"{loop.topics[s]}.reference" for s in ("link_metrics", "sla_alerts")}
    return {**loop.topics, **outputs}


def submit_reference(loop: ClosedLoop, work_dir: Path) -> TableResult:
    """The metrics job, bounded, on the loop's input topics into topics of its own: the
    undisturbed computation over the records the live job had. Returns once it runs."""
    config = loop.config
    topics = _reference_topics(loop)
    outputs = {s: topics[s] for s in ("link_metrics", "sla_alerts")}
    ensure_topics(config.kafka, outputs, config.kafka.partitions, config.kafka.replication_factor)
    conf = flink_configuration(
        checkpoint_interval_ns=1_000_000_000, checkpoint_dir=work_dir / "reference-checkpoints"
    )
    group = f"chaos-reference-{uuid.uuid4().hex[:6]}"
    return run_metrics_job(config, topics, conf, group_id=group, bounded=True)


def reference_windows(loop: ClosedLoop, job: TableResult) -> list[dict[str, Any]]:
    """The windows of the submitted reference job, once it has read all its input."""
    job.wait(600_000)
    return read_stream(loop.config.kafka, "link_metrics", _reference_topics(loop))


def chaos_run(
    base_config: Path,
    work_dir: Path,
    plan: ChaosPlan,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One chaos run; returns (and writes to work_dir/report.json) its checks and costs."""
    config = load_config(base_config)
    link = config.links[0]
    stack = chaos_stack(work_dir / "stack")
    group = FlowGroup("cubic", plan.flows, "cubic", 0, None)
    testbed = Testbed(
        own_testbed_plan(config, work_dir / "testbed", "ch", [group], plan.initial_buffer_ms)
    )
    loop: ClosedLoop | None = None
    faults: Faults | None = None
    report: dict[str, Any] = {"plan": dataclasses.asdict(plan)}
    service_pids: set[int] = set()
    watchers: list[Arrivals] = []
    # The traffic, and later the undisturbed computation's start, beside the run's own steps.
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chaos")
    reference_job: Future[TableResult] | None = None
    try:
        progress("stack: 3 Kafka nodes, Flink JobManager + 2 TaskManagers")
        stack.up(timeout_s=240, progress=progress)
        service_pids |= {s.pid for s in stack.services if s.pid is not None}
        testbed.up()
        assert stack.flink is not None
        loop = ClosedLoop(
            tomllib.loads(base_config.read_text()),
            testbed,
            work_dir / "loop",
            bootstrap=stack.bootstrap,
            policy=plan.policy,
            sections={
                "kafka": {"replication_factor": KAFKA_NODES},
                "metrics": {"max_out_of_orderness": OUT_OF_ORDERNESS},
            },
            jobmanager=stack.flink.rest.removeprefix("http://"),
            optimizers=2,
        )
        loop.start(progress=progress)
        faults = Faults(stack, testbed, loop)
        windows, decisions = Arrivals(loop, "link_metrics"), Arrivals(loop, "buffer_decisions")
        watchers += [windows, decisions]
        windows.start()
        decisions.start()
        traffic = TrafficRun(testbed, work_dir / "traffic", Scenario(duration_s=plan.duration_s))
        began = time.monotonic()
        sending = background.submit(traffic.run, lambda _: None)
        for i, part in enumerate(FAULTS):
            at = plan.first_fault_s + i * plan.fault_every_s
            time.sleep(max(0.0, began + at - time.monotonic()))
            fault = faults.kill(part)
            progress(f"{_traffic_line(time.monotonic() - began, plan)}: killed {fault.what}")
            time.sleep(plan.down_s)
            faults.restart(fault)
            progress(f"{_traffic_line(time.monotonic() - began, plan)}: {part} started again")
        sending.result()  # raises what the traffic raised
        # The last windows: the exporter ends its interval, and the live job closes every
        # window its event time passes: it trails the newest record by the out-of-orderness.
        # A job still recovering from the last faults catches up first (reported apart).
        assert loop.exporter is not None
        loop.exporter.stop()
        traffic_end = time.monotonic()
        intervals = read_stream(loop.config.kafka, "link_counters", loop.topics)
        lag_ns = loop.config.metrics.max_out_of_orderness_ns
        closed_until = max(r["ts_ns"] for r in intervals) - lag_ns
        last_end = closed_until // loop.config.flink.window_ns * loop.config.flink.window_ns
        # Every input record is written now: the undisturbed computation is built and runs
        # while the live job catches up and the loop stops.
        progress("the undisturbed computation: the metrics job, bounded, on the same records")
        reference_job = background.submit(submit_reference, loop, work_dir)
        progress("waiting for the live job's last window")
        caught_up = procs.wait_until(
            lambda: any(w["window_end_ns"] >= last_end for _, w in windows.seen), CATCH_UP_S
        )
        report["last_window_after_s"] = (
            round(time.monotonic() - traffic_end, 1) if caught_up else None
        )
        windows.stop()
        decisions.stop()
        loop.stop()
        live = read_stream(loop.config.kafka, "link_metrics", loop.topics)
        reference = reference_windows(loop, reference_job.result())
        reference_job = None  # it has ended
        made = read_stream(loop.config.kafka, "buffer_decisions", loop.topics)
        per_window: dict[tuple[Any, ...], int] = {}
        for d in made:
            k = (d["link_id"], d["queue"], d["window_end_ns"])
            per_window[k] = per_window.get(k, 0) + 1
        limits = sorted({q["limit_bytes"] for q in _qdisc(work_dir / "traffic")})
        report |= {
            "windows": compare_windows(live, reference, closed_until),
            "decisions": {
                "count": len(made),
                "doubled": sorted(list(k) for k, n in per_window.items() if n > 1),
            },
            "router": {
                "limits_bytes": limits,
                "bounds_bytes": [link.min_buffer_bytes, link.max_buffer_bytes],
                "within": all(link.min_buffer_bytes <= x <= link.max_buffer_bytes for x in limits),
            },
            "faults": fault_costs(
                faults.times, windows.seen, decisions.seen, loop.config.flink.window_ns
            ),
            # What the costs are computed from: each window's end and the time it became
            # readable, each decision's arrival.
            "arrivals": {
                "windows": [[w["window_end_ns"], t] for t, w in windows.seen],
                "decisions": [t for t, _ in decisions.seen],
                "faults": [dataclasses.asdict(f) for f in faults.times],
            },
        }
    finally:
        # A run that raised still closes its readers: left polling, they outlived the test
        # and their consumers kept the pytest process from exiting (seen in CI).
        for watcher in watchers:
            if not watcher.stopping.is_set():
                watcher.stop()
        if loop is not None:
            loop.stop()
        background.shutdown()
        if reference_job is not None and reference_job.exception() is None:
            # A run that raised meanwhile leaves it reading Kafka, retrying after the stack is
            # down until its wait gives up, 10 min later.
            with contextlib.suppress(Exception):  # it ended by itself
                reference_job.result().get_job_client().cancel().result()
        testbed.down()
        stack.down()
    pids = service_pids | (faults.pids if faults is not None else set())
    if loop is not None:
        pids |= {p.pid for p in loop.processes.values()}
    report["leftovers"] = leftovers(pids, testbed)
    (work_dir / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


def _traffic_line(elapsed_s: float, plan: ChaosPlan) -> str:
    """Where the traffic is: a bar, the seconds in, and the traffic's time left."""
    left = max(0.0, plan.duration_s - elapsed_s)
    return (
        f"{bar(elapsed_s / plan.duration_s)} {elapsed_s:5.0f} s of {plan.duration_s:.0f} "
        f"(about {duration_text(left)} of traffic left)"
    )


def _qdisc(traffic_dir: Path) -> list[dict[str, Any]]:
    path = traffic_dir / "qdisc.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def failed_checks(report: dict[str, Any]) -> list[str]:
    """The checks a chaos run's report fails, each with what was wrong. How fast the loop
    came back after each fault is reported, not checked: a job that never came back has
    windows missing."""
    failed = []
    windows = report["windows"]
    for what in ("missing", "unexpected", "doubled", "differing"):
        if windows[what]:
            failed.append(f"windows {what}: {len(windows[what])} (first {windows[what][0]})")
    if report["decisions"]["doubled"]:
        failed.append(f"decisions doubled: {report['decisions']['doubled'][:3]}")
    router = report["router"]
    if not router["within"]:
        failed.append(f"router buffer {router['limits_bytes']} left {router['bounds_bytes']}")
    for what, left in report["leftovers"].items():
        if left:
            failed.append(f"left behind: {what} {left}")
    return failed


def summary(report: dict[str, Any]) -> str:
    """The report as an operator reads it: the checks, then a line per fault."""
    windows = report["windows"]
    lines = [
        f"windows: {windows['windows']} in the undisturbed computation; live: "
        f"{len(windows['missing'])} missing, {len(windows['doubled'])} doubled, "
        f"{len(windows['differing'])} differing; the last "
        + (
            f"{report['last_window_after_s']:.1f} s after the traffic"
            if report["last_window_after_s"] is not None
            else f"not written within {CATCH_UP_S:.0f} s of the traffic's end"
        ),
        f"decisions: {report['decisions']['count']}, {len(report['decisions']['doubled'])} doubled",
        f"router buffer: {report['router']['limits_bytes']} B, bounds "
        f"{report['router']['bounds_bytes']} B",
        "fault         down  next window  next decision  recovered after  windows missing",
    ]
    for f in report["faults"]:
        gaps = [
            "-" if f[k] is None else f"{f[k]:.1f} s"
            for k in ("next_window_after_s", "next_decision_after_s", "recovered_after_s")
        ]
        lines.append(
            f"{f['part']:<12} {f['down_s']:4.1f} s  {gaps[0]:>11}  {gaps[1]:>13}  "
            f"{gaps[2]:>15}  {f['windows_missing']:>15}"
        )
    failed = failed_checks(report)
    lines.append("all checks passed" if not failed else "FAILED: " + "; ".join(failed))
    return "\n".join(lines)


def default_out() -> Path:
    return paths.home() / ".run" / "chaos" / time.strftime("%Y%m%d-%H%M%S")
