"""What every exporter target provides: start, counters, stop — whatever the data plane is.

Two targets implement `Target`: `model` (the software data plane, driven by the Rust binary
`p4bs-exporter`, see `p4bs_exporter.model_target`) and `tofino` (the switch's digests and registers
over bfrt_grpc, see `p4bs_exporter.tofino`). Both produce the same records to the same
topics with the same keys and headers, and report the same `ExporterStats`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p4bs_schemas.codec import codec
from p4bs_schemas.registry import STREAMS, current_schema

# The streams an exporter writes (config keys of [kafka.topics]): one record per link and
# export interval carries its counters, long-flow events and RTT samples (LinkCounters v3).
EXPORTED_STREAMS = ("link_counters",)


class ExporterError(RuntimeError):
    """An exporter that could not start or failed while running, with what it said."""


class SpecError(ExporterError):
    """A run spec the exporter refused: every problem, one per entry."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} problem(s)\n  " + "\n  ".join(problems))


@dataclass
class ExporterStats:
    """An exporter's own counters; the field names are those of the stats JSON file.

    `in_flight` is the lag: records handed to the Kafka client and not yet acknowledged
    (acks=all). `dropped` counts records given up because the client's queue was full, which
    only a live source does (a capture cannot wait); file sources wait instead (`waits`).
    """

    target: str = ""
    pid: int | None = None
    state: str = "starting"  # starting, running, reconnecting (tofino), flushing, done, failed
    uptime_s: float = 0.0
    produced: dict[str, int] = field(default_factory=dict)  # per stream
    produced_total: int = 0
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    rtt_samples_produced: int = 0  # RTT samples inside the produced records
    rtt_samples_dropped: int = 0  # RTT samples inside the dropped records
    invalid: int = 0  # records (or RTT samples) the schema cannot carry, or the client refused
    in_flight: int = 0
    waits: int = 0  # back-pressure: times a full client queue made the source wait
    records_per_s: float = 0.0  # produced, over the last interval
    delivered_per_s: float = 0.0
    source_done: bool = False
    frames: int = 0  # frames (or digests) taken from the data plane
    kernel_drops: int = 0  # frames the capture lost before the exporter saw them
    pipeline: dict[str, int] = field(default_factory=dict)  # the data plane's own counters
    problems: list[str] = field(default_factory=list)  # damaged input, lost frames
    last_error: str | None = None  # the Kafka client's latest complaint
    active_s: float | None = None  # first produced record to the end of the final flush
    undelivered_at_exit: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExporterStats:
        """Known fields only; missing ones keep their defaults (a run that failed early)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def read(cls, path: Path) -> ExporterStats | None:
        """The stats file as last written, or None if there is none yet."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return cls.from_json(data) if isinstance(data, dict) else None

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class Target(Protocol):
    """One exporter: a data plane's records into Kafka.

    `start` returns once exporting has begun (raising `SpecError` for a bad spec and
    `ExporterError` when it cannot start); `stats` is cheap and may be called any time;
    `wait` returns True once the target has finished on its own (its input ended, or it
    failed); `stop` ends it, flushing Kafka within its bound, and returns the final stats.
    """

    name: str

    def start(self) -> None: ...
    def stats(self) -> ExporterStats: ...
    def wait(self, timeout_s: float) -> bool: ...
    def stop(self, timeout_s: float = 30.0) -> ExporterStats: ...


def stream_spec(stream: str, topic: str) -> dict[str, Any]:
    """What the exporter needs to write one stream as the Python producer would: the topic,
    the header values of `Codec.headers` and the schema's fields (the Rust encoder refuses a
    schema whose fields differ from the ones it was written for)."""
    name = STREAMS[stream]
    schema = current_schema(name)
    headers = dict(codec(name).headers)
    full_name, fingerprint = headers["p4bs-schema"], headers["p4bs-fingerprint"]
    assert isinstance(full_name, bytes) and isinstance(fingerprint, bytes)
    return {
        "topic": topic,
        "schema": full_name.decode(),
        "fingerprint": fingerprint.decode(),
        "fields": _flat_fields(schema),
    }


def _flat_fields(schema: dict[str, Any], prefix: str = "") -> list[list[str]]:
    """[path, type] of every field, nested records' fields after their array as
    `flows[].src_ip`, an array of numbers' item type as `rtt_ns[]`: the form the Rust encoder
    compares with its own."""
    flat = []
    for f in schema["fields"]:
        kind, path = f["type"], prefix + f["name"]
        if isinstance(kind, dict) and kind["type"] == "array":
            flat.append([path, "array"])
            items = kind["items"]
            if isinstance(items, dict):
                flat += _flat_fields(items, f"{path}[].")
            else:
                flat.append([f"{path}[]", items])
        else:
            flat.append([path, kind])
    return flat
