"""Benchmark: RTT samples per second the model exporter delivers into the local Kafka.

Target (the exporter issue): >= 1M RTT samples/s on one core, in batch (a capture at pace
max). A capture of the after tap with SAMPLES data segments, each ACKed 20.5 µs later (1000
flows), is generated once under .cache/bench/ (about 70 bytes a frame, 2 frames a sample).
A Kafka broker of its own is started on free ports and pinned to CPU 0; `p4bs-exporter` runs
pinned to CPU 1 (`taskset -c 1`), RUNS times, each into fresh topics; a run's rate is the
RTT samples delivered (acks=all; inside `LinkCounters` records, one per link and export
interval, split into parts of `max_rtt_samples_per_record` as the testbed config has it) over
the time from its first produced record to the end of its final flush. Then the Python
reference: `p4bs_schemas.intervals.IntervalAssembler` and `p4bs.bus.RecordProducer` assembling
and producing the same kind of samples for about 5 s on CPU 1. Prints each run, the median,
the reference and the ratio.

    .venv/bin/python tests/bench/exporter.py [--samples 5000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from benchkit import fresh_topics

from p4bs import paths
from p4bs.bus import RecordProducer
from p4bs.config import Config, KafkaConfig, load_config
from p4bs_exporter import EXPORTED_STREAMS, ExporterStats, run_spec
from p4bs_infra.procs import free_ports
from p4bs_infra.services import KafkaBroker, wait_ready
from p4bs_schemas.intervals import NO_COUNTS, IntervalAssembler

TARGET = 1_000_000  # RTT samples/s
T0 = 1_700_000_000 * 10**9
FLOWS = 1000
STEP_NS = 1000  # one data segment per µs of capture time
RTT_STEPS = 20  # ACK 20.5 steps after its segment
MSS = 1448
BROKER_CPU, EXPORTER_CPU = 0, 1

FRAME = np.dtype(
    [
        ("sec", "<u4"),
        ("nsec", "<u4"),
        ("caplen", "<u4"),
        ("wirelen", "<u4"),
        ("eth", "u1", 14),
        ("vhl", "u1"),
        ("tos", "u1"),
        ("total", ">u2"),
        ("ip_id", ">u2"),
        ("frag", ">u2"),
        ("ttl", "u1"),
        ("proto", "u1"),
        ("ip_sum", ">u2"),
        ("src", ">u4"),
        ("dst", ">u4"),
        ("sport", ">u2"),
        ("dport", ">u2"),
        ("seq", ">u4"),
        ("ack", ">u4"),
        ("offset", "u1"),
        ("flags", "u1"),
        ("window", ">u2"),
        ("tcp_sum", ">u2"),
        ("urgent", ">u2"),
    ]
)
SENDERS = 0x0AC90100  # 10.201.1.0
RECEIVER = 0x0AC90202  # 10.201.2.2, inside the example link's output prefix


def make_capture(path: Path, samples: int) -> None:
    """The after tap of SAMPLES segments (flow i % FLOWS) and their ACKs, in time order."""
    i = np.arange(samples, dtype=np.int64)
    flow = i % FLOWS
    seq = (1000 + (i // FLOWS) * MSS).astype(np.uint32)
    frames = np.zeros(2 * samples, dtype=FRAME)
    data, acks = frames[:samples], frames[samples:]
    for part in (data, acks):
        part["caplen"] = 54
        part["eth"][:, 12] = 0x08
        part["vhl"], part["ttl"], part["proto"] = 0x45, 64, 6
        part["frag"], part["offset"], part["window"] = 0x4000, 5 << 4, 65535
    ts_data = T0 + i * STEP_NS
    ts_ack = ts_data + RTT_STEPS * STEP_NS + STEP_NS // 2
    data["total"], data["wirelen"] = 40 + MSS, 54 + MSS
    data["src"], data["dst"] = SENDERS + 10 + flow // 50, RECEIVER
    data["sport"], data["dport"] = 40000 + flow, 5201
    data["seq"], data["ack"], data["flags"] = seq, 1, 0x18
    data["ip_id"] = (i // FLOWS).astype(np.uint16)
    acks["total"], acks["wirelen"] = 40, 54
    acks["src"], acks["dst"] = RECEIVER, SENDERS + 10 + flow // 50
    acks["sport"], acks["dport"] = 5201, 40000 + flow
    acks["seq"], acks["ack"], acks["flags"] = 1, seq + MSS, 0x10
    for part, ts in ((data, ts_data), (acks, ts_ack)):
        part["sec"], part["nsec"] = ts // 10**9, ts % 10**9
    order = np.argsort(np.concatenate([ts_data, ts_ack]), kind="stable")
    header = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)  # ns timestamps
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(header)
        out.write(frames[order].tobytes())
    tmp.rename(path)


def capture(samples: int) -> Path:
    path = paths.cache_dir() / "bench" / f"exporter-after-{samples}.pcap"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        make_capture(path, samples)
        print(
            f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) "
            f"in {time.monotonic() - began:.1f} s"
        )
    return path


def pin(pid: int, cpu: int) -> None:
    """Pins every thread of `pid` to `cpu`."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, stdout=-3)


