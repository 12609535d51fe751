"""The InfluxDB sink: link metrics, SLA alerts and buffer decisions from Kafka into InfluxDB.

Points are written in batches (line protocol, InfluxDB 1.x `/write`); a batch's Kafka
offsets are committed only once InfluxDB has taken it, and a failed write is retried with a
doubling backoff until it succeeds, so the history has no holes (Kafka holds the backlog
meanwhile). A batch InfluxDB rejects for good (HTTP 4xx, e.g. points older than the
retention policy) is counted, logged and passed over. A point is identified by its
measurement, tags and time, so a batch written twice after a crash stays one set of points.

Link metrics go into the database's default retention policy (every window, kept for
`influxdb.retention`), SLA alerts and buffer decisions into `events` (kept for a year by
default); continuous queries summarise the windows per second and per minute
(p4bs/retention.py). Windows written too late for a continuous query to see them again (a
job catching up) the sink summarises itself: at most once a second, it makes the rollups of
the intervals they fall in again (`retention.late_rollup_select`); a summary that fails is
tried again at the next one.

Schema (time = the record's window end or event time, ns):
- `link_metrics`, tags `link`, `router`, `interface`; every numeric field of LinkMetrics
  (a null field is left out of the point), `change` as a boolean.
- `sla_alerts`, tags `link`, `router`, `interface`, `kind`, `state`; fields `value`,
  `bound`, `windows`, `alert_id`.
- `buffer_decisions`, tags `link`, `router`, `interface`, `queue`, `policy`, `phase`,
  `outcome`; fields `buffer_bytes`, `previous_buffer_bytes`, `trial`, `f`, `reason`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from p4bs import retention
from p4bs.bus import Cluster, ConsumerStats, Received, RecordConsumer
from p4bs.config import InfluxConfig
from p4bs.influx import InfluxClient, InfluxError

log = logging.getLogger(__name__)

STREAMS = ("link_metrics", "sla_alerts", "buffer_decisions")
MAX_BACKOFF_S = 30.0

# stream -> (time field, tag fields besides the link's, fields not written)
_LAYOUT: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "link_metrics": ("window_end_ns", (), ("window_start_ns",)),
    "sla_alerts": ("ts_ns", ("kind", "state"), ()),
    "buffer_decisions": ("ts_ns", ("queue", "policy", "phase", "outcome"), ()),
}


def _escape(text: str, special: str) -> str:
    for char in "\\" + special:
        text = text.replace(char, "\\" + char)
    return text


def _field_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        return repr(value)
    return '"' + _escape(str(value), '"') + '"'


def line_of(stream: str, record: Mapping[str, Any]) -> str:
    """One point in InfluxDB's line protocol."""
    time_field, tags, skipped = _LAYOUT[stream]
    router, _, interface = record["link_id"].partition(":")
    tag_values = {"link": record["link_id"], "router": router, "interface": interface}
    tag_values.update({tag: str(record[tag]) for tag in tags})
    key = ",".join(
        [stream] + [f"{_escape(k, ',= ')}={_escape(v, ',= ')}" for k, v in tag_values.items() if v]
    )
    fields = ",".join(
        f"{_escape(name, ',= ')}={_field_value(value)}"
        for name, value in record.items()
        if name not in (time_field, "link_id", *tags, *skipped) and value is not None
    )
    return f"{key} {fields} {record[time_field]}"


@dataclass
class SinkStats:
    written: int = 0
    rejected: int = 0  # points InfluxDB refused for good (see last_error)
    batches: int = 0
    retries: int = 0
    late_rollups: int = 0  # rollups made again for windows too late for their query
    last_error: str | None = None


def write_points(
    influx: InfluxClient,
    policy: str,
    lines: list[str],
    stats: SinkStats,
    stop: threading.Event,
) -> bool:
    """Writes `lines` into retention policy `policy` until InfluxDB takes them (retrying a
    failure with a doubling backoff) or rejects them for good (counted in `stats.rejected`,
    logged); False if stopped first."""
    backoff = 0.5
    while True:
        try:
            influx.write(lines, retention_policy=policy, timeout_s=30)
            stats.written += len(lines)
            return True
        except InfluxError as exc:
            error = str(exc)
            if exc.refused:
                # Rejected for good (e.g. points older than the retention policy): no
                # retry can help. Counted and logged; the records stay in Kafka.
                stats.rejected += len(lines)
                stats.last_error = error
                log.error("InfluxDB rejected %d points: %s", len(lines), error)
                return True
        stats.last_error = error
        log.warning("InfluxDB write of %d points failed: %s", len(lines), error)
        if stop.wait(backoff):
            return False
        stats.retries += 1
        backoff = min(backoff * 2, MAX_BACKOFF_S)


