"""RTT samples travel in batches (`RttSampleBatch`): one Kafka record per link and batch
interval instead of one per sample, in columns (the batch's flows once each, then per sample
its flow's index, its offset in the interval and its RTT) so that a reader's per-sample work
is numbers only. `RttBatcher` groups samples as the Rust exporter does; `samples_of` turns a
batch back into flat samples, each with its `link_id` and its absolute `ts_ns`;
`layout_problem` says what breaks the columns' invariants, which the schema cannot state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]

DEFAULT_INTERVAL_NS = 10_000_000
DEFAULT_MAX_SAMPLES = 1024

FLOW_FIELDS = ("src_ip", "dst_ip", "src_port", "dst_port", "protocol")
SAMPLE_COLUMNS = ("flow_index", "offset_ns", "rtt_ns")


def samples_of(batch: Record) -> list[Record]:
    """The batch's samples as `RttSample` fields (ts_ns, the flow's 5-tuple, rtt_ns) plus the
    batch's `link_id`, oldest first."""
    start = batch["ts_ns"] - batch["interval_ns"]
    flows = batch["flows"]
    return [
        {"link_id": batch["link_id"], "ts_ns": start + offset, **flows[index], "rtt_ns": rtt}
        for index, offset, rtt in zip(
            batch["flow_index"], batch["offset_ns"], batch["rtt_ns"], strict=True
        )
    ]


def layout_problem(batch: Record) -> str | None:
    """What makes a batch that fits the schema unreadable as columns, or None: no samples,
    columns of different lengths, a flow index outside `flows`, an offset outside the
    interval."""
    lengths = [len(batch[c]) for c in SAMPLE_COLUMNS]
    if len(set(lengths)) > 1:
        listed = ", ".join(f"{c} {n}" for c, n in zip(SAMPLE_COLUMNS, lengths, strict=True))
        return f"the per-sample columns differ in length ({listed})"
    if not lengths[0]:
        return "no samples"
    flows = len(batch["flows"])
    for i, index in enumerate(batch["flow_index"]):
        if not 0 <= index < flows:
            return f"flow_index[{i}] = {index} is not a position in flows ({flows} flows)"
    interval = batch["interval_ns"]
    for i, offset in enumerate(batch["offset_ns"]):
        if not 0 <= offset < interval:
            return f"offset_ns[{i}] = {offset} is outside [0, interval_ns = {interval})"
    return None


@dataclass
class _Open:
    end_ns: int
    flows: list[Record] = field(default_factory=list)
    index_of: dict[tuple[Any, ...], int] = field(default_factory=dict)
    flow_index: list[int] = field(default_factory=list)
    offset_ns: list[int] = field(default_factory=list)
    rtt_ns: list[int] = field(default_factory=list)

    def add(self, sample: Record, start_ns: int) -> None:
        key = tuple(sample[f] for f in FLOW_FIELDS)
        index = self.index_of.get(key)
        if index is None:
            index = self.index_of[key] = len(self.flows)
            self.flows.append(dict(zip(FLOW_FIELDS, key, strict=True)))
        self.flow_index.append(index)
        self.offset_ns.append(sample["ts_ns"] - start_ns)
        self.rtt_ns.append(sample["rtt_ns"])


class RttBatcher:
    """Groups samples per link into batches of the interval they fall in.

    A batch is complete when a sample of another interval arrives, when it holds
    `max_samples`, or when `close(now_ns)` says its interval is over. Every sample lands in a
    batch of its own interval: batches come in time order as long as the data plane's clock
    does (a clock going back, which the data plane counts, starts a batch of the earlier
    interval).
    """

    def __init__(
        self, interval_ns: int = DEFAULT_INTERVAL_NS, max_samples: int = DEFAULT_MAX_SAMPLES
    ) -> None:
        if interval_ns <= 0 or max_samples <= 0:
            raise ValueError(f"interval {interval_ns} ns and max_samples {max_samples} must be > 0")
        self.interval_ns = interval_ns
        self.max_samples = max_samples
        self._open: dict[str, _Open] = {}

    def _end_of(self, ts_ns: int) -> int:
        return ts_ns - ts_ns % self.interval_ns + self.interval_ns

    def _batch(self, link_id: str, batch: _Open) -> Record:
        return {
            "link_id": link_id,
            "ts_ns": batch.end_ns,
            "interval_ns": self.interval_ns,
            "flows": batch.flows,
            "flow_index": batch.flow_index,
            "offset_ns": batch.offset_ns,
            "rtt_ns": batch.rtt_ns,
        }

    def add(self, link_id: str, sample: Record) -> list[Record]:
        """Adds one sample (RttSample fields: ts_ns, the flow's 5-tuple, rtt_ns); returns the
        batches it completed (at most one)."""
        end = self._end_of(sample["ts_ns"])
        done = []
        batch = self._open.get(link_id)
        if batch is not None and (end != batch.end_ns or len(batch.rtt_ns) >= self.max_samples):
            done.append(self._batch(link_id, batch))
            batch = None
        if batch is None:
            batch = self._open[link_id] = _Open(end)
        batch.add(sample, end - self.interval_ns)
        return done

    def close(self, now_ns: int | None = None) -> list[Record]:
        """The open batches whose interval ended by `now_ns` (all of them if None), at most
        one per link; they are no longer held."""
        done = []
        for link_id, batch in list(self._open.items()):
            if now_ns is None or batch.end_ns <= now_ns:
                done.append(self._batch(link_id, batch))
                del self._open[link_id]
        return done
