"""The fleet as the dashboard knows it: one Kafka reader thread keeps, per link, its config,
its newest window, its recent decisions, its open alerts and its optimizer state, and hands
every new record to the pages that listen (`subscribe`).

The reader assigns itself every partition of the topics it reads and commits nothing, under a
group id of its own that it never joins: it takes no partition from the optimizer, the sinks
or another dashboard. It reads the compacted topics (links, optimizer_state) from their
starts, and the alerts (an open one may be old), and of the others only their tails
(`TAIL_RECORDS` per partition): the newest window of every link is in the metrics' tail, and
what came before is InfluxDB's (`history`). A
record it cannot decode is counted and its reason kept for the page; it is not dead-lettered,
as the dashboard only watches (the parts that consume the topic dead-letter it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from p4bs.bus import client_settings
from p4bs.config import Config, ConfigError, LinkConfig, link_from_table
from p4bs.topic_range import SECOND_NS, Deadline, arrived, reader, unread, watermarks
from p4bs_schemas.codec import RecordError, codec
from p4bs_schemas.registry import STREAMS

log = logging.getLogger(__name__)

# Records read back from each partition's end at start, per stream that is not compacted: the
# newest window of up to this many links per partition, and their recent decisions and alerts.
TAIL_RECORDS = 5_000
DECISIONS_KEPT = 200  # per link, newest first on the link page
REASONS_KEPT = 20  # of malformed records, shown on the pages
STREAMS_READ = ("links", "optimizer_state", "link_metrics", "buffer_decisions", "sla_alerts")
# Read from their starts: the compacted topics, and the alerts, as an alert is raised once and
# stays open until it is resolved, however many records came after it (alerts are few: each
# takes K windows out of bounds).
READ_WHOLE = frozenset({"links", "optimizer_state", "sla_alerts"})
WATERMARKS_TIMEOUT_NS = 10 * SECOND_NS  # for a topic's partitions and their ends
LISTENER_QUEUE = 2_000  # events a slow page may be behind before it misses some


@dataclass
class LinkView:
    """What the dashboard holds of one link."""

    link: LinkConfig
    window: dict[str, Any] | None = None  # the newest LinkMetrics record
    decisions: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=DECISIONS_KEPT))
    open_alerts: dict[str, dict[str, Any]] = field(default_factory=dict)  # by alert_id
    state: dict[str, Any] | None = None  # the newest OptimizerLinkState record, decoded


@dataclass
class FeedStats:
    received: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS_READ, 0))
    malformed: int = 0
    reasons: deque[str] = field(default_factory=lambda: deque(maxlen=REASONS_KEPT))
    unknown_links: int = 0  # records of links neither the config nor the links topic has
    kafka_error: str | None = None  # the last error the reader met, until it reads again
    caught_up: bool = False  # the tails read at start are all read
    dropped_events: int = 0  # events a page was too far behind to be given
    odd_values: int = 0  # NaN or infinite numbers a page was sent as null ("—")


Event = dict[str, Any]  # {"kind": stream, "link_id": ..., "record": ...}


class Fleet:
    """The state of every link, updated by the reader thread and read by the server."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.links: dict[str, LinkView] = {link.id: LinkView(link) for link in config.links}
        self.stats = FeedStats()
        self._lock = threading.Lock()
        # Per link, the queues of its pages' event streams and the loops they belong to.
        self._listeners: dict[
            str, list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]]
        ] = {}

    @contextmanager
    def locked(self) -> Iterator[dict[str, LinkView]]:
        with self._lock:
            yield self.links

    # -- updates (the reader thread) ------------------------------------------------------

    def apply(self, stream: str, record: dict[str, Any]) -> None:
        """Takes one decoded record of `stream` in, then tells the listeners."""
        with self._lock:
            self.stats.received[stream] += 1
            link_id = record["link_id"]
            if stream == "links":
                self._apply_spec(record)
            else:
                view = self.links.get(link_id)
                if view is None:
                    self.stats.unknown_links += 1
                    return
                self._apply_to(view, stream, record)
        self.publish({"kind": stream, "link_id": link_id, "record": record})

    def _apply_spec(self, record: dict[str, Any]) -> None:
        link_id = record["link_id"]
        if record["removed"]:
            self.links.pop(link_id, None)
            return
        try:
            link = link_from_table(self.config, json.loads(record["config"]), f"links/{link_id}")
        except (ConfigError, ValueError) as exc:
            self._malformed(f"links record of {link_id}: {exc}")
            return
        view = self.links.get(link_id)
        if view is None:
            self.links[link_id] = LinkView(link)
        else:
            view.link = link

    @staticmethod
    def _apply_to(view: LinkView, stream: str, record: dict[str, Any]) -> None:
        if stream == "link_metrics":
            if view.window is None or record["window_end_ns"] >= view.window["window_end_ns"]:
                view.window = record
        elif stream == "buffer_decisions":
            view.decisions.appendleft(record)
        elif stream == "sla_alerts":
            if record["state"] == "raise":
                view.open_alerts[record["alert_id"]] = record
            else:
                view.open_alerts.pop(record["alert_id"], None)
        elif stream == "optimizer_state":
            view.state = record

    def odd_values(self, where: list[str]) -> None:
        """Numbers that were NaN or infinite, sent to a page as null."""
        with self._lock:
            self.stats.odd_values += len(where)
        log.warning("values shown as null (not finite numbers): %s", ", ".join(where[:10]))

    def malformed(self, reason: str) -> None:
        with self._lock:
            self._malformed(reason)

    def _malformed(self, reason: str) -> None:
        self.stats.malformed += 1
        self.stats.reasons.append(reason)
        log.warning("malformed record: %s", reason)

    # -- listeners (the pages' event streams) ---------------------------------------------

    def subscribe(self, link_id: str) -> asyncio.Queue[Event]:
        """A queue of the link's events from now on, for a coroutine of the running loop."""
        queue: asyncio.Queue[Event] = asyncio.Queue(LISTENER_QUEUE)
        with self._lock:
            self._listeners.setdefault(link_id, []).append((asyncio.get_running_loop(), queue))
        return queue

    def unsubscribe(self, link_id: str, queue: asyncio.Queue[Event]) -> None:
        with self._lock:
            kept = [(lp, q) for lp, q in self._listeners.get(link_id, []) if q is not queue]
            if kept:
                self._listeners[link_id] = kept
            else:
                self._listeners.pop(link_id, None)

    def publish(self, event: Event) -> None:
        with self._lock:
            listeners = list(self._listeners.get(event["link_id"], ()))
        for loop, queue in listeners:
            loop.call_soon_threadsafe(self._offer, queue, event)

    def _offer(self, queue: asyncio.Queue[Event], event: Event) -> None:
        try:
            queue.put_nowait(event)
        except asyncio.QueueFull:  # the page is this far behind: it misses the event
            self.stats.dropped_events += 1


