"""A PyFlink job in the embedded MiniCluster reads one p4bs topic and writes another, with
the tables derived from the Avro schemas: Flink's bytes and the p4bs codec's must agree, for
arrays of records and arrays of numbers (the columns of RTT sample batches) too."""

from __future__ import annotations

import time

from p4bs.bus import RecordConsumer, RecordProducer
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import kafka_table_ddl, table_environment
from p4bs_schemas.rtt_batch import RttBatcher

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


def test_flink_job_reads_a_topic_and_writes_one(stack: Stack, topics: dict[str, str]) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    batcher = RttBatcher(interval_ns=10_000_000, max_samples=4)
    batches = [b for i, s in enumerate(SAMPLES) for b in batcher.add(f"r1:eth{i % 2}", s)]
    batches += batcher.close()
    for batch in batches:
        producer.produce("rtt_samples", batch)
    assert producer.flush(30) == 0

    # The job passes on the batches whose first RTT is >= 20.00002 ms, one interval later,
    # to a second topic: the per-test topic named for link counters, unused otherwise here.
    out_topics = {**topics, "rtt_samples": topics["link_counters"]}
    env = table_environment()
    env.execute_sql(
        kafka_table_ddl(
            "batches_in",
            "rtt_samples",
            topics["rtt_samples"],
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
            "batches_out", "rtt_samples", out_topics["rtt_samples"], stack.kafka.bootstrap
        )
    )
    result = env.execute_sql(
        "INSERT INTO batches_out SELECT link_id, ts_ns + interval_ns, interval_ns, flows, "
        "flow_index, offset_ns, rtt_ns FROM batches_in WHERE rtt_ns[1] >= 20000020"
    )
    result.wait(240_000)

    expected = [
        {**b, "ts_ns": b["ts_ns"] + b["interval_ns"]}
        for b in batches
        if b["rtt_ns"][0] >= 20_000_020
    ]
    # Several flows in a batch, and flows with several samples in it.
    assert any(1 < len(b["flows"]) < len(b["rtt_ns"]) for b in expected)
    consumer = RecordConsumer(stack.kafka.bootstrap, "flink-test-out", ["rtt_samples"], out_topics)
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
    by_link = sorted(expected, key=lambda b: b["link_id"])  # a link's order is kept
    assert sorted((r.record for r in got), key=lambda b: b["link_id"]) == by_link
