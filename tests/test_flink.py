"""A PyFlink job in the embedded MiniCluster reads one p4bs topic and writes another, with
the tables derived from the Avro schemas: Flink's bytes and the p4bs codec's must agree."""

from __future__ import annotations

import time

from p4bs.bus import RecordConsumer, RecordProducer
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import kafka_table_ddl, table_environment

SAMPLES = [
    {
        "link_id": f"r1:eth{i % 2}",
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


def test_flink_job_reads_a_topic_and_writes_one(stack: Stack, topics: dict[str, str]) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    for sample in SAMPLES:
        producer.produce("rtt_samples", sample)
    assert producer.flush(30) == 0

    # The job writes RttSample records (RTTs >= 20.00002 ms, doubled) to a second topic: the
    # per-test topic named for link counters, unused otherwise in this test.
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
        "INSERT INTO samples_out SELECT link_id, ts_ns, src_ip, dst_ip, src_port, dst_port, "
        "protocol, rtt_ns * 2 FROM samples_in WHERE rtt_ns >= 20000020"
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
        (s["link_id"], s["src_port"], s["rtt_ns"] * 2) for s in SAMPLES if s["rtt_ns"] >= 20_000_020
    }
    assert len(expected) == 30
    assert {
        (r.record["link_id"], r.record["src_port"], r.record["rtt_ns"]) for r in got
    } == expected
    assert all(r.key == r.record["link_id"] for r in got)  # the sink keys by link too
    assert consumer.stats.malformed == 0