class FeedReader:
    """The thread that reads the topics into a `Fleet` until `stop`."""

    def __init__(self, fleet: Fleet, poll_s: float = 0.2) -> None:
        self.fleet = fleet
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-feed", daemon=True)
        topics = fleet.config.kafka.topics
        self._stream_of = {topics[s]: s for s in STREAMS_READ}

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        """Reads on, making the consumer again after an error (Kafka down at start, a
        credential missing), every few seconds until stopped."""
        while not self._stop.is_set():
            try:
                self._read()
            except (KafkaException, LookupError) as exc:
                with self.fleet.locked():
                    self.fleet.stats.kafka_error = str(exc)
                log.warning("dashboard feed: %s; reading again in 5 s", exc)
                self._stop.wait(5.0)

    def _consumer(self) -> Consumer:
        return reader(
            client_settings(self.fleet.config.kafka),
            "p4bs-dashboard",
            # A decision reaches the page within a fraction of a second of its commit.
            settings={"fetch.wait.max.ms": 50},
        )

    def _read(self) -> None:
        consumer = self._consumer()
        try:
            # The links topic first, to its end: a link is known before its records come.
            links_topic = self.fleet.config.kafka.topics["links"]
            self._read_to(consumer, self._assign(consumer, [links_topic]))
            others = [t for t in self._stream_of if t != links_topic]
            ends = self._assign(consumer, others)
            with self.fleet.locked():
                self.fleet.stats.kafka_error = None
            self._read_to(consumer, ends)
            with self.fleet.locked():
                self.fleet.stats.caught_up = True
            while not self._stop.is_set():
                for msg in arrived(consumer, self.poll_s):
                    self._handle(msg)
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer, topics: list[str]) -> dict[tuple[str, int], int]:
        """Adds the topics' partitions to the assignment, each from where it is read;
        returns the end now of each that has records to read."""
        assigned, ends = [], {}
        for topic in topics:
            stream = self._stream_of[topic]
            marks = watermarks(consumer, topic, Deadline(WATERMARKS_TIMEOUT_NS))
            for partition, (low, high) in marks.items():
                first = low if stream in READ_WHOLE else max(low, high - TAIL_RECORDS)
                assigned.append(TopicPartition(topic, partition, first))
                if high > first:  # an empty one has no position to compare until it fills
                    ends[(topic, partition)] = high
        consumer.incremental_assign(assigned)
        return ends

    def _read_to(self, consumer: Consumer, ends: dict[tuple[str, int], int]) -> None:
        """Reads on until every partition is read at least up to where `ends` says it ended
        (or until stopped)."""
        while ends and not self._stop.is_set():
            for msg in arrived(consumer, self.poll_s):
                self._handle(msg)
            ends = unread(consumer, ends)

    def _handle(self, msg: Message) -> None:
        error = msg.error()
        if error is not None:
            if error.fatal():
                raise KafkaException(error)
            if error.code() != KafkaError._PARTITION_EOF:
                with self.fleet.locked():
                    self.fleet.stats.kafka_error = error.str()
            return
        topic, partition, offset = msg.topic() or "", msg.partition(), msg.offset()
        stream = self._stream_of[topic]
        try:
            record = codec(STREAMS[stream]).decode(msg.value(), msg.headers())
        except RecordError as exc:
            self.fleet.malformed(f"{topic}[{partition}]@{offset}: {exc}")
            return
        if stream == "optimizer_state":
            record = _decoded_state(record)
        self.fleet.apply(stream, record)


def _decoded_state(record: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state with its policy snapshot as data (it travels as JSON text)."""
    try:
        snapshot = json.loads(record["policy_state"])
    except ValueError:
        snapshot = None
    return {**record, "policy_state": snapshot}
