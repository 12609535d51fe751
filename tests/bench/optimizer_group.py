"""Benchmark: many links on several optimizer processes of one group, and how soon a killed
process's links are decided again.

    .venv/bin/python tests/bench/optimizer_group.py [--links 10000] [--instances 4]
        [--seconds 30] [--switch-every 1] [--no-kill]

Issue 19's targets: 10,000 links on 4 instances, GLOBECOM, one decision per link per second,
window-to-decision lag p99 < 250 ms; a killed instance's links decided again within 10 s.
Issue 41's: the same on 2 instances, the links settled as a network's are (`--switch-every
10`: a link decides once in 10 s, a tenth of them each second).

A Kafka broker of its own on free ports (the stack's settings: transactions checked for
timeouts every second), topics of 2 partitions per instance. `--instances` `p4bs optimizer
run --dry-run` processes of one group share the links (decisions recorded, nothing
applied). A producer process emits each link's 100 ms windows as they end and as the metrics
job's optimizer feed ([metrics] optimizer_feed, its defaults) holds them: the link's SRTT
alternates between 20 and 30 ms every `--switch-every` seconds (each link at its own phase),
so that GLOBECOM decides on each switch, and the feed holds those windows and the link's
heartbeat, once a second at the link's own offset in the second. The windows start once
the group is stable with every instance holding partitions. The lag of a decision is from
the end of the window it was made on (`window_end_ns`) to its record arriving, committed,
at a read-committed consumer in this process (fetch wait 10 ms), over `--seconds` after a
warm-up, and apart, to when it was made (the record's `ts_ns`); decisions/s against the
links/s offered. Then (unless `--no-kill`) the first instance is killed (SIGKILL), and
every link's SRTT switches in the window ending a second later, so that every link must be
decided again: for each of the killed instance's links, the time from the kill to its first
decision by another instance; the largest is the handover time, and apart, when their
partitions were given to the others (their logs). The reference, measured first in the
same run: the floor of any lag, a record produced to the broker and read back committed by
the same kind of consumer (p50/p99 of 200).

Also: each instance's CPU over the measured span (all its threads, from /proc), per 1,000
of the links it held, and beside it the broker's, the window producer's and this process's
(the cores all share); over the whole run, the policy's decisions made twice (two records on
one link's window), those whose buffer is not the one the window calls for (GLOBECOM on the
window's SRTT, computed here by the policy itself: a replay after the kill that decided
from a wrong state would show), the guards' decisions apart (a link whose windows came
late falls back to its safe buffer, then resumes; those once the windows stop at the end
left out), and the windows the instances passed
over as replays (covered by a saved state, from their last progress lines).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for manylinks
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for optimizer_service

from benchkit import quantiles
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from manylinks import many_links_config
from optimizer_service import SRTTS_NS, WindowTemplate, produce_windows, variant_of
from simlink import WINDOW_NS

from p4bs import paths
from p4bs.bus import RecordConsumer, RecordProducer, ensure_topics
from p4bs.config import load_config
from p4bs.progress import Progress
from p4bs_infra.procs import free_ports, wait_until
from p4bs_infra.services import KafkaBroker, wait_ready
from p4bs_optimizer.policies.base import Window
from p4bs_optimizer.policies.globecom import GlobecomPolicy
from p4bs_schemas.registry import STREAMS

LAG_GOAL_S = 0.25
HANDOVER_GOAL_S = 10.0
WARMUP_S = 20.0
GROUP_TIMEOUT_S = 120.0
SECOND_NS = 1_000_000_000
PROGRESS_EVERY_NS = 5 * SECOND_NS
GUARD_PHASES = ("fallback", "resume")  # the safe buffer when metrics stop, and the return


def round_trips(bootstrap: str, topics: dict[str, str], count: int = 200) -> list[float]:
    """Seconds from producing a decision record to reading it back committed."""
    consumer = RecordConsumer(
        bootstrap,
        f"bench-floor-{uuid.uuid4().hex[:6]}",
        ["buffer_decisions"],
        topics,  # still empty: read from its start
        settings={"fetch.wait.max.ms": 10},
    )
    producer = RecordProducer(bootstrap, topics, client_id="bench-floor")
    while not consumer.assigned():
        consumer.poll(0.1)
    times = []
    for i in range(count):
        sent = time.time_ns()
        producer.produce("buffer_decisions", _decision(i, sent))
        producer.flush(10)
        if consumer.poll(10.0) is None:
            raise RuntimeError("a record produced was not read back within 10 s")
        times.append((time.time_ns() - sent) / 1e9)
    consumer.close()
    return times


def cpu_seconds(pid: int) -> float:
    """A process's CPU so far, all its threads (utime + stime in /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_formed(bootstrap: str, group: str, instances: list[str]) -> bool:
    """Whether the group is stable with a member of each instance, each holding partitions:
    the windows start then, so that the warm-up does not hold the group's forming (seconds,
    twice as long in some runs)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        described = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
    except KafkaException:
        return False  # not there yet
    holders = {m.client_id for m in described.members if m.assignment.topic_partitions}
    return described.state == ConsumerGroupState.STABLE and holders == set(instances)


def buffers_called_for() -> list[int]:
    """The buffer GLOBECOM decides on a benchmark window at each of SRTTS_NS (every link is
    the example's link, with the same windows but for the SRTT)."""
    link = load_config(paths.example_config()).links[0]
    buffers = []
    for srtt_ns in SRTTS_NS:
        record = WindowTemplate(link, srtt_ns, 10 * SECOND_NS).record
        (decision,) = GlobecomPolicy(link, {}).decide(Window.from_record(record, None))
        buffers.append(decision.buffer_bytes)
    return buffers


GIVEN = re.compile(
    r"^(\S+ \S+) INFO \S+ownership: given \S[^:]*: \d+ link states read from the changelog "
    r"in (\S+) s",
    re.M,
)


def given_after(work: Path, survivors: list[str], killed_ns: int) -> tuple[float, float] | None:
    """Seconds from the kill to the first partitions given to a survivor after it, and of
    them the changelog's read, from their logs' lines (local time, to the millisecond); None
    if none was."""
    given = [
        (datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), float(read))
        for name in survivors
        for stamp, read in GIVEN.findall((work / f"{name}.log").read_text(errors="replace"))
    ]
    later = [(t - killed_ns / 1e9, read) for t, read in given if t > killed_ns / 1e9]
    return min(later) if later else None


