"""The metrics job on the recorded replay against an independent computation (replay.py)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer
from feedrule import holds_heartbeat, thinned
from pyflink.table import EnvironmentSettings, TableEnvironment
from replay import (
    EMPTY_COUNTERS,
    LINK,
    assert_windows_match,
    config_for,
    consume,
    expected,
    produce,
    replay,
)

from p4bs.bus import RecordConsumer, RecordProducer, read_stream
from p4bs.config import LinkConfig
from p4bs.links import DEFAULT_LEAD_NS
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import flink_configuration
from p4bs_jobs.metrics import INTERVAL_SUMMARY_CLASS, INTERVAL_TIME_CLASS, run_metrics_job
from p4bs_schemas.registry import STREAMS, current_schema


def test_every_window_matches_an_independent_computation(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    records = replay()
    config = config_for(repo, stack.kafka.bootstrap)
    want = expected(records, config)
    assert sum(e["long_flows"] > 0 for e in want) > 20  # the replay exercises every part
    assert any(e["retransmissions"] for e in want) and any(e["change"] for e in want)
    # The router dropped part of what arrived: what the link carried (utilisation, from the
    # after tap) is less than the offered load (from the before tap).
    assert sum(e["throughput_bps"] for e in want) < sum(e["offered_bps"] for e in want)
    assert any(e["offered_utilisation"] > e["utilisation"] + 0.01 for e in want)
    # Bad interval records first, in the first window and in the replay's partition: counted
    # and skipped, they change nothing (a record with a plausible time reaches the window).
    first_end = (min(r["ts_ns"] for r in records) // 100_000_000 + 1) * 100_000_000
    bad = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    for value in (
        _interval(first_end, 1, [0, 0], [1], retransmissions=5),  # columns of different lengths
        _interval(first_end, 1, [3], [1]),  # a sample of a flow the record does not list
        _interval(first_end, 1, [0], [1], retransmissions=5)[:-2],  # cut short
        # A flow event's address holding ',' and ' ' (the job once split events' text on them)
        _interval(first_end, 1, [0], [1], ("start",), src_ip="10.0.1.2, 6", retransmissions=5),
        _interval(first_end, 1, [0], [-1], retransmissions=5),  # a negative RTT
        _interval(first_end, 1, [], [], data_packets=-1),  # a negative count
        b"not avro",
        None,
    ):
        bad.produce(topics["link_counters"], value, LINK)
    assert bad.flush(30) == 0
    produce(stack.kafka.bootstrap, topics, records)

    conf = flink_configuration(
        checkpoint_interval_ns=1_000_000_000, checkpoint_dir=tmp_path / "checkpoints"
    )
    run_metrics_job(config, topics, conf, group_id="metrics-test", bounded=True).wait(300_000)

    assert_windows_match(consume(stack.kafka.bootstrap, topics, len(want), "reader"), want)


def _spec(
    like: LinkConfig, link_id: str, ts_ns: int, capacity_bps: int, removed: bool = False
) -> dict[str, Any]:
    """A LinkSpec record: `like`'s weights and SLA bounds, this id, time and capacity."""
    return {
        "link_id": link_id,
        "ts_ns": ts_ns,
        "removed": removed,
        "capacity_bps": capacity_bps,
        "max_queue_delay_ns": like.max_queue_delay_ns,
        "max_loss": like.max_loss,
        "weight_loss": like.weight_loss,
        "weight_delay": like.weight_delay,
        "config": "{}",
    }


