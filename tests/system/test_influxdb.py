"""InfluxDB 1.8 from the stack: it serves the v2 API's client (influxdb-client) as well as the
project's own 1.x client (p4bs.influx, which the sinks use), with the configured retention."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS

from p4bs_infra.stack import Stack


def test_point_written_with_influxdb_client_reads_back(stack: Stack) -> None:
    db = stack.influxdb.database
    ts = time.time_ns()
    # InfluxDB 1.8's v2 compatibility API: bucket = "database/retention policy", no token.
    with InfluxDBClient(url=stack.influxdb.url, token="", org="-") as client:
        point = (
            Point("link_metrics")
            .tag("link_id", "r1:eth1")
            .field("srtt_ns", 21_000_000)
            .field("f", -0.25)
            .time(ts, WritePrecision.NS)
        )
        client.write_api(write_options=SYNCHRONOUS).write(bucket=f"{db}/autogen", record=point)
        tables = client.query_api().query(
            f'from(bucket: "{db}/autogen") |> range(start: -1h) '
            '|> filter(fn: (r) => r._measurement == "link_metrics" and r.link_id == "r1:eth1")'
        )
    values = {rec.get_field(): rec.get_value() for table in tables for rec in table.records}
    assert values == {"srtt_ns": 21_000_000, "f": -0.25}
    when = datetime.fromtimestamp(ts // 1_000_000_000, UTC) + timedelta(
        microseconds=ts % 1_000_000_000 // 1000
    )
    assert {rec.get_time() for table in tables for rec in table.records} == {when}


def test_database_has_the_configured_retention(stack: Stack) -> None:
    (series,) = stack.influxdb.query(f'SHOW RETENTION POLICIES ON "{stack.influxdb.database}"')
    policies = {row["name"]: row for row in series.rows()}
    assert policies["autogen"]["duration"] == "48h0m0s"
    assert policies["autogen"]["default"] is True
