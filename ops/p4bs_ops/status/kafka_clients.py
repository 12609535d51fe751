"""The Kafka clients the checks make: their settings, the cluster's silence turned into a
check's failure with the client library's own reason, and readers of a topic's ranges
(`p4bs.topic_range`) that never join a group."""

from __future__ import annotations

import contextlib
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from p4bs.bus import client_settings
from p4bs.config import KafkaConfig
from p4bs.topic_range import Deadline, TopicUnavailable, reader, watermarks
from p4bs_ops.status.runner import MS_NS, CheckFailed, describe_error


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


def status_reader(kafka: KafkaConfig, errors: KafkaErrors, *, committed_only: bool) -> Consumer:
    """A reader of topic ranges (`p4bs.topic_range.reader`): never joined, never committed."""
    return reader(kafka_settings(kafka, errors), "p4bs-status", committed_only=committed_only)


def topic_watermarks(
    consumer: Consumer, topic: str, deadline: Deadline
) -> dict[int, tuple[int, int]]:
    """`p4bs.topic_range.watermarks` of every partition; a topic the cluster does not have
    (or cannot list now) is the check's failure."""
    try:
        return watermarks(consumer, topic, deadline)
    except TopicUnavailable as exc:
        raise CheckFailed(str(exc)) from None


def timestamp_ns(msg: Any) -> int | None:
    kind, ms = msg.timestamp()
    return ms * MS_NS if kind != 0 and ms >= 0 else None  # 0: TIMESTAMP_NOT_AVAILABLE
