"""The Kafka clients the checks make: their settings, the cluster's silence turned into a
check's failure with the client library's own reason, and reading ranges of a topic with a
consumer that never joins its group."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from p4bs.bus import client_settings
from p4bs.config import KafkaConfig
from p4bs_ops.status.runner import MS_NS, CheckFailed, Deadline, describe_error


class KafkaErrors:
    """librdkafka's error callback: the last errors it reported, for a clear message (its
    own logging is turned off, so that a stopped broker does not flood the screen)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def __call__(self, error: KafkaError) -> None:
        self.seen = [*self.seen[-19:], (error.code(), error.str())]

    def last(self) -> str | None:
        """The newest error that says why (a connection refused, a failed login) rather
        than that all brokers are down."""
        for code, text in reversed(self.seen):
            if code != KafkaError._ALL_BROKERS_DOWN:
                return text
        return self.seen[-1][1] if self.seen else None


def kafka_settings(
    kafka: KafkaConfig, errors: KafkaErrors, bootstrap: str | None = None
) -> dict[str, Any]:
    try:
        settings = client_settings(kafka)
    except LookupError as exc:
        raise CheckFailed(f"kafka credentials: {exc}") from None
    if bootstrap is not None:
        settings["bootstrap.servers"] = bootstrap
    return {**settings, "log_level": 0, "error_cb": errors, "client.id": "p4bs-status"}


def no_cluster(
    kafka: KafkaConfig, errors: KafkaErrors, exc: BaseException, client: Any = None
) -> CheckFailed:
    """The check's failure when the cluster did not answer, with the client library's own
    reason (its error callback is served by `client.poll`)."""
    if client is not None:
        with contextlib.suppress(Exception):
            client.poll(0)
    reason = errors.last() or (exc.args[0].str() if is_kafka_error(exc) else str(exc))
    return CheckFailed(
        f"Kafka at {kafka.bootstrap}: no broker answered: {reason}", {"bootstrap": kafka.bootstrap}
    )


def is_kafka_error(exc: BaseException) -> bool:
    return (
        isinstance(exc, KafkaException) and bool(exc.args) and isinstance(exc.args[0], KafkaError)
    )


def kafka_reason(exc: BaseException) -> str:
    if is_kafka_error(exc):
        return str(exc.args[0].str())
    return describe_error(exc)


def status_consumer(kafka: KafkaConfig, errors: KafkaErrors, *, committed_only: bool) -> Consumer:
    return Consumer(
        {
            **kafka_settings(kafka, errors),
            "group.id": f"p4bs-status-{uuid.uuid4().hex[:8]}",  # never joined, never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )


def _partitions(consumer: Consumer, topic: str, deadline: Deadline) -> list[int]:
    meta = consumer.list_topics(topic, timeout=deadline.left_s())
    info = meta.topics.get(topic)
    if info is None or info.error is not None:
        reason = "missing" if info is None else info.error.str()
        raise CheckFailed(f"topic {topic}: {reason}")
    return sorted(info.partitions)


def watermarks(consumer: Consumer, topic: str, deadline: Deadline) -> dict[int, tuple[int, int]]:
    """Per partition of `topic`: its first and next offsets, as the broker has them now."""
    return {
        p: consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=deadline.left_s(), cached=False
        )
        for p in _partitions(consumer, topic, deadline)
    }


def read_ranges(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    deadline: Deadline,
    on_message: Callable[[Any], None],
) -> bool:
    """Reads [start, end) of each partition, handing each record to `on_message`; True when
    every range was read to its end before the deadline. Transaction markers (and, reading
    committed data, aborted records) are passed by position."""
    todo = {p: end for p, (start, end) in ranges.items() if end > start}
    if not todo:
        return True
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in todo])
    try:
        while todo:
            if deadline.passed:
                return False
            for msg in consumer.consume(500, timeout=min(0.2, deadline.left_s())):
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                partition, offset = msg.partition(), msg.offset()
                if partition in todo and offset is not None and offset < todo[partition]:
                    on_message(msg)
            for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= todo[tp.partition]:
                    del todo[tp.partition]
    finally:
        consumer.unassign()
    return True


def timestamp_ns(msg: Any) -> int | None:
    kind, ms = msg.timestamp()
    return ms * MS_NS if kind != 0 and ms >= 0 else None  # 0: TIMESTAMP_NOT_AVAILABLE
