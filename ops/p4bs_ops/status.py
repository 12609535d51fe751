"""`p4bs status`: one look at a whole deployment, from its config alone.

Each part of the deployment has a check, a function of the config and the options that
returns a `PartStatus` (its name, healthy or not, a summary line, a details dict):

- kafka: every broker and bootstrap address answers, the config's topics exist with a
  leader for each partition, and each consumer group the project uses (the metrics job's,
  the optimizer's, the InfluxDB sink's, the alert dispatcher's) with its lag per topic;
- flink: the metrics job's state and its last completed checkpoint's age (JobManager REST
  API), or, for the embedded mini cluster, that nothing outside `p4bs jobs run` can see it;
- exporters: the age of each link's newest `link_counters` record;
- optimizer: the members of the optimizer's group and the links each owns, from the newest
  `optimizer_state` record of each link (`owner`, `epoch`);
- routers: each router read through its driver (queue 0 of one of its links' interfaces);
- influxdb: `/ping`, the database, and the points written per second.

Every check is bounded by the options' timeout and turns its own failures into an unhealthy
result naming what failed; the checks run side by side, each in a thread of its own, so one
stopped part never holds up or crashes the others. Times are ns and sizes bytes inside, and
in the JSON; `render_text` prints human units.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from p4bs.bus import client_settings
from p4bs.config import Config, KafkaConfig, LinkConfig, RouterConfig
from p4bs.units import duration_for_bytes
from p4bs_schemas.codec import RecordError, codec
from p4bs_schemas.registry import STREAMS

SECOND_NS = 1_000_000_000
MS_NS = 1_000_000

# The consumer groups of the project's parts, as each part names its own by default: the
# metrics job (`p4bs jobs run|submit --group`, streaming-jobs/p4bs_jobs/cli.py), the InfluxDB
# sink (p4bs_jobs.influx_sink.InfluxSink) and the alert dispatcher (p4bs_jobs.alerts); the
# optimizer's is the config's [optimizer] group. tests/unit/test_status_render.py checks
# that these are still the parts' defaults.
METRICS_GROUP = "p4bs-metrics"
INFLUX_SINK_GROUP = "p4bs-influx-sink"
ALERT_DISPATCHER_GROUP = "p4bs-alert-dispatcher"
# The streams each group reads (the optimizer also reads link_counters for a Jenks link).
METRICS_STREAMS = ("link_counters", "links")
INFLUX_SINK_STREAMS = ("link_metrics", "sla_alerts", "buffer_decisions")
ALERT_DISPATCHER_STREAMS = ("sla_alerts",)
# A Flink job made by the Table API is named after its sinks ("insert-into_<catalog>.
# <database>.metrics_out,..."): the metrics job is the one writing the table metrics_out
# (streaming-jobs/p4bs_jobs/metrics.py).
METRICS_JOB_MATCH = "metrics_out"
RUNNING = "RUNNING"

PARTS = ("kafka", "flink", "exporters", "optimizer", "routers", "influxdb")

# How far back the exporters' check reads link_counters for links it has not seen yet: at
# most this many records in all (then their age is "older than" what was read).
EXPORTER_READ_BUDGET = 200_000
# A thread that outlives its check's timeout by this much is left behind, reported as hung.
GRACE_NS = 2 * SECOND_NS


@dataclass(frozen=True)
class PartStatus:
    """One part of the deployment as its check found it."""

    name: str
    healthy: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    took_ns: int = 0


@dataclass(frozen=True)
class StatusOptions:
    """What the checks wait for and what they call healthy."""

    timeout_ns: int = 5 * SECOND_NS  # per check
    max_data_age_ns: int = 5 * SECOND_NS  # a link's newest link_counters record
    # The metrics job's last completed checkpoint; None: 10 checkpoint intervals, >= 30 s.
    max_checkpoint_age_ns: int | None = None
    max_lag: int | None = None  # records per group and topic; None: lag is only reported
    influx_interval_ns: int = SECOND_NS  # between the two readings of InfluxDB's counters
    metrics_group: str = METRICS_GROUP
    flink_job: str = METRICS_JOB_MATCH  # a part of the metrics job's name

    def checkpoint_age_limit_ns(self, config: Config) -> int:
        if self.max_checkpoint_age_ns is not None:
            return self.max_checkpoint_age_ns
        return max(10 * config.flink.checkpoint_interval_ns, 30 * SECOND_NS)


class CheckFailed(Exception):
    """A check that cannot go on: its message is the part's summary."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class Deadline:
    def __init__(self, timeout_ns: int) -> None:
        self.end_ns = time.monotonic_ns() + timeout_ns

    def left_s(self, floor_s: float = 0.05) -> float:
        return max(floor_s, (self.end_ns - time.monotonic_ns()) / 1e9)

    @property
    def passed(self) -> bool:
        return time.monotonic_ns() >= self.end_ns


# ---- running the checks --------------------------------------------------------------------


Check = Callable[[Config, StatusOptions], PartStatus]