def exporter_run(config: Config, pcap: Path, work: Path) -> tuple[float, float, ExporterStats]:
    """RTT samples/s over the run's wall time, and per CPU second the exporter used."""
    bootstrap = config.kafka.bootstrap
    stats_path = work / f"stats-{uuid.uuid4().hex[:6]}.json"
    spec = run_spec(
        config,
        stats_path=stats_path,
        pcaps=[("after", pcap)],
        topics=fresh_topics(bootstrap, 4),
        stats_interval_s=1.0,
        flush_timeout_s=300,
    )
    spec_path = stats_path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    binary = paths.built("p4bs-exporter")
    argv = ["taskset", "-c", str(EXPORTER_CPU), str(binary), "--spec", str(spec_path)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stderr=subprocess.DEVNULL, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    stats = ExporterStats.read(stats_path)
    assert stats is not None and stats.state == "done", stats
    assert stats.active_s is not None and stats.failed == 0 and stats.undelivered_at_exit == 0
    samples = stats.rtt_samples_produced
    assert stats.delivered == stats.produced_total
    return samples / stats.active_s, samples / cpu_s, stats


def python_reference(config: Config, seconds: float = 5.0) -> float:
    """IntervalAssembler and RecordProducer assembling and producing RTT samples on one core
    for about `seconds`, each export interval closed by its (zero) counters as the data plane's
    export does: samples/s delivered, flush included."""
    os.sched_setaffinity(0, {EXPORTER_CPU})
    bootstrap = config.kafka.bootstrap
    producer = RecordProducer(bootstrap, fresh_topics(bootstrap, 4), client_id="bench-python")
    d = config.dataplane
    interval = d.export_interval_ns
    assembler = IntervalAssembler(interval, d.max_rtt_samples_per_record)
    link = "r1:eth1"
    end = T0 - T0 % interval + interval
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < seconds:
        for _ in range(1000):
            ts = T0 + n * STEP_NS
            if ts >= end:
                for record in assembler.close(link, end, interval, NO_COUNTS):
                    producer.produce("link_counters", record)
                end += interval
            sample = {
                "ts_ns": ts,
                "src_ip": "10.201.1.10",
                "dst_ip": "10.201.2.2",
                "src_port": 40000 + n % FLOWS,
                "dst_port": 5201,
                "protocol": 6,
                "rtt_ns": 20_500,
            }
            for record in assembler.add_sample(link, sample):
                producer.produce("link_counters", record)
            n += 1
    for record in assembler.close(link, end, interval, NO_COUNTS):
        producer.produce("link_counters", record)
    assert producer.flush(120) == 0
    took = time.monotonic() - began
    assert producer.stats.delivered == producer.stats.sent
    return n / took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if os.cpu_count() is None or (os.cpu_count() or 0) < 2:
        print("needs two CPUs (one for the broker, one for the exporter)", file=sys.stderr)
        return 1
    pcap = capture(args.samples)
    work = Path(tempfile.mkdtemp(prefix="p4bs-bench-exporter-"))
    broker = KafkaBroker(work, *free_ports(2))
    try:
        broker.start()
        wait_ready(broker, 90)
        pin(broker.pid, BROKER_CPU)
        base = load_config(paths.example_config())
        config = dataclasses.replace(base, kafka=KafkaConfig(bootstrap=broker.bootstrap))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"{args.samples:,} RTT samples, exporter on CPU {EXPORTER_CPU}, "
            f"broker on CPU {BROKER_CPU} (load average {load})"
        )
        rates = []
        for run in range(args.runs):
            rate, per_cpu_s, stats = exporter_run(config, pcap, work)
            rates.append(rate)
            produced = ", ".join(f"{s} {stats.produced[s]:,}" for s in EXPORTED_STREAMS)
            produced += f"; {stats.rtt_samples_produced:,} RTT samples"
            print(
                f"  run {run + 1}: {rate:,.0f} RTT samples/s delivered "
                f"({stats.delivered:,} records in {stats.active_s:.2f} s: {produced}); "
                f"{per_cpu_s:,.0f} per CPU second the exporter got"
            )
        median = statistics.median(rates)
        reference = python_reference(config)
        print(f"median: {median:,.0f} RTT samples/s ({median / TARGET:.2f} x the 1M/s target)")
        print(
            f"Python IntervalAssembler + RecordProducer: {reference:,.0f} RTT samples/s; "
            f"ratio {median / reference:.1f}"
        )
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if median >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
