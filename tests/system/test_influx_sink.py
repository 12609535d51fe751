"""The InfluxDB sink: records from Kafka become points a Grafana-style InfluxQL query reads
back; while InfluxDB cannot be reached it retries and commits nothing, so a later run writes
everything."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from p4bs import retention
from p4bs.bus import RecordProducer
from p4bs.config import InfluxConfig
from p4bs_infra.procs import free_ports, wait_until
from p4bs_infra.stack import Stack
from p4bs_sinks.influx_sink import InfluxSink, SinkStats

LINK = "r7:et-0/0/1"
WINDOW = 100_000_000
START = time.time_ns() // 10**9 * 10**9 - 3600 * 10**9  # within the stack's 48 h retention


def _metrics(i: int) -> dict[str, Any]:
    return {
        "link_id": LINK,
        "window_start_ns": START + i * WINDOW,
        "window_end_ns": START + (i + 1) * WINDOW,
        "rtt_samples": 100 + i,
        "rtt_flows": 4,
        "rtt_hmean_ns": 20_000_000 + i,
        "srtt_ns": 21_000_000 + i,
        "rtt_min_ns": 19_000_000,
        "long_flows": 4,
        "data_packets": 1000,
        "retransmissions": i % 3,
        "loss_rate": (i % 3) / 1000,
        "loss_rate_ewma": 0.001,
        "queue_delay_samples": 0 if i == 0 else 50,
        "queue_delay_ns": None if i == 0 else 1_000_000 * i,
        "queue_delay_ewma_ns": None if i == 0 else 900_000,
        "throughput_bps": 95_000_000,
        "utilisation": 0.95,
        # The offered load: null in a v1 window (the first), above the capacity later.
        "offered_bps": None if i == 0 else 101_000_000 + i,
        "offered_utilisation": None if i == 0 else 1.01,
        "f": -0.1 * i,
        "zscore": 0.0,
        "change": i == 7,
    }


def _run(sink: InfluxSink, until: Callable[[SinkStats], bool]) -> SinkStats:
    stop = threading.Event()
    worker = threading.Thread(target=sink.run, args=(stop,))
    worker.start()
    try:
        wait_until(lambda: until(sink.stats), 60)
    finally:
        stop.set()
        worker.join(30)
    return sink.stats


def test_points_read_back_and_nothing_is_lost_while_influxdb_is_away(
    stack: Stack, topics: dict[str, str]
) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    for i in range(20):
        producer.produce("link_metrics", _metrics(i))
    producer.produce(
        "sla_alerts",
        {
            "link_id": LINK,
            "ts_ns": START + 15 * WINDOW,
            "alert_id": f"{LINK}/queue_delay/1",
            "state": "raise",
            "kind": "queue_delay",
            "value": 12e6,
            "bound": 10e6,
            "windows": 5,
        },
    )
    producer.produce(
        "buffer_decisions",
        {
            "link_id": LINK,
            "ts_ns": START + 5 * WINDOW,
            "queue": 0,
            "policy": "stanford",
            "phase": "settled",
            "buffer_bytes": 125_000,
            "previous_buffer_bytes": None,
            "reason": "BDP/sqrt(N)",
            "trial": None,
            "outcome": "applied",
            "f": None,
        },
    )
    assert producer.flush(30) == 0
    settings = InfluxConfig(url=stack.influxdb.url, database=stack.influxdb.database)

    (nowhere,) = free_ports(1)
    away = dataclasses.replace(settings, url=f"http://127.0.0.1:{nowhere}")
    stats = _run(
        InfluxSink(away, stack.kafka.bootstrap, topics, group="sink-t"), lambda s: s.retries >= 2
    )
    assert stats.written == 0 and stats.retries >= 2 and stats.last_error

    # The windows are an hour old: too late for the continuous queries, so the sink makes
    # their per-second and per-minute rollups itself.
    stats = _run(
        InfluxSink(settings, stack.kafka.bootstrap, topics, group="sink-t"),
        lambda s: s.written >= 22 and s.late_rollups >= len(retention.ROLLUPS),
    )
    assert stats.written == 22 and stats.rejected == 0
    assert stats.late_rollups == len(retention.ROLLUPS)

    def query(q: str) -> list[list[Any]]:
        (series,) = stack.influxdb.query(q)
        return series.values

    db = f'"{stack.influxdb.database}"."autogen".'
    events = f'"{stack.influxdb.database}"."events".'  # alerts and decisions, kept longer
    where = f"\"link\" = '{LINK}' AND time >= {START} AND time < {START + 3 * 10**9}"
    rows = query(
        f'SELECT mean("srtt_ns"), sum("retransmissions"), count("queue_delay_ns") '
        f"FROM {db}link_metrics WHERE {where} GROUP BY time(1s)"
    )
    # A window's point is at its end: the first second holds windows 0-8, the next 9-18.
    assert [r[1:] for r in rows[:2]] == [
        [21_000_004, sum(i % 3 for i in range(9)), 8],
        [21_000_013.5, sum(i % 3 for i in range(9, 19)), 10],
    ]
    # The rollups the sink made of these late windows hold the same summaries.
    for rollup in retention.ROLLUPS:
        every = retention.influxql_duration_ns(rollup.every)
        first, last = START // every * every, START + every + 3 * 10**9
        span = f"\"link\" = '{LINK}' AND time >= {first} AND time < {last}"
        raw = query(
            f'SELECT mean("srtt_ns"), max("rtt_samples") FROM {db}link_metrics '
            f"WHERE {span} GROUP BY time({rollup.every}) fill(none)"
        )
        made = query(
            f'SELECT "mean_srtt_ns", "max_rtt_samples" FROM '
            f'"{stack.influxdb.database}"."{rollup.policy}".link_metrics WHERE {span}'
        )
        assert made == raw, rollup.policy
    # Carried and offered load side by side; the v1 window has no offered load.
    rows = query(
        f'SELECT "utilisation", "offered_utilisation", "offered_bps" '
        f"FROM {db}link_metrics WHERE {where} LIMIT 2"
    )
    assert [r[1:] for r in rows] == [[0.95, None, None], [0.95, 1.01, 101_000_001]]
    (change,) = query(f'SELECT "f" FROM {db}link_metrics WHERE {where} AND "change" = true')
    assert change[1] == -0.1 * 7  # the float exactly as produced
    (alert,) = query(
        f'SELECT "value", "alert_id" FROM {events}sla_alerts WHERE "kind" = \'queue_delay\''
    )
    assert alert[1:] == [12e6, f"{LINK}/queue_delay/1"]
    (decision,) = query(
        f'SELECT "buffer_bytes", "reason" FROM {events}buffer_decisions WHERE {where}'
    )
    assert decision[1:] == [125_000, "BDP/sqrt(N)"]