def run_status(
    config: Config, options: StatusOptions, parts: Iterable[str] = PARTS
) -> list[PartStatus]:
    """Runs the checks of `parts` side by side; returns their results in `PARTS` order. A
    check that raises is unhealthy with its error; one still running well after its timeout
    is unhealthy as hung (its thread is left behind: it is a daemon)."""
    wanted = [p for p in PARTS if p in set(parts)]
    results: dict[str, PartStatus] = {}
    threads = {}
    for name in wanted:
        thread = threading.Thread(
            target=_run_one,
            args=(name, CHECKS[name], config, options, results),
            name=f"p4bs-status-{name}",
            daemon=True,
        )
        thread.start()
        threads[name] = thread
    limit = Deadline(options.timeout_ns + options.influx_interval_ns + GRACE_NS)
    for thread in threads.values():
        thread.join(limit.left_s(0.0))
    out = []
    for name in wanted:
        result = results.get(name)
        if result is None:
            result = PartStatus(
                name,
                False,
                f"no answer: the check was still waiting after {options.timeout_ns / 1e9:g} s",
            )
        out.append(result)
    return out


def _run_one(
    name: str, check: Check, config: Config, options: StatusOptions, into: dict[str, PartStatus]
) -> None:
    into[name] = _part(name)(check)(config, options)


def _part(name: str) -> Callable[[Check], Check]:
    """Makes a check return its failures as an unhealthy part: CheckFailed with its message
    and details, any other error named by its type; and times it."""

    def wrap(check: Check) -> Check:
        @functools.wraps(check)
        def guarded(config: Config, options: StatusOptions) -> PartStatus:
            began = time.monotonic_ns()
            try:
                result = check(config, options)
            except CheckFailed as exc:
                result = PartStatus(name, False, str(exc), exc.details)
            except Exception as exc:  # a client library's surprise: still a result
                result = PartStatus(name, False, f"check failed: {_describe(exc)}")
            if result.took_ns:  # a check already timed
                return result
            return dataclasses.replace(result, took_ns=time.monotonic_ns() - began)

        return guarded

    return wrap


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def exit_code(results: Iterable[PartStatus]) -> int:
    """0 when every part is healthy, 1 otherwise."""
    return 0 if all(r.healthy for r in results) else 1


# ---- Kafka ---------------------------------------------------------------------------------


class _Errors:
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


def _kafka_settings(
    kafka: KafkaConfig, errors: _Errors, bootstrap: str | None = None
) -> dict[str, Any]:
    try:
        settings = client_settings(kafka)
    except LookupError as exc:
        raise CheckFailed(f"kafka credentials: {exc}") from None
    if bootstrap is not None:
        settings["bootstrap.servers"] = bootstrap
    return {**settings, "log_level": 0, "error_cb": errors, "client.id": "p4bs-status"}


def _no_cluster(
    kafka: KafkaConfig, errors: _Errors, exc: BaseException, client: Any = None
) -> CheckFailed:
    """The check's failure when the cluster did not answer, with the client library's own
    reason (its error callback is served by `client.poll`)."""
    if client is not None:
        with contextlib.suppress(Exception):
            client.poll(0)
    reason = errors.last() or (exc.args[0].str() if _is_kafka_error(exc) else str(exc))
    return CheckFailed(
        f"Kafka at {kafka.bootstrap}: no broker answered: {reason}", {"bootstrap": kafka.bootstrap}
    )


def _is_kafka_error(exc: BaseException) -> bool:
    return (
        isinstance(exc, KafkaException) and bool(exc.args) and isinstance(exc.args[0], KafkaError)
    )


def _probe_broker(kafka: KafkaConfig, address: str, timeout_s: float) -> str | None:
    """None when a client bootstrapped from `address` alone gets the cluster's metadata (the
    request goes to that broker, the only one it knows); the reason otherwise."""
    errors = _Errors()
    admin = AdminClient(_kafka_settings(kafka, errors, bootstrap=address))
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        with contextlib.suppress(Exception):
            admin.poll(0)
        return errors.last() or (exc.args[0].str() if _is_kafka_error(exc) else str(exc))
    return None


def group_streams(config: Config, options: StatusOptions) -> dict[str, tuple[str, ...]]:
    """Each consumer group the project's parts use, and the streams it reads."""
    optimizer: tuple[str, ...] = ("link_metrics",)
    if any(link.policy == "jenks" for link in config.links):
        optimizer = ("link_metrics", "link_counters")
    return {
        options.metrics_group: METRICS_STREAMS,
        config.optimizer.group: optimizer,
        INFLUX_SINK_GROUP: INFLUX_SINK_STREAMS,
        ALERT_DISPATCHER_GROUP: ALERT_DISPATCHER_STREAMS,
    }


