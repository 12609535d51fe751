"""InfluxDB 1.8 from the stack, through the project's one client (p4bs.influx, which the
sinks, the dashboard and status use): a point written at a nanosecond reads back exactly,
and the database has the configured retention."""

from __future__ import annotations

import time
import uuid

from p4bs_infra.stack import Stack


def test_a_point_written_reads_back_to_the_nanosecond(stack: Stack) -> None:
    link = f"r{uuid.uuid4().hex[:8]}:eth1"  # the session's database is shared
    ts = time.time_ns() // 1000 * 1000 + 123  # not a whole microsecond: ns precision kept
    stack.influxdb.client.write([f"link_metrics,link_id={link} srtt_ns=21000000i,f=-0.25 {ts}"])
    (series,) = stack.influxdb.client.query(
        f"SELECT srtt_ns, f FROM link_metrics WHERE link_id = '{link}'", epoch="ns"
    )
    assert series.rows() == [{"time": ts, "srtt_ns": 21_000_000, "f": -0.25}]


def test_database_has_the_configured_retention(stack: Stack) -> None:
    (series,) = stack.influxdb.query(f'SHOW RETENTION POLICIES ON "{stack.influxdb.database}"')
    policies = {row["name"]: row for row in series.rows()}
    assert policies["autogen"]["duration"] == "48h0m0s"
    assert policies["autogen"]["default"] is True
