"""A link's history from InfluxDB, read with the queries of the Grafana `link` dashboard
(ops/grafana/dashboards/link.json, rendered by `p4bs_ops.grafana` as Grafana renders them):
the dashboard shows what Grafana shows, and the queries are tested once
(tests/testbed/test_monitoring.py).

Each chart is one panel of that dashboard; `CHARTS` names the panel and, for each of its
columns, the LinkMetrics field a live window adds to it, so that the page appends pushed
windows to the series InfluxDB gave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p4bs.config import InfluxConfig
from p4bs.influx import InfluxClient, InfluxError
from p4bs_ops import grafana

LINK_DASHBOARD = "link"
MAX_POINTS = 600  # per chart: about the page's width in pixels


@dataclass(frozen=True)
class Chart:
    key: str  # the page's name for it
    panel: str  # the link dashboard's panel title
    unit: str  # of its values: "ns", "bytes", "ratio" or "count"
    fields: dict[str, str]  # the query's column -> the LinkMetrics field live windows add


CHARTS = (
    Chart("rtt", "SRTT and RTT min", "ns", {"SRTT": "srtt_ns", "RTT min": "rtt_min_ns"}),
    Chart("flows", "Long flows N", "count", {"N": "long_flows"}),
    Chart("loss", "Loss", "ratio", {"loss": "loss_rate", "loss EWMA": "loss_rate_ewma"}),
    Chart(
        "delay",
        "Queueing delay",
        "ns",
        {"queueing delay": "queue_delay_ns", "EWMA": "queue_delay_ewma_ns"},
    ),
    Chart(
        "utilisation",
        "Utilisation: carried and offered",
        "ratio",
        {"carried": "utilisation", "offered": "offered_utilisation"},
    ),
    Chart("f", "f", "count", {"f": "f", "min f": "f"}),
    # The buffer in force: the applied decisions of queue 0 (LinkMetrics does not carry it).
    Chart("buffer", "Buffer in force", "bytes", {"buffer": "buffer_bytes"}),
)
DECISIONS_ANNOTATION = "Buffer decisions"
ALERTS_ANNOTATION = "SLA alerts"


class HistoryError(Exception):
    """InfluxDB did not answer a query; the message says why."""


def _queries() -> dict[str, grafana.Query]:
    """The link dashboard's queries by panel or annotation title."""
    dashboard = grafana.load_dashboards()[LINK_DASHBOARD]
    return {q.title: q for q in grafana.queries(dashboard) if q.kind != "variable"}


def link_history(influx: InfluxConfig, link_id: str, start_ns: int, end_ns: int) -> dict[str, Any]:
    """The link's charts, decisions and alerts between `start_ns` and `end_ns`: each chart as
    columns (times in ms for the page's charts, values in the system's units), the
    decisions and alerts newest last. Raises HistoryError when InfluxDB fails."""
    queries = _queries()
    interval = grafana.auto_interval_ns(start_ns, end_ns, MAX_POINTS)
    context = grafana.Context(start_ns, end_ns, interval, {"link": [link_id]})
    try:
        db = InfluxClient(influx)
    except InfluxError as exc:  # a credential that does not resolve
        raise HistoryError(str(exc)) from None
    try:
        charts = {}
        for chart in CHARTS:
            rows = _select(db, grafana.render(queries[chart.panel], context))
            charts[chart.key] = _columns(rows, list(chart.fields))
        decisions = _select(db, grafana.render(queries[DECISIONS_ANNOTATION], context))
        alerts = _select(db, grafana.render(queries[ALERTS_ANNOTATION], context))
    finally:
        db.close()
    return {
        "start_ns": start_ns,
        "end_ns": end_ns,
        "interval_ns": interval,
        "charts": charts,
        "decisions": sorted(decisions, key=lambda r: r["time"]),
        "alerts": sorted(alerts, key=lambda r: r["time"]),
    }


def _select(db: InfluxClient, statement: str) -> list[dict[str, Any]]:
    """The rows of every series the statement returns, each a dict with `time` in ms."""
    try:
        found = db.query(statement, epoch="ms")
    except InfluxError as exc:  # its message names the statement
        raise HistoryError(str(exc)) from None
    rows = []
    for series in found:
        rows += [dict(zip(series.columns, values, strict=True)) for values in series.values]
    return rows


def _columns(rows: list[dict[str, Any]], columns: list[str]) -> dict[str, list[Any]]:
    """Rows as columns: `time` and one list per column, in time order."""
    rows = sorted(rows, key=lambda r: r["time"])
    return {"time": [r["time"] for r in rows], **{c: [r.get(c) for r in rows] for c in columns}}
