"""The exporter's Prometheus endpoint: the switch's `metrics_address` (loopback only, "" off)
goes into the run spec, and the built `p4bs-exporter` serves `/metrics` there from its start,
before Kafka answers (here it never does: no broker runs in unit tests)."""

from __future__ import annotations

import json
import re
import selectors
import subprocess
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from pcapgen import FlowPlan, write_taps

from p4bs import paths
from p4bs.config import ConfigError, parse_config
from p4bs_exporter import run_spec
from p4bs_exporter.metrics import serve_exporter_metrics
from p4bs_exporter.model_target import socket_address
from p4bs_exporter.target import ExporterStats
from p4bs_exporter.tofino_contract import REGISTER_READS
from p4bs_infra.procs import free_port

NAMES = (
    "p4bs_exporter_records_total",
    "p4bs_exporter_records_dropped_total",
    "p4bs_exporter_in_flight",
    "p4bs_exporter_digests_total",
    "p4bs_exporter_register_reads_total",
)


def config_with_switch(**switch: str) -> dict[str, object]:
    data = tomllib.loads(paths.example_config().read_text())
    data["switches"] = [{**data["switches"][0], **switch}]
    return data


def test_the_switch_metrics_address_is_loopback_by_default_and_checked() -> None:
    assert parse_config(config_with_switch()).switches[0].metrics_address == "127.0.0.1:9465"
    for kept in ("", "[::1]:9500", "localhost:9466"):
        config = parse_config(config_with_switch(metrics_address=kept))
        assert config.switches[0].metrics_address == kept
    for refused, why in (
        ("0.0.0.0:9465", "exposes the exporter's metrics beyond this machine"),
        ("10.0.0.5:9465", "exposes the exporter's metrics beyond this machine"),
        ("exporter.example:9465", "an IP address or localhost"),
        ("127.0.0.1", "must be host:port"),
    ):
        with pytest.raises(ConfigError) as error:
            parse_config(config_with_switch(metrics_address=refused))
        assert "switches[0].metrics_address: " in str(error.value)
        assert why in str(error.value)


def test_the_run_spec_carries_the_address_as_the_binary_parses_it(tmp_path: Path) -> None:
    config = parse_config(config_with_switch(metrics_address="localhost:9470"))
    spec = run_spec(config, stats_path=tmp_path / "stats.json", pcaps=[("before", tmp_path)])
    assert spec["metrics_address"] == "127.0.0.1:9470"
    off = run_spec(config, stats_path=tmp_path / "s.json", metrics_address="")
    assert off["metrics_address"] == ""
    assert socket_address("[::1]:9500") == "[::1]:9500"
    assert socket_address("::1:9500") == "[::1]:9500"


def line_matching(process: subprocess.Popen[str], pattern: str, timeout_s: float) -> str:
    """The first line of the process's stderr that matches, waiting at most `timeout_s`."""
    assert process.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    seen = []
    while (left := deadline - time.monotonic()) > 0:
        if not selector.select(left):
            break
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} in {''.join(seen)!r}")


def test_the_binary_serves_its_metrics_while_it_waits_for_kafka(tmp_path: Path) -> None:
    binary = paths.built("p4bs-exporter")
    if not binary.exists():
        pytest.skip(f"{binary} is not built (make build)")
    before, _ = write_taps(
        tmp_path, [FlowPlan("10.201.1.10", "10.201.2.2", 40000, 5201, 10**18, 50, 10**5, 10**7)]
    )
    config = parse_config(tomllib.loads(paths.example_config().read_text()))
    address = f"127.0.0.1:{free_port()}"
    spec = run_spec(
        config,
        stats_path=tmp_path / "stats.json",
        pcaps=[("before", before)],
        topics={"link_counters": "p4bs.test.metrics"},
        metrics_address=address,
    )
    spec["kafka"]["bootstrap"] = f"127.0.0.1:{free_port()}"  # nobody listens there
    spec["startup_timeout_s"] = 60
    spec_path = tmp_path / "run.json"
    spec_path.write_text(json.dumps(spec))
    process = subprocess.Popen(
        [str(binary), "--spec", str(spec_path)], stderr=subprocess.PIPE, text=True
    )
    try:
        line_matching(process, re.escape(f"metrics on http://{address}/metrics"), 30)
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
            text = reply.read().decode()
        for name in NAMES:
            assert re.search(rf"^{name}(\{{[^}}]*\}})? 0$", text, re.M), (name, text)
        assert 'p4bs_exporter_records_total{topic="p4bs.test.metrics"} 0' in text
        assert 'p4bs_exporter_records_dropped_total{reason="queue_full"} 0' in text
    finally:
        process.terminate()
        process.wait(timeout=30)


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text: str = reply.read().decode()
        return text


def test_the_tofino_exporters_endpoint_reads_its_stats_at_each_scrape() -> None:
    stats = ExporterStats(target="tofino", produced_total=12, dropped=1, failed=2, in_flight=5)
    stats.frames = 40  # digests taken from the data plane
    stats.pipeline[REGISTER_READS] = 7
    address = f"127.0.0.1:{free_port()}"
    endpoint = serve_exporter_metrics(address, lambda: stats, "p4bs.link_counters")
    try:
        text = scrape(address)
        for line in (
            'p4bs_exporter_records_total{topic="p4bs.link_counters"} 12.0',
            'p4bs_exporter_records_dropped_total{reason="queue_full"} 1.0',
            'p4bs_exporter_records_dropped_total{reason="invalid"} 0.0',
            'p4bs_exporter_records_dropped_total{reason="delivery_failed"} 2.0',
            "p4bs_exporter_in_flight 5.0",
            "p4bs_exporter_digests_total 40.0",
            "p4bs_exporter_register_reads_total 7.0",
        ):
            assert line in text.splitlines(), (line, text)
        stats.produced_total, stats.in_flight = 30, 0
        text = scrape(address)
        assert 'p4bs_exporter_records_total{topic="p4bs.link_counters"} 30.0' in text
        assert "p4bs_exporter_in_flight 0.0" in text
        # The address is taken now: a second exporter there fails at start.
        with pytest.raises(OSError):
            serve_exporter_metrics(address, lambda: stats, "p4bs.link_counters")
    finally:
        endpoint.stop()
