"""The optimizer feed's rule (streaming-jobs/functions/io/p4bs/flink/OptimizerFeed.java) over
LinkMetrics records, written again from streaming-jobs/README.md for the tests: which of a
thinned link's windows the metrics job passes on to the optimizer."""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

Record = Mapping[str, Any]


def _moved(previous: int | None, now: int | None, deadband: float) -> bool:
    """Present in one window and not the other, or moved by more than `deadband` of the
    previous value."""
    if previous is None or now is None:
        return (previous is None) != (now is None)
    return abs(now - previous) > deadband * previous


def heartbeat_offset_ns(link_id: str, heartbeat_ns: int) -> int:
    """Where in the heartbeat period the link's heartbeats fall (its id's CRC-32 modulo the
    period), so that the links' heartbeats spread over it."""
    return zlib.crc32(link_id.encode()) % heartbeat_ns


def heartbeat_within(start_ns: int, end_ns: int, offset_ns: int, heartbeat_ns: int) -> bool:
    """(start, end] holds a heartbeat of a link whose heartbeats fall at `offset_ns`."""
    return (end_ns - offset_ns) // heartbeat_ns > (start_ns - offset_ns) // heartbeat_ns


def holds_heartbeat(window: Record, heartbeat_ns: int) -> bool:
    """The window's (start, end] holds one of its link's heartbeats."""
    start, end = window["window_start_ns"], window["window_end_ns"]
    return heartbeat_within(
        start, end, heartbeat_offset_ns(window["link_id"], heartbeat_ns), heartbeat_ns
    )


def passes(
    previous: Record | None, window: Record, *, alert: bool, deadband: float, heartbeat_ns: int
) -> bool:
    """Whether a thinned link's `window` can matter to its policy, after its `previous`
    window (None: its first); `alert`: an SLA alert was raised or resolved in it."""
    if previous is None:
        return True
    return (
        window["long_flows"] != previous["long_flows"]
        or _moved(previous["srtt_ns"], window["srtt_ns"], deadband)
        or _moved(previous["rtt_min_ns"], window["rtt_min_ns"], deadband)
        or window["change"]
        or alert
        or holds_heartbeat(window, heartbeat_ns)
    )


def thinned(
    windows: Iterable[Record],
    alert_ends: Collection[int],
    *,
    deadband: float,
    heartbeat_ns: int,
) -> list[Record]:
    """The windows of one link (in order) the feed holds when its policy is thinned;
    `alert_ends`: the ends of its windows that raised or resolved an SLA alert."""
    out, previous = [], None
    for window in windows:
        alert = window["window_end_ns"] in alert_ends
        if passes(previous, window, alert=alert, deadband=deadband, heartbeat_ns=heartbeat_ns):
            out.append(window)
        previous = window
    return out
