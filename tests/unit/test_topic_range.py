"""The Kafka range reader (`p4bs.topic_range`) and the readers built on it
(`p4bs.bus.read_records`, the optimizer's `newest_states`) against a fake consumer: which
records are handed over, when a range counts as read, the retry of a partition without a
leader, the deadline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from p4bs.bus import read_newest, read_records
from p4bs.topic_range import (
    SECOND_NS,
    Deadline,
    TopicUnavailable,
    partitions,
    partitions_once_known,
    read_ranges,
    unread,
    watermarks,
)
from p4bs_optimizer.changelog import LinkState, newest_states, to_record
from p4bs_schemas.codec import codec
from p4bs_schemas.registry import STREAMS

TOPIC = "t"
SHORT_NS = SECOND_NS // 5  # a deadline that passes within the test


@dataclass
class FakeMessage:
    topic_: str
    partition_: int
    offset_: int
    value_: bytes = b""
    headers_: list[tuple[str, bytes]] | None = None
    key_: bytes | None = None
    error_: KafkaError | None = None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes:
        return self.value_

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.headers_

    def key(self) -> bytes | None:
        return self.key_

    def error(self) -> KafkaError | None:
        return self.error_


@dataclass
class FakeLog:
    """One partition: records by offset; an offset without one is a transaction marker or an
    aborted record, passed by position. `open_from`: a transaction open there (a committed
    reader's position stops at it)."""

    records: dict[int, FakeMessage] = field(default_factory=dict)
    low: int = 0
    high: int = 0
    open_from: int | None = None
    leaderless_asks: int = 0  # watermark asks answered "no leader" before the first answer
    fatal: bool = False


class FakeConsumer:
    """The calls a range reader makes, on logs held in memory."""

    def __init__(self, logs: dict[int, FakeLog], known: bool = True, unknown_asks: int = 0) -> None:
        self.logs = logs
        self.known = known
        self.unknown_asks = unknown_asks  # topic lists without the topic before it is known
        self.asks = 0
        self.positions: dict[int, int] = {}
        self.assigned_calls: list[list[tuple[int, int]]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        partition_info = {p: object() for p in self.logs}
        info = type("TopicInfo", (), {"partitions": partition_info, "error": None})
        self.unknown_asks -= 1
        known = self.known and self.unknown_asks < 0
        return type("Metadata", (), {"topics": {topic: info} if known else {}})

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        assert not cached  # the broker's offsets now, not the last fetched
        self.asks += 1
        log = self.logs[tp.partition]
        if log.fatal:
            raise KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        if log.leaderless_asks > 0:
            log.leaderless_asks -= 1
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return log.low, log.high

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned_calls.append([(tp.partition, tp.offset) for tp in tps])
        self.positions = {tp.partition: tp.offset for tp in tps}

    def unassign(self) -> None:
        self.positions = {}

    def _next(self) -> FakeMessage | None:
        for partition, position in self.positions.items():
            log = self.logs[partition]
            while position < log.high and position != log.open_from:
                position += 1
                self.positions[partition] = position
                if position - 1 in log.records:
                    return log.records[position - 1]
        return None

    def poll(self, timeout: float) -> FakeMessage | None:
        return self._next()

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        batch = []
        while len(batch) < num_messages and (msg := self._next()) is not None:
            batch.append(msg)
        return batch

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions[tp.partition]) for tp in tps]


def log_of(offsets: range, *, markers: tuple[int, ...] = (), partition: int = 0) -> FakeLog:
    """A partition holding a record at each of `offsets` but the markers'."""
    records = {o: FakeMessage(TOPIC, partition, o) for o in offsets if o not in markers}
    return FakeLog(records, low=offsets.start, high=offsets.stop)


def fake(consumer: FakeConsumer) -> Consumer:
    return cast(Consumer, consumer)


def read(consumer: FakeConsumer, ranges: dict[int, tuple[int, int]], timeout_ns: int) -> Any:
    seen: list[tuple[int, int]] = []
    complete = read_ranges(
        fake(consumer),
        TOPIC,
        ranges,
        Deadline(timeout_ns),
        lambda msg: seen.append((msg.partition() or 0, msg.offset() or 0)),
    )
    return complete, seen


