"""What the benchmarks share: their quantiles and a fresh set of topics on their broker.
A benchmark runs as a script, so this folder is first on its import path."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Iterable

from p4bs.bus import ensure_topics
from p4bs_schemas.registry import STREAMS


def quantiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 (nearest rank: the largest sample below 100 samples)."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def fresh_topics(
    bootstrap: str, partitions: int, streams: Iterable[str] = tuple(STREAMS)
) -> dict[str, str]:
    """Topics of this run's own for `streams` (every stream by default), made now."""
    run = uuid.uuid4().hex[:8]
    topics = {stream: f"bench-{run}.{stream}" for stream in streams}
    ensure_topics(bootstrap, topics, partitions=partitions, replication_factor=1)
    return topics
