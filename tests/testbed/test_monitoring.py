"""Monitoring on one running closed loop (20 Cubic flows, GLOBECOM, 30 s of traffic, an SLA
of d-hat = 2 ms so that alerts are raised: below the ~3.5 ms mean queueing delay the Stanford
buffer gives 20 flows, and far below the 200 ms queue before the first decision):

- Prometheus: every service's endpoint (the exporter, the metrics job on a standalone Flink
  cluster with Flink's own reporter on, the InfluxDB sink, the alert dispatcher posting to a
  webhook of the test's own, the optimizer and the dashboard), scraped over HTTP before and
  after the traffic and read with prometheus_client's parser: each service's counts must
  move with the traffic;
- Grafana (ops/grafana) against the real InfluxDB: the sink fills a database of the test's
  own, then every query of every dashboard (panels, annotations, variables), its macros
  rendered as Grafana renders them, must return series with data in every column.

One loop serves both (each needs the same traffic through the whole loop: one run instead of
two saves its ~1 min in CI)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dashboard import running_dashboard
from promscrape import Samples, scrape
from test_closed_loop import cubic_testbed

from p4bs import paths, retention
from p4bs_infra.procs import free_port_block, free_ports, stop_session, wait_until
from p4bs_infra.services import FlinkJobManager, FlinkTaskManager, InfluxDB
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import TestbedPlan
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.closed_loop import ClosedLoop
from p4bs_ops import grafana

FLOWS = 20
TRAFFIC_S = 30
SLA = {"max_queue_delay": "2ms", "max_loss": 0.01}
MOVE_TIMEOUT_S = 60  # for a count to show what already happened (scrapes, Flink's reporter)
MINUTE_NS = 60 * 10**9
# Columns a GLOBECOM run leaves empty: its decisions are no optimisation trials and carry
# no f of one.
EMPTY_IN_THIS_RUN = {'"events"."buffer_decisions"': {"trial", "f"}}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


class Webhook:
    """An Alertmanager stand-in on a free loopback port: every POST is taken (200)."""

    def __init__(self) -> None:
        self.posts = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def flink_cluster(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A JobManager and two TaskManagers with Flink's Prometheus reporter on a block of three
    ports (one each, in whatever order they start): the JobManager's REST endpoint and the
    reporters' URLs."""
    rest, rpc = free_ports(2)
    first = free_port_block(3, avoid=(rest, rpc))
    ports = f"{first}-{first + 2}"
    state = tmp_path / "flink"
    services: list[Any] = [FlinkJobManager(state, rest, rpc, ports)]
    services += [FlinkTaskManager(state, rest, rpc, i, ports) for i in range(2)]
    try:
        for service in services:
            service.start()
        for service in services:
            assert wait_until(service.ready, 120, 0.5), service.failure("was not ready")
        yield (
            f"127.0.0.1:{rest}",
            [f"http://127.0.0.1:{p}/metrics" for p in range(first, first + 3)],
        )
    finally:
        for service in reversed(services):
            service.stop()


