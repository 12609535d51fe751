"""A link's export interval travels whole, as one `LinkCounters` record (v3): the interval's
counters, its long-flow events and its RTT samples, so that one stream, with one watermark,
carries all of it. The RTT samples are columns (the record's flows once each, then per
sample its flow's index, its offset in the interval and its RTT) so that a reader's
per-sample work is numbers only; an interval with more samples than a record holds comes in
several records (parts), the last of them `complete`, with the counters and the events.

`IntervalAssembler` gathers what the data plane reports into those records, as the Rust
exporter does; `samples_of` and `events_of` turn a record back into flat samples and flow
events, each with its `link_id`; `layout_problem` says what breaks the columns'
invariants, which the schema cannot state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]

DEFAULT_MAX_SAMPLES = 8192

FLOW_FIELDS = ("src_ip", "dst_ip", "src_port", "dst_port", "protocol")
SAMPLE_COLUMNS = ("flow_index", "offset_ns", "rtt_ns")
COUNT_FIELDS = (
    "packets",
    "bytes",
    "after_packets",
    "after_bytes",
    "data_packets",
    "data_bytes",
    "retransmissions",
    "queue_delay_samples",
    "queue_delay_sum_ns",
    "queue_delay_ewma_ns",
)
EVENT_FIELDS = ("ts_ns", "kind", "reason", *FLOW_FIELDS, "packets")
NO_COUNTS: Record = dict.fromkeys(COUNT_FIELDS, 0)
KINDS = ("start", "end")
REASONS = ("threshold", "window", "idle_timeout", "fin", "rst")


def samples_of(record: Record) -> list[Record]:
    """The record's RTT samples, oldest first, each with the record's `link_id`, its absolute
    `ts_ns`, its flow's 5-tuple and `rtt_ns`."""
    start = record["ts_ns"] - record["interval_ns"]
    flows = record["flows"]
    return [
        {"link_id": record["link_id"], "ts_ns": start + offset, **flows[index], "rtt_ns": rtt}
        for index, offset, rtt in zip(
            record["flow_index"], record["offset_ns"], record["rtt_ns"], strict=True
        )
    ]


def events_of(record: Record) -> list[Record]:
    """The record's long-flow events, each with the record's `link_id` (FlowEvent fields)."""
    return [{"link_id": record["link_id"], **event} for event in record["flow_events"]]


def layout_problem(record: Record) -> str | None:
    """What makes a record that fits the schema unreadable as an interval, or None: sample
    columns of different lengths, a flow index outside `flows`, an offset outside the
    interval, a flow event outside it, counts or events on a part that is not the last. A
    field left out is read as the writer writes it, with its default (no samples, no events,
    complete)."""
    columns = [record.get(c, []) for c in SAMPLE_COLUMNS]
    lengths = [len(column) for column in columns]
    if len(set(lengths)) > 1:
        listed = ", ".join(f"{c} {n}" for c, n in zip(SAMPLE_COLUMNS, lengths, strict=True))
        return f"the per-sample columns differ in length ({listed})"
    flow_index, offset_ns, _ = columns
    flows = len(record.get("flows", []))
    for i, index in enumerate(flow_index):
        if not 0 <= index < flows:
            return f"flow_index[{i}] = {index} is not a position in flows ({flows} flows)"
    interval = record["interval_ns"]
    for i, offset in enumerate(offset_ns):
        if not 0 <= offset < interval:
            return f"offset_ns[{i}] = {offset} is outside [0, interval_ns = {interval})"
    start, end = record["ts_ns"] - interval, record["ts_ns"]
    events = record.get("flow_events", [])
    for i, event in enumerate(events):
        if not start <= event["ts_ns"] < end:
            return f"flow_events[{i}].ts_ns = {event['ts_ns']} is outside [{start}, {end})"
        for name, allowed in (("kind", KINDS), ("reason", REASONS)):
            if event[name] not in allowed:
                listed = ", ".join(sorted(allowed))
                return f"flow_events[{i}].{name}: {event[name]!r} is not one of {listed}"
    if not record.get("complete", True):
        if events:
            return "flow events on a part that is not its interval's last (complete)"
        counted = [name for name in COUNT_FIELDS if record.get(name)]
        if counted:
            return f"counts ({', '.join(counted)}) on a part that is not its interval's last"
    return None


class _Columns:
    """RTT samples as a record's columns."""

    def __init__(self) -> None:
        self.flows: list[Record] = []
        self.index_of: dict[tuple[Any, ...], int] = {}
        self.flow_index: list[int] = []
        self.offset_ns: list[int] = []
        self.rtt_ns: list[int] = []

    def add(self, sample: Record, start_ns: int) -> None:
        key = tuple(sample[f] for f in FLOW_FIELDS)
        index = self.index_of.get(key)
        if index is None:
            index = self.index_of[key] = len(self.flows)
            self.flows.append(dict(zip(FLOW_FIELDS, key, strict=True)))
        self.flow_index.append(index)
        self.offset_ns.append(sample["ts_ns"] - start_ns)
        self.rtt_ns.append(sample["rtt_ns"])

    def fields(self) -> Record:
        return {
            "flows": self.flows,
            "flow_index": self.flow_index,
            "offset_ns": self.offset_ns,
            "rtt_ns": self.rtt_ns,
        }


@dataclass
class _Open:
    """What has come of one link's interval (of the grid) and not been sent."""

    samples: list[Record] = field(default_factory=list)
    events: list[Record] = field(default_factory=list)
    parts: int = 0  # sent already