def test_only_the_records_inside_each_range_are_handed_over() -> None:
    """A range that ends below the partition's end: the records fetched beyond it (in the
    same batch) are not handed over, nor those before its start."""
    consumer = FakeConsumer({0: log_of(range(0, 10)), 1: log_of(range(3, 6), partition=1)})
    complete, seen = read(consumer, {0: (2, 4), 1: (3, 6)}, SECOND_NS)
    assert complete
    assert sorted(seen) == [(0, 2), (0, 3), (1, 3), (1, 4), (1, 5)]
    assert consumer.positions == {}  # unassigned after


def test_a_range_ending_with_a_commit_marker_is_read_once_the_marker_is_passed() -> None:
    """Offsets 5 (an aborted record) and 6 (the markers) hold nothing a committed reader
    receives: the range [0, 7) is read when the position reaches 7."""
    consumer = FakeConsumer({0: log_of(range(0, 7), markers=(5, 6))})
    complete, seen = read(consumer, {0: (0, 7)}, SECOND_NS)
    assert complete
    assert seen == [(0, o) for o in range(5)]


def test_empty_ranges_are_not_assigned_and_count_as_read() -> None:
    consumer = FakeConsumer({0: log_of(range(4, 4)), 1: log_of(range(0, 3), partition=1)})
    complete, seen = read(consumer, {0: (4, 4), 1: (0, 3)}, SECOND_NS)
    assert complete and len(seen) == 3
    assert consumer.assigned_calls == [[(1, 0)]]
    assert read(FakeConsumer({}), {0: (4, 4)}, SECOND_NS) == (True, [])


def test_a_range_behind_an_open_transaction_is_not_complete_at_the_deadline() -> None:
    log = log_of(range(0, 6))
    log.open_from = 3
    complete, seen = read(FakeConsumer({0: log}), {0: (0, 6)}, SHORT_NS)
    assert not complete
    assert seen == [(0, 0), (0, 1), (0, 2)]


def test_a_partition_without_a_leader_is_asked_again_until_it_answers() -> None:
    logs = {0: log_of(range(2, 9)), 1: log_of(range(0, 0), partition=1)}
    logs[0].leaderless_asks = 3
    consumer = FakeConsumer(logs)
    assert watermarks(fake(consumer), TOPIC, Deadline(5 * SECOND_NS)) == {0: (2, 9), 1: (0, 0)}
    assert consumer.asks == 5
    # Only the partitions asked for.
    assert watermarks(fake(consumer), TOPIC, Deadline(SECOND_NS), [1]) == {1: (0, 0)}


def test_a_partition_still_without_a_leader_at_the_deadline_raises() -> None:
    log = log_of(range(0, 3))
    log.leaderless_asks = 10**9
    with pytest.raises(KafkaException) as raised:
        watermarks(fake(FakeConsumer({0: log})), TOPIC, Deadline(SHORT_NS))
    assert raised.value.args[0].code() == KafkaError.LEADER_NOT_AVAILABLE


def test_a_fatal_error_is_raised_at_once() -> None:
    log = log_of(range(0, 3))
    log.fatal = True
    consumer = FakeConsumer({0: log})
    with pytest.raises(KafkaException):
        watermarks(fake(consumer), TOPIC, Deadline(5 * SECOND_NS))
    assert consumer.asks == 1


def test_a_topic_the_cluster_does_not_know_is_named() -> None:
    with pytest.raises(TopicUnavailable, match=r"^topic t: missing$"):
        partitions(fake(FakeConsumer({0: FakeLog()}, known=False)), TOPIC, Deadline(SECOND_NS))
    assert partitions(fake(FakeConsumer({1: FakeLog(), 0: FakeLog()})), TOPIC, Deadline(1)) == [
        0,
        1,
    ]


def test_a_topic_just_created_is_asked_for_again_until_the_cluster_knows_it() -> None:
    consumer = FakeConsumer({1: FakeLog(), 0: FakeLog()}, unknown_asks=3)
    assert partitions_once_known(fake(consumer), TOPIC, Deadline(5 * SECOND_NS)) == [0, 1]
    never = FakeConsumer({0: FakeLog()}, known=False)
    with pytest.raises(TopicUnavailable, match=r"^topic t: missing$"):
        partitions_once_known(fake(never), TOPIC, Deadline(SHORT_NS))


