"""The Grafana dashboards (ops/grafana) against the real InfluxDB: a short closed loop with the
InfluxDB sink fills a database of the test's own, then every query of every dashboard (panels,
annotations, variables), its macros rendered as Grafana renders them, must return series with
data in every column."""

from __future__ import annotations

import json
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_closed_loop import cubic_testbed

from p4bs import paths, retention
from p4bs_infra.procs import wait_until
from p4bs_infra.services import InfluxDB
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import TestbedPlan
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.closed_loop import ClosedLoop
from p4bs_ops import grafana

# 20 Cubic flows behind the testbed's 200 ms buffer, sized by GLOBECOM (decisions from the
# first window with an SRTT: the Stanford rule, 59 kB here once N = 20). The link's SLA has a
# d-hat of 2 ms, below the ~3.5 ms mean queueing delay the Stanford buffer gives 20 flows (and
# far below the 200 ms queue before the first decision): a queue_delay alert is raised
# whatever the metrics job's lag. With the example config's 10 ms, whether one is raised
# depends on how long the queue stays above 10 ms before the first decisions reach the
# router (2.5 s in one run here: just the K = 5 windows).
FLOWS = 20
TRAFFIC_S = 30
SLA = {"max_queue_delay": "2ms", "max_loss": 0.01}
MINUTE_NS = 60 * 10**9
# Columns a GLOBECOM run leaves empty: its decisions are no optimisation trials and carry
# no f of one.
EMPTY_IN_THIS_RUN = {'"events"."buffer_decisions"': {"trial", "f"}}


def _select(influx: InfluxDB, statement: str) -> dict[str, Any]:
    """The statement's first result, as Grafana's InfluxDB data source asks for it (the
    database as a parameter, times in ms)."""
    body = urllib.parse.urlencode({"db": influx.database, "q": statement, "epoch": "ms"})
    try:
        with urllib.request.urlopen(f"{influx.url}/query", data=body.encode(), timeout=30) as r:
            result: dict[str, Any] = json.loads(r.read())["results"][0]
    except urllib.error.HTTPError as exc:  # a statement InfluxDB cannot parse
        return {"error": exc.read().decode()}
    return result


def _count(influx: InfluxDB, field: str, source: str, where: str) -> int:
    result = _select(influx, f'SELECT count("{field}") FROM {source} WHERE {where}')
    return sum(s["values"][0][1] for s in result.get("series", []))


def _stored(influx: InfluxDB) -> dict[str, int]:
    """How many windows, applied decisions of queue 0 and raised alerts InfluxDB holds."""
    applied = "\"outcome\" = 'applied' AND \"queue\" = '0'"
    return {
        "windows": _count(influx, "f", '"autogen"."link_metrics"', "time > 0"),
        "applied": _count(influx, "buffer_bytes", '"events"."buffer_decisions"', applied),
        "raised": _count(influx, "alert_id", '"events"."sla_alerts"', "\"state\" = 'raise'"),
    }


def _problems(query: grafana.Query, rendered: str, result: dict[str, Any]) -> list[str]:
    """What is wrong with a query's result: an error, no series, or a column without a value
    in any series (a misspelt field or alias gives a column of nulls)."""
    where = f"{query.where}\n    {rendered}"
    if "error" in result:
        return [f"{where}\n    error: {result['error']}"]
    series = result.get("series", [])
    if not series:
        return [f"{where}\n    no series"]
    may_be_empty = set().union(*(v for k, v in EMPTY_IN_THIS_RUN.items() if k in query.text))
    problems = []
    for column in series[0]["columns"]:
        if column == "time" or column in may_be_empty:
            continue
        values = [row[s["columns"].index(column)] for s in series for row in s["values"]]
        if all(value is None for value in values):
            problems.append(f"{where}\n    column {column!r} has no value in any series")
    return problems


def test_every_dashboard_query_returns_data_after_a_closed_loop_run(
    unique_plan: Callable[..., TestbedPlan],
    stack: Stack,
    influx_database: InfluxDB,
    tmp_path: Path,
) -> None:
    # A database of the test's own, with the stack's retention policies and continuous
    # queries: queries without a time range (the buffer in force, the open alerts) see this
    # run's points only.
    influx = influx_database
    began_ns = time.time_ns()
    try:
        with cubic_testbed(unique_plan, (FLOWS, 0)) as testbed:
            link = testbed.plan.link_id
            base = tomllib.loads(paths.example_config().read_text())
            loop = ClosedLoop(
                base,
                testbed,
                tmp_path / "loop",
                bootstrap=stack.kafka.bootstrap,
                policy="globecom",
                influx_url=influx.url,
                sections={"influxdb": {"database": influx.database}},
                link_settings={"sla": SLA},
            )
            loop.start(progress=lambda _: None)
            try:
                scenario = Scenario(duration_s=TRAFFIC_S, warmup_s=5)
                TrafficRun(testbed, tmp_path / "run", scenario).run(progress=lambda _: None)
                # The sink writes what the job and the optimizer made, some seconds behind.
                filled = wait_until(lambda: all(_stored(influx).values()), 60, interval_s=1.0)
            finally:
                loop.stop()
        assert filled, f"{_stored(influx)}; InfluxDB sink log:\n{loop.log_tail('influx-sink')}"
        # The rollups of the whole run made again as the sink makes those of late windows
        # (retention.late_rollup_select): the per-minute continuous query runs at minute
        # boundaries, which a run this short may not reach after its windows.
        for rollup in retention.ROLLUPS:
            made = _count(influx, "mean_f", f'"{rollup.policy}"."link_metrics"', "time > 0")
            print(f"{rollup.policy}: {made} points from the continuous query")
            influx.query(
                retention.late_rollup_select(influx.database, rollup, began_ns, time.time_ns())
            )
        # The dashboard's range from the start of the run's first minute, so that the
        # per-minute summary of that minute is in it.
        start_ns, end_ns = began_ns // MINUTE_NS * MINUTE_NS, time.time_ns()
        context = grafana.Context(
            start_ns, end_ns, grafana.auto_interval_ns(start_ns, end_ns), {"link": [link]}
        )
        queries = list(grafana.all_queries())
        problems = []
        for query in queries:
            rendered = grafana.render(query, context)
            result = _select(influx, rendered)
            problems += _problems(query, rendered, result)
            if query.kind == "variable" and result.get("series"):
                # Only this run's link is in this database.
                assert [v[1] for v in result["series"][0]["values"]] == [link], result
        print(f"{len(queries)} queries of {len(grafana.load_dashboards())} dashboards run")
        assert not problems, "\n".join(problems)
    finally:
        influx.query(f'DROP DATABASE "{influx.database}"')