class InfluxSink:
    def __init__(
        self,
        settings: InfluxConfig,
        cluster: Cluster,
        topics: Mapping[str, str],
        *,
        group: str = "p4bs-influx-sink",
        batch_size: int = 5000,
        batch_interval_s: float = 0.2,
    ) -> None:
        self.settings = settings
        self.batch_size = batch_size
        self.batch_interval_s = batch_interval_s
        self.stats = SinkStats()
        self._influx = InfluxClient(settings)
        self._consumer = RecordConsumer(cluster, group, STREAMS, topics, store_on_poll=False)
        # Per rollup, the first and last window written too late for its continuous query.
        self._late: dict[retention.Rollup, tuple[int, int]] = {}
        self._summarised = time.monotonic()

    @property
    def consumer_stats(self) -> ConsumerStats:
        """Its consumer's counts: the records it took, those it sent to the dead letters."""
        return self._consumer.stats

    def _write_batch(self, batch: list[Received], stop: threading.Event) -> bool:
        """Writes the batch, each measurement into its retention policy, until InfluxDB
        takes it or rejects it for good; False if stopped."""
        by_policy: dict[str, list[Received]] = {}
        for received in batch:
            policy = retention.retention_policy_of(received.stream)
            by_policy.setdefault(policy, []).append(received)
        for policy, points in by_policy.items():
            if not self._write_points(policy, points, stop):
                return False
        self._consumer.handled(batch)
        self.stats.batches += 1
        self._note_late(batch)
        return True

    def _note_late(self, batch: list[Received]) -> None:
        written = time.time_ns()
        ends = [r.record["window_end_ns"] for r in batch if r.stream == retention.DOWNSAMPLED]
        for rollup in retention.ROLLUPS:
            cutoff = rollup.late_before(written)
            late = [end for end in ends if end < cutoff]
            if late:
                first, last = self._late.get(rollup, (min(late), max(late)))
                self._late[rollup] = (min(first, min(late)), max(last, max(late)))

    def _summarise_late(self, timeout_s: float = 60.0) -> None:
        """Makes the rollups of the late windows' intervals again; what fails stays noted."""
        self._summarised = time.monotonic()
        for rollup, (first, last) in list(self._late.items()):
            query = retention.late_rollup_select(self.settings.database, rollup, first, last)
            try:
                self._influx.query(query, timeout_s=timeout_s)
            except InfluxError as exc:
                self.stats.last_error = str(exc)
                log.warning("%s of late windows not made again: %s", rollup.policy, exc)
                continue
            del self._late[rollup]
            self.stats.late_rollups += 1

    def _write_points(self, policy: str, points: list[Received], stop: threading.Event) -> bool:
        lines = [line_of(r.stream, r.record) for r in points]
        return write_points(self._influx, policy, lines, self.stats, stop)

    def run(
        self, stop: threading.Event, on_batch: Callable[[SinkStats], None] | None = None
    ) -> SinkStats:
        """Writes until `stop` is set; what is read but not yet written then is read again
        by the next run (its offsets were not committed)."""
        batch: list[Received] = []
        opened = time.monotonic()
        try:
            while not stop.is_set():
                received = self._consumer.poll(self.batch_interval_s / 4)
                if received is not None:
                    if not batch:
                        opened = time.monotonic()
                    batch.append(received)
                due = time.monotonic() - opened >= self.batch_interval_s
                if batch and (len(batch) >= self.batch_size or due):
                    if not self._write_batch(batch, stop):
                        break
                    batch = []
                    if on_batch is not None:
                        on_batch(self.stats)
                if self._late and time.monotonic() - self._summarised >= 1.0:
                    self._summarise_late()
        finally:
            if self._late:  # their windows are committed: a next run would not see them
                self._summarise_late(timeout_s=5.0)
            self._consumer.close()
            self._influx.close()
        return self.stats
