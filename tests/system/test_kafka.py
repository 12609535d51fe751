"""Records through the real broker: encoded, keyed by link, decoded; bad ones dead-lettered."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from p4bs.bus import Received, RecordConsumer, RecordProducer, read_stream
from p4bs_infra.stack import Stack
from p4bs_schemas.codec import FINGERPRINT_HEADER, RecordError, codec
from p4bs_schemas.registry import current_schema


def rtt(link_id: str = "r1:eth1", rtt_ns: object = 20_000_000) -> dict[str, Any]:
    """A link interval's record with one RTT sample (the counts and flow events left to
    their defaults)."""
    flow = {"src_ip": "10.0.1.2", "dst_ip": "10.0.2.2", "src_port": 40000, "dst_port": 5201}
    counts = ("packets", "bytes", "data_packets", "data_bytes", "retransmissions")
    return {
        "link_id": link_id,
        "ts_ns": 1_700_000_000_100_000_000,
        "interval_ns": 100_000_000,
        "seq": 0,
        **dict.fromkeys(counts, 0),
        "queue_delay_samples": 0,
        "queue_delay_sum_ns": 0,
        "queue_delay_ewma_ns": 0,
        "flows": [{**flow, "protocol": 6}],
        "flow_index": [0],
        "offset_ns": [0],
        "rtt_ns": [rtt_ns],
    }


def _drain(consumer: RecordConsumer, want: int, timeout_s: float = 60.0) -> list[Received]:
    """Polls until `want` records arrived or the timeout passed."""
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        received = consumer.poll(1.0)
        if received is not None:
            got.append(received)
    return got


def test_record_produced_consumed_and_decoded(stack: Stack, topics: dict[str, str]) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    producer.produce("link_counters", rtt())
    producer.produce("link_counters", rtt("r2:eth0", 7))
    assert producer.flush(30) == 0
    assert producer.stats.delivered == 2

    consumer = RecordConsumer(stack.kafka.bootstrap, "test-roundtrip", ["link_counters"], topics)
    try:
        got = _drain(consumer, 2)
    finally:
        consumer.close()
    assert sorted((r.key, r.record["rtt_ns"][0]) for r in got) == [
        ("r1:eth1", 20_000_000),
        ("r2:eth0", 7),
    ]
    assert {r.record["link_id"] for r in got} == {r.key for r in got}


def test_malformed_record_goes_to_dead_letters_and_consumer_keeps_going(
    stack: Stack, topics: dict[str, str]
) -> None:
    topic = topics["link_counters"]
    raw = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    good = codec("LinkCounters").encode(rtt())
    garbage = b"\xff\xfe not avro"
    # Fits the schema, but its sample's flow is not in the record.
    no_flow = io.BytesIO()
    schemaless_writer(no_flow, parse_schema(current_schema("LinkCounters")), rtt() | {"flows": []})
    # One partition (same key) keeps the order: good, garbage, wrong fingerprint, no flow, good.
    raw.produce(topic, good, b"r1:eth1")
    raw.produce(topic, garbage, b"r1:eth1")
    raw.produce(topic, good, b"r1:eth1", headers=[(FINGERPRINT_HEADER, b"deadbeefdeadbeef")])
    raw.produce(topic, no_flow.getvalue(), b"r1:eth1")
    raw.produce(topic, codec("LinkCounters").encode(rtt(rtt_ns=99)), b"r1:eth1")
    assert raw.flush(30) == 0

    consumer = RecordConsumer(stack.kafka.bootstrap, "test-dlq", ["link_counters"], topics)
    try:
        got = _drain(consumer, 2)
    finally:
        consumer.close()
    assert [r.record["rtt_ns"][0] for r in got] == [20_000_000, 99]
    assert consumer.stats.malformed == 3

    letters_reader = RecordConsumer(
        stack.kafka.bootstrap, "test-dlq-read", ["dead_letters"], topics
    )
    try:
        letters = [r.record for r in _drain(letters_reader, 3)]
    finally:
        letters_reader.close()
    assert len(letters) == 3
    assert {letter["source_offset"] for letter in letters} == {1, 2, 3}
    by_offset = {letter["source_offset"]: letter for letter in letters}
    assert by_offset[1]["value"] == garbage and "undecodable" in by_offset[1]["error"]
    assert "unknown writer schema fingerprint deadbeefdeadbeef" in by_offset[2]["error"]
    assert by_offset[3]["error"] == (
        "LinkCounters: flow_index[0] = 0 is not a position in flows (0 flows)"
    )
    assert all(letter["source_topic"] == topic for letter in letters)
    assert all(letter["consumer"] == "test-dlq" for letter in letters)


def test_producer_refuses_a_malformed_record_before_sending(
    stack: Stack, topics: dict[str, str]
) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    with pytest.raises(RecordError, match="rtt_ns"):
        producer.produce("link_counters", rtt(rtt_ns="slow"))
    assert producer.stats.sent == 0


def test_read_stream_returns_the_committed_records_and_stops_at_the_end(
    stack: Stack, topics: dict[str, str]
) -> None:
    """As the Flink jobs write (transactions, one aborted): the reader gets exactly the
    committed records and stops at the partitions' ends (transaction markers included)
    rather than waiting for its idle timeout."""
    producer = Producer(
        {"bootstrap.servers": stack.kafka.bootstrap, "transactional.id": f"t-{time.time_ns()}"}
    )
    producer.init_transactions(30)
    encode = codec("LinkCounters").encode
    for rtt_ns, commit in ((1, True), (2, False), (3, True)):
        producer.begin_transaction()
        for link in ("r1:eth1", "r2:eth0", "r3:eth2"):
            producer.produce(topics["link_counters"], encode(rtt(link, rtt_ns)), link.encode())
        if commit:
            producer.commit_transaction(30)
        else:
            # Delivered first, so the aborted records are in the log for the reader to skip,
            # and so the abort cannot overtake the transaction's registration of its
            # partitions: EndTxn on a transaction the coordinator still sees empty is fatal
            # INVALID_TXN_STATE (librdkafka #4849; seen once in CI).
            assert producer.flush(30) == 0
            producer.abort_transaction(30)

    idle_s = 120.0
    began = time.monotonic()
    got = read_stream(stack.kafka.bootstrap, "link_counters", topics, idle_s=idle_s)
    assert time.monotonic() - began < idle_s / 2
    assert sorted((r["link_id"], r["rtt_ns"][0]) for r in got) == sorted(
        (link, n) for link in ("r1:eth1", "r2:eth0", "r3:eth2") for n in (1, 3)
    )


def test_a_partition_is_at_its_end_once_read_to_it_and_not_after_forget_or_a_new_record(
    stack: Stack, topics: dict[str, str]
) -> None:
    """`at_end_of`, what the optimizer's stale-metrics guard trusts: a partition is known to
    be read to its end only when the client said so after the last record taken; records
    still to take, or `forget_ends`, make it unknown again."""
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    topic = topics["link_counters"]
    consumer = RecordConsumer(
        stack.kafka.bootstrap, "test-ends", ["link_counters"], topics, report_ends=True
    )

    def read_to_end(want: int) -> tuple[list[Received], set[int]]:
        """Polls until `want` records came and their partitions are at their end."""
        got: list[Received] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got += consumer.poll_batch(100, 0.5)
            ends = consumer.at_end_of(topic)
            if len(got) >= want and {r.partition for r in got} <= ends:
                return got, ends
        raise AssertionError(f"{len(got)} of {want} records, ends {consumer.at_end_of(topic)}")

    try:
        for i in range(20):
            producer.produce("link_counters", rtt(f"r1:eth{i}"))
        assert producer.flush(30) == 0
        got, ends = read_to_end(20)
        held = {r.partition for r in got}
        assert len(got) == 20 and len(held) > 1  # the links' keys spread over partitions
        assert consumer.at_end_of("another-topic") == set()
        consumer.forget_ends()
        assert consumer.at_end_of(topic) == set()
        producer.produce("link_counters", rtt("r1:eth0"))
        assert producer.flush(30) == 0
        (again,), ends = read_to_end(1)
        assert again.partition in ends
        # A full batch leaves the client's queue unknown: records of a partition whose end
        # was reported may wait there behind others' (a handover's backlog).
        producer.produce("link_counters", rtt("r1:eth0"))
        producer.produce("link_counters", rtt("r1:eth1"))
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 60
        while not (taken := consumer.poll_batch(1, 0.5)) and time.monotonic() < deadline:
            pass
        assert len(taken) == 1 and consumer.at_end_of(topic) == set()
        read_to_end(1)
    finally:
        consumer.close()


def test_a_full_batch_says_how_far_behind_the_reading_is(
    stack: Stack, topics: dict[str, str]
) -> None:
    """`behind_ns`, which has the optimizer commit a backlog's decisions in fewer
    transactions: the age of a full batch's newest record (its timestamp), 0 once a batch
    took all the client held."""
    records = codec("LinkCounters")
    producer = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    written_ms = int(time.time() * 1000) - 5_000  # records 5 s old
    for i in range(3):
        value = records.encode(rtt(f"r1:eth{i}"))
        producer.produce(
            topics["link_counters"], value, f"r1:eth{i}".encode(), headers=records.headers,
            timestamp=written_ms + i,
        )  # fmt: skip
    assert producer.flush(30) == 0
    consumer = RecordConsumer(stack.kafka.bootstrap, "test-behind", ["link_counters"], topics)
    try:
        deadline = time.monotonic() + 60
        while not (taken := consumer.poll_batch(1, 0.5)) and time.monotonic() < deadline:
            pass
        assert len(taken) == 1
        assert 4_900_000_000 <= consumer.behind_ns <= 60_000_000_000
        got = _drain_batches(consumer, 2)
        assert len(got) == 2 and consumer.behind_ns == 0
    finally:
        consumer.close()


def _drain_batches(consumer: RecordConsumer, want: int) -> list[Received]:
    """poll_batch until `want` records came, then once more (an empty, drained batch)."""
    got: list[Received] = []
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.poll_batch(100, 0.5)
    got += consumer.poll_batch(100, 0.5)
    return got
