"""Each service's Prometheus endpoint, served on a free loopback port and scraped over HTTP
(prometheus_client's parser reads what it serves), while the code path that counts runs:
the optimizer's link controller deciding on synthetic windows (the controller tests' clock,
router and scripted policy), the InfluxDB sink's write path and the alert dispatcher's
posts against a scripted HTTP server of this test, the dashboard's API in process. The
numbers must move as the code ran. And the rule for an address beyond the loopback: refused
without [prometheus] token and TLS (the config check and the endpoint itself); with them,
TLS and the bearer token."""

from __future__ import annotations

import importlib.metadata
import re
import threading
import time
import tomllib
import urllib.error
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml
from prometheus_client import CollectorRegistry
from promscrape import Samples, scrape, value
from test_dashboard_fleet import _fleet, _get, _window
from test_link_controller import GUARDS, SECOND_NS, Link, example_link, run

from p4bs import paths
from p4bs.bus import ConsumerStats
from p4bs.config import (
    AlertsConfig,
    ConfigError,
    InfluxConfig,
    PrometheusConfig,
    SecretRef,
    load_config,
    parse_config,
)
from p4bs.exposure import ExposureError
from p4bs.influx import InfluxClient
from p4bs.metrics_endpoint import (
    EndpointError,
    MetricsEndpoint,
    registry_of,
    serve_metrics,
    start_metrics_endpoint,
    with_metrics_address,
)
from p4bs_cli.main import build_parser
from p4bs_infra.pki import make_test_pki
from p4bs_infra.services import PROMETHEUS_REPORTER, FlinkJobManager, flink_home
from p4bs_infra.stack import StackSettings
from p4bs_ops.dashboard.metrics import DashboardMetrics
from p4bs_ops.dashboard.server import build_app
from p4bs_optimizer.service import OptimizerService
from p4bs_optimizer.service.metrics import OptimizerCollector
from p4bs_sinks.alerts import DispatchStats, dispatch_alert
from p4bs_sinks.influx_sink import SinkStats, write_points
from p4bs_sinks.metrics import DispatcherCollector, SinkCollector


def serving(registry: CollectorRegistry) -> MetricsEndpoint:
    """`registry` on a free loopback port (the caller stops it)."""
    endpoint = start_metrics_endpoint("127.0.0.1:0", registry, PrometheusConfig(), key="test")
    assert endpoint is not None
    return endpoint


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