def test_links_topic_adds_changes_and_removes_links_in_a_running_job(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """The replay on the config's link r1:eth1 and, relabelled, on r9:eth9, which the config
    does not have. The links topic adds r9:eth9 a minute before its traffic (with r1's
    figures), halves r1:eth1's capacity 4 s into the replay and removes it at 8 s: r9's
    windows are the reference's, all of them and nothing for the minute its spec waited
    alone; r1's are the reference's until 4 s, then with twice the utilisation, and none
    from 8 s. One bounded run of the job: the links come as data, not at a restart.

    Before them, records the job must pass over without stopping or taking them: bytes that
    are not Avro, a spec cut short, a tombstone, specs of r1:eth1 with a NaN p-hat, a zero
    capacity, p-hat 0 (each would have made r1's windows NaN or infinite), and a link id
    holding ',' and ' ' (its traffic gives no window). r8:eth8's spec is valid but its
    weights (1e308) make f infinite wherever loss or delay is not 0: those windows give no
    row, the rest theirs (f = 0)."""
    records = replay()
    config = config_for(repo, stack.kafka.bootstrap)
    link = config.links[0]
    first = min(r["ts_ns"] for r in records)
    window = config.flink.window_ns
    halved_from = (first + 4_000_000_000) // window * window
    removed_from = (first + 8_000_000_000) // window * window
    want_r1 = expected(records, config)
    want_r9 = expected(records, config)
    assert want_r1[0]["window_start_ns"] < halved_from < removed_from
    assert want_r1[-1]["window_start_ns"] > removed_from

    odd_id, r8 = "r7, x:eth7", "r8:eth8"
    # The first 3 s, cut after an interval's counters: samples past them would be closed into
    # an interval of their own with no counters, a window the reference does not have and the
    # job keeps or drops as late depending on the partitions' watermarks.
    cut = max(
        i
        for i, r in enumerate(records)
        if r["kind"] == "link_counters" and r["ts_ns"] < first + 3_000_000_000
    )
    early = records[: cut + 1]
    want_r8 = [
        w for w in expected(early, config) if w["loss_rate"] == 0 and not w["queue_delay_ns"]
    ]
    assert 0 < len(want_r8) < len(expected(early, config))
    cut_short = _spec_bytes(_spec(link, LINK, first + 1, 1))[:-5]
    bad = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    for key, value in (
        (LINK, b"not avro"),
        (LINK, cut_short),
        (LINK, None),
        (LINK, _spec_bytes({**_spec(link, LINK, first + 1, 1), "max_loss": math.nan})),
        (LINK, _spec_bytes(_spec(link, LINK, first + 2, 0))),
        (LINK, _spec_bytes({**_spec(link, LINK, first + 3, 1), "max_loss": 0.0})),
        (odd_id, _spec_bytes(_spec(link, odd_id, first - 60_000_000_000, link.capacity_bps))),
        (
            r8,
            _spec_bytes(
                {
                    **_spec(link, r8, first - 60_000_000_000, link.capacity_bps),
                    "weight_loss": 1e308,
                    "weight_delay": 1e308,
                }
            ),
        ),
    ):
        bad.produce(topics["links"], value, key)
    assert bad.flush(30) == 0
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    for record in (
        _spec(link, "r9:eth9", first - 60_000_000_000, link.capacity_bps),
        _spec(link, LINK, halved_from + 1, link.capacity_bps // 2),
        _spec(link, LINK, removed_from + 1, link.capacity_bps // 2, removed=True),
    ):
        producer.produce("links", record)
    assert producer.flush(30) == 0
    # Both links' records in time order: a partition's watermark follows the newest record.
    relabelled = [{**r, "link_id": "r9:eth9"} for r in records]
    relabelled += [{**r, "link_id": link_id} for r in early for link_id in (odd_id, r8)]
    both = sorted(records + relabelled, key=lambda r: r["ts_ns"])
    produce(stack.kafka.bootstrap, topics, both)

    conf = flink_configuration(
        checkpoint_interval_ns=1_000_000_000, checkpoint_dir=tmp_path / "checkpoints"
    )
    run_metrics_job(config, topics, conf, group_id="links-test", bounded=True).wait(300_000)

    kept_r1 = [w for w in want_r1 if w["window_start_ns"] < removed_from]
    count = len(kept_r1) + len(want_r9) + len(want_r8)
    got = consume(stack.kafka.bootstrap, topics, count, "reader", 2.0)
    by_link: dict[str, list[dict[str, Any]]] = {}
    for record in got:
        by_link.setdefault(record["link_id"], []).append(record)
    assert set(by_link) == {LINK, "r9:eth9", r8}
    assert sorted(w["window_start_ns"] for w in by_link[r8]) == [
        w["window_start_ns"] for w in want_r8
    ]
    assert all(w["f"] == 0 and math.isfinite(w["zscore"]) for w in by_link[r8])
    assert_windows_match(by_link["r9:eth9"], want_r9, link_id="r9:eth9")
    assert_windows_match(
        by_link[LINK],
        [
            w
            if w["window_start_ns"] < halved_from
            else {
                **w,
                "utilisation": 2 * w["utilisation"],
                "offered_utilisation": 2 * w["offered_utilisation"],
            }
            for w in kept_r1
        ],
    )


def test_a_link_applied_while_the_job_runs_live_has_windows_until_it_is_removed(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """The job live (unbounded, idle sources let go after `source_idle_timeout`), counters of
    the config's link and of r9:eth9, which the config lacks, every window as it ends. No
    window of r9:eth9 until a LinkSpec adds it (20 Mbit/s: its 10 Mbit/s read as 50%
    utilisation), then every window from the one its ts_ns falls in, none from its removal:
    the links topic reaches the running job, no restart. Each spec is stamped as `p4bs links
    apply` stamps it, the default lead ahead, from a fresh producer (whose first record took
    0.5 s to deliver: stamped at the moment it was sent, the job dropped it as late)."""
    config = config_for(repo, stack.kafka.bootstrap)
    link = config.links[0]
    window = config.flink.window_ns
    bootstrap = stack.kafka.bootstrap
    stop = threading.Event()

    def traffic() -> None:
        producer = RecordProducer(bootstrap, topics)
        end, seq = (time.time_ns() // window + 1) * window, 0
        while not stop.is_set():
            time.sleep(max(0.0, (end - time.time_ns()) / 1e9))  # paces the traffic
            for link_id in (link.id, "r9:eth9"):
                counters = {
                    **EMPTY_COUNTERS,
                    "link_id": link_id,
                    "ts_ns": end,
                    "interval_ns": window,
                    "seq": seq,
                    "packets": 100,
                    "bytes": 125_000,
                    "after_packets": 100,
                    "after_bytes": 125_000,
                }
                producer.produce("link_counters", counters)
            end, seq = end + window, seq + 1
        assert producer.flush(30) == 0

    sender = threading.Thread(target=traffic, name="traffic")
    sender.start()
    conf = flink_configuration(
        checkpoint_interval_ns=500_000_000, checkpoint_dir=tmp_path / "checkpoints"
    )
    result = run_metrics_job(config, topics, conf, group_id="live-links", bounded=False)
    reader = RecordConsumer(bootstrap, "live-reader", ["link_metrics"], topics)
    got: dict[str, list[dict[str, Any]]] = {link.id: [], "r9:eth9": []}

    def read_until(condition: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            received = reader.poll(0.5)
            if received is not None:
                got[received.record["link_id"]].append(received.record)
            if condition():
                return True
        return False

    def seen_past(ts_ns: int) -> Callable[[], bool]:
        return lambda: any(w["window_start_ns"] > ts_ns for w in got[link.id])

    try:
        assert read_until(lambda: bool(got[link.id]), 120), "no window of the config's link"
        added_ns = time.time_ns() + DEFAULT_LEAD_NS
        producer = RecordProducer(bootstrap, topics)
        producer.produce("links", _spec(link, "r9:eth9", added_ns, 20_000_000))
        assert producer.flush(30) == 0 and time.time_ns() < added_ns
        assert read_until(seen_past(added_ns + 3_000_000_000), 60)
        removed_ns = time.time_ns() + DEFAULT_LEAD_NS
        producer = RecordProducer(bootstrap, topics)
        producer.produce("links", _spec(link, "r9:eth9", removed_ns, 20_000_000, removed=True))
        assert producer.flush(30) == 0 and time.time_ns() < removed_ns
        assert read_until(seen_past(removed_ns + 3_000_000_000), 60)
    finally:
        stop.set()
        sender.join()
        reader.close()
        result.get_job_client().cancel()
    added_from = added_ns // window * window
    removed_from = removed_ns // window * window
    starts = sorted(w["window_start_ns"] for w in got["r9:eth9"])
    assert starts and starts[0] == added_from, (starts[:3], added_from)
    assert starts == list(range(added_from, removed_from, window))
    assert all(w["utilisation"] == pytest.approx(0.5) for w in got["r9:eth9"])


def _interval(
    ts_ns: int,
    flows: int,
    flow_index: list[int],
    rtt_ns: list[int],
    events: tuple[str, ...] = (),
    src_ip: str | None = None,
    **counts: int,
) -> bytes:
    """A LinkCounters record's Avro bytes as written, without the codec's checks: 100 ms to
    ts_ns, these samples of `flows` flows (the first from `src_ip` if given), an event per
    kind in `events` (of flow 0) and these counts (others 0)."""
    flow_list = [
        {"src_ip": f"10.0.1.{2 + f}", "dst_ip": "10.0.2.2", "src_port": 40000 + f,
         "dst_port": 5201, "protocol": 6}
        for f in range(flows)
    ]  # fmt: skip
    if src_ip is not None:
        flow_list[0]["src_ip"] = src_ip
    record = {
        **EMPTY_COUNTERS,
        **counts,
        "link_id": LINK,
        "ts_ns": ts_ns,
        "flow_events": [
            {
                "ts_ns": ts_ns - 1000,
                "kind": kind,
                "reason": "threshold",
                "packets": 1,
                **flow_list[0],
            }
            for kind in events
        ],
        "flows": flow_list,
        "flow_index": flow_index,
        "offset_ns": [0] * len(flow_index),
        "rtt_ns": rtt_ns,
    }
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(STREAMS["link_counters"])), record)
    return out.getvalue()


def _spec_bytes(spec: dict[str, Any]) -> bytes:
    """A LinkSpec record's Avro bytes as written, without the codec's checks."""
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(STREAMS["links"])), spec)
    return out.getvalue()


def _bytes_sql(value: bytes) -> str:
    return f"CAST(X'{value.hex()}' AS BYTES)"


def test_interval_records_are_read_from_their_bytes_and_bad_ones_are_skipped() -> None:
    """The job reads interval records as raw bytes, without the codec's checks: a sample
    that names a flow the record does not list is skipped, a record that does not decode
    (cut short, sample columns of different lengths, a byte left over, not Avro) adds
    nothing, none of its counts either, and a header that does not decode gets event time 0
    (the job's filter); the rest of the window counts: counts summed, events listed."""
    settings = EnvironmentSettings.new_instance().in_batch_mode()
    env = TableEnvironment.create(settings.with_configuration(flink_configuration()).build())
    env.create_java_temporary_system_function("INTERVAL_SUMMARY", INTERVAL_SUMMARY_CLASS)
    env.create_java_temporary_system_function("INTERVAL_TIME", INTERVAL_TIME_CLASS)
    ts_ns = 1_700_000_000_100_000_000
    counts = {"bytes": 3000, "after_bytes": 2000, "data_packets": 2, "retransmissions": 1}
    counts |= {"queue_delay_samples": 2, "queue_delay_sum_ns": 50}
    # The last two samples: no such flow.
    good = _interval(ts_ns, 2, [0, 1, 0, 2, -1], [10, 40, 30, 99, 99], ("start",), **counts)
    records = [
        good,
        _interval(ts_ns, 2, [1, 1], [20], **counts),  # sample columns of different lengths
        _interval(ts_ns, 2, [1], [5], ("end",), **counts),
        good[:-3],  # cut short
        good + b"\0",  # a byte after the last field
        b"not avro",
    ]
    rows = " UNION ALL ".join(f"SELECT {_bytes_sql(b)} AS record" for b in records)
    times = f"SELECT INTERVAL_TIME(record) FROM ({rows})"
    with env.sql_query(times).execute().collect() as results:
        got_times = [row[0] for row in results]
    # The header (link, ts_ns, interval_ns) is all the event time reads.
    assert got_times == [(ts_ns - 1) // 1_000_000] * 5 + [0]
    summary = f"SELECT INTERVAL_SUMMARY(record) FROM ({rows})"
    with env.sql_query(summary).execute().collect() as results:
        ((window,),) = list(results)
    samples, flows_seen, inverse_sum, min_ns, flow_keys, *sums, events = window
    assert (samples, flows_seen, min_ns) == (4, 2, 5)
    assert inverse_sum == pytest.approx(2 / 40 + 2 / 45)  # per flow: samples / sum of RTTs
    assert list(flow_keys) == ["10.0.1.2:40000>10.0.2.2:5201/6", "10.0.1.3:40001>10.0.2.2:5201/6"]
    assert sums == [2 * n for n in counts.values()]  # the two records that decode
    flow = "10.0.1.2:40000>10.0.2.2:5201/6"
    assert sorted(tuple(e) for e in events) == [
        (ts_ns - 1000, False, flow),
        (ts_ns - 1000, True, flow),
    ]


def test_the_optimizer_feed_holds_every_window_that_can_matter_and_no_other(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """[metrics] optimizer_feed on, the replay on four links: r1:eth1 of the config, GLOBECOM
    (thinned), r1:eth2 of the config, P4BS (every window), r9:eth9 of the links topic, its
    config naming GLOBECOM (thinned), and r8:eth8 of the links topic, its config not JSON
    (every window). The feed holds, per link, exactly the windows of its link_metrics that
    the rule (tests/feedrule.py, recomputed here over those windows and the run's SLA alerts)
    selects for a thinned link, and all of them for the others, each the same record."""
    records = replay()
    base = config_for(repo, stack.kafka.bootstrap)
    link = base.links[0]
    config = dataclasses.replace(
        base,
        links=(
            dataclasses.replace(link, policy="globecom", policy_options={}),
            dataclasses.replace(link, interface="eth2"),  # P4BS
        ),
        metrics=dataclasses.replace(base.metrics, optimizer_feed=True),
    )
    thinned_ids = {LINK, "r9:eth9"}
    first = min(r["ts_ns"] for r in records)
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    for link_id, link_config in (("r9:eth9", {"policy": "globecom"}), ("r8:eth8", None)):
        spec = _spec(link, link_id, first - 60_000_000_000, link.capacity_bps)
        spec["config"] = "policy = 'p4bs'" if link_config is None else json.dumps(link_config)
        producer.produce("links", spec)
    assert producer.flush(30) == 0
    link_ids = (LINK, "r1:eth2", "r9:eth9", "r8:eth8")
    relabelled = [{**r, "link_id": link_id} for r in records for link_id in link_ids]
    produce(stack.kafka.bootstrap, topics, sorted(relabelled, key=lambda r: r["ts_ns"]))

    conf = flink_configuration(
        checkpoint_interval_ns=1_000_000_000, checkpoint_dir=tmp_path / "checkpoints"
    )
    run_metrics_job(config, topics, conf, group_id="feed-test", bounded=True).wait(300_000)

    want = expected(records, config)
    windows: dict[str, list[dict[str, Any]]] = {link_id: [] for link_id in link_ids}
    metrics_partitions: dict[str, set[int]] = {}
    for record in consume(
        stack.kafka.bootstrap, topics, 4 * len(want), "reader", 2.0, partitions=metrics_partitions
    ):
        windows[record["link_id"]].append(record)
    for link_id in link_ids:
        assert_windows_match(windows[link_id], want, link_id=link_id)
        windows[link_id].sort(key=lambda r: r["window_start_ns"])
    alert_ends: dict[str, set[int]] = {link_id: set() for link_id in link_ids}
    for alert in read_stream(stack.kafka.bootstrap, "sla_alerts", topics, idle_s=5.0):
        alert_ends[alert["link_id"]].add(alert["ts_ns"])
    m = config.metrics
    want_feed = {
        link_id: thinned(
            windows[link_id],
            alert_ends[link_id],
            deadband=m.feed_deadband,
            heartbeat_ns=m.feed_heartbeat_ns,
        )
        if link_id in thinned_ids
        else windows[link_id]
        for link_id in link_ids
    }
    count = sum(map(len, want_feed.values()))
    feed: dict[str, list[dict[str, Any]]] = {link_id: [] for link_id in link_ids}
    feed_partitions: dict[str, set[int]] = {}
    for record in consume(
        stack.kafka.bootstrap,
        topics,
        count,
        "feed-reader",
        2.0,
        stream="optimizer_feed",
        partitions=feed_partitions,
    ):
        feed[record["link_id"]].append(record)
    # Co-partitioned: a link's windows in the feed sit in the partition of its link_metrics
    # (so the optimizer's changelog partition is the same whichever it reads).
    assert feed_partitions == metrics_partitions
    assert all(len(p) == 1 for p in feed_partitions.values())
    for link_id in link_ids:
        got = sorted(feed[link_id], key=lambda r: r["window_start_ns"])
        assert got == want_feed[link_id], link_id
    # The rule thinned: fewer windows, and not only the heartbeats (N and SRTT move in the
    # replay).
    held = want_feed[LINK]
    assert len(held) < len(want) / 2
    heartbeats = [w for w in held if holds_heartbeat(w, m.feed_heartbeat_ns)]
    assert len(heartbeats) + 1 < len(held)
