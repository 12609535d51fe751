"""RTT samples travel in batches (`RttSampleBatch`): one Kafka record per link and batch
interval instead of one per sample. `RttBatcher` groups samples as the Rust exporter does;
`samples_of` turns a batch back into flat samples, each with its `link_id`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]

DEFAULT_INTERVAL_NS = 10_000_000
DEFAULT_MAX_SAMPLES = 1024


def samples_of(batch: Record) -> list[Record]:
    """The batch's samples as `RttSample` fields plus the batch's `link_id`."""
    return [{"link_id": batch["link_id"], **sample} for sample in batch["samples"]]


@dataclass
class _Open:
    end_ns: int
    samples: list[Record] = field(default_factory=list)


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
            "samples": batch.samples,
        }

    def add(self, link_id: str, sample: Record) -> list[Record]:
        """Adds one sample (RttSample fields, without link_id); returns the batches it
        completed (at most one)."""
        end = self._end_of(sample["ts_ns"])
        done = []
        batch = self._open.get(link_id)
        if batch is not None and (end != batch.end_ns or len(batch.samples) >= self.max_samples):
            done.append(self._batch(link_id, batch))
            batch = None
        if batch is None:
            batch = self._open[link_id] = _Open(end)
        batch.samples.append(sample)
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