@_part("kafka")
def check_kafka(config: Config, options: StatusOptions) -> PartStatus:
    kafka = config.kafka
    deadline = Deadline(options.timeout_ns)
    errors = _Errors()
    admin = AdminClient(_kafka_settings(kafka, errors))
    try:
        metadata = admin.list_topics(timeout=deadline.left_s())
    except KafkaException as exc:
        raise _no_cluster(kafka, errors, exc, admin) from None

    # Every broker the cluster lists, and every bootstrap address, asked on its own.
    advertised = {f"{b.host}:{b.port}": b.id for b in metadata.brokers.values()}
    bootstrap = [a.strip() for a in kafka.bootstrap.split(",") if a.strip()]
    addresses = list(dict.fromkeys([*sorted(advertised, key=advertised.__getitem__), *bootstrap]))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(addresses)))
    probes = {a: pool.submit(_probe_broker, kafka, a, deadline.left_s()) for a in addresses}
    pool.shutdown(wait=False)
    reachability: dict[str, str | None] = {}
    for address, future in probes.items():
        try:
            reachability[address] = future.result(deadline.left_s() + 1.0)
        except concurrent.futures.TimeoutError:
            reachability[address] = "no answer in time"
    brokers = [
        {
            "id": broker_id,
            "address": address,
            "controller": broker_id == metadata.controller_id,
            "reachable": reachability[address] is None,
            **({"error": reachability[address]} if reachability[address] else {}),
        }
        for address, broker_id in sorted(advertised.items(), key=lambda item: item[1])
    ]
    other_bootstrap = [
        {
            "address": address,
            "reachable": reachability[address] is None,
            **({"error": reachability[address]} if reachability[address] else {}),
        }
        for address in bootstrap
        if address not in advertised
    ]
    problems = [
        f"broker {b['id']} at {b['address']}: {b['error']}" for b in brokers if not b["reachable"]
    ]
    problems += [
        f"bootstrap {b['address']}: {b['error']}" for b in other_bootstrap if not b["reachable"]
    ]

    # The config's topics: there, and a leader for each partition.
    topics: dict[str, dict[str, Any]] = {}
    for stream, topic in kafka.topics.items():
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            reason = "missing" if meta is None or meta.error is None else meta.error.str()
            topics[stream] = {"topic": topic, "error": reason}
            problems.append(f"topic {topic}: {reason}")
            continue
        offline = sorted(p for p, info in meta.partitions.items() if info.leader < 0)
        under = sorted(
            p for p, info in meta.partitions.items() if len(info.isrs) < len(info.replicas)
        )
        topics[stream] = {
            "topic": topic,
            "partitions": len(meta.partitions),
            "offline_partitions": offline,
            "under_replicated_partitions": under,
        }
        if offline:
            problems.append(f"topic {topic}: partitions {offline} have no leader")

    groups = _group_lags(admin, config, options, metadata, deadline)
    if options.max_lag is not None:
        for group, info in groups.items():
            for topic, lag in info.get("lag", {}).items():
                if lag.get("lag", 0) > options.max_lag:
                    problems.append(
                        f"group {group}: {lag['lag']:,} records behind on {topic} "
                        f"(over {options.max_lag:,})"
                    )
    lags = ", ".join(f"{group} {_lag_text(info)}" for group, info in groups.items())
    reachable = sum(1 for b in brokers if b["reachable"])
    summary = f"{reachable} of {len(brokers)} brokers reachable, {len(topics)} topics; lag: {lags}"
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        summary = "; ".join(problems[:3]) + more
    details = {
        "bootstrap": kafka.bootstrap,
        "brokers": brokers,
        **({"bootstrap_addresses": other_bootstrap} if other_bootstrap else {}),
        "topics": topics,
        "groups": groups,
        "problems": problems,
    }
    return PartStatus("kafka", not problems, summary, details)


def _lag_text(info: Mapping[str, Any]) -> str:
    if "error" in info:
        return f"unknown ({info['error']})"
    if not info["committed"]:
        return "no offsets"
    return f"{sum(t['lag'] for t in info['lag'].values() if 'lag' in t):,}"


