"""Benchmark: the tofino exporter's per-interval counter export at 256 links, against a fake
bfrt_grpc (tests/fakebfrt.py), beside the per-index hardware read it replaced.

Question (issue 18): does reading the per-link registers fit the 100 ms export interval at
256 links? Each export interval the target reads the 7 per-link registers and produces one
LinkCounters record per link. Two ways, measured in the same run, alternating:

- `sync` (the exporter): per register, `operations_execute(target, "Sync")` then one
  `entry_get(..., {"from_hw": False})` of the links' cells;
- `per-index` (the reference, the previous code): per register one `entry_get(...,
  {"from_hw": True})` of the links' cells, which the driver serves by reading every index of
  every pipe from the hardware one at a time.

Per interval it counts the gRPC round trips (each Read and Write request) and the hardware
index reads the driver must do, and times the exporter's own CPU work (the `_export` step:
decoding the cells, the differences, the records produced into a local Kafka broker), with
the CPU the fake spent answering taken out. RUNS runs of INTERVALS intervals per way;
medians over all intervals of a way.

What the fake cannot tell: the real gRPC latency (multiply the round trips by your RTT to
bf_switchd, and add the driver's time per Sync DMA or per hardware index read), and the
real client's decoding of the responses (protobuf parsing and its to_dict conversions per
entry, which the fake does not do: its entries are Python objects already).

    .venv/bin/python tests/bench/tofino_registers.py [--links 256] [--pipes 4] \\
        [--intervals 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fakebfrt

from fakebfrt import COUNTER_FIELDS, Switch, fake_modules, write_config

from p4bs.bus import ensure_topics
from p4bs.config import load_config
from p4bs_exporter.tofino import TofinoTarget
from p4bs_exporter.tofino_contract import REGISTER_INDEX
from p4bs_infra.procs import free_ports, wait_until
from p4bs_infra.services import KafkaBroker, wait_ready
from p4bs_schemas.registry import STREAMS

INTERVAL = "100ms"
INTERVAL_NS = 100_000_000


def scripts(links: int, pipes: int, looks: int) -> dict[str, list[dict[int, dict[str, list[int]]]]]:
    """Every register of every link counts up at each look at the hardware (1000 queueing
    delay samples per interval: the filter's time constant stays put)."""
    out = {}
    for register, fields in COUNTER_FIELDS.items():
        out[register] = [
            {i: {f: [n * 1000 + i + p for p in range(pipes)] for f in fields} for i in range(links)}
            for n in range(looks)
        ]
    return out


class Measured(TofinoTarget):
    """The exporter, each `_export` measured: (round trips, hardware index reads, exporter
    CPU ns without the fake's)."""

    def __init__(self, fake: Switch, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fake = fake
        self.exports: list[tuple[int, int, int]] = []

    def _export(self, tick_ns: int) -> None:
        fake = self.fake
        rpcs, hw, fake_cpu = sum(fake.rpcs.values()), fake.hw_index_reads, fake.fake_cpu_ns
        cpu = time.thread_time_ns()
        super()._export(tick_ns)
        cpu = time.thread_time_ns() - cpu - (fake.fake_cpu_ns - fake_cpu)
        self.exports.append((sum(fake.rpcs.values()) - rpcs, fake.hw_index_reads - hw, cpu))


class PerIndex(Measured):
    """The reference: the previous read, one from_hw entry per index (no Sync)."""

    def _read_register(self, register: str) -> Iterable[tuple[int, Mapping[str, Any]]]:
        table = self._table(register)
        keys = [table.make_key([self._gc.KeyTuple(REGISTER_INDEX, s.index)]) for s in self.links]
        for data, key in table.entry_get(self._target, keys, {"from_hw": True}):
            yield int(key.to_dict()[REGISTER_INDEX]["value"]), data.to_dict()


def one_run(
    way: type[Measured], config_path: Path, links: int, pipes: int, intervals: int
) -> list[tuple[int, int, int]]:
    fake = Switch(scripts(links, pipes, 2 * intervals + 10), pipes=pipes)
    modules = fake_modules(fake)
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        target = way(fake, load_config(config_path))
        target.start()
        ok = wait_until(lambda: len(target.exports) >= intervals, intervals * 0.5 + 30)
        stats = target.stop(30)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    assert ok, f"{way.__name__}: {len(target.exports)} exports of {intervals}"
    assert stats.produced.get("link_counters", 0) >= intervals * links, stats
    assert not [p for p in stats.problems if "register read" in p], stats.problems
    return target.exports[:intervals]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", type=int, default=256)
    parser.add_argument("--pipes", type=int, default=4)
    parser.add_argument("--intervals", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="p4bs-bench-tofino-"))
    broker = KafkaBroker(work, *free_ports(2))
    try:
        broker.start()
        wait_ready(broker, 90)
        topics = {s: f"bench-{uuid.uuid4().hex[:6]}.{s}" for s in STREAMS}
        ensure_topics(broker.bootstrap, topics, partitions=4, replication_factor=1)
        config = write_config(
            work, broker.bootstrap, topics, args.links, INTERVAL, first_port=0, port_step=2
        )
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"{args.links} links, {args.pipes} pipes, export every {INTERVAL}; "
            f"{args.runs} runs x {args.intervals} intervals per way (load average {load})"
        )
        results: dict[str, list[tuple[int, int, int]]] = {"sync": [], "per-index": []}
        for run in range(args.runs):
            for name, way in (("sync", Measured), ("per-index", PerIndex)):
                got = one_run(way, config, args.links, args.pipes, args.intervals)
                results[name] += got
                cpu = statistics.median(c for _, _, c in got) / 1e6
                print(f"  run {run + 1} {name:>9}: median exporter CPU {cpu:.2f} ms/interval")
        print(f"per interval, medians ({args.links} links):")
        print(f"  {'':>9}  {'round trips':>11}  {'hw index reads':>14}  {'exporter CPU':>12}")
        for name, got in results.items():
            trips = statistics.median(t for t, _, _ in got)
            hw = statistics.median(h for _, h, _ in got)
            cpu = statistics.median(c for _, _, c in got) / 1e6
            share = cpu * 1e6 / INTERVAL_NS
            print(
                f"  {name:>9}  {trips:>11.0f}  {hw * args.pipes:>14,.0f}  "
                f"{cpu:>9.2f} ms ({share:.1%} of the interval)"
            )
        print(
            "  hw index reads = per-index entries x pipes, each a separate read by the driver;"
            " a Sync is one DMA of the whole table per pipe.\n"
            "  Not measured (no switch here): gRPC latency — multiply the round trips by the"
            " RTT to bf_switchd and add the driver's time per Sync or per hardware read; and"
            " the real client's decoding of each returned entry."
        )
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