def replayed_windows(log: Path) -> int:
    """The windows an instance passed over as replays, from its last progress line."""
    counts = re.findall(r"\(replayed (\d+)\)", log.read_text(errors="replace"))
    return int(counts[-1]) if counts else 0


def _decision(i: int, ts_ns: int) -> dict[str, object]:
    return {
        "link_id": "r1:floor",
        "ts_ns": ts_ns,
        "queue": 0,
        "policy": "globecom",
        "phase": "static",
        "buffer_bytes": 100_000 + i,
        "previous_buffer_bytes": None,
        "reason": "round trip",
        "trial": None,
        "outcome": "dry_run",
        "f": None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured")
    parser.add_argument(
        "--switch-every", type=int, default=1, help="windows between a link's SRTT switches"
    )
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument(
        "--lags",
        type=Path,
        help="a CSV of the measured decisions: link, owner, window end, decided, read (ns)",
    )
    args = parser.parse_args()
    offered = args.links / args.switch_every  # decisions a second
    switch_windows = args.switch_every * SECOND_NS // WINDOW_NS
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"optimizer group benchmark: {args.links:,} links on {args.instances} processes, "
        f"a decision per link every {args.switch_every} s "
        f"({os.cpu_count()} CPUs, load average {load})",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="p4bs-bench-group-"))
    broker = KafkaBroker(work, *free_ports(2))
    processes: list[subprocess.Popen[bytes]] = []
    ok = True
    try:
        broker.start()
        wait_ready(broker, 90)
        run = uuid.uuid4().hex[:6]
        topics = {stream: f"group-{run}.{stream}" for stream in STREAMS}
        ensure_topics(broker.bootstrap, topics, 2 * args.instances, 1)
        floor = quantiles(round_trips(broker.bootstrap, topics))
        print(
            f"  reference: a record produced and read back committed, p50 "
            f"{floor[0] * 1e3:.1f} ms p99 {floor[1] * 1e3:.1f} ms",
            flush=True,
        )
        config_path = many_links_config(
            work / "config.toml", broker.bootstrap, topics, list(range(args.links)), "globecom"
        )
        names = [f"bench-{run}-{i}" for i in range(args.instances)]
        for name in names:
            argv = [sys.executable, "-m", "p4bs_cli", "optimizer", "run", "--dry-run"]
            argv += ["--config", str(config_path), "--instance", name, "--report-every", "10"]
            argv += ["--metrics-address", ""]  # several on this host: no endpoint each
            with (work / f"{name}.log").open("wb") as log:
                processes.append(subprocess.Popen(argv, stdout=log, stderr=log))
        config = load_config(config_path)
        group = config.optimizer.group
        if not wait_until(lambda: group_formed(broker.bootstrap, group, names), GROUP_TIMEOUT_S):
            raise RuntimeError(f"the instances formed no stable group within {GROUP_TIMEOUT_S} s")
        kill_at = WARMUP_S + args.seconds
        total_s = kill_at + (0 if args.no_kill else 3 * HANDOVER_GOAL_S)
        first_end_ns = (time.time_ns() // SECOND_NS + 5) * SECOND_NS
        start_ns = first_end_ns + int(WARMUP_S * 1e9)
        end_ns = first_end_ns + int(kill_at * 1e9)
        flip_ns = None if args.no_kill else end_ns // SECOND_NS * SECOND_NS + SECOND_NS
        producer = multiprocessing.get_context("spawn").Process(
            target=produce_windows,
            args=(broker.bootstrap, topics["link_metrics"], args.links, first_end_ns, total_s),
            kwargs={"switch_windows": switch_windows, "feed": True, "flip_from_ns": flip_ns},
        )
        producer.start()
        assert broker.pid is not None and producer.pid is not None
        # What else shares the cores: the broker, the window producer, this reader.
        others = {"broker": broker.pid, "window producer": producer.pid, "reader": os.getpid()}
        consumer = RecordConsumer(
            broker.bootstrap,
            f"bench-reader-{run}",
            ["buffer_decisions"],
            topics,
            settings={"fetch.wait.max.ms": 10},
        )
        # Per decision: link, owner, window end, arrival (ns); when it was made; its buffer.
        seen: list[tuple[str, str, int, int]] = []
        made: list[int] = []
        buffers: list[int] = []
        phases: list[str] = []
        cpu_at: dict[str, list[float]] = {}
        killed_ns = 0
        stop_ns = first_end_ns + int(total_s * 1e9) + 5 * SECOND_NS
        progress = Progress(1, first_guess_s=(stop_ns - time.time_ns()) / 1e9)
        began_ns = shown_ns = time.time_ns()
        while time.time_ns() < stop_ns:
            if time.time_ns() - shown_ns >= PROGRESS_EVERY_NS:
                shown_ns = time.time_ns()
                phase = "handover after the kill" if killed_ns else "after the measured span"
                if shown_ns < end_ns:
                    phase = "measuring" if shown_ns >= start_ns else "warm-up"
                progress.show(
                    f"{phase}: {len(seen):,} decisions read", elapsed_s=(shown_ns - began_ns) / 1e9
                )
            for mark, at_ns in (("start", start_ns), ("end", end_ns)):
                if mark not in cpu_at and time.time_ns() >= at_ns:
                    cpu_at[mark] = [cpu_seconds(proc.pid) for proc in processes]
                    cpu_at[mark] += [cpu_seconds(pid) for pid in others.values()]
            received = consumer.poll(0.1)
            if received is not None and received.record["owner"] in names:  # not the floor's
                r = received.record
                seen.append((r["link_id"], r["owner"], r["window_end_ns"] or 0, time.time_ns()))
                made.append(r["ts_ns"])
                buffers.append(r["buffer_bytes"])
                phases.append(r["phase"])
            if not args.no_kill and not killed_ns and time.time_ns() >= end_ns:
                processes[0].send_signal(signal.SIGKILL)
                killed_ns = time.time_ns()
        consumer.close()
        progress.finished((time.time_ns() - began_ns) / 1e9)
        progress.show(f"{len(seen):,} decisions read", final=True)
        producer.join(60)

        inside, inside_made = [], []
        for s, made_ns in zip(seen, made, strict=True):
            if start_ns <= s[2] < end_ns:
                inside.append(s)
                inside_made.append(made_ns)
        if args.lags:
            args.lags.write_text(
                "".join(
                    f"{link},{owner},{end},{made_ns},{read}\n"
                    for (link, owner, end, read), made_ns in zip(inside, inside_made, strict=True)
                )
            )
        lags = [(s[3] - s[2]) / 1e9 for s in inside]
        rate = len(inside) / args.seconds
        p50, p99 = quantiles(lags) if lags else (float("nan"), float("nan"))
        sustained = rate >= 0.95 * offered and p99 < LAG_GOAL_S
        print(
            f"  {rate:,.0f} decisions/s (offered {offered:,.0f}/s, {rate / offered:.0%}); lag "
            f"window end -> decision committed and read p50 {p50 * 1e3:.0f} ms p99 "
            f"{p99 * 1e3:.0f} ms (goal < {LAG_GOAL_S * 1e3:.0f} ms): "
            f"{'met' if sustained else 'NOT met'}",
            flush=True,
        )
        if lags:
            pairs = list(zip(inside, inside_made, strict=True))
            to_made = quantiles([(m - s[2]) / 1e9 for s, m in pairs])
            to_read = quantiles([(s[3] - m) / 1e9 for s, m in pairs])
            print(
                f"  of it: window end -> decided p50 {to_made[0] * 1e3:.0f} ms p99 "
                f"{to_made[1] * 1e3:.0f} ms; decided -> committed and read p50 "
                f"{to_read[0] * 1e3:.0f} ms p99 {to_read[1] * 1e3:.0f} ms",
                flush=True,
            )
        ok = sustained
        held = collections.Counter(link for link, owner, _, _ in inside)
        per_owner = collections.Counter(owner for _, owner, _, _ in inside)
        for name, proc, before, after in zip(
            names, processes, cpu_at.get("start", []), cpu_at.get("end", []), strict=False
        ):
            links_held = len({link for link, owner, _, _ in inside if owner == name})
            cpu = (after - before) / args.seconds
            per_thousand = cpu / (links_held / 1000) if links_held else float("nan")
            print(
                f"  {name} (pid {proc.pid}): {links_held:,} links, {per_owner[name]:,} "
                f"decisions; CPU {cpu:.2f} s/s, {per_thousand:.3f} per 1,000 links",
                flush=True,
            )
        spans = zip(cpu_at.get("start", []), cpu_at.get("end", []), strict=False)
        cpus = [(after - before) / args.seconds for before, after in spans][len(processes) :]
        if cpus:
            print(
                "  beside them: "
                + ", ".join(f"{name} {cpu:.2f}" for name, cpu in zip(others, cpus, strict=True))
                + " CPU s/s",
                flush=True,
            )
        # The policy's decisions, each on its window; a link whose windows came late (an
        # instance behind) falls back to its safe buffer and resumes the policy's buffer on
        # a later window: those are the guards', counted apart.
        called_for = buffers_called_for()
        # The windows stop at the end of the run: every link falls back once its limit has
        # passed since its last one, a heartbeat before the end at most (those are left
        # out; the reader may stop before).
        last_ns = first_end_ns + int(total_s * 1e9) - config.metrics.feed_heartbeat_ns
        stopped_ns = last_ns + config.optimizer.stale_after_ns
        guarded = collections.Counter(
            p for p, m in zip(phases, made, strict=True) if p in GUARD_PHASES and m < stopped_ns
        )
        policy_made = [
            (s, buffer) for s, buffer, p in zip(seen, buffers, phases, strict=True)
            if p not in GUARD_PHASES
        ]  # fmt: skip
        wrong = sum(
            buffer
            != called_for[
                variant_of(
                    end // WINDOW_NS,
                    int(link.rsplit("eth", 1)[1]),
                    switch_windows,
                    None if flip_ns is None else flip_ns // WINDOW_NS,
                )
            ]
            for (link, _, end, _), buffer in policy_made
        )
        twice = sum(
            n - 1 for n in collections.Counter((s[0], s[2]) for s, _ in policy_made).values()
        )
        replayed = sum(replayed_windows(work / f"{name}.log") for name in names[1:])
        print(
            f"  over the run: {len(policy_made):,} policy decisions, {twice} made twice, "
            f"{wrong} with a buffer other than their window's ({called_for} B for SRTT "
            f"{[t // 1_000_000 for t in SRTTS_NS]} ms); the guards' while windows came "
            + (", ".join(f"{n:,} {p}" for p, n in sorted(guarded.items())) or "none")
            + f"; {replayed:,} windows passed over as replays by the survivors; "
            f"{len(held):,} links decided in the measured span",
            flush=True,
        )
        ok = ok and twice == 0 and wrong == 0
        if killed_ns:
            # Its links once the group had settled (at the start, links move between them).
            theirs = {link for link, owner, end, _ in seen if owner == names[0] and end >= start_ns}
            taken = {}
            for link, owner, _, arrived in seen:
                if link in theirs and owner != names[0] and arrived > killed_ns:
                    taken.setdefault(link, (arrived - killed_ns) / 1e9)
            times = sorted(taken.values())
            lost = len(theirs) - len(times)
            handover = times[-1] if times and not lost else float("inf")
            print(
                f"  killed {names[0]} ({len(theirs):,} links): decided again by the others "
                f"after median {statistics.median(times) if times else float('nan'):.1f} s, "
                f"all after {handover:.1f} s (goal < {HANDOVER_GOAL_S:g} s; {lost} never): "
                f"{'met' if handover < HANDOVER_GOAL_S else 'NOT met'}",
                flush=True,
            )
            given_read = given_after(work, names[1:], killed_ns)
            if given_read is not None and times:
                given, read = given_read
                print(
                    f"  of it: their partitions given to the others {given:.1f} s after the "
                    f"kill (the session timeout and the rebalance, then {read:.1f} s of "
                    f"changelog read), their links decided {statistics.median(times) - given:.1f}"
                    f" s (median) and {times[-1] - given:.1f} s (all) after that",
                    flush=True,
                )
            ok = ok and handover < HANDOVER_GOAL_S
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in processes:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        broker.stop()
        shutil.rmtree(broker.dir / "data", ignore_errors=True)  # ~60 MB a run; the logs stay
    print(f"  logs in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
