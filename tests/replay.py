"""The recorded replay (tests/fixtures/metrics-replay.jsonl.gz: the data-plane model's records
of a testbed run, see fixtures/record_metrics_replay.py) and what the metrics job must make of
it, computed here straightforwardly from the definitions in streaming-jobs/README.md, without
the job's code (the z-score by the offline simulator's Python detector, which a shared test
vector ties to the definition: tests/unit/test_change_detector.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from p4bs.bus import Received, RecordConsumer, RecordProducer
from p4bs.config import Config, load_config
from p4bs_eval.change_detector import ChangeDetector
from p4bs_loop.chaos import same_value
from p4bs_schemas.intervals import COUNT_FIELDS, IntervalAssembler

FIXTURE = Path(__file__).with_name("fixtures") / "metrics-replay.jsonl.gz"
LINK = "r1:eth1"
# A LinkCounters record's figures, all zero (no flow event, no RTT sample), for records made
# up in a test.
EMPTY_COUNTERS = {
    "interval_ns": 100_000_000,
    "seq": 0,
    "packets": 0,
    "bytes": 0,
    "after_packets": 0,
    "after_bytes": 0,
    "data_packets": 0,
    "data_bytes": 0,
    "retransmissions": 0,
    "queue_delay_samples": 0,
    "queue_delay_sum_ns": 0,
    "queue_delay_ewma_ns": 0,
    "part": 0,
    "complete": True,
    "flow_events": [],
    "flows": [],
    "flow_index": [],
    "offset_ns": [],
    "rtt_ns": [],
}


def replay() -> list[dict[str, Any]]:
    with gzip.open(FIXTURE, "rt") as lines:
        records = [json.loads(line) for line in lines]
    # Utilisation is computed from the after tap's bytes (LinkCounters v2): a recording of
    # an older model has none, and must be made again.
    old = [r for r in records if r["kind"] == "link_counters" and "after_bytes" not in r]
    assert not old, (
        f"{FIXTURE.name}: {len(old)} link_counters records without after_bytes (recorded "
        "before LinkCounters v2); record it again: tests/fixtures/record_metrics_replay.py"
    )
    return records


def config_for(repo: Path, bootstrap: str) -> Config:
    config = load_config(repo / "config" / "testbed.toml")
    # A short change-detector lag so that the 12 s replay has z-scores to compare.
    return dataclasses.replace(
        config,
        kafka=dataclasses.replace(config.kafka, bootstrap=bootstrap),
        metrics=dataclasses.replace(config.metrics, zscore_lag=10, long_flow_ttl_ns=1_500_000_000),
    )


def config_file(repo: Path, bootstrap: str, topics: dict[str, str], path: Path) -> Path:
    """`config_for`'s config as a file, for a process of its own, on the test's topics."""
    text = (repo / "config" / "testbed.toml").read_text().replace("127.0.0.1:9092", bootstrap)
    text = re.sub(r"^zscore_lag = .*$", "zscore_lag = 10", text, count=1, flags=re.M)
    text = re.sub(r'^long_flow_ttl = "10s"', 'long_flow_ttl = "1500ms"', text, count=1, flags=re.M)
    names = "".join(f'{stream} = "{topic}"\n' for stream, topic in topics.items())
    path.write_text(f"{text}\n[kafka.topics]\n{names}")
    assert load_config(path).metrics == config_for(repo, bootstrap).metrics
    return path


def _flow(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["src_ip"], r["src_port"], r["dst_ip"], r["dst_port"], r["protocol"])


def expected(records: list[dict[str, Any]], config: Config) -> list[dict[str, Any]]:
    """Every window's metrics from the definitions in streaming-jobs/README.md."""
    window = config.flink.window_ns
    link = config.links[0]
    m = config.metrics
    counters: dict[int, list[dict[str, Any]]] = defaultdict(list)
    samples: dict[int, dict[tuple[Any, ...], list[int]]] = defaultdict(lambda: defaultdict(list))
    events: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        # Windows hold whole export intervals: a sample or an event is in the window of its
        # interval's record, the window of its own time.
        if r["kind"] == "link_counters":
            counters[(r["ts_ns"] - r["interval_ns"]) // window].append(r)
        elif r["kind"] == "rtt_sample":
            samples[r["ts_ns"] // window][_flow(r)].append(r["rtt_ns"])
        elif r["kind"] == "long_flow":
            events[r["ts_ns"] // window].append(r)

    out = []
    srtt = loss_ewma = delay_ewma = None
    minima: list[tuple[int, int]] = []
    active: dict[tuple[Any, ...], int] = {}
    detect = ChangeDetector(m)
    for w in sorted(counters):
        end = (w + 1) * window
        flows = samples.get(w, {})
        hmean = len(flows) / sum(1 / (sum(v) / len(v)) for v in flows.values()) if flows else None
        if hmean is not None:
            srtt = hmean if srtt is None else m.srtt_alpha * srtt + (1 - m.srtt_alpha) * hmean
        if flows:
            minima.append((end, min(min(v) for v in flows.values())))
        horizon = [v for t, v in minima if t > end - m.rtt_min_horizon_ns]
        for e in sorted(events.get(w, []), key=lambda e: e["ts_ns"]):
            if e["event"] == "start":
                active.setdefault(_flow(e), e["ts_ns"])
            else:
                active.pop(_flow(e), None)
        for f in flows:
            if f in active:
                active[f] = end
        active = {f: seen for f, seen in active.items() if seen >= end - m.long_flow_ttl_ns}
        c = counters[w]
        data = sum(x["data_packets"] for x in c)
        retrans = sum(x["retransmissions"] for x in c)
        loss = retrans / data if data else 0.0
        loss_ewma = (
            loss if loss_ewma is None else m.loss_alpha * loss_ewma + (1 - m.loss_alpha) * loss
        )
        qd_n = sum(x["queue_delay_samples"] for x in c)
        delay = sum(x["queue_delay_sum_ns"] for x in c) / qd_n if qd_n else None
        if delay is not None:
            delay_ewma = (
                delay
                if delay_ewma is None
                else m.queue_delay_alpha * delay_ewma + (1 - m.queue_delay_alpha) * delay
            )
        f_value = -(
            link.weight_loss * loss / link.max_loss
            + link.weight_delay * (delay or 0) / link.max_queue_delay_ns
        )
        # The smoothed z-score of f: the one Python detector, which the shared test vector
        # ties to its definition and to the job's Java one (tests/unit/test_change_detector.py).
        zscore, change = detect(f_value)
        # Utilisation is what the link carried (after tap); the offered load is the before
        # tap's, which exceeds it while the queue grows or the router drops.
        carried = sum(x["after_bytes"] for x in c) * 8 / (window / 1e9)
        offered = sum(x["bytes"] for x in c) * 8 / (window / 1e9)
        out.append(
            {
                "window_start_ns": w * window,
                "window_end_ns": end,
                "rtt_samples": sum(len(v) for v in flows.values()),
                "rtt_flows": len(flows),
                "rtt_hmean_ns": None if hmean is None else round(hmean),
                "srtt_ns": None if srtt is None else round(srtt),
                "rtt_min_ns": min(horizon) if horizon else None,
                "long_flows": len(active),
                "data_packets": data,
                "retransmissions": retrans,
                "loss_rate": loss,
                "loss_rate_ewma": loss_ewma,
                "queue_delay_samples": qd_n,
                "queue_delay_ns": None if delay is None else round(delay),
                "queue_delay_ewma_ns": None if delay_ewma is None else round(delay_ewma),
                "throughput_bps": round(carried),
                "utilisation": carried / link.capacity_bps,
                "offered_bps": round(offered),
                "offered_utilisation": offered / link.capacity_bps,
                "f": f_value,
                "zscore": zscore,
                "change": change,
            }
        )
    return out


def interval_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's records as the exporter sends them: per link and export interval, one
    LinkCounters record with the interval's counters, flow events and RTT samples."""
    interval_ns = next(r["interval_ns"] for r in records if r["kind"] == "link_counters")
    assembler = IntervalAssembler(interval_ns)
    out = []
    for r in records:
        body = {k: v for k, v in r.items() if k not in ("kind", "link_id")}
        if r["kind"] == "rtt_sample":
            out += assembler.add_sample(r["link_id"], body)
        elif r["kind"] == "long_flow":
            assembler.add_event(r["link_id"], {**body, "kind": body["event"]})
        elif r["kind"] == "link_counters":
            counts = {k: r[k] for k in COUNT_FIELDS}
            out += assembler.close(r["link_id"], r["ts_ns"], r["interval_ns"], counts)
    return out + assembler.close_all()


def produce(
    bootstrap: str,
    topics: dict[str, str],
    records: list[dict[str, Any]],
) -> None:
    producer = RecordProducer(bootstrap, topics)
    for record in interval_records(records):
        producer.produce("link_counters", record)
    assert producer.flush(30) == 0


def consume(
    bootstrap: str,
    topics: dict[str, str],
    count: int,
    group: str,
    linger_s: float = 0.0,
    stream: str = "link_metrics",
    partitions: dict[str, set[int]] | None = None,
) -> list[dict[str, Any]]:
    """`count` metrics records (read committed) of `stream`, and whatever else arrives within
    `linger_s` after them (duplicates would); `partitions` gets each link's partitions."""
    consumer = RecordConsumer(bootstrap, group, [stream], topics)
    got: list[dict[str, Any]] = []

    def take(received: Received | None) -> None:
        if received is not None:
            got.append(received.record)
            if partitions is not None:
                partitions.setdefault(received.record["link_id"], set()).add(received.partition)

    deadline = time.monotonic() + 120
    try:
        while len(got) < count and time.monotonic() < deadline:
            take(consumer.poll(1.0))
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline:
            take(consumer.poll(max(0.0, deadline - time.monotonic())))
    finally:
        consumer.close()
    assert consumer.stats.malformed == 0
    return got


def assert_windows_match(
    got: list[dict[str, Any]], want: list[dict[str, Any]], link_id: str = LINK
) -> None:
    """Every window of `link_id` once, none missing, each value as computed (counts exact,
    floats 1e-9)."""
    got = sorted(got, key=lambda r: r["window_start_ns"])
    starts = [g["window_start_ns"] for g in got]
    wanted = [e["window_start_ns"] for e in want]
    assert starts == wanted, {
        "got": len(starts),
        "want": len(wanted),
        "missing": sorted(set(wanted) - set(starts)),
        "unexpected": sorted(set(starts) - set(wanted)),
        "duplicated": len(starts) - len(set(starts)),
    }
    for g, e in zip(got, want, strict=True):
        assert g["link_id"] == link_id
        wrong = {k: (g[k], v) for k, v in e.items() if not same_value(g[k], v)}
        assert not wrong, (e["window_start_ns"], wrong)
