"""A PyFlink job in the embedded MiniCluster reads one p4bs topic and writes another, with
the tables derived from the Avro schemas: Flink's bytes and the p4bs codec's must agree, for
arrays of records (flows, flow events) and arrays of numbers (the RTT sample columns) too."""

from __future__ import annotations

import time

from p4bs.bus import RecordConsumer, RecordProducer
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import kafka_table_ddl, table_environment
from p4bs_schemas.intervals import NO_COUNTS, IntervalAssembler
from p4bs_schemas.registry import STREAMS, current_schema

# Two links, three flows each, every flow with several samples.
SAMPLES = [
    {
        "ts_ns": 1_700_000_000_000_000_000 + i * 1_000_000,
        "src_ip": "10.0.1.2",
        "dst_ip": "10.0.2.2",
        "src_port": 40000 + i % 6,
        "dst_port": 5201,
        "protocol": 6,
        "rtt_ns": 20_000_000 + i,
    }
    for i in range(50)
]
INTERVAL_NS = 10_000_000


def _intervals() -> list[dict[str, object]]:
    """The samples of two links in records of at most 4 samples, each interval with a flow
    event and counts."""
    assembler = IntervalAssembler(INTERVAL_NS, max_samples=4)
    records = []
    for i, sample in enumerate(SAMPLES):
        link = f"r1:eth{i % 2}"
        records += assembler.add_sample(link, sample)
        if i % 10 == 9:
            end = sample["ts_ns"] // INTERVAL_NS * INTERVAL_NS + INTERVAL_NS
            event = {**sample, "ts_ns": end - 1, "kind": "start", "reason": "threshold"}
            assembler.add_event(link, {**event, "packets": 500})
            records += assembler.close(link, end, INTERVAL_NS, {**NO_COUNTS, "packets": i})
    return records + assembler.close_all()


def test_flink_job_reads_a_topic_and_writes_one(stack: Stack, topics: dict[str, str]) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    records = _intervals()
    for record in records:
        producer.produce("link_counters", record)
    assert producer.flush(30) == 0

    # The job passes on the records whose first RTT is >= 20.00002 ms, seq + 1000, to a
    # second topic: the per-test topic named for link metrics, unused otherwise here.
    out_topics = {**topics, "link_counters": topics["link_metrics"]}
    env = table_environment()
    env.execute_sql(
        kafka_table_ddl(
            "intervals_in",
            "link_counters",
            topics["link_counters"],
            stack.kafka.bootstrap,
            options={
                "properties.group.id": "flink-test",
                "scan.startup.mode": "earliest-offset",
                "scan.bounded.mode": "latest-offset",
            },
        )
    )
    env.execute_sql(
        kafka_table_ddl(
            "intervals_out", "link_counters", out_topics["link_counters"], stack.kafka.bootstrap
        )
    )
    columns = ", ".join(
        "seq + 1000" if f["name"] == "seq" else f"`{f['name']}`"
        for f in current_schema(STREAMS["link_counters"])["fields"]
    )
    result = env.execute_sql(
        f"INSERT INTO intervals_out SELECT {columns} FROM intervals_in WHERE rtt_ns[1] >= 20000020"
    )
    result.wait(240_000)

    expected = [
        {**r, "seq": r["seq"] + 1000}
        for r in records
        if r["rtt_ns"] and r["rtt_ns"][0] >= 20_000_020
    ]
    # Several flows in a record, flows with several samples in it, records with events.
    assert any(1 < len(r["flows"]) < len(r["rtt_ns"]) for r in expected)
    assert any(r["flow_events"] for r in expected) and not all(r["complete"] for r in expected)
    consumer = RecordConsumer(
        stack.kafka.bootstrap, "flink-test-out", ["link_counters"], out_topics
    )
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(expected) and time.monotonic() < deadline:
            received = consumer.poll(1.0)
            if received is not None:
                got.append(received)
    finally:
        consumer.close()
    assert consumer.stats.malformed == 0
    assert all(r.key == r.record["link_id"] for r in got)  # the sink keys by link too
    by_link = sorted(expected, key=lambda r: r["link_id"])  # a link's order is kept
    assert sorted((r.record for r in got), key=lambda r: r["link_id"]) == by_link