@contextlib.contextmanager
def alert_dispatcher(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`p4bs sinks alerts` with the loop's config, stopped by its PID at the end."""
    argv = [sys.executable, "-m", "p4bs_cli", "sinks", "alerts", "--config", str(config)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        stop_session(process)


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


def check_grafana_queries(influx: InfluxDB, link: str, began_ns: int) -> None:
    """Every query of every dashboard over the run's time, on the database the loop filled."""
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


def answers(url: str) -> bool:
    try:
        scrape(url)
    except OSError:
        return False
    return True


def scrape_flink(urls: list[str]) -> Samples:
    """Every reporter's samples, the TaskManagers' (the job's operators) among them; a port
    of the block that no process took is left out."""
    merged: Samples = {}
    for url in urls:
        with contextlib.suppress(OSError):
            for (name, labels), value in scrape(url).items():
                key = (name, labels | {("reporter", url)})
                merged[key] = value
    return merged


def test_every_service_s_metrics_move_and_every_grafana_query_has_data_after_a_closed_loop(
    unique_plan: Callable[..., TestbedPlan],
    stack: Stack,
    influx_database: InfluxDB,
    flink_cluster: tuple[str, list[str]],
    webhook: Webhook,
    tmp_path: Path,
) -> None:
    jobmanager, flink_urls = flink_cluster
    optimizer_port, sink_port, alerts_port = free_ports(3)
    endpoints = {
        "optimizer": f"http://127.0.0.1:{optimizer_port}/metrics",
        "sink": f"http://127.0.0.1:{sink_port}/metrics",
        "alerts": f"http://127.0.0.1:{alerts_port}/metrics",
    }
    sections = {
        "influxdb": {"database": influx_database.database},
        "optimizer": {"metrics_address": f"127.0.0.1:{optimizer_port}"},
        "sinks": {"metrics_address": f"127.0.0.1:{sink_port}"},
        "alerts": {"metrics_address": f"127.0.0.1:{alerts_port}", "webhook": webhook.url},
    }
    began_ns = time.time_ns()
    with cubic_testbed(unique_plan, (FLOWS, 0)) as testbed:
        link = testbed.plan.link_id
        base = tomllib.loads(paths.example_config().read_text())
        loop = ClosedLoop(
            base,
            testbed,
            tmp_path / "loop",
            bootstrap=stack.kafka.bootstrap,
            policy="globecom",
            influx_url=influx_database.url,
            sections=sections,
            link_settings={"sla": SLA},
            jobmanager=jobmanager,
        )
        endpoints["exporter"] = f"http://{loop.metrics_addresses['exporter']}/metrics"
        loop.start(progress=lambda _: None)
        try:
            with (
                alert_dispatcher(loop.config_path, tmp_path / "alerts.log"),
                running_dashboard(loop.config_path, tmp_path / "dashboard") as dashboard,
            ):
                endpoints["dashboard"] = dashboard.metrics_url  # the port running_dashboard gave
                for url in endpoints.values():  # each process serves once it has started
                    assert wait_until(partial(answers, url), 60, 0.5), f"{url} does not answer"
                before = {name: scrape(url) for name, url in endpoints.items()}
                flink_before = scrape_flink(flink_urls)
                scenario = Scenario(duration_s=TRAFFIC_S, warmup_s=5)
                TrafficRun(testbed, tmp_path / "run", scenario).run(progress=lambda _: None)
                assert dashboard.get("/api/fleet").status == 200

                def moved(name: str, metric: str, **labels: str) -> bool:
                    now = scrape(endpoints[name])
                    return total(now, metric, **labels) > total(before[name], metric, **labels)

                checks = [
                    ("optimizer", "p4bs_optimizer_decisions_total", {"outcome": "applied"}),
                    ("optimizer", "p4bs_optimizer_window_lag_seconds_count", {}),
                    ("optimizer", "p4bs_optimizer_windows_total", {"kind": "decided"}),
                    ("sink", "p4bs_sink_points_written_total", {}),
                    ("alerts", "p4bs_alerts_read_total", {}),
                    ("alerts", "p4bs_alerts_sent_total", {}),
                    ("dashboard", "p4bs_dashboard_feed_records_total", {"stream": "link_metrics"}),
                    ("dashboard", "p4bs_dashboard_requests_total", {"route": "/api/fleet"}),
                    ("exporter", "p4bs_exporter_records_total", {}),
                ]
                for name, metric, labels in checks:
                    assert wait_until(
                        partial(moved, name, metric, **labels), MOVE_TIMEOUT_S, 1.0
                    ), (
                        f"{name}: {metric}{labels} did not move: "
                        f"{total(scrape(endpoints[name]), metric, **labels)}"
                    )
                after = {name: scrape(url) for name, url in endpoints.items()}
                records_in = "flink_taskmanager_job_task_operator_numRecordsIn"
                assert wait_until(
                    lambda: (
                        total(scrape_flink(flink_urls), records_in)
                        > total(flink_before, records_in)
                    ),
                    MOVE_TIMEOUT_S,
                    1.0,
                ), "Flink's reporter: the job's operators took no record"
                flink_after = scrape_flink(flink_urls)
            # The sink writes what the job and the optimizer made, some seconds behind.
            filled = wait_until(lambda: all(_stored(influx_database).values()), 60, 1.0)
        finally:
            loop.stop()
    stored = _stored(influx_database)
    assert filled, f"{stored}; InfluxDB sink log:\n{loop.log_tail('influx-sink')}"
    # The loop's one link, owned by its one optimizer process; no refusal for a clean run.
    assert total(after["optimizer"], "p4bs_optimizer_links_owned") == 1
    assert total(after["optimizer"], "p4bs_optimizer_decisions_total", outcome="failed") == 0
    assert total(after["sink"], "p4bs_sink_dead_letters_total") == 0
    assert total(after["sink"], "p4bs_sink_points_rejected_total") == 0
    assert total(after["alerts"], "p4bs_alerts_failed_total") == 0 and webhook.posts > 0
    assert 0 <= total(after["dashboard"], "p4bs_dashboard_feed_lag_seconds") < 30
    # The job's own counters are reported under their names (none malformed in this run).
    malformed = "flink_taskmanager_job_task_operator_p4bs_malformed_link_counters"
    assert any(name == malformed for name, _ in flink_after), sorted({n for n, _ in flink_after})
    assert total(flink_after, malformed) == 0
    try:
        check_grafana_queries(influx_database, link, began_ns)
    finally:
        influx_database.query(f'DROP DATABASE "{influx_database.database}"')
