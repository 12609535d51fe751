"""The consumer groups of the project's parts: which streams each reads, each group's state
and members, and how far behind it is (its lag per topic)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from p4bs.config import Config
from p4bs.topic_range import Deadline
from p4bs_ops.status.kafka_clients import is_kafka_error, kafka_reason
from p4bs_ops.status.runner import CheckFailed, StatusOptions

# The consumer groups of the project's parts, as each part names its own by default: the
# metrics job's is the options' `metrics_group` (runner.METRICS_GROUP), then the InfluxDB
# sink (p4bs_sinks.influx_sink.InfluxSink) and the alert dispatcher (p4bs_sinks.alerts); the
# optimizer's is the config's [optimizer] group. tests/unit/test_status_render.py checks
# that these are still the parts' defaults.
INFLUX_SINK_GROUP = "p4bs-influx-sink"
ALERT_DISPATCHER_GROUP = "p4bs-alert-dispatcher"
# The streams each group reads (the optimizer also reads link_counters for a Jenks link).
METRICS_STREAMS = ("link_counters", "links")
INFLUX_SINK_STREAMS = ("link_metrics", "sla_alerts", "buffer_decisions")
ALERT_DISPATCHER_STREAMS = ("sla_alerts",)


def group_streams(config: Config, options: StatusOptions) -> dict[str, tuple[str, ...]]:
    """Each consumer group the project's parts use, and the streams it reads."""
    optimizer: tuple[str, ...] = (config.metrics.optimizer_stream,)
    if any(link.policy == "jenks" for link in config.links):
        optimizer = (config.metrics.optimizer_stream, "link_counters")
    return {
        options.metrics_group: METRICS_STREAMS,
        config.optimizer.group: optimizer,
        INFLUX_SINK_GROUP: INFLUX_SINK_STREAMS,
        ALERT_DISPATCHER_GROUP: ALERT_DISPATCHER_STREAMS,
    }


def lag_text(info: Mapping[str, Any]) -> str:
    if "error" in info:
        return f"unknown ({info['error']})"
    if not info["committed"]:
        return "no offsets"
    return f"{sum(t['lag'] for t in info['lag'].values() if 'lag' in t):,}"


def group_lags(
    admin: AdminClient,
    config: Config,
    options: StatusOptions,
    metadata: Any,
    deadline: Deadline,
) -> dict[str, dict[str, Any]]:
    """Per group: its state and members, and per topic the records it has yet to read (the
    topic's committed end, as a read-committed consumer sees it, minus the group's
    committed offset, over the partitions it committed)."""
    wanted = group_streams(config, options)
    topics = config.kafka.topics
    described: dict[str, tuple[str, list[Any]] | str] = {}
    for group in wanted:
        try:
            described[group] = describe_group(admin, group, deadline)
        except (CheckFailed, KafkaException) as exc:
            described[group] = str(exc)
    committed: dict[str, dict[tuple[str, int], int] | BaseException] = {}
    for group in wanted:
        try:
            future = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=deadline.left_s()
            )[group]
            answer = future.result(deadline.left_s())
            committed[group] = {
                (tp.topic, tp.partition): tp.offset
                for tp in answer.topic_partitions or []
                if tp.offset >= 0
            }
        except Exception as exc:
            committed[group] = exc
    # The committed ends of every partition of the deployment's topics the groups read (a
    # group's offsets on topics the config does not name are another deployment's).
    names = {topics[s] for streams in wanted.values() for s in streams}
    partitions = [
        TopicPartition(t, p)
        for t in sorted(names)
        if t in metadata.topics
        for p in metadata.topics[t].partitions
    ]
    ends: dict[tuple[str, int], int] = {}
    if partitions:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        try:
            answers = admin.list_offsets(
                {tp: latest for tp in partitions},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=deadline.left_s(),
            )
        except KafkaException:
            answers = {}
        for tp, future in answers.items():
            try:
                ends[(tp.topic, tp.partition)] = future.result(deadline.left_s()).offset
            except Exception:  # the partition's end is not known: its lag is left out
                continue
    out: dict[str, dict[str, Any]] = {}
    for group, streams in wanted.items():
        info: dict[str, Any] = {}
        description = described[group]
        if isinstance(description, str):
            info["state"] = f"unknown: {description}"
        else:
            info["state"], info["members"] = description[0], len(description[1])
        offsets = committed[group]
        if isinstance(offsets, BaseException):
            info["error"] = kafka_reason(offsets)
            out[group] = info
            continue
        info["committed"] = any(topic in {topics[s] for s in streams} for topic, _ in offsets)
        per_topic: dict[str, dict[str, Any]] = {}
        for topic in dict.fromkeys(topics[s] for s in streams):
            if topic not in metadata.topics:
                continue
            parts = sorted(metadata.topics[topic].partitions)
            mine = {p: offsets[(topic, p)] for p in parts if (topic, p) in offsets}
            if not mine:
                per_topic[topic] = {"committed_partitions": 0, "partitions": len(parts)}
                continue
            known = [p for p in mine if (topic, p) in ends]
            per_topic[topic] = {
                "lag": sum(max(0, ends[(topic, p)] - mine[p]) for p in known),
                "committed_partitions": len(mine),
                "partitions": len(parts),
            }
        info["lag"] = per_topic
        out[group] = info
    return out


def describe_group(admin: AdminClient, group: str, deadline: Deadline) -> tuple[str, list[Any]]:
    """The group's state and members; a group the coordinator does not know has none."""
    future = admin.describe_consumer_groups([group], request_timeout=deadline.left_s())[group]
    try:
        description = future.result(deadline.left_s())
    except KafkaException as exc:
        if is_kafka_error(exc) and exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
            return "dead", []
        raise CheckFailed(f"group {group}: {kafka_reason(exc)}") from None
    return _state_name(description.state), list(description.members)


def _state_name(state: Any) -> str:
    name = getattr(state, "name", None)
    return str(name if name is not None else state).lower()