class ScriptedHttp:
    """An HTTP server on a free loopback port answering each POST with the next status of
    `statuses` (then 204), and noting each request's path."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.paths: list[str] = []
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                script.paths.append(self.path)
                status = script.statuses.pop(0) if script.statuses else 204
                body = b'{"error": "scripted"}' if status >= 300 else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedHttp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def endpoints() -> Iterator[list[MetricsEndpoint]]:
    started: list[MetricsEndpoint] = []
    yield started
    for endpoint in started:
        endpoint.stop()


def test_the_optimizer_s_decisions_guards_fallbacks_and_lag_move_on_its_endpoint(
    endpoints: list[MetricsEndpoint],
) -> None:
    """A change applied, one held to the link's bound, then the safe buffer when metrics stop:
    three applied decisions, one refusal by the bounds guard, one stale-metrics fallback, two
    windows' lags, one link owned, and CPU spent saving the link's states."""
    service = OptimizerService(load_config(paths.example_config()))
    link = Link(GUARDS)
    # The controller counts into its host's stats: those are the service's here.
    service.stats = link.host.stats
    service.controllers = {link.link.id: link.controller}
    endpoints.append(serving(registry_of(OptimizerCollector(service))))
    before = scrape(endpoints[0].url)
    high = example_link().max_buffer_bytes

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(SECOND_NS)
        await link.window(decide=high + 1_000)
        await link.commit()
        link.clock.advance(GUARDS.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()

    run(scenario)
    after = scrape(endpoints[0].url)
    assert [outcome for _, outcome, _ in link.outcomes()] == ["applied"] * 3
    assert moved(before, after, "p4bs_optimizer_decisions_total", outcome="applied") == 3
    assert moved(before, after, "p4bs_optimizer_decisions_total", outcome="failed") == 0
    assert moved(before, after, "p4bs_optimizer_guard_refusals_total", guard="bounds") == 1
    assert moved(before, after, "p4bs_optimizer_guard_refusals_total", guard="freeze") == 0
    assert moved(before, after, "p4bs_optimizer_fallbacks_total", cause="stale_metrics") == 1
    # The two policy decisions were made on windows; the fallback on none.
    assert moved(before, after, "p4bs_optimizer_window_lag_seconds_count") == 2
    assert value(after, "p4bs_optimizer_links_owned") == 1
    assert value(after, "p4bs_optimizer_windows_total", kind="decided") == 2
    # Each decision saved the link's state; no record came through a consumer here.
    assert moved(before, after, "p4bs_optimizer_cpu_seconds_total", part="state") > 0
    assert moved(before, after, "p4bs_optimizer_cpu_seconds_total", part="decode") == 0


def test_the_sink_s_points_retries_and_dead_letters_move_on_its_endpoint(
    endpoints: list[MetricsEndpoint],
) -> None:
    """Two points written after one failure (a retry), a third rejected for good, against a
    scripted InfluxDB; the records its consumer dead-lettered (counted by p4bs.bus, which
    needs a broker: here the counts as it keeps them), by stream and reason."""
    stats = SinkStats()
    consumer = ConsumerStats(dead_letters=Counter({("link_metrics", "malformed_record"): 2}))
    endpoints.append(serving(registry_of(SinkCollector(stats, consumer))))
    before = scrape(endpoints[0].url)
    stop = threading.Event()
    with (
        ScriptedHttp([500, 204, 400]) as influxdb,
        InfluxClient(InfluxConfig(url=influxdb.url)) as influx,
    ):
        assert write_points(influx, "autogen", ["m v=1i 1", "m v=2i 2"], stats, stop)
        assert write_points(influx, "events", ["m v=3i 3"], stats, stop)
    assert all(path.startswith("/write?") for path in influxdb.paths)
    after = scrape(endpoints[0].url)
    assert moved(before, after, "p4bs_sink_points_written_total") == 2
    assert moved(before, after, "p4bs_sink_write_retries_total") == 1
    assert moved(before, after, "p4bs_sink_points_rejected_total") == 1
    dead = {"stream": "link_metrics", "reason": "malformed_record"}
    assert value(after, "p4bs_sink_dead_letters_total", **dead) == 2


def test_the_dispatcher_s_alerts_read_sent_and_failed_move_on_its_endpoint(
    endpoints: list[MetricsEndpoint],
) -> None:
    """Two alerts read: one sent on its second attempt, one failed after both."""
    stats = DispatchStats()
    endpoints.append(serving(registry_of(DispatcherCollector(stats, ConsumerStats()))))
    before = scrape(endpoints[0].url)
    alert = {"link_id": "r1:eth1", "kind": "loss", "state": "raise", "alert_id": "a1",
             "windows": 3, "value": 0.02, "bound": 0.01, "ts_ns": 1_800 * SECOND_NS}  # fmt: skip
    with ScriptedHttp([503, 200, 500, 500]) as webhook:
        settings = AlertsConfig(webhook=webhook.url, attempts=2, backoff_ns=10_000_000)
        stop = threading.Event()
        assert dispatch_alert(alert, webhook.url, settings, stats, stop)
        assert not dispatch_alert({**alert, "alert_id": "a2"}, webhook.url, settings, stats, stop)
    after = scrape(endpoints[0].url)
    assert moved(before, after, "p4bs_alerts_read_total") == 2
    assert moved(before, after, "p4bs_alerts_sent_total") == 1
    assert moved(before, after, "p4bs_alerts_failed_total") == 1
    assert moved(before, after, "p4bs_alerts_post_retries_total") == 2


def test_the_dashboard_s_requests_and_feed_lag_move_on_its_endpoint(
    tmp_path: Path, endpoints: list[MetricsEndpoint]
) -> None:
    """Requests counted by route template and status (a 404 for an unknown link under the
    link's route, not its path); the feed's lag from its newest window, 3 s old."""
    fleet, link_id = _fleet(0)
    fleet.apply("link_metrics", _window(link_id, time.time_ns() - 3 * SECOND_NS, -0.1))
    metrics = DashboardMetrics(fleet)
    app = build_app(fleet, assets=tmp_path, metrics=metrics)  # no page asks for the assets
    endpoints.append(serving(registry_of(metrics)))
    assert _get(app, "/api/fleet")[0] == 200
    assert _get(app, "/api/fleet")[0] == 200
    assert _get(app, "/api/links/r9:nowhere")[0] == 404
    after = scrape(endpoints[0].url)
    requests = "p4bs_dashboard_requests_total"
    assert value(after, requests, route="/api/fleet", status="200") == 2
    assert value(after, requests, route="/api/links/{link_id}", status="404") == 1
    assert value(after, "p4bs_dashboard_feed_records_total", stream="link_metrics") == 1
    assert 3 <= value(after, "p4bs_dashboard_feed_lag_seconds") < 60


def _one_counter() -> CollectorRegistry:
    registry = CollectorRegistry()
    prometheus_client.Counter("p4bs_test_things", "things", registry=registry).inc(7)
    return registry


@pytest.mark.parametrize(
    "access",
    [
        PrometheusConfig(),
        PrometheusConfig(token=SecretRef(env="P4BS_TEST_TOKEN")),
        PrometheusConfig(tls_cert="cert.pem", tls_key="key.pem"),
    ],
)
def test_an_endpoint_beyond_the_loopback_needs_a_token_and_tls(access: PrometheusConfig) -> None:
    """Refused before anything is bound, naming the setting and what to give."""
    with pytest.raises(ExposureError, match=r"optimizer\.metrics_address 0\.0\.0\.0:9461 exposes"):
        start_metrics_endpoint(
            "0.0.0.0:9461", _one_counter(), access, key="optimizer.metrics_address"
        )
    with pytest.raises(ExposureError, match="an IP address or localhost"):
        start_metrics_endpoint("metrics.example:9461", _one_counter(), access, key="k")


def _example_data() -> dict[str, Any]:
    return tomllib.loads(paths.example_config().read_text())


@pytest.mark.parametrize("section", ["optimizer", "sinks", "alerts", "dashboard"])
def test_the_config_refuses_a_metrics_address_beyond_the_loopback_without_its_opt_in(
    section: str,
) -> None:
    data = _example_data()
    data.setdefault(section, {})["metrics_address"] = "192.0.2.7:9400"
    with pytest.raises(ConfigError) as refused:
        parse_config(data)
    (problem,) = [p for p in refused.value.problems if "metrics_address" in p]
    assert problem.startswith(f"{section}.metrics_address: ") and "[prometheus] token" in problem
    data["prometheus"] = {"token": {"env": "METRICS_TOKEN"}, "tls_cert": "c.pem", "tls_key": "k"}
    config = parse_config(data)
    assert getattr(config, section).metrics_address == "192.0.2.7:9400"


def test_the_config_s_metrics_addresses_default_to_the_loopback_and_empty_turns_one_off() -> None:
    config = load_config(paths.example_config())
    addresses = [
        config.optimizer.metrics_address,
        config.sinks.metrics_address,
        config.alerts.metrics_address,
        config.dashboard.metrics_address,
    ]
    assert addresses == ["127.0.0.1:9461", "127.0.0.1:9462", "127.0.0.1:9463", "127.0.0.1:9464"]
    data = _example_data()
    data["optimizer"]["metrics_address"] = ""
    off = parse_config(data).optimizer
    assert (
        start_metrics_endpoint(off.metrics_address, _one_counter(), PrometheusConfig(), key="k")
        is None
    )
    data["optimizer"]["metrics_address"] = "127.0.0.1"
    with pytest.raises(ConfigError, match=r"optimizer\.metrics_address: must be host:port"):
        parse_config(data)


def test_with_a_token_and_tls_the_endpoint_speaks_tls_and_wants_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoints: list[MetricsEndpoint]
) -> None:
    pki = make_test_pki(tmp_path / "pki", "127.0.0.1", netconf_port=830)
    monkeypatch.setenv("P4BS_TEST_METRICS_TOKEN", "s3cret")
    access = PrometheusConfig(
        token=SecretRef(env="P4BS_TEST_METRICS_TOKEN"),
        tls_cert=str(pki["server.pem"]),
        tls_key=str(pki["server-key.pem"]),
    )
    endpoint = start_metrics_endpoint("127.0.0.1:0", _one_counter(), access, key="k")
    assert endpoint is not None
    endpoints.append(endpoint)
    assert endpoint.url.startswith("https://127.0.0.1:")
    ca = str(pki["ca.pem"])
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(endpoint.url, ca_file=ca)
    assert refused.value.code == 401
    with pytest.raises(urllib.error.HTTPError):
        scrape(endpoint.url, token="wrong", ca_file=ca)
    assert value(scrape(endpoint.url, token="s3cret", ca_file=ca), "p4bs_test_things_total") == 7


def test_the_dashboard_s_own_bind_follows_the_same_rule() -> None:
    """One rule (p4bs.exposure) for the dashboard's --bind and the endpoints: the same words."""
    from p4bs_ops.dashboard.server import SetupError, check_exposure

    with pytest.raises(SetupError, match=r"--bind 0\.0\.0\.0 exposes the dashboard beyond"):
        check_exposure("0.0.0.0", None, tls=False)


def test_the_stack_s_flink_cluster_switches_on_flink_s_prometheus_reporter(tmp_path: Path) -> None:
    """[flink] metrics_ports reaches the cluster's config (the JobManager's and TaskManagers'
    one config.yaml) as Flink's Prometheus reporter on those ports, whose plugin jar is the
    distribution's own, of PyFlink's Flink version; without it, no reporter."""
    data = _example_data()
    data["flink"]["metrics_ports"] = "9470-9479"
    settings = StackSettings.from_config(parse_config(data), tmp_path)
    assert settings.flink_metrics_ports == "9470-9479"
    jobmanager = FlinkJobManager(tmp_path, 8081, 6123, settings.flink_metrics_ports)
    jobmanager._write_config()
    written = yaml.safe_load((tmp_path / "flink-conf" / "config.yaml").read_text())
    reporter = written["metrics"]["reporter"]["prom"]
    assert reporter == {"factory": {"class": PROMETHEUS_REPORTER}, "port": "9470-9479"}
    version = importlib.metadata.version("apache-flink")
    plugin = flink_home() / "plugins" / "metrics-prometheus"
    assert (plugin / f"flink-metrics-prometheus-{version}.jar").is_file()
    FlinkJobManager(tmp_path, 8081, 6123)._write_config()
    written = yaml.safe_load((tmp_path / "flink-conf" / "config.yaml").read_text())
    assert "prom" not in (written.get("metrics") or {}).get("reporter", {})
    for wrong in ("80", "9479-9470", "a-b"):
        data["flink"]["metrics_ports"] = wrong
        with pytest.raises(ConfigError, match=r"flink\.metrics_ports: must be"):
            parse_config(data)


def test_every_service_metric_the_grafana_row_and_the_alert_rules_name_is_served() -> None:
    """The Prometheus dashboard (ops/grafana/prometheus) and ops/DEPLOYING.md (table, alert
    rules) name only metrics the Python services serve (the exporter's are its own)."""
    fleet, _ = _fleet(0)
    optimizer = OptimizerService(load_config(paths.example_config()))
    optimizer.consumer_stats.dead_letters["link_metrics", "malformed_record"] += 1
    collectors = [
        OptimizerCollector(optimizer),
        SinkCollector(SinkStats(), ConsumerStats(dead_letters=Counter({("s", "r"): 1}))),
        DispatcherCollector(DispatchStats(), ConsumerStats(dead_letters=Counter({("s", "r"): 1}))),
        DashboardMetrics(fleet),
    ]
    served = set()
    for family in registry_of(*collectors).collect():
        # A counter's name, even one with no sample yet (no request counted): NAME_total.
        total = {f"{family.name}_total"} if family.type == "counter" else set()
        served |= {family.name} | total | {sample.name for sample in family.samples}
    pages = [
        paths.home() / "ops/grafana/prometheus/services.json",
        paths.home() / "ops/DEPLOYING.md",
    ]
    for page in pages:
        named = set(
            re.findall(r"\bp4bs_(?:optimizer|sink|alerts|dashboard)_[a-z_]+", page.read_text())
        )
        assert named, page
        assert named <= served, f"{page.name} names what no service serves: {named - served}"


@pytest.mark.parametrize(
    ("command", "key"),
    [
        (["optimizer", "run"], "optimizer.metrics_address"),
        (["sinks", "influx"], "sinks.metrics_address"),
        (["sinks", "alerts"], "alerts.metrics_address"),
        (["dashboard"], "dashboard.metrics_address"),
    ],
)
def test_each_service_takes_another_metrics_address_on_its_command_line(
    command: list[str], key: str
) -> None:
    """What runs a second process of a service on one host (two optimizers of a group) gives
    it a port of its own; "" for none; a port without its host refused by the parser."""
    parser = build_parser()
    config = load_config(paths.example_config())
    section = key.partition(".")[0]
    for given, expected in (("127.0.0.1:9466", "127.0.0.1:9466"), ("", "")):
        args = parser.parse_args([*command, "--metrics-address", given])
        changed = with_metrics_address(config, key, args.metrics_address)
        assert getattr(changed, section).metrics_address == expected
    unchanged = with_metrics_address(config, key, parser.parse_args(command).metrics_address)
    assert getattr(unchanged, section) == getattr(config, section)
    with pytest.raises(SystemExit):
        parser.parse_args([*command, "--metrics-address", "9466"])


def test_an_address_already_taken_is_an_error_naming_the_setting(
    endpoints: list[MetricsEndpoint],
) -> None:
    """Two processes given one port (a second optimizer without --metrics-address): the
    second stops at start, saying which setting and address."""
    first = serving(_one_counter())
    endpoints.append(first)
    port = first.server.server_address[1]
    key = "sinks.metrics_address"
    busy = with_metrics_address(load_config(paths.example_config()), key, f"127.0.0.1:{port}")
    with pytest.raises(EndpointError, match=rf"^sinks\.metrics_address 127\.0\.0\.1:{port}: "):
        serve_metrics(busy, key, SinkCollector(SinkStats(), ConsumerStats()))
    assert value(scrape(first.url), "p4bs_test_things_total") == 7  # the first serves on
