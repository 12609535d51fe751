"""Benchmark: the InfluxDB sink's sustained write rate against an ISP's offered load.

    .venv/bin/python tests/bench/influx_sink.py [--links 10000] [--seconds 30]

Issue 19: at 10,000 links and 100 ms windows the sink is offered 100,000 link-metrics
points/s. A Kafka broker and an InfluxDB 1.8 of their own (the stack's classes, with the
retention policies and continuous queries `p4bs stack up` sets up) on free ports.

1. Reference, same run: InfluxDB's own write rate for such points (at least 50,000, after
   as many written once to make the shard), the line protocol made beforehand and posted
   in the sink's batch size (5000) from one thread, nothing else running: about the
   ceiling of one writer on this InfluxDB.
2. The sink (`p4bs_sinks.influx_sink.InfluxSink`, one process, as `p4bs sinks influx` runs
   it) on a backlog of `--seconds` of windows of `--links` links in Kafka (produced first,
   by another process): points written per second from the first batch to the last,
   against the offered 10 windows/s per link, and the ratio to the reference.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for simlink

from simlink import WINDOW_NS, LinkModel

from p4bs import paths
from p4bs.bus import RecordProducer, ensure_topics
from p4bs.config import InfluxConfig, load_config
from p4bs_infra.procs import free_ports
from p4bs_infra.services import InfluxDB, KafkaBroker, wait_ready
from p4bs_schemas.registry import STREAMS
from p4bs_sinks.influx_sink import InfluxSink, line_of

BATCH = 5000
WINDOWS_PER_S = 10


def windows(links: int, seconds: float, first_end_ns: int) -> Iterator[dict[str, object]]:
    """`seconds` of every link's windows, in time order."""
    base = load_config(paths.example_config()).links[0]
    model = LinkModel(f_noise=0.01)
    for k in range(int(seconds * WINDOWS_PER_S)):
        end_ns = first_end_ns + k * WINDOW_NS
        for i in range(links):
            window = model.window(base, 200_000, end_ns)
            window["link_id"] = f"r{i // 1000}:eth{i % 1000}"
            yield window


def produce(bootstrap: str, topics: dict[str, str], links: int, seconds: float, first: int) -> None:
    """In its own process: the backlog."""
    producer = RecordProducer(bootstrap, topics, client_id="bench-sink-windows")
    for window in windows(links, seconds, first):
        producer.produce("link_metrics", window)
    assert producer.flush(120) == 0


def reference(db: InfluxDB, points: list[dict[str, object]]) -> float:
    """Points/s InfluxDB takes of these, posted in batches from one thread."""
    batches = [
        [line_of("link_metrics", p) for p in points[i : i + BATCH]]
        for i in range(0, len(points), BATCH)
    ]
    began = time.perf_counter()
    for lines in batches:
        db.client.write(lines, timeout_s=30)
    return len(points) / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="of windows in the backlog")
    args = parser.parse_args()
    offered = args.links * WINDOWS_PER_S
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"InfluxDB sink benchmark: {args.links:,} links, {offered:,} points/s offered "
        f"({os.cpu_count()} CPUs, load average {load})",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="p4bs-bench-sink-"))
    kafka_port, controller, influx_port, rpc = free_ports(4)
    broker = KafkaBroker(work, kafka_port, controller)
    db = InfluxDB(work, influx_port, rpc, InfluxConfig(database="bench", retention_ns=0))
    try:
        for service in (broker, db):
            service.start()
        for service in (broker, db):
            wait_ready(service, 90)
        db.create_database()
        day_ago = (time.time_ns() // WINDOW_NS - 864_000) * WINDOW_NS
        span = max(1.0, 50_000 / offered)  # at least 50,000 points
        reference(db, list(windows(args.links, span, day_ago - 10**12)))  # makes the shard
        rate = reference(db, list(windows(args.links, span, day_ago)))
        print(f"  reference: InfluxDB takes {rate:,.0f} points/s from one writer", flush=True)

        run = uuid.uuid4().hex[:6]
        topics = {stream: f"sink-{run}.{stream}" for stream in STREAMS}
        ensure_topics(broker.bootstrap, topics, 4, 1)
        first = (time.time_ns() // WINDOW_NS - 36_000) * WINDOW_NS  # an hour ago
        producer = multiprocessing.get_context("spawn").Process(
            target=produce, args=(broker.bootstrap, topics, args.links, args.seconds, first)
        )
        producer.start()
        producer.join()
        total = int(args.seconds * WINDOWS_PER_S) * args.links
        settings = InfluxConfig(url=db.url, database=db.database)
        sink = InfluxSink(settings, broker.bootstrap, topics, group=f"bench-sink-{run}")
        stop = threading.Event()
        batches: list[tuple[float, int]] = []

        def on_batch(stats: object) -> None:
            batches.append((time.perf_counter(), sink.stats.written))
            if sink.stats.written >= total:
                stop.set()

        worker = threading.Thread(target=sink.run, args=(stop, on_batch))
        worker.start()
        worker.join(args.seconds * 20 + 120)
        stop.set()
        worker.join(30)
        (t0, w0), (t1, w1) = batches[0], batches[-1]
        sustained = (w1 - w0) / (t1 - t0) if t1 > t0 else float("nan")
        sizes = [b - a for (_, a), (_, b) in itertools.pairwise(batches)]
        print(
            f"  the sink: {w1:,} of {total:,} points written at {sustained:,.0f} points/s "
            f"({sustained / offered:.0%} of the offered {offered:,}/s; {sustained / rate:.0%} of "
            f"the reference); batches of median {statistics.median(sizes or [0]):,.0f} points; "
            f"{'keeps up' if sustained >= offered else 'does NOT keep up'}",
            flush=True,
        )
        return 0 if sustained >= offered else 1
    finally:
        db.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
