"""Reading part of a Kafka topic without joining a consumer group.

A reader (`reader`) is a consumer that is given its partitions by assignment and commits
nothing: it takes no partition from the group that processes the topic and leaves no trace
in the cluster. With it:

- `partitions` and `watermarks`: a topic's partitions and, per partition, its first and next
  offsets, asked again while a partition has no leader yet (a topic just made) until the
  deadline;
- `read_ranges`: [start, end) of partitions, each record handed to a callback, until every
  range is read or the deadline passes;
- `arrived` and `unread`, for a reader that reads on after the ends it had at start and
  wants to know when it has caught up with them (the dashboard's feed).

What counts as read to the end: the reader's position in the partition has reached the end.
A reader of committed data never receives transaction markers or aborted records, but its
position moves past them, so a range that ends with a commit marker is read once the marker
is passed, not when its last record arrives.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

SECOND_NS = 1_000_000_000
BATCH = 500  # records taken at once of those fetched
POLL_S = 0.2  # the longest wait for a record before the positions are looked at again
RETRY_S = 0.1  # between two asks while a partition has no leader or a topic is not known yet

Ranges = Mapping[int, tuple[int, int]]  # partition -> [start, end) offsets
Ends = Mapping[tuple[str, int], int]  # (topic, partition) -> the offset to read up to


class Deadline:
    """When a task that makes several calls to the cluster must be done: each call is given
    the time that is left (monotonic clock)."""

    def __init__(self, timeout_ns: int) -> None:
        self.end_ns = time.monotonic_ns() + timeout_ns

    def left_s(self, floor_s: float = 0.05) -> float:
        """The seconds left, at least `floor_s`: a call given no time at all would not even
        wait for an answer that is already on its way."""
        return max(floor_s, (self.end_ns - time.monotonic_ns()) / SECOND_NS)

    @property
    def passed(self) -> bool:
        return time.monotonic_ns() >= self.end_ns


class TopicUnavailable(LookupError):
    """The cluster does not know the topic, or cannot list its partitions now."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"topic {topic}: {reason}")
        self.topic = topic
        self.reason = reason


def reader(
    client: Mapping[str, Any],
    name: str,
    *,
    committed_only: bool = True,
    settings: Mapping[str, Any] | None = None,
) -> Consumer:
    """A consumer for reading ranges: `client` is how it reaches the cluster
    (`p4bs.bus.client_settings`), `name` starts its group id, which is its own and never
    joined. `committed_only=False` also reads records of open and aborted transactions.
    A start that retention has removed by the time it is read is read from the partition's
    new first record. `settings` are librdkafka's, over these."""
    return Consumer(
        {
            **client,
            # librdkafka wants a group id even though the group is never joined.
            "group.id": f"{name}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
            **(settings or {}),
        }
    )


def partitions(consumer: Consumer, topic: str, deadline: Deadline) -> list[int]:
    """The topic's partition numbers, in order. Raises TopicUnavailable when the cluster
    does not know the topic or reports an error for it."""
    info = consumer.list_topics(topic, timeout=deadline.left_s()).topics.get(topic)
    if info is None or info.error is not None:
        raise TopicUnavailable(topic, "missing" if info is None else info.error.str())
    return sorted(info.partitions)


def partitions_once_known(consumer: Consumer, topic: str, deadline: Deadline) -> list[int]:
    """`partitions`, asked again until the deadline while the cluster does not know the
    topic: one just created reaches the metadata a client is answered with a moment later."""
    while True:
        try:
            return partitions(consumer, topic, deadline)
        except TopicUnavailable:
            if deadline.passed:
                raise
            time.sleep(RETRY_S)  # the pace of the asks, not a synchronisation


def watermarks(
    consumer: Consumer,
    topic: str,
    deadline: Deadline,
    numbers: Iterable[int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Per partition of the topic (those `numbers`, or all), its first and next offsets as
    the broker has them now. A partition without a leader yet is asked again until the
    deadline; then its error, or a fatal one at once, is raised as KafkaException."""
    wanted = partitions(consumer, topic, deadline) if numbers is None else list(numbers)
    return {p: _watermarks(consumer, TopicPartition(topic, p), deadline) for p in wanted}


def _watermarks(
    consumer: Consumer, partition: TopicPartition, deadline: Deadline
) -> tuple[int, int]:
    while True:
        try:
            return consumer.get_watermark_offsets(
                partition, timeout=deadline.left_s(), cached=False
            )
        except KafkaException as exc:
            if exc.args[0].fatal() or deadline.passed:
                raise
            time.sleep(RETRY_S)  # the pace of the asks, not a synchronisation


def arrived(consumer: Consumer, timeout_s: float) -> list[Message]:
    """What has arrived: waits up to `timeout_s` for a first message and takes those already
    fetched after it, up to BATCH (a batch call would wait its whole timeout for a full
    batch). Error events (a partition's end, a broker down) are among them."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(BATCH - 1, timeout=0)]


def unread(consumer: Consumer, ends: Ends) -> dict[tuple[str, int], int]:
    """Those of `ends` the consumer's position has not reached yet (transaction markers and
    aborted records are passed by position), with their ends."""
    if not ends:
        return {}
    positions = consumer.position([TopicPartition(t, p) for t, p in ends])
    return {
        (tp.topic, tp.partition): ends[(tp.topic, tp.partition)]
        for tp in positions
        if tp.offset < ends[(tp.topic, tp.partition)]
    }


def read_ranges(
    consumer: Consumer,
    topic: str,
    ranges: Ranges,
    deadline: Deadline,
    on_message: Callable[[Message], None],
) -> bool:
    """Reads [start, end) of each partition of `ranges`, handing each record in it (none
    before its start or from its end on) to `on_message`; True when every range was read to
    its end before the deadline. The consumer's assignment is replaced while it reads and
    cleared after. A fatal error is raised as KafkaException; others (a broker restarting)
    are librdkafka's to retry."""
    todo = {(topic, p): end for p, (start, end) in ranges.items() if end > start}
    if not todo:
        return True
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for _, p in todo])
    try:
        while todo:
            if deadline.passed:
                return False
            for msg in arrived(consumer, min(POLL_S, deadline.left_s())):
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None  # set on every record
                # One fetched before its partition's end was reached may lie beyond it.
                if offset < todo.get((topic, partition), 0):
                    on_message(msg)
            todo = unread(consumer, todo)
    finally:
        consumer.unassign()
    return True
