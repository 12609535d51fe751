"""The history InfluxDB keeps (p4bs/retention.py), as `p4bs stack up` sets it up: retention
policies for the windows, their per-second and per-minute summaries and the events, and
continuous queries that make the summaries from the windows InfluxDB receives."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest

from p4bs import retention
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_sinks.influx_sink import line_of

WINDOW = 100_000_000


def _rows(stack: Stack, statement: str) -> list[dict[str, Any]]:
    """The statement's rows as dicts (with the series' tags), [] when it has none."""
    return [row for series in stack.influxdb.query(statement) for row in series.rows()]


def _write_windows(stack: Stack, link: str, ends: list[int]) -> list[float]:
    """Windows of `link` ending at `ends`, written as the sink writes them; returns their f."""
    fs = [-0.01 * (i % 17) for i in range(len(ends))]
    lines = [
        line_of(
            "link_metrics",
            {
                "link_id": link,
                "window_start_ns": end - WINDOW,
                "window_end_ns": end,
                "f": f,
                "queue_delay_ns": 1_000_000 * (i % 7),
                "change": False,
            },
        )
        for i, (end, f) in enumerate(zip(ends, fs, strict=True))
    ]
    stack.influxdb.client.write(lines)
    return fs


def test_the_stack_sets_up_retention_policies_and_continuous_queries(stack: Stack) -> None:
    db = stack.influxdb.database
    policies = {r["name"]: r for r in _rows(stack, f'SHOW RETENTION POLICIES ON "{db}"')}
    assert policies["autogen"]["duration"] == "48h0m0s" and policies["autogen"]["default"]
    assert policies["events"]["duration"] == "8760h0m0s"
    assert policies["rollup_1s"]["duration"] == "720h0m0s"
    assert policies["rollup_1m"]["duration"] == "8760h0m0s"
    queries = {r["name"] for r in _rows(stack, "SHOW CONTINUOUS QUERIES") if "name" in r}
    assert queries >= {"link_metrics_1s", "link_metrics_1m"}


def test_windows_are_summarised_per_second_as_they_arrive(stack: Stack) -> None:
    """Windows written now, as the sink writes them, appear per second in `rollup_1s` with
    the mean, min and max of each field over the second (a window's point is at its end)."""
    link = f"r9:cq-{time.time_ns()}"
    first = (time.time_ns() // 10**9 - 2) * 10**9  # whole seconds, within the resample span
    ends = [first + (i + 1) * WINDOW for i in range(20)]
    fs = _write_windows(stack, link, ends)
    db = stack.influxdb.database
    where = f"\"link\" = '{link}'"

    def summarised() -> list[dict[str, Any]]:
        return _rows(stack, f'SELECT * FROM "{db}"."rollup_1s"."link_metrics" WHERE {where}')

    assert wait_until(lambda: len(summarised()) == 3, 30), summarised()
    for row in summarised():
        second = [f for end, f in zip(ends, fs, strict=True) if _second(end) == row["time"]]
        assert row["mean_f"] == pytest.approx(statistics.fmean(second), rel=1e-12)
        assert (row["min_f"], row["max_f"]) == (min(second), max(second))
        assert row["interface"] == link.partition(":")[2]


def test_the_minute_summary_has_the_99th_percentile(stack: Stack) -> None:
    """The per-minute continuous query's statement, run over a past minute: mean, min, max
    and the 99th percentile (nearest rank, as InfluxDB computes it) of each field."""
    link = f"r9:cq1m-{time.time_ns()}"
    minute = (time.time_ns() // 60_000_000_000 - 30) * 60_000_000_000  # half an hour ago
    ends = [minute + (i + 1) * WINDOW for i in range(599)]  # all inside the minute
    fs = _write_windows(stack, link, ends)
    db = stack.influxdb.database
    rollup = next(r for r in retention.ROLLUPS if r.every == "1m")
    stack.influxdb.query(
        f"{retention.rollup_select(db, rollup)} WHERE \"link\" = '{link}' AND time >= {minute} "
        f"AND time < {minute + 60_000_000_000} GROUP BY time(1m), *"
    )
    (row,) = _rows(
        stack, f'SELECT * FROM "{db}"."rollup_1m"."link_metrics" WHERE "link" = \'{link}\''
    )
    ordered = sorted(fs)
    assert row["mean_f"] == pytest.approx(statistics.fmean(fs), rel=1e-12)  # summed in its order
    assert (row["min_f"], row["max_f"]) == (ordered[0], ordered[-1])
    assert row["percentile_f"] == ordered[round(0.99 * len(ordered) + 0.5) - 1]


def _second(end_ns: int) -> str:
    """The RFC 3339 start of the second a window ending at `end_ns` is summarised in."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end_ns // 10**9))
