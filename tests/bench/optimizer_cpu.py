"""Benchmark: the optimizer's CPU per 1,000 links, by part, beside a reference commit's
measured in the same run (issue 41).

    .venv/bin/python tests/bench/optimizer_cpu.py [--links 1000,4000,10000] [--runs 3]
        [--reference 695705d] [--seconds 20] [--workloads deciding,steady,quiet-feed]

Each measurement is one `optimizer_service.py capacity --links N --workload W` (one dry-run
service process, GLOBECOM, each link's window every 100 ms; "deciding": its SRTT switching
between 20 and 30 ms every second, so that every link decides once a second, the workload
of the figures before issue 41; "steady": the SRTT wobbling by 3%, within GLOBECOM's gamma,
so that a link decides once; "steady-feed": the steady workload's windows that the metrics
job's optimizer feed holds, [metrics] optimizer_feed: a link's first, its 3% SRTT switch once
a second, a heartbeat once a second; "quiet-feed": a 1% wobble, within the feed's deadband,
so the heartbeats alone) in a process of its own, on one Kafka broker this
benchmark starts. The reference runs the same benchmark script with the reference commit's
packages first on its import path (a git worktree in a temporary folder, removed after).
The two codes alternate, the first of each pair swapped from one run to the next, so that
the machine's drift falls on both.

Figures per N, medians over the runs: the service process's CPU (all its threads, the Kafka
client's too) in seconds per second per 1,000 links, counted on the windows it handled: a
process that falls behind handles fewer than offered (then NOT sustained), and its CPU per
1,000 links is CPU / (windows handled per s / windows offered per s per link / 1,000; 10
windows a second per link but with the feed). For this checkout, the CPU by part
(`p4bs_optimizer_cpu_seconds_total{part}`: decode, windows, state, produce, commit; "kafka
and rest" is what is left of the process's CPU: the Kafka client's threads, the benchmark's
own bookkeeping). Then head / reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchkit import fresh_topics

from p4bs import paths
from p4bs.bus import RecordConsumer, TransactionalProducer
from p4bs.progress import Progress
from p4bs_infra.procs import free_ports
from p4bs_infra.services import KafkaBroker, wait_ready

CAPACITY = Path(__file__).resolve().parent / "optimizer_service.py"
WINDOWS_PER_LINK_S = 10  # the capacity benchmark's windows: one per link every 100 ms
PARTS = ("decode", "windows", "state", "produce", "commit")


def package_path(tree: Path) -> str:
    """The import path that puts `tree`'s packages before the installed (editable) ones:
    each package's parent folder, as pyproject.toml's package-dir maps them."""
    mapping = {
        "p4bs": "core", "p4bs_cli": "cli", "p4bs_eval": "eval", "p4bs_exporter": "exporter",
        "p4bs_infra": "infra", "p4bs_jobs": "streaming-jobs", "p4bs_linux_tc": "linux-tc",
        "p4bs_loop": "loop", "p4bs_ops": "ops", "p4bs_optimizer": "optimizer",
        "p4bs_schemas": "schemas", "p4bs_sinks": "sinks",
    }  # fmt: skip
    return os.pathsep.join(str(tree / folder) for folder in mapping.values())


def measure(
    code: str,
    tree: Path | None,
    bootstrap: str,
    links: int,
    workload: str,
    seconds: float,
    work: Path,
) -> dict[str, Any]:
    """One capacity run of `links` under this checkout's packages (tree None) or tree's."""
    out = work / f"{code}-{links}-{workload}.json"
    out.unlink(missing_ok=True)
    # The example config the code reads: the reference's own (this checkout's may have keys
    # the reference does not know).
    env = dict(os.environ, P4BS_HOME=str(tree or paths.home()))
    if tree is not None:
        env["PYTHONPATH"] = package_path(tree)
    command = [sys.executable, str(CAPACITY), "capacity", "--links", str(links)]
    command += ["--seconds", str(seconds), "--bootstrap", bootstrap, "--json", str(out)]
    command += ["--workload", workload]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith(str(links))]
    print(f"    {code:9s} {lines[0].strip() if lines else done.stdout[-300:]}", flush=True)
    if not out.exists():
        raise RuntimeError(f"{code} at {links} links gave no figures: {done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return figures


def warm_up(bootstrap: str) -> None:
    """Has the fresh broker make its group and transaction state topics (tens of seconds on a
    loaded machine), which the first measurement would otherwise wait for in its span."""
    topics = fresh_topics(bootstrap, 1, ["link_metrics"])
    TransactionalProducer(bootstrap, topics, f"warm-up-{uuid.uuid4().hex[:6]}", 60_000)
    consumer = RecordConsumer(bootstrap, "warm-up", ["link_metrics"], topics)
    deadline = time.monotonic() + 180
    try:
        while not consumer.assigned():
            if time.monotonic() > deadline:
                raise RuntimeError("the broker gave no group assignment within 180 s")
            consumer.poll(0.5)
    finally:
        consumer.close()


def per_thousand(figures: dict[str, Any], cpu_s_per_s: float) -> float:
    """CPU s/s per 1,000 links' windows handled (10,000 windows/s; with the feed, what it
    offers per 1,000 links)."""
    offered = figures.get("offered_windows_per_s", figures["links"] * WINDOWS_PER_LINK_S)
    handled = figures["windows_per_s"] / (1000 * offered / figures["links"])
    return cpu_s_per_s / handled if handled > 0 else float("nan")


def report(
    links: int, workload: str, head: list[dict[str, Any]], reference: list[dict[str, Any]]
) -> None:
    def median(rows: list[dict[str, Any]], cpu: str | None = None) -> float:
        return statistics.median(
            per_thousand(r, r["cpu_s_per_s"] if cpu is None else r["cpu_parts"].get(cpu, 0.0))
            for r in rows
        )

    ours, theirs = median(head), median(reference)
    parts = {part: median(head, part) for part in PARTS}
    rest = ours - sum(parts.values())
    sustained = sum(r["sustained"] for r in head)
    sustained_ref = sum(r["sustained"] for r in reference)
    lag = statistics.median(r["lag_p99_s"] for r in head) * 1e3
    lag_ref = statistics.median(r["lag_p99_s"] for r in reference) * 1e3
    print(
        f"  {links:6,d} links, {workload}: head {ours:.3f} CPU s/s per 1,000 links ("
        + ", ".join(f"{p} {v:.3f}" for p, v in parts.items())
        + f", kafka and rest {rest:.3f}); sustained {sustained}/{len(head)}, lag p99 "
        f"{lag:.0f} ms | reference {theirs:.3f}, sustained {sustained_ref}/{len(reference)}, "
        f"lag p99 {lag_ref:.0f} ms | head / reference {ours / theirs:.2f}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", default="1000,4000,10000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reference", default="695705d", help="a commit (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured, per run")
    parser.add_argument("--workloads", default="deciding,steady")
    args = parser.parse_args()
    counts = [int(x) for x in args.links.split(",")]
    workloads = args.workloads.split(",")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"optimizer CPU per 1,000 links ({os.cpu_count()} CPUs, load average {load}); "
        f"reference {args.reference}",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="p4bs-bench-cpu-"))
    tree = work / "reference"
    subprocess.run(
        ["git", "-C", str(paths.home()), "worktree", "add", "-q", "--detach", str(tree),
         args.reference],
        check=True,
    )  # fmt: skip
    broker = KafkaBroker(work / "kafka", *free_ports(2))
    cells = [(n, workload) for workload in workloads for n in counts]
    results: dict[tuple[int, str], dict[str, list[dict[str, Any]]]] = {
        cell: {"head": [], "reference": []} for cell in cells
    }
    progress = Progress(args.runs * len(cells) * 2, first_guess_s=args.seconds + 40)
    try:
        broker.start()
        wait_ready(broker, 90)
        warm_up(broker.bootstrap)
        for run in range(args.runs):
            for n, workload in cells:
                print(f"  run {run + 1}, {n:,} links, {workload}:", flush=True)
                codes = [("head", None), ("reference", tree)]
                for code, code_tree in codes[:: 1 if run % 2 == 0 else -1]:
                    with progress.step(f"{code}: {n:,} links, {workload}, run {run + 1}"):
                        figures = measure(
                            code, code_tree, broker.bootstrap, n, workload, args.seconds, work
                        )
                    results[n, workload][code].append(figures)
        print(f"medians of {args.runs} runs:")
        for n, workload in cells:
            report(n, workload, results[n, workload]["head"], results[n, workload]["reference"])
    finally:
        broker.stop()
        subprocess.run(
            ["git", "-C", str(paths.home()), "worktree", "remove", "--force", str(tree)],
            check=False,
        )
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
