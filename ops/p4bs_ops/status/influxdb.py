"""The InfluxDB check: `/ping`, the config's database, and the points written per second."""

from __future__ import annotations

import time
from typing import Any

from p4bs.config import Config
from p4bs.influx import InfluxClient, InfluxError
from p4bs_ops.status.runner import (
    SECOND_NS,
    CheckFailed,
    Deadline,
    PartStatus,
    StatusOptions,
    part_check,
)


@part_check("influxdb")
def check_influxdb(config: Config, options: StatusOptions) -> PartStatus:
    """`/ping`, the config's database, and the write rate: the `write` module's `pointReq`
    counter of `SHOW STATS` read twice, `influx_interval` apart (points the server was asked
    to write, into any database, per second). SHOW STATS reads the server's counters in
    memory: it works whether or not the server keeps them in `_internal` (the project's
    InfluxDB does not: [monitor] store-enabled = false), and it does not depend on the data's
    timestamps as counting the newest points of link_metrics would (those are windows' event
    times: a sink catching up writes old ones)."""
    influx = config.influxdb
    deadline = Deadline(options.timeout_ns)
    try:
        client = InfluxClient(influx)
    except InfluxError as exc:  # a credential that does not resolve
        raise CheckFailed(str(exc)) from None
    with client:
        try:
            version = client.ping(timeout_s=deadline.left_s())
        except InfluxError as exc:
            raise CheckFailed(str(exc), {"url": influx.url}) from None
        details: dict[str, Any] = {
            "url": influx.url,
            "version": version,
            "database": influx.database,
        }
        try:
            databases = client.query("SHOW DATABASES", timeout_s=deadline.left_s())
        except InfluxError as exc:
            raise CheckFailed(str(exc), details) from None
        names = {row[0] for series in databases for row in series.values}
        details["database_exists"] = influx.database in names
        try:
            first, first_at = _points_requested(client, deadline), time.monotonic_ns()
            time.sleep(options.influx_interval_ns / 1e9)  # the measurement's interval
            second, second_at = _points_requested(client, deadline), time.monotonic_ns()
            rate = (second - first) * SECOND_NS / max(1, second_at - first_at)
            details["points_per_s"] = round(rate, 1)
            details["interval_ns"] = second_at - first_at
            rate_text = f"{rate:,.0f} points/s written"
        except (InfluxError, CheckFailed) as exc:  # no rights to SHOW STATS: reachable still
            details["points_per_s"] = None
            details["rate_error"] = str(exc)
            rate_text = "write rate unknown"
    known = version and version != "unknown"  # a build from source says "unknown"
    where = f"{influx.url}" + (f" (InfluxDB {version})" if known else "")
    if not details["database_exists"]:
        return PartStatus(
            "influxdb", False, f"{where}: no database {influx.database!r}; {rate_text}", details
        )
    summary = f"{where} up, database {influx.database}; {rate_text}"
    return PartStatus("influxdb", True, summary, details)


def _points_requested(client: InfluxClient, deadline: Deadline) -> int:
    """The server's `write` counter `pointReq` (points asked to be written since it began)."""
    for series in client.query("SHOW STATS", timeout_s=deadline.left_s()):
        if series.name == "write":
            row = dict(zip(series.columns, series.values[0], strict=True))
            return int(row["pointReq"])
    raise CheckFailed("SHOW STATS: no write statistics")
