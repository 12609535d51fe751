"""The InfluxDB check: `/ping`, the config's database, and the points written per second."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from p4bs.config import Config
from p4bs_ops.status.http_json import get_json, http_reason
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
    headers: dict[str, str] = {}
    try:
        if influx.username is not None and influx.password is not None:
            token = f"{influx.username.resolve()}:{influx.password.resolve()}"
            headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
    except LookupError as exc:
        raise CheckFailed(f"influxdb credentials: {exc}") from None
    url = f"{influx.url}/ping"
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=deadline.left_s()) as reply:
            version = reply.headers.get("X-Influxdb-Version")
            status = reply.status
    except (OSError, ValueError) as exc:
        raise CheckFailed(http_reason(url, exc), {"url": influx.url}) from None
    details: dict[str, Any] = {"url": influx.url, "version": version, "database": influx.database}
    if status != 204:
        raise CheckFailed(f"{url}: HTTP {status}, not 204", details)
    try:
        databases = _influx_query(influx.url, "SHOW DATABASES", headers, deadline)
    except CheckFailed as exc:
        raise CheckFailed(str(exc), details) from None
    names = {row[0] for series in databases for row in series.get("values") or []}
    details["database_exists"] = influx.database in names
    try:
        first, first_at = _points_requested(influx.url, headers, deadline), time.monotonic_ns()
        time.sleep(options.influx_interval_ns / 1e9)  # the measurement's interval
        second, second_at = _points_requested(influx.url, headers, deadline), time.monotonic_ns()
        rate = (second - first) * SECOND_NS / max(1, second_at - first_at)
        details["points_per_s"] = round(rate, 1)
        details["interval_ns"] = second_at - first_at
        rate_text = f"{rate:,.0f} points/s written"
    except CheckFailed as exc:  # a user without the rights to SHOW STATS: reachable still
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


def _influx_query(
    base: str, statement: str, headers: Mapping[str, str], deadline: Deadline
) -> list[dict[str, Any]]:
    """The series of one InfluxQL statement; CheckFailed with InfluxDB's message on error."""
    url = f"{base}/query?" + urllib.parse.urlencode({"q": statement})
    try:
        answer = get_json(url, deadline.left_s(), headers)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise CheckFailed(f"{statement}: HTTP {exc.code}: {message}") from None
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"{statement}: {http_reason(base, exc)}") from None
    series: list[dict[str, Any]] = []
    for result in answer.get("results", []):
        if "error" in result:
            raise CheckFailed(f"{statement}: {result['error']}")
        series.extend(result.get("series") or [])
    return series


def _points_requested(base: str, headers: Mapping[str, str], deadline: Deadline) -> int:
    """The server's `write` counter `pointReq` (points asked to be written since it began)."""
    for series in _influx_query(base, "SHOW STATS", headers, deadline):
        if series.get("name") == "write":
            row = dict(zip(series["columns"], series["values"][0], strict=True))
            return int(row["pointReq"])
    raise CheckFailed("SHOW STATS: no write statistics")