@dataclass
class _Link:
    seq: int = 0
    open: dict[int, _Open] = field(default_factory=dict)  # by the interval's end


class IntervalAssembler:
    """Gathers a link's RTT samples and flow events by the export interval they fall in
    until the interval's counters close it; returns the records to send, in order.

    Intervals are `interval_ns` long, aligned to multiples of it since the epoch, as the data
    plane's; the counters may close a longer one (after a jump of the clock) or a shorter one
    (the last, at exit). A part is sent once a grid interval holds `max_samples` samples not
    yet sent. `close` ends the interval [end - interval, end) with its counts: grid intervals
    that ended at or before its start (their counters were lost) go first, as records of their
    own with zero counts; then the samples and events before `end` in records of at most
    `max_samples` samples, the last `complete`, with the counts and the events. `seq` counts
    a link's records.
    """

    def __init__(self, interval_ns: int, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        if interval_ns <= 0 or max_samples <= 0:
            raise ValueError(f"interval {interval_ns} ns and max_samples {max_samples} must be > 0")
        self.interval_ns = interval_ns
        self.max_samples = max_samples
        self._links: dict[str, _Link] = {}

    def _open(self, link_id: str, ts_ns: int) -> _Open:
        end = ts_ns - ts_ns % self.interval_ns + self.interval_ns
        return self._links.setdefault(link_id, _Link()).open.setdefault(end, _Open())

    def _records(
        self,
        link_id: str,
        end_ns: int,
        interval_ns: int,
        samples: list[Record],
        ending: tuple[Record, list[Record]] | None,
        first_part: int,
    ) -> list[Record]:
        """The records of [end - interval, end) holding `samples`, at most `max_samples`
        each; with `ending` (counts, events), the last is complete and carries them."""
        link = self._links[link_id]
        chunks = [
            samples[i : i + self.max_samples] for i in range(0, len(samples), self.max_samples)
        ]
        if ending is not None and not chunks:
            chunks = [[]]
        records = []
        for i, chunk in enumerate(chunks):
            columns = _Columns()
            for sample in chunk:
                columns.add(sample, end_ns - interval_ns)
            last = ending is not None and i == len(chunks) - 1
            counts, events = ending if last and ending is not None else (NO_COUNTS, [])
            records.append(
                {
                    "link_id": link_id,
                    "ts_ns": end_ns,
                    "interval_ns": interval_ns,
                    "seq": link.seq,
                    **counts,
                    "part": first_part + i,
                    "complete": last,
                    "flow_events": events,
                    **columns.fields(),
                }
            )
            link.seq += 1
        return records

    def add_sample(self, link_id: str, sample: Record) -> list[Record]:
        """One RTT sample (ts_ns, the flow's 5-tuple, rtt_ns); returns the part it filled, if
        it did."""
        interval = self._open(link_id, sample["ts_ns"])
        interval.samples.append(sample)
        if len(interval.samples) < self.max_samples:
            return []
        end = sample["ts_ns"] - sample["ts_ns"] % self.interval_ns + self.interval_ns
        part = self._records(link_id, end, self.interval_ns, interval.samples, None, interval.parts)
        interval.samples, interval.parts = [], interval.parts + 1
        return part

    def add_event(self, link_id: str, event: Record) -> None:
        """One long-flow event (FlowEvent fields; `link_id`, if there, is not kept)."""
        self._open(link_id, event["ts_ns"]).events.append({k: event[k] for k in EVENT_FIELDS})

    def close(self, link_id: str, end_ns: int, interval_ns: int, counts: Record) -> list[Record]:
        """The interval [end_ns - interval_ns, end_ns) is over and these are its counts
        (COUNT_FIELDS): the records that end it, after those of earlier intervals still
        open."""
        link = self._links.setdefault(link_id, _Link())
        start, done = end_ns - interval_ns, []
        samples: list[Record] = []
        events: list[Record] = []
        parts = 0
        still_open: list[_Open] = []  # grid intervals taken from that keep something
        for end in sorted(link.open):
            interval = link.open[end]
            if end <= start:
                done += self._records(
                    link_id, end, self.interval_ns, interval.samples,
                    (NO_COUNTS, interval.events), interval.parts,
                )  # fmt: skip
                del link.open[end]
                continue
            taken = len(samples) + len(events)
            samples += [s for s in interval.samples if s["ts_ns"] < end_ns]
            events += [e for e in interval.events if e["ts_ns"] < end_ns]
            taken = len(samples) + len(events) - taken
            interval.samples = [s for s in interval.samples if s["ts_ns"] >= end_ns]
            interval.events = [e for e in interval.events if e["ts_ns"] >= end_ns]
            # The records of a grid interval are numbered on, whichever interval takes its
            # samples (a short last one at exit takes from the grid interval it ends in);
            # one emptied goes.
            if end <= end_ns or taken:
                parts = max(parts, interval.parts)
            if end <= end_ns or (taken and not interval.samples and not interval.events):
                del link.open[end]
            elif taken:
                still_open.append(interval)
        ending = self._records(link_id, end_ns, interval_ns, samples, (counts, events), parts)
        for interval in still_open:
            interval.parts = parts + len(ending)
        return done + ending

    def close_all(self) -> list[Record]:
        """Every interval still open, as complete records of the grid with zero counts."""
        done = []
        for link_id, link in self._links.items():
            for end in sorted(link.open):
                interval = link.open.pop(end)
                done += self._records(
                    link_id, end, self.interval_ns, interval.samples,
                    (NO_COUNTS, interval.events), interval.parts,
                )  # fmt: skip
        return done
