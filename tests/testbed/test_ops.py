"""The ops part (ops/) on one running closed loop: P4BS with warm_start on 20 Cubic flows
through the testbed's router for 70 s, an SLA of d-hat = 2 ms so that alerts are raised
(below the ~3.5 ms mean queueing delay the Stanford buffer gives 20 flows, and far below the
200 ms queue before the first decision), the metrics job on a standalone Flink cluster with
Flink's own reporter on, the InfluxDB sink filling a database of the module's own, the alert
dispatcher posting to a webhook of the test's own, and the dashboard. One loop serves both
tests (each needs the same traffic through the whole loop; two loops cost ~80 s more in CI):

- the dashboard in a real browser (Debian's Chromium driven by Playwright), while the traffic
  runs: the link page's charts have points (also after the range picker asks for the last
  minute); a decision the optimizer makes while the page is open is on the page within 2 s of
  the moment its record could be read from Kafka (the test reads the topic too; the page
  notes when each decision reached it), and within 10 s of the decision itself, the
  optimizer's transaction included; the fleet page shows the link with its window and last
  decision; the search page draws the P4BS search's GP; no script error in any page.
  Screenshots of the three pages are kept in .cache/artifacts/dashboard/ (printed);
- monitoring, after the traffic: every service's Prometheus endpoint (the exporter, the
  metrics job's TaskManagers, the InfluxDB sink, the alert dispatcher, the optimizer and the
  dashboard), scraped over HTTP before and after the traffic and read with
  prometheus_client's parser: each service's counts must move with the traffic; then every
  query of every Grafana dashboard (ops/grafana: panels, annotations, variables), its macros
  rendered as Grafana renders them, against the database the loop filled: each must return
  series with data in every column."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_END, Consumer, TopicPartition
from dashboard import Dashboard, running_dashboard
from playwright.sync_api import Browser, Page, sync_playwright
from promscrape import Samples, scrape
from test_closed_loop import cubic_testbed

from conftest import own_database
from p4bs import paths, retention
from p4bs_infra.procs import free_port_block, free_ports, stop_session, wait_until
from p4bs_infra.services import FlinkJobManager, FlinkTaskManager, InfluxDB
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import TestbedPlan
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.closed_loop import ClosedLoop
from p4bs_ops import grafana
from p4bs_schemas.codec import codec
from p4bs_schemas.registry import STREAMS

FLOWS = 20
TRAFFIC_S = 70  # long enough for P4BS to find its bounds and fit its GP
SLA = {"max_queue_delay": "2ms", "max_loss": 0.01}
LIVE_S = 2.0  # a decision on the page at most this long after its record could be read
END_TO_END_S = 10.0  # ... and after the optimizer made it (its transaction included)
MOVE_TIMEOUT_S = 60  # for a count to show what already happened (scrapes, Flink's reporter)
MINUTE_NS = 60 * 10**9
ARTIFACTS = paths.cache_dir() / "artifacts" / "dashboard"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHARTS = ("rtt", "flows", "loss", "delay", "utilisation", "f", "buffer")


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
    problems = []
    for column in series[0]["columns"]:
        if column == "time":
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


@contextlib.contextmanager
def flink_cluster(state: Path) -> Iterator[tuple[str, list[str]]]:
    """A JobManager and two TaskManagers with Flink's Prometheus reporter on a block of three
    ports (one each, in whatever order they start): the JobManager's REST endpoint and the
    reporters' URLs."""
    rest, rpc = free_ports(2)
    first = free_port_block(3, avoid=(rest, rpc))
    ports = f"{first}-{first + 2}"
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


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Debian's Chromium (Playwright's own browsers are never downloaded), with a fresh
    profile: Playwright's launch gives each browser a new, temporary user-data folder."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run make setup (apt package chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _wait_in_page(page: Page, condition: str, timeout_s: float, what: str) -> None:
    """Waits until the JavaScript `condition` holds in the page, failing with `what`."""
    try:
        page.wait_for_function(condition, timeout=timeout_s * 1000, polling=200)
    except Exception as exc:  # Playwright's TimeoutError names only the timeout
        state = page.evaluate(
            "JSON.stringify({points: window.p4bs.points, search: window.p4bs.search, "
            "decisions: window.p4bs.decisions.length})"
        )
        raise AssertionError(f"{what} within {timeout_s:g} s: {exc}; page state {state}") from None


@contextlib.contextmanager
def decisions_from_now(bootstrap: str, topic: str) -> Iterator[Consumer]:
    """A reader of the decisions topic from its end now on (committed records only, as the
    dashboard reads them)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dash-watch-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions])
    try:
        yield consumer
    finally:
        consumer.close()


def _next_decision(
    watch: Consumer, link: str, after_ns: int, timeout_s: float
) -> tuple[dict[str, Any], int, int]:
    """The link's first decision whose record is stamped after `after_ns` (in the ms after),
    the Kafka timestamp of its record and when this test read it (ns)."""
    schema = codec(STREAMS["buffer_decisions"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = watch.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        record, record_ns = schema.decode(msg.value(), msg.headers()), msg.timestamp()[1] * 10**6
        if record["link_id"] == link and record_ns > after_ns:
            return record, record_ns, time.time_ns()
    raise AssertionError(f"no decision of {link} within {timeout_s:g} s")


@dataclasses.dataclass
class LiveLoop:
    """The module's running loop, its traffic sending in a thread, and what the monitoring
    test compares with: every endpoint's samples scraped before the traffic began."""

    loop: ClosedLoop
    link: str
    influx: InfluxDB
    dashboard: Dashboard
    webhook: Webhook
    endpoints: dict[str, str]
    flink_urls: list[str]
    before: dict[str, Samples]
    flink_before: Samples
    began_ns: int
    traffic: threading.Thread