def test_unread_keeps_the_partitions_whose_position_is_below_their_end() -> None:
    consumer = FakeConsumer({0: FakeLog(), 1: FakeLog()})
    consumer.positions = {0: 5, 1: 7}
    assert unread(fake(consumer), {(TOPIC, 0): 5, (TOPIC, 1): 8}) == {(TOPIC, 1): 8}
    assert unread(fake(consumer), {}) == {}


def test_a_deadline_gives_the_time_left_and_at_least_its_floor() -> None:
    assert 0.9 < Deadline(SECOND_NS).left_s() <= 1.0
    gone = Deadline(-1)
    assert gone.passed
    assert gone.left_s() == 0.05 and gone.left_s(0.0) == 0.0


def state_message(partition: int, offset: int, link_id: str, epoch: int) -> FakeMessage:
    schema = codec(STREAMS["optimizer_state"])
    record = to_record(link_id, LinkState("static", epoch=epoch), "p1", ts_ns=offset)
    value = schema.encode(record)
    return FakeMessage(TOPIC, partition, offset, value, schema.headers, link_id.encode())


def test_newest_states_keeps_each_links_last_record_and_names_the_malformed() -> None:
    """Link a's second state (epoch 2) is its newest; b's is in partition 1; the record that
    does not decode is named and passed over, as are records after the end read."""
    logs = {
        0: FakeLog(
            {
                0: state_message(0, 0, "a", 1),
                1: FakeMessage(TOPIC, 0, 1, b"\x00not avro"),
                2: state_message(0, 2, "a", 2),
            },
            high=3,
        ),
        1: FakeLog({0: state_message(1, 0, "b", 1)}, high=1),
    }
    newest = newest_states(fake(FakeConsumer(logs)), TOPIC, Deadline(SECOND_NS))
    assert newest.complete
    assert {k: (r.partition, r.record["epoch"]) for k, r in newest.records.items()} == {
        "a": (0, 2),
        "b": (1, 1),
    }
    assert len(newest.malformed) == 1 and newest.malformed[0].startswith("t[0]@1: ")
    # Only the partitions asked for.
    only_b = newest_states(fake(FakeConsumer(logs)), TOPIC, Deadline(SECOND_NS), [1])
    assert set(only_b.records) == {"b"}
    # The same records through the generic reader, in each partition's order.
    every = read_records(fake(FakeConsumer(logs)), "optimizer_state", TOPIC, Deadline(SECOND_NS))
    assert [(r.partition, r.offset) for r in every.records] == [(0, 0), (0, 2), (1, 0)]


def test_read_newest_decodes_each_keys_newest_and_falls_back_past_a_malformed_one() -> None:
    """Key a: two states, then one that does not decode; its second state stands in and the
    undecodable one is named. Key b's first record does not decode either, but its newest
    does: the older one is never decoded, so it is not named. The same key in another
    partition is another record (as compaction keeps it)."""
    broken_a = FakeMessage(TOPIC, 0, 3, b"\x00not avro", key_=b"a")
    logs = {
        0: FakeLog(
            {
                0: state_message(0, 0, "a", 1),
                1: state_message(0, 1, "a", 2),
                2: FakeMessage(TOPIC, 0, 2, b"\x00not avro", key_=b"b"),
                3: broken_a,
                4: state_message(0, 4, "b", 1),
            },
            high=5,
        ),
        1: FakeLog({0: state_message(1, 0, "a", 7)}, high=1),
    }
    read = read_newest(fake(FakeConsumer(logs)), "optimizer_state", TOPIC, Deadline(SECOND_NS))
    assert read.complete
    assert [(r.partition, r.offset, r.record["epoch"]) for r in read.records] == [
        (0, 1, 2),
        (0, 4, 1),
        (1, 0, 7),
    ]
    assert [m.split(":")[0] for m in read.malformed] == ["t[0]@3"]
