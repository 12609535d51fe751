"""Where InfluxDB keeps the history, and for how long: the retention policies and the
continuous queries that downsample the windows.

- `autogen` (the database's default): every window as the metrics job made it, for
  `influxdb.retention` (days; at 10,000 links and 100 ms windows that is 100,000 points/s).
- `rollup_1s` and `rollup_1m`: `link_metrics` per link and second (mean, min, max of every
  field) and per link and minute (the same and the 99th percentile), made by continuous
  queries from the windows, for `influxdb.retention_1s` and `influxdb.retention_1m`. A
  field's summaries are named `mean_<field>`, `min_<field>`, `max_<field>`,
  `percentile_<field>`; the tags (link, router, interface) are kept.
- `events`: SLA alerts and buffer decisions (few, and what an operator asks about months
  later), for `influxdb.events_retention`; the InfluxDB sink writes them there.

Each continuous query recomputes a few of its last intervals every time it runs
(`RESAMPLE ... FOR`: 5 s per second, 2 min per minute), so windows that reach InfluxDB a
little late (the metrics job's output latency) are still summarised. Windows later than that
(the metrics job catching up after a cold start or a failover, a sink catching up) the
continuous query never sees again: the InfluxDB sink summarises their intervals itself
(`late_rollup_select`, sinks/p4bs_sinks/influx_sink.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from p4bs.config import InfluxConfig

RAW = "autogen"
EVENTS = "events"
EVENT_MEASUREMENTS = frozenset({"sla_alerts", "buffer_decisions"})
DOWNSAMPLED = "link_metrics"


_INFLUXQL_UNITS_NS = {
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}


def influxql_duration_ns(text: str) -> int:
    """An InfluxQL (or Grafana) duration (`100ms`, `1s`, `5m`, `1h`, `1d`) in ns."""
    found = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text.strip())
    if found is None:
        raise ValueError(f"not a duration: {text!r}")
    return int(found[1]) * _INFLUXQL_UNITS_NS[found[2]]


@dataclass(frozen=True)
class Rollup:
    """One downsampled series: its interval, retention policy and summaries."""

    every: str  # InfluxQL duration: the GROUP BY time interval
    policy: str
    resample_for: str  # how far back each run recomputes
    summaries: tuple[str, ...]

    def late_before(self, written_ns: int) -> int:
        """Windows written at `written_ns` that end before this come too late for the
        continuous query: its next run, at most one interval later, recomputes only
        `resample_for` back."""
        every, back = influxql_duration_ns(self.every), influxql_duration_ns(self.resample_for)
        return written_ns + every - back


ROLLUPS = (
    Rollup("1s", "rollup_1s", "5s", ("mean(*)", "min(*)", "max(*)")),
    Rollup("1m", "rollup_1m", "2m", ("mean(*)", "min(*)", "max(*)", "percentile(*, 99)")),
)


def retention_policy_of(measurement: str) -> str:
    """The retention policy the sink writes a measurement into."""
    return EVENTS if measurement in EVENT_MEASUREMENTS else RAW


def _duration(ns: int) -> str:
    return f"{ns // 1_000_000_000}s" if ns else "INF"


def retention_policies(influx: InfluxConfig) -> list[tuple[str, str]]:
    """(policy, InfluxQL duration) of every retention policy but the default one."""
    durations = {
        EVENTS: influx.events_retention_ns,
        "rollup_1s": influx.retention_1s_ns,
        "rollup_1m": influx.retention_1m_ns,
    }
    return [(policy, _duration(ns)) for policy, ns in durations.items()]


def continuous_query(database: str, rollup: Rollup) -> tuple[str, str]:
    """The continuous query that makes `rollup` from the windows: its name and statement."""
    name = f"{DOWNSAMPLED}_{rollup.every}"
    statement = (
        f'CREATE CONTINUOUS QUERY "{name}" ON "{database}" '
        f"RESAMPLE EVERY {rollup.every} FOR {rollup.resample_for} BEGIN "
        f"{rollup_select(database, rollup)} GROUP BY time({rollup.every}), * END"
    )
    return name, statement


def late_rollup_select(database: str, rollup: Rollup, first_ns: int, last_ns: int) -> str:
    """The rollup of every interval holding a window from `first_ns` to `last_ns`, made
    again from the windows InfluxDB holds (its points replace what was there)."""
    every = influxql_duration_ns(rollup.every)
    start, end = first_ns // every * every, (last_ns // every + 1) * every
    return (
        f"{rollup_select(database, rollup)} WHERE time >= {start} AND time < {end} "
        f"GROUP BY time({rollup.every}), *"
    )


def rollup_select(database: str, rollup: Rollup) -> str:
    """The continuous query's SELECT ... INTO ... FROM, without its GROUP BY (a caller may
    add a time range, to make a rollup of the past)."""
    return (
        f"SELECT {', '.join(rollup.summaries)} "
        f'INTO "{database}"."{rollup.policy}"."{DOWNSAMPLED}" '
        f'FROM "{database}"."{RAW}"."{DOWNSAMPLED}"'
    )