@pytest.fixture(scope="module")
def live_loop(
    unique_plan: Callable[..., TestbedPlan],
    stack: Stack,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveLoop]:
    work = tmp_path_factory.mktemp("ops")
    influx = own_database(stack, work / "influx")
    optimizer_port, sink_port, alerts_port = free_ports(3)
    endpoints = {
        "optimizer": f"http://127.0.0.1:{optimizer_port}/metrics",
        "sink": f"http://127.0.0.1:{sink_port}/metrics",
        "alerts": f"http://127.0.0.1:{alerts_port}/metrics",
    }
    began_ns = time.time_ns()
    with contextlib.ExitStack() as running:
        running.callback(influx.query, f'DROP DATABASE "{influx.database}"')
        webhook = Webhook()
        running.callback(webhook.close)
        jobmanager, flink_urls = running.enter_context(flink_cluster(work / "flink"))
        testbed = running.enter_context(cubic_testbed(unique_plan, (FLOWS, 0)))
        sections = {
            "influxdb": {"database": influx.database},
            "optimizer": {"metrics_address": f"127.0.0.1:{optimizer_port}"},
            "sinks": {"metrics_address": f"127.0.0.1:{sink_port}"},
            "alerts": {"metrics_address": f"127.0.0.1:{alerts_port}", "webhook": webhook.url},
        }
        loop = ClosedLoop(
            tomllib.loads(paths.example_config().read_text()),
            testbed,
            work / "loop",
            bootstrap=stack.kafka.bootstrap,
            policy="p4bs",
            # The bound search's measurements inside the bounds warm-start the GP: the search
            # page has a posterior from the first trial on.
            policy_options={"warm_start": True},
            influx_url=influx.url,
            sections=sections,
            link_settings={"sla": SLA},
            jobmanager=jobmanager,
        )
        endpoints["exporter"] = f"http://{loop.metrics_addresses['exporter']}/metrics"
        running.callback(loop.stop)
        loop.start(progress=lambda _: None)
        running.enter_context(alert_dispatcher(loop.config_path, work / "alerts.log"))
        dashboard = running.enter_context(running_dashboard(loop.config_path, work / "dashboard"))
        endpoints["dashboard"] = dashboard.metrics_url  # the port running_dashboard gave
        for url in endpoints.values():  # each process serves once it has started
            assert wait_until(partial(answers, url), 60, 0.5), f"{url} does not answer"
        before = {name: scrape(url) for name, url in endpoints.items()}
        flink_before = scrape_flink(flink_urls)
        traffic = TrafficRun(testbed, work / "run", Scenario(duration_s=TRAFFIC_S))
        sending = threading.Thread(target=traffic.run, kwargs={"progress": lambda _: None})
        sending.start()
        running.callback(sending.join)
        yield LiveLoop(
            loop,
            testbed.plan.link_id,
            influx,
            dashboard,
            webhook,
            endpoints,
            flink_urls,
            before,
            flink_before,
            began_ns,
            sending,
        )