def _group_lags(
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
            described[group] = _describe_group(admin, group, deadline)
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
            info["error"] = _kafka_reason(offsets)
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


def _state_name(state: Any) -> str:
    name = getattr(state, "name", None)
    return str(name if name is not None else state).lower()


def _kafka_reason(exc: BaseException) -> str:
    if _is_kafka_error(exc):
        return str(exc.args[0].str())
    return _describe(exc)


# ---- reading a topic's tail ------------------------------------------------------------------


def _consumer(kafka: KafkaConfig, errors: _Errors, *, committed_only: bool) -> Consumer:
    return Consumer(
        {
            **_kafka_settings(kafka, errors),
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


def _watermarks(consumer: Consumer, topic: str, deadline: Deadline) -> dict[int, tuple[int, int]]:
    """Per partition of `topic`: its first and next offsets, as the broker has them now."""
    return {
        p: consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=deadline.left_s(), cached=False
        )
        for p in _partitions(consumer, topic, deadline)
    }


def _read_ranges(
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


def _timestamp_ns(msg: Any) -> int | None:
    kind, ms = msg.timestamp()
    return ms * MS_NS if kind != 0 and ms >= 0 else None  # 0: TIMESTAMP_NOT_AVAILABLE


# ---- exporters -------------------------------------------------------------------------------


@_part("exporters")
def check_exporters(config: Config, options: StatusOptions) -> PartStatus:
    """Each link's newest link_counters record, by the record's Kafka timestamp (when its
    exporter produced it) and key (its link). The records of the last `max_data_age` are
    read, at least the newest of each partition; a link not among them (stale, or unknown)
    is looked for further back, a chunk at a time, within a budget of records."""
    deadline = Deadline(options.timeout_ns)
    topic = config.kafka.topics["link_counters"]
    errors = _Errors()
    consumer = _consumer(config.kafka, errors, committed_only=False)
    try:
        return _exporters(consumer, config, options, topic, deadline)
    except KafkaException as exc:
        raise _no_cluster(config.kafka, errors, exc, consumer) from None
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
    marks = _watermarks(consumer, topic, deadline)
    partitions = sorted(marks)
    since_ms = (now_ns - options.max_data_age_ns) // MS_NS
    found = consumer.offsets_for_times(
        [TopicPartition(topic, p, since_ms) for p in partitions], timeout=deadline.left_s()
    )
    newest: dict[str, tuple[int, int, int]] = {}  # link -> (ts ns, partition, offset)
    oldest: dict[int, int] = {}  # partition -> the oldest timestamp read there

    def seen(msg: Any) -> None:
        key, ts_ns = msg.key(), _timestamp_ns(msg)
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
    complete = _read_ranges(consumer, topic, ranges, deadline, seen)
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
        complete = _read_ranges(consumer, topic, ranges, deadline, seen)
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
    limit = human_duration(options.max_data_age_ns)
    if stale:
        described = ", ".join(f"{link} ({_age_text(links[link])})" for link in stale[:5])
        more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
        summary = f"{len(stale)} of {len(links)} links with no data in {limit}: {described}{more}"
        return PartStatus("exporters", False, summary, details)
    ages = [v["age_ns"] for v in links.values()]
    plural = "s" if len(links) != 1 else ""
    summary = (
        f"{len(links)} link{plural} fresh (newest record at most "
        f"{human_duration(max(ages))} old, limit {limit})"
    )
    return PartStatus("exporters", True, summary, details)


def _age_text(info: Mapping[str, Any]) -> str:
    if info.get("age_ns") is not None:
        return f"{human_duration(info['age_ns'])} ago"
    if "older_than_ns" in info:
        return f"none in the last {human_duration(info['older_than_ns'])}"
    return "no record in the topic"


# ---- optimizer -------------------------------------------------------------------------------


@_part("optimizer")
def check_optimizer(config: Config, options: StatusOptions) -> PartStatus:
    """The optimizer group's members and the partitions of link_metrics each holds; each
    link's newest optimizer_state record (its `owner` and `epoch`, in the partition of the
    link's windows), and the member holding that partition now."""
    deadline = Deadline(options.timeout_ns)
    group = config.optimizer.group
    errors = _Errors()
    admin = AdminClient(_kafka_settings(config.kafka, errors))
    try:
        admin.list_topics(timeout=deadline.left_s())  # the cluster answers at all
    except KafkaException as exc:
        raise _no_cluster(config.kafka, errors, exc, admin) from None
    group_state, group_members = _describe_group(admin, group, deadline)
    metrics_topic = config.kafka.topics["link_metrics"]
    members = []
    holder: dict[int, str] = {}  # link_metrics partition -> member
    for member in group_members:
        label = f"{member.client_id}@{member.host.lstrip('/')}"
        assigned = sorted(
            tp.partition
            for tp in (member.assignment.topic_partitions if member.assignment else [])
            if tp.topic == metrics_topic
        )
        for p in assigned:
            holder[p] = label
        members.append(
            {
                "member": label,
                "client_id": member.client_id,
                "host": member.host.lstrip("/"),
                "member_id": member.member_id,
                "partitions": assigned,
            }
        )
    consumer = _consumer(config.kafka, errors, committed_only=True)
    try:
        states, complete = _newest_states(consumer, config, deadline)
    except KafkaException as exc:
        raise _no_cluster(config.kafka, errors, exc, consumer) from None
    finally:
        consumer.close()
    now_ns = time.time_ns()
    links: dict[str, dict[str, Any]] = {}
    unowned, unheld = [], []
    for link in config.links:
        state = states.get(link.id)
        if state is None:
            links[link.id] = {"owner": None}
            unowned.append(link.id)
            continue
        record, partition = state
        held_by = holder.get(partition)
        links[link.id] = {
            "owner": record["owner"],
            "epoch": record["epoch"],
            "partition": partition,
            "state_age_ns": max(0, now_ns - record["ts_ns"]),
            "held_by": held_by,
        }
        if held_by is None:
            unheld.append(link.id)
    for entry in members:
        entry["links"] = sorted(
            link_id
            for link_id, info in links.items()
            if info.get("partition") in entry["partitions"]
        )
    owners: dict[str, list[str]] = {}
    for link_id, info in links.items():
        if info["owner"] is not None:
            owners.setdefault(info["owner"], []).append(link_id)
    details: dict[str, Any] = {
        "group": group,
        "state": group_state,
        "instances": members,
        "links": links,
        "unowned": unowned,
    }
    others = sorted(set(states) - {link.id for link in config.links})
    if others:
        details["not_in_config"] = others
    if not complete:
        details["note"] = "the state topic was not read to its end within the timeout"
    problems = []
    if not members:
        problems.append(f"no instance in group {group}")
    if unowned:
        problems.append(f"links with no owner: {', '.join(unowned)}")
    if members and unheld:
        problems.append(f"links whose partition no instance holds: {', '.join(unheld)}")
    if problems:
        return PartStatus("optimizer", False, "; ".join(problems), details)
    owned = ", ".join(
        f"{owner} {len(ids)} link{'s' if len(ids) != 1 else ''}"
        for owner, ids in sorted(owners.items())
    )
    summary = f"{len(members)} instance{'s' if len(members) != 1 else ''}; owners: {owned}"
    return PartStatus("optimizer", True, summary, details)


def _describe_group(admin: AdminClient, group: str, deadline: Deadline) -> tuple[str, list[Any]]:
    """The group's state and members; a group the coordinator does not know has none."""
    future = admin.describe_consumer_groups([group], request_timeout=deadline.left_s())[group]
    try:
        description = future.result(deadline.left_s())
    except KafkaException as exc:
        if _is_kafka_error(exc) and exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
            return "dead", []
        raise CheckFailed(f"group {group}: {_kafka_reason(exc)}") from None
    return _state_name(description.state), list(description.members)


def _newest_states(
    consumer: Consumer, config: Config, deadline: Deadline
) -> tuple[dict[str, tuple[dict[str, Any], int]], bool]:
    """The newest committed state record of each link, with its partition (the topic is a
    compacted changelog: reading it whole reads little more than one record per link)."""
    topic = config.kafka.topics["optimizer_state"]
    schema = codec(STREAMS["optimizer_state"])
    ranges = _watermarks(consumer, topic, deadline)
    newest: dict[str, tuple[dict[str, Any], int]] = {}

    def seen(msg: Any) -> None:
        try:
            record = schema.decode(msg.value(), msg.headers())
        except RecordError:
            return
        newest[record["link_id"]] = (record, msg.partition())

    complete = _read_ranges(consumer, topic, ranges, deadline, seen)
    return newest, complete


# ---- routers ---------------------------------------------------------------------------------


@_part("routers")
def check_routers(config: Config, options: StatusOptions) -> PartStatus:
    """Each router with a link, read through its driver: queue 0 of its first link's
    interface, one attempt within the timeout (the router's own if shorter)."""
    routers: dict[str, dict[str, Any]] = {}
    probes: list[tuple[RouterConfig, LinkConfig]] = []
    for router in config.routers:
        link = next((k for k in config.links if k.router == router.name), None)
        if link is None:
            routers[router.name] = {"driver": router.driver, "checked": False, "note": "no link"}
            continue
        probes.append((router, link))
    answers = asyncio.run(_read_routers(config, probes, options.timeout_ns))
    failed = []
    for (router, link), answer in zip(probes, answers, strict=True):
        entry: dict[str, Any] = {
            "driver": router.driver,
            "address": router.address,
            "interface": link.interface,
            "queue": 0,
        }
        if isinstance(answer, int):
            entry["reachable"] = True
            entry["buffer_bytes"] = answer
            entry["drains_in_ns"] = duration_for_bytes(answer, link.capacity_bps)
        else:
            entry["reachable"] = False
            entry["error"] = answer
            failed.append(f"{router.name}: {answer}")
        routers[router.name] = entry
    details = {"routers": routers}
    if failed:
        return PartStatus("routers", False, "; ".join(failed), details)
    read = [
        f"{name} {human_bytes(r['buffer_bytes'])}"
        for name, r in routers.items()
        if r.get("reachable")
    ]
    summary = f"{len(read)} router{'s' if len(read) != 1 else ''} answered: {', '.join(read)}"
    if not read:
        summary = "no router with a link to read"
    return PartStatus("routers", True, summary, details)


async def _read_routers(
    config: Config, probes: list[tuple[RouterConfig, LinkConfig]], timeout_ns: int
) -> list[int | str]:
    return list(await asyncio.gather(*(_read_router(config, r, k, timeout_ns) for r, k in probes)))


async def _read_router(
    config: Config, router: RouterConfig, link: LinkConfig, timeout_ns: int
) -> int | str:
    """Queue 0's buffer in bytes, or why it could not be read."""
    from p4bs_optimizer.drivers import driver_for
    from p4bs_optimizer.drivers.base import DriverError

    bounded = dataclasses.replace(router, timeout_ns=min(router.timeout_ns, timeout_ns))
    try:
        driver = driver_for(bounded, links=config.links, attempts=1)
    except Exception as exc:  # a driver that cannot be made (its library, its address)
        return f"driver {router.driver}: {_describe(exc)}"
    try:
        # The driver cuts an attempt at its timeout; this bounds the rest (connecting a
        # library that ignores it, closing).
        return await asyncio.wait_for(
            driver.get_buffer(link.interface, 0), timeout_ns / 1e9 + GRACE_NS / 2e9
        )
    except DriverError as exc:
        return f"{exc.kind}: {exc.message}"
    except TimeoutError:
        return f"no answer within {timeout_ns / 1e9:g} s"
    except Exception as exc:
        return _describe(exc)
    finally:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing to do
            await asyncio.wait_for(driver.close(), 1.0)


# ---- Flink -----------------------------------------------------------------------------------


def _get_json(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return json.loads(reply.read())


def _http_reason(url: str, exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"{url}: HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        return f"{url}: {text}"
    if isinstance(exc, TimeoutError):
        return f"{url}: no answer in time"
    if isinstance(exc, ValueError):
        return f"{url}: not JSON ({exc})"
    return f"{url}: {_describe(exc)}"


@_part("flink")
def check_flink(config: Config, options: StatusOptions) -> PartStatus:
    flink = config.flink
    if flink.mode == "embedded":
        return PartStatus(
            "flink",
            True,
            "embedded mini cluster: the job is not observable from here (it runs inside "
            f"`p4bs jobs run`); its progress is group {options.metrics_group}'s lag (kafka)",
            {
                "mode": "embedded",
                "to_watch_it": '[flink] mode = "remote" with jobmanager = HOST:PORT, a '
                "standalone cluster there, and the job submitted with `p4bs jobs submit`",
            },
        )
    deadline = Deadline(options.timeout_ns)
    rest = f"http://{flink.jobmanager}"
    url = f"{rest}/jobs/overview"
    try:
        overview = _get_json(url, deadline.left_s())
    except (OSError, ValueError) as exc:
        raise CheckFailed(
            f"JobManager {_http_reason(url, exc)}", {"mode": "remote", "jobmanager": rest}
        ) from None
    jobs = [j for j in overview.get("jobs", []) if options.flink_job in str(j.get("name", ""))]
    details: dict[str, Any] = {"mode": "remote", "jobmanager": rest}
    if not jobs:
        names = sorted(str(j.get("name")) for j in overview.get("jobs", []))
        details["jobs"] = names
        raise CheckFailed(
            f"no metrics job (name containing {options.flink_job!r}) on {rest}; submit it with "
            "`p4bs jobs submit`",
            details,
        )
    # A running one first, else the newest: jobs cancelled earlier stay listed for a while.
    jobs.sort(key=lambda j: (j.get("state") == RUNNING, j.get("start-time", 0)), reverse=True)
    job = jobs[0]
    jid, state = str(job.get("jid")), str(job.get("state"))
    details.update(
        {
            "job_id": jid,
            "name": job.get("name"),
            "state": state,
            "running_ns": int(job.get("duration", 0)) * MS_NS,
            "max_checkpoint_age_ns": options.checkpoint_age_limit_ns(config),
        }
    )
    running = sum(j.get("state") == RUNNING for j in jobs)
    if running > 1:
        details["running_jobs"] = running
    if state != RUNNING:
        return PartStatus("flink", False, f"metrics job {jid} is {state}", details)
    url = f"{rest}/jobs/{jid}/checkpoints"
    try:
        checkpoints = _get_json(url, deadline.left_s())
    except (OSError, ValueError) as exc:
        reason = _http_reason(url, exc)
        raise CheckFailed(f"metrics job {jid} is RUNNING; {reason}", details) from None
    completed = (checkpoints.get("latest") or {}).get("completed")
    counts = checkpoints.get("counts") or {}
    details["checkpoints"] = {k: counts.get(k) for k in ("completed", "failed", "in_progress")}
    limit = options.checkpoint_age_limit_ns(config)
    if not completed:
        if details["running_ns"] <= limit:
            return PartStatus(
                "flink",
                True,
                f"metrics job {jid} RUNNING for {human_duration(details['running_ns'])}, "
                "no checkpoint completed yet",
                details,
            )
        return PartStatus(
            "flink",
            False,
            f"metrics job {jid} RUNNING for {human_duration(details['running_ns'])} with no "
            "completed checkpoint",
            details,
        )
    age = max(0, time.time_ns() - int(completed["latest_ack_timestamp"]) * MS_NS)
    details["last_checkpoint"] = {"id": completed.get("id"), "age_ns": age}
    if age > limit:
        return PartStatus(
            "flink",
            False,
            f"metrics job {jid} RUNNING, but its last checkpoint ({completed.get('id')}) is "
            f"{human_duration(age)} old (limit {human_duration(limit)})",
            details,
        )
    return PartStatus(
        "flink",
        True,
        f"metrics job {jid} RUNNING, last checkpoint {human_duration(age)} ago",
        details,
    )


# ---- InfluxDB --------------------------------------------------------------------------------


@_part("influxdb")
def check_influxdb(config: Config, options: StatusOptions) -> PartStatus:
    """`/ping`, the config's database, and the write rate: the `write` module's `pointReq`
    counter of `SHOW STATS` read twice, `influx_interval` apart (points the server was asked
    to write, into any database, per second). SHOW STATS reads the server's counters in
    memory: it works whether or not the server keeps them in `_internal` (the project's
    InfluxDB does not: [monitor] store-enabled = false), and it does not depend on the data's
    timestamps as counting the newest points of link_metrics would (those are windows' event
    times: a sink catching up writes old ones)."""
    influx = config.influxdb
    deadline = Deadline(options.timeout_ns)
    headers: dict[str, str] = {}
    try:
        if influx.username is not None and influx.password is not None:
            token = f"{influx.username.resolve()}:{influx.password.resolve()}"
            headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
    except LookupError as exc:
        raise CheckFailed(f"influxdb credentials: {exc}") from None
    url = f"{influx.url}/ping"
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=deadline.left_s()) as reply:
            version = reply.headers.get("X-Influxdb-Version")
            status = reply.status
    except (OSError, ValueError) as exc:
        raise CheckFailed(_http_reason(url, exc), {"url": influx.url}) from None
    details: dict[str, Any] = {"url": influx.url, "version": version, "database": influx.database}
    if status != 204:
        raise CheckFailed(f"{url}: HTTP {status}, not 204", details)
    try:
        databases = _influx_query(influx.url, "SHOW DATABASES", headers, deadline)
    except CheckFailed as exc:
        raise CheckFailed(str(exc), details) from None
    names = {row[0] for series in databases for row in series.get("values") or []}
    details["database_exists"] = influx.database in names
    try:
        first, first_at = _points_requested(influx.url, headers, deadline), time.monotonic_ns()
        time.sleep(options.influx_interval_ns / 1e9)  # the measurement's interval
        second, second_at = _points_requested(influx.url, headers, deadline), time.monotonic_ns()
        rate = (second - first) * SECOND_NS / max(1, second_at - first_at)
        details["points_per_s"] = round(rate, 1)
        details["interval_ns"] = second_at - first_at
        rate_text = f"{rate:,.0f} points/s written"
    except CheckFailed as exc:  # a user without the rights to SHOW STATS: reachable still
        details["points_per_s"] = None
        details["rate_error"] = str(exc)
        rate_text = "write rate unknown"
    known = version and version != "unknown"  # a build from source says "unknown"
    where = f"{influx.url}" + (f" (InfluxDB {version})" if known else "")
    if not details["database_exists"]:
        return PartStatus(
            "influxdb", False, f"{where}: no database {influx.database!r}; {rate_text}", details
        )
    summary = f"{where} up, database {influx.database}; {rate_text}"
    return PartStatus("influxdb", True, summary, details)


def _influx_query(
    base: str, statement: str, headers: Mapping[str, str], deadline: Deadline
) -> list[dict[str, Any]]:
    """The series of one InfluxQL statement; CheckFailed with InfluxDB's message on error."""
    url = f"{base}/query?" + urllib.parse.urlencode({"q": statement})
    try:
        answer = _get_json(url, deadline.left_s(), headers)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise CheckFailed(f"{statement}: HTTP {exc.code}: {message}") from None
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"{statement}: {_http_reason(base, exc)}") from None
    series: list[dict[str, Any]] = []
    for result in answer.get("results", []):
        if "error" in result:
            raise CheckFailed(f"{statement}: {result['error']}")
        series.extend(result.get("series") or [])
    return series


def _points_requested(base: str, headers: Mapping[str, str], deadline: Deadline) -> int:
    """The server's `write` counter `pointReq` (points asked to be written since it began)."""
    for series in _influx_query(base, "SHOW STATS", headers, deadline):
        if series.get("name") == "write":
            row = dict(zip(series["columns"], series["values"][0], strict=True))
            return int(row["pointReq"])
    raise CheckFailed("SHOW STATS: no write statistics")


CHECKS: dict[str, Check] = {
    "kafka": check_kafka,
    "flink": check_flink,
    "exporters": check_exporters,
    "optimizer": check_optimizer,
    "routers": check_routers,
    "influxdb": check_influxdb,
}


# ---- output ----------------------------------------------------------------------------------


def to_json(results: Iterable[PartStatus], config_path: str, checked_at_ns: int) -> dict[str, Any]:
    """The stable JSON object of `p4bs status --json` (ns, bytes, bit/s as integers)."""
    results = list(results)
    return {
        "healthy": all(r.healthy for r in results),
        "config": config_path,
        "checked_at_ns": checked_at_ns,
        "parts": {
            r.name: {
                "healthy": r.healthy,
                "summary": r.summary,
                "took_ns": r.took_ns,
                "details": r.details,
            }
            for r in results
        },
    }


def render_text(
    results: Iterable[PartStatus],
    config_path: str | None = None,
    checked_at_ns: int | None = None,
    *,
    details: bool = True,
) -> str:
    """The screen: a line per part (OK/FAIL, name, summary), its details indented below,
    then the verdict."""
    results = list(results)
    lines = []
    if config_path is not None:
        at = ""
        if checked_at_ns is not None:
            when = datetime.fromtimestamp(checked_at_ns / 1e9, UTC)
            at = " at " + when.isoformat(timespec="seconds").replace("+00:00", "Z")
        lines.append(f"p4bs status of {config_path}{at}")
    width = max((len(r.name) for r in results), default=0)
    for r in results:
        took = f" [{human_duration(r.took_ns)}]" if r.took_ns >= MS_NS else ""
        lines.append(f"{'OK' if r.healthy else 'FAIL':<4}  {r.name:<{width}}  {r.summary}{took}")
        if details:
            lines.extend(_detail_lines(r.details, " " * (width + 8)))
    bad = [r.name for r in results if not r.healthy]
    if bad:
        lines.append(f"unhealthy: {', '.join(bad)} ({len(bad)} of {len(results)} parts)")
    else:
        lines.append("healthy: " + ("1 part" if len(results) == 1 else f"all {len(results)} parts"))
    return "\n".join(lines)


_FIELD = re.compile(r"[a-z][a-z0-9_]*")


def _label(key: str) -> str:
    """A details key as printed: a field name without its unit suffix, underscores as
    spaces ("age_ns" -> "age"); a name (a link, a group, a topic) as it is."""
    if not _FIELD.fullmatch(key):
        return key
    for suffix in ("_ns", "_bytes", "_bps", "_per_s"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def format_value(key: str, value: Any) -> str:
    """A details value in human units, by its key's unit suffix."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if key.endswith("_ns"):
            return human_duration(int(value))
        if key.endswith("_bytes"):
            return human_bytes(int(value))
        if key.endswith("_bps"):
            return human_rate(int(value))
        if key.endswith("_per_s"):
            return f"{value:,.1f}/s"
        return f"{value:,}" if isinstance(value, int) else f"{value:g}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "none"
    return str(value)


def _scalar(value: Any) -> bool:
    """A value printed within a line: a scalar or a list of scalars."""
    if isinstance(value, list):
        return not any(isinstance(x, dict | list) for x in value)
    return not isinstance(value, dict)


def _inline(value: Mapping[str, Any]) -> str:
    """A dict's scalar entries on one line (empty lists left out)."""
    return ", ".join(
        f"{_label(k)} {format_value(k, v)}" for k, v in value.items() if _scalar(v) and v != []
    )


def _detail_lines(details: Mapping[str, Any], indent: str) -> list[str]:
    """Each entry on a line of its own; a dict's scalars inline after its name and its
    nested entries below, indented; a list of dicts one item a line."""
    lines = []
    for key, value in details.items():
        name = _label(str(key))
        if isinstance(value, dict):
            nested = {k: v for k, v in value.items() if not _scalar(v)}
            inline = _inline(value)
            if inline:
                lines.append(f"{indent}{name}: {inline}")
            else:
                lines.append(f"{indent}{name}:" + ("" if nested else " none"))
            lines.extend(_detail_lines(nested, indent + "  "))
        elif isinstance(value, list) and not _scalar(value):
            lines.append(f"{indent}{name}:" + ("" if value else " none"))
            for item in value:
                if isinstance(item, dict):
                    lines.append(f"{indent}  - {_inline(item)}")
                    nested = {k: v for k, v in item.items() if not _scalar(v)}
                    lines.extend(_detail_lines(nested, indent + "    "))
                else:
                    lines.append(f"{indent}  - {item}")
        else:
            lines.append(f"{indent}{name}: {format_value(str(key), value)}")
    return lines


def human_duration(ns: int) -> str:
    """850 ns, 12.3 µs, 80 ms, 3.2 s, 4 min 10 s, 2 h 5 min, 3 d 4 h."""
    if ns < 0:
        return "-" + human_duration(-ns)
    if ns < 1_000:
        return f"{ns} ns"
    if ns < MS_NS:
        return f"{ns / 1e3:.3g} µs"
    if ns < SECOND_NS:
        return f"{ns / 1e6:.3g} ms"
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:.3g} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def human_bytes(size: int) -> str:
    """262144 -> '256 KiB'; below 1 KiB in bytes."""
    if abs(size) < 1024:
        return f"{size} B"
    exponent = min(int(math.log(abs(size), 1024)), 4)
    unit = ("B", "KiB", "MiB", "GiB", "TiB")[exponent]
    return f"{size / 1024**exponent:.4g} {unit}"


def human_rate(bps: int) -> str:
    for unit, scale in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if abs(bps) >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps} bit/s"


__all__ = [
    "CHECKS",
    "PARTS",
    "PartStatus",
    "StatusOptions",
    "exit_code",
    "render_text",
    "run_status",
    "to_json",
]
