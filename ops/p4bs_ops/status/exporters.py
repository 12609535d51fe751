"""The exporters' check: the age of each link's newest `link_counters` record, by the record's
Kafka timestamp (when its exporter produced it) and key (its link)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from p4bs.config import Config
from p4bs.topic_range import Deadline, read_ranges
from p4bs.units import format_duration_ns
from p4bs_ops.status.kafka_clients import (
    KafkaErrors,
    no_cluster,
    status_reader,
    timestamp_ns,
    topic_watermarks,
)
from p4bs_ops.status.runner import MS_NS, PartStatus, StatusOptions, part_check

# How far back the check reads link_counters for links it has not seen yet: at most this
# many records in all (then their age is "older than" what was read).
EXPORTER_READ_BUDGET = 200_000


@part_check("exporters")
def check_exporters(config: Config, options: StatusOptions) -> PartStatus:
    """Each link's newest link_counters record, by the record's Kafka timestamp (when its
    exporter produced it) and key (its link). The records of the last `max_data_age` are
    read, at least the newest of each partition; a link not among them (stale, or unknown)
    is looked for further back, a chunk at a time, within a budget of records."""
    deadline = Deadline(options.timeout_ns)
    topic = config.kafka.topics["link_counters"]
    errors = KafkaErrors()
    consumer = status_reader(config.kafka, errors, committed_only=False)
    try:
        return _exporters(consumer, config, options, topic, deadline)
    except KafkaException as exc:
        raise no_cluster(config.kafka, errors, exc, consumer) from None
    finally:
        consumer.close()


def _exporters(
    consumer: Consumer,
    config: Config,
    options: StatusOptions,
    topic: str,
    deadline: Deadline,
) -> PartStatus:
    now_ns = time.time_ns()
    marks = topic_watermarks(consumer, topic, deadline)
    partitions = sorted(marks)
    since_ms = (now_ns - options.max_data_age_ns) // MS_NS
    found = consumer.offsets_for_times(
        [TopicPartition(topic, p, since_ms) for p in partitions], timeout=deadline.left_s()
    )
    newest: dict[str, tuple[int, int, int]] = {}  # link -> (ts ns, partition, offset)
    oldest: dict[int, int] = {}  # partition -> the oldest timestamp read there

    def seen(msg: Any) -> None:
        key, ts_ns = msg.key(), timestamp_ns(msg)
        if key is None or ts_ns is None:
            return
        link, partition = key.decode(errors="replace"), msg.partition()
        if link not in newest or ts_ns > newest[link][0]:
            newest[link] = (ts_ns, partition, msg.offset())
        oldest[partition] = min(ts_ns, oldest.get(partition, ts_ns))

    starts: dict[int, int] = {}
    ranges: dict[int, tuple[int, int]] = {}
    for tp in found:
        low, high = marks[tp.partition]
        start = tp.offset if 0 <= tp.offset < high else high
        start = max(low, min(start, high - 1))  # the newest record at least
        starts[tp.partition] = start
        ranges[tp.partition] = (start, high)
    complete = read_ranges(consumer, topic, ranges, deadline, seen)
    read = sum(high - start for start, high in ranges.values())
    wanted = {link.id for link in config.links}
    chunk = max(100, 4 * len(wanted))
    while complete and wanted - set(newest) and read < EXPORTER_READ_BUDGET:
        ranges = {}
        for p, start in starts.items():
            low = marks[p][0]
            if start > low:
                ranges[p] = (max(low, start - chunk), start)
                starts[p] = ranges[p][0]
        if not ranges:
            break
        complete = read_ranges(consumer, topic, ranges, deadline, seen)
        read += sum(end - start for start, end in ranges.values())
        chunk *= 2
    # A link not found has no record in the partitions read to their start, and none newer
    # than what was read of the others: its newest is older than the nearest of those.
    not_at_start = [p for p in partitions if starts[p] > marks[p][0]]
    horizon_ns = min(
        (now_ns - oldest.get(p, now_ns - options.max_data_age_ns) for p in not_at_start),
        default=None,
    )
    links: dict[str, dict[str, Any]] = {}
    stale: list[str] = []
    for link in config.links:
        if link.id in newest:
            ts_ns, partition, offset = newest[link.id]
            age = max(0, now_ns - ts_ns)
            links[link.id] = {
                "age_ns": age,
                "stale": age > options.max_data_age_ns,
                "partition": partition,
                "offset": offset,
            }
        else:
            links[link.id] = {"age_ns": None, "stale": True}
            if horizon_ns is not None:
                links[link.id]["older_than_ns"] = max(options.max_data_age_ns, horizon_ns)
        if links[link.id]["stale"]:
            stale.append(link.id)
    unknown = {
        link: {"age_ns": max(0, now_ns - ts), "partition": p}
        for link, (ts, p, _) in sorted(newest.items())
        if link not in wanted
    }
    details: dict[str, Any] = {
        "topic": topic,
        "max_age_ns": options.max_data_age_ns,
        "links": links,
        "records_read": read,
        **({"not_in_config": unknown} if unknown else {}),
    }
    if not complete:
        details["note"] = "reading was cut off by the timeout"
    limit = format_duration_ns(options.max_data_age_ns)
    if stale:
        described = ", ".join(f"{link} ({_age_text(links[link])})" for link in stale[:5])
        more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
        summary = f"{len(stale)} of {len(links)} links with no data in {limit}: {described}{more}"
        return PartStatus("exporters", False, summary, details)
    ages = [v["age_ns"] for v in links.values()]
    plural = "s" if len(links) != 1 else ""
    summary = (
        f"{len(links)} link{plural} fresh (newest record at most "
        f"{format_duration_ns(max(ages))} old, limit {limit})"
    )
    return PartStatus("exporters", True, summary, details)


def _age_text(info: Mapping[str, Any]) -> str:
    if info.get("age_ns") is not None:
        return f"{format_duration_ns(info['age_ns'])} ago"
    if "older_than_ns" in info:
        return f"none in the last {format_duration_ns(info['older_than_ns'])}"
    return "no record in the topic"
