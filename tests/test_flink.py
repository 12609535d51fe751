"""A PyFlink job in the embedded MiniCluster reads one p4bs topic and writes another, with
the tables derived from the Avro schemas: Flink's bytes and the p4bs codec's must agree, for
nested arrays of records (RTT sample batches) too."""

from __future__ import annotations

import time

from p4bs.bus import RecordConsumer, RecordProducer
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import kafka_table_ddl, table_environment
from p4bs_schemas.rtt_batch import RttBatcher, samples_of

SAMPLES = [
    {
        "ts_ns": 1_700_000_000_000_000_000 + i * 1_000_000,
        "src_ip": "10.0.1.2",
        "dst_ip": "10.0.2.2",
        "src_port": 40000 + i,
        "dst_port": 5201,
        "protocol": 6,
        "rtt_ns": 20_000_000 + i,
    }
    for i in range(50)
]
SAMPLE_FIELDS = ", ".join(SAMPLES[0])


def test_flink_job_reads_a_topic_and_writes_one(stack: Stack, topics: dict[str, str]) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    batcher = RttBatcher(interval_ns=10_000_000, max_samples=4)
    batches = [b for i, s in enumerate(SAMPLES) for b in batcher.add(f"r1:eth{i % 2}", s)]
    batches += batcher.close()
    for batch in batches:
        producer.produce("rtt_samples", batch)
    assert producer.flush(30) == 0

    # The job unnests the batches and writes each sample with RTT >= 20.00002 ms, doubled, as
    # a batch of one to a second topic: the per-test topic named for link counters, unused
    # otherwise in this test.
    out_topics = {**topics, "rtt_samples": topics["link_counters"]}
    env = table_environment()
    env.execute_sql(
        kafka_table_ddl(
            "samples_in",
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
            "samples_out", "rtt_samples", out_topics["rtt_samples"], stack.kafka.bootstrap
        )
    )
    result = env.execute_sql(
        "INSERT INTO samples_out SELECT link_id, b.ts_ns, interval_ns, "
        "ARRAY[ROW(s.ts_ns, src_ip, dst_ip, src_port, dst_port, protocol, rtt_ns * 2)] "
        f"FROM samples_in AS b CROSS JOIN UNNEST(samples) AS s({SAMPLE_FIELDS}) "
        "WHERE rtt_ns >= 20000020"
    )
    result.wait(240_000)

    consumer = RecordConsumer(stack.kafka.bootstrap, "flink-test-out", ["rtt_samples"], out_topics)
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 30 and time.monotonic() < deadline:
            received = consumer.poll(1.0)
            if received is not None:
                got.append(received)
    finally:
        consumer.close()
    expected = {
        (f"r1:eth{i % 2}", s["src_port"], s["rtt_ns"] * 2)
        for i, s in enumerate(SAMPLES)
        if s["rtt_ns"] >= 20_000_020
    }
    assert len(expected) == 30
    out = [sample for r in got for sample in samples_of(r.record)]
    assert {(s["link_id"], s["src_port"], s["rtt_ns"]) for s in out} == expected
    assert all(r.key == r.record["link_id"] for r in got)  # the sink keys by link too
    assert all(len(r.record["samples"]) == 1 for r in got)
    assert consumer.stats.malformed == 0
