"""Benchmark: testbed build time, and RTT/utilisation against the buffer for Cubic and BBR.

.venv/bin/python tests/bench/testbed.py up [REPEAT]
    `p4bs testbed up` for the default scenario, REPEAT times: median vs the 30 s target.
.venv/bin/python tests/bench/testbed.py rtt [--duration S] [--ccas cubic,bbr] [--flows 10,50]
    Each CCA x N with a 200 ms buffer and with BDP/sqrt(N): steady-state mean RTT, the
    reference it is compared with (base + buffer delay, or base), utilisation, delay-wire
    lateness p99, and the CPU the wire used. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from p4bs import paths
from p4bs.config import load_config
from p4bs.progress import Progress
from p4bs_infra import procs
from p4bs_infra.testbed import Testbed, TestbedPlan
from p4bs_infra.traffic import Scenario, TrafficRun

UP_TARGET_S = 30.0


def example_plan(state: Path) -> TestbedPlan:
    plan = TestbedPlan.from_config(load_config(paths.example_config()))
    name = f"b{uuid.uuid4().hex[:6]}"
    return dataclasses.replace(plan, name=name, state_dir=state / name)


def bench_up(repeat: int) -> None:
    os.environ.setdefault("P4BS_ROUTER_USER", "bench")
    os.environ.setdefault("P4BS_ROUTER_PASSWORD", "bench-password")
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            testbed = Testbed(example_plan(Path(tmp)))
            try:
                times.append(testbed.up())
            finally:
                testbed.down()
            print(f"run {i + 1}/{repeat}: testbed up in {times[-1]:.2f} s", flush=True)
    median = statistics.median(times)
    print(
        f"p4bs testbed up: median {median:.2f} s over {repeat} runs; target {UP_TARGET_S:.0f} s;"
        f" median/target = {median / UP_TARGET_S:.3f}"
    )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks of 10 ms


def bench_rtt(duration: float, ccas: list[str], flow_counts: list[int]) -> None:
    os.environ.setdefault("P4BS_ROUTER_USER", "bench")
    os.environ.setdefault("P4BS_ROUTER_PASSWORD", "bench-password")
    print(
        "| CCA | N | buffer | buffer B | probe RTT ms | reference ms | probe/ref | TCP RTT ms | "
        "util | wire late p99 ms | wire CPU % |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    # On stderr: the table on stdout stays a table.
    progress = Progress(len(ccas) * len(flow_counts) * 2, duration + 15, out=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for cca in ccas:
            for n in flow_counts:
                for label in ("200ms", "BDP/sqrtN"):
                    with progress.step(f"{cca}, {n} flows, buffer {label}"):
                        plan = example_plan(Path(tmp))
                        mean_base = plan.base_rtt_ns + plan.extra_delay_max_ns / 2
                        bdp = plan.rate_bps * mean_base / 8e9
                        buffer = plan.buffer_bytes if label == "200ms" else int(bdp / math.sqrt(n))
                        group = dataclasses.replace(plan.groups[0], flows=n, cca=cca)
                        plan = dataclasses.replace(plan, buffer_bytes=buffer, groups=[group])
                        testbed = Testbed(plan)
                        testbed.up()
                        try:
                            pid = procs.running_pid(testbed.wire_pidfile)
                            assert pid is not None
                            cpu0, t0 = _cpu_seconds(pid), time.monotonic()
                            summary = TrafficRun(
                                testbed,
                                Path(tmp) / f"{cca}-{n}-{label.replace('/', '')}",
                                Scenario(duration_s=duration, warmup_s=duration / 3),
                            ).run(progress=lambda _: None)
                            cpu = (_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
                        finally:
                            testbed.down()
                        lf, router, probe = (summary[k] for k in ("long_flows", "router", "probe"))
                        base = probe["idle_rtt_ns"]
                        reference = base + (buffer * 8e9 / plan.rate_bps if label == "200ms" else 0)
                        rtt = probe["loaded_rtt_mean_ns"]
                        late = max(d["late_p99_ns"] for d in summary["delay_wire"].values())
                        print(
                            f"| {cca} | {n} | {label} | {buffer} | {rtt / 1e6:.1f} | "
                            f"{reference / 1e6:.1f} | {rtt / reference:.2f} | "
                            f"{lf['rtt_mean_ns'] / 1e6:.1f} | "
                            f"{router['throughput_bps'] / plan.rate_bps:.3f} | {late / 1e6:.1f} | "
                            f"{100 * cpu:.0f} |",
                            flush=True,
                        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up")
    up.add_argument("repeat", type=int, nargs="?", default=5)
    rtt = sub.add_parser("rtt")
    rtt.add_argument("--duration", type=float, default=30.0)
    rtt.add_argument("--ccas", default="cubic,bbr")
    rtt.add_argument("--flows", default="10,50")
    args = parser.parse_args()
    if args.what == "up":
        bench_up(args.repeat)
    else:
        bench_rtt(args.duration, args.ccas.split(","), [int(n) for n in args.flows.split(",")])


if __name__ == "__main__":
    main()