def test_dashboard_pages_in_chromium_while_the_traffic_runs(
    live_loop: LiveLoop, stack: Stack, browser: Browser
) -> None:
    live, link = live_loop, live_loop.link
    dashboard = live.dashboard
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert live.traffic.is_alive(), "the traffic ended before the pages were opened"
    with decisions_from_now(stack.kafka.bootstrap, live.loop.topics["buffer_decisions"]) as watch:
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        # Link: every chart with points (history, then live windows and decisions).
        page.goto(f"{dashboard.url}/link/{urllib.parse.quote(link)}")
        _wait_in_page(page, "window.p4bs.streaming === true", 30, "no event stream")
        decision, record_ns, read_ns = _next_decision(watch, link, time.time_ns(), 90)
        key = f"{decision['ts_ns']}/{decision['queue']}"
        _wait_in_page(
            page,
            f"window.p4bs.decisions.some((d) => d.id === {key!r})",
            10,
            f"decision {key} not on the page",
        )
        received_ms = page.evaluate(
            f"window.p4bs.decisions.find((d) => d.id === {key!r}).received_ms"
        )
        # The dashboard's share: from the moment the record could be read (the test's
        # own read-committed reader had it) to the page. Before that, the optimizer's
        # transaction: here, under the loop's load, 0.2 to 3.5 s from the decision.
        late_s = (received_ms * 1_000_000 - read_ns) / 1e9
        print(
            f"decision {key} ({decision['phase']}): record stamped "
            f"{(record_ns - decision['ts_ns']) / 1e9:.3f} s after the decision, "
            f"readable {(read_ns - record_ns) / 1e9:.3f} s after that, on the page "
            f"{late_s:.3f} s later"
        )
        assert late_s <= LIVE_S
        assert received_ms / 1e3 - decision["ts_ns"] / 1e9 <= END_TO_END_S
        everything = " && ".join(f"window.p4bs.points[{c!r}] > 0" for c in CHARTS)
        _wait_in_page(page, everything, 30, "charts without points")
        page.locator(f'#decisions tr[data-id="{key}"]').wait_for(timeout=5_000)
        # The range picker: the last minute, read again from InfluxDB.
        page.select_option("#range", "60")
        _wait_in_page(
            page,
            "document.getElementById('status').textContent === 'live'",
            30,
            "range not loaded",
        )
        _wait_in_page(page, everything, 30, "charts without points in the last minute")
        # The decision's mark on the time axis (a pixel is 0.13 s of this minute) tells
        # its outcome and reason. The cursor is put on it in the same script that finds
        # its position: the live range slides on with every window, and a mouse moved
        # a moment later lands on a later time (here once, on the next decision).
        marker = page.evaluate(
            """(ms) => {
              const u = window.p4bs.plots.rtt;
              u.setCursor({ left: u.valToPos(ms, "x"), top: u.over.clientHeight / 2 });
              return document.querySelector('#chart-rtt .marker').textContent;
            }""",
            decision["ts_ns"] / 1e6,
        )
        assert decision["outcome"] in marker and decision["reason"][:40] in marker, marker
        page.screenshot(path=str(ARTIFACTS / "link.png"), full_page=True)

        # Fleet: the link's row, its window and last decision read from Kafka.
        page.goto(dashboard.url + "/")
        row = page.locator(f'tr[data-link="{link}"][data-sla]:not([data-sla="no data"])')
        row.wait_for(timeout=30_000)
        assert "p4bs" in row.inner_text() and "applied" in row.inner_text()
        page.screenshot(path=str(ARTIFACTS / "fleet.png"), full_page=True)

        # Search: the GP over the buffer range, once P4BS has an observation in it.
        page.goto(f"{dashboard.url}/search/{urllib.parse.quote(link)}")
        _wait_in_page(
            page,
            "window.p4bs.search && window.p4bs.search.observations > 0",
            TRAFFIC_S,
            "no GP on the search page",
        )
        assert page.evaluate("window.p4bs.search.grid") > 0
        page.screenshot(path=str(ARTIFACTS / "search.png"), full_page=True)
        print(f"screenshots in {ARTIFACTS}")
        assert not errors, f"errors in the pages' scripts: {errors}"


def test_every_service_s_metrics_move_and_every_grafana_query_has_data_after_the_traffic(
    live_loop: LiveLoop,
) -> None:
    live = live_loop
    live.traffic.join()
    assert live.dashboard.get("/api/fleet").status == 200

    def moved(name: str, metric: str, **labels: str) -> bool:
        now = scrape(live.endpoints[name])
        return total(now, metric, **labels) > total(live.before[name], metric, **labels)

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
        assert wait_until(partial(moved, name, metric, **labels), MOVE_TIMEOUT_S, 1.0), (
            f"{name}: {metric}{labels} did not move: "
            f"{total(scrape(live.endpoints[name]), metric, **labels)}"
        )
    after = {name: scrape(url) for name, url in live.endpoints.items()}
    records_in = "flink_taskmanager_job_task_operator_numRecordsIn"
    assert wait_until(
        lambda: (
            total(scrape_flink(live.flink_urls), records_in) > total(live.flink_before, records_in)
        ),
        MOVE_TIMEOUT_S,
        1.0,
    ), "Flink's reporter: the job's operators took no record"
    flink_after = scrape_flink(live.flink_urls)
    # The sink writes what the job and the optimizer made, some seconds behind.
    filled = wait_until(lambda: all(_stored(live.influx).values()), 60, 1.0)
    stored = _stored(live.influx)
    assert filled, f"{stored}; InfluxDB sink log:\n{live.loop.log_tail('influx-sink')}"
    # The loop's one link, owned by its one optimizer process; no refusal for a clean run.
    assert total(after["optimizer"], "p4bs_optimizer_links_owned") == 1
    assert total(after["optimizer"], "p4bs_optimizer_decisions_total", outcome="failed") == 0
    assert total(after["sink"], "p4bs_sink_dead_letters_total") == 0
    assert total(after["sink"], "p4bs_sink_points_rejected_total") == 0
    assert total(after["alerts"], "p4bs_alerts_failed_total") == 0 and live.webhook.posts > 0
    assert 0 <= total(after["dashboard"], "p4bs_dashboard_feed_lag_seconds") < 30
    # The job's own counters are reported under their names (none malformed in this run).
    malformed = "flink_taskmanager_job_task_operator_p4bs_malformed_link_counters"
    assert any(name == malformed for name, _ in flink_after), sorted({n for n, _ in flink_after})
    assert total(flink_after, malformed) == 0
    check_grafana_queries(live.influx, live.link, live.began_ns)
