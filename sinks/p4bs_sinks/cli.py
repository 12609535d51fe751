"""`p4bs sinks influx|alerts`: the services that carry the topics out of Kafka."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client.registry import Collector

from p4bs import logs, paths
from p4bs.config import Config, ConfigError, load_config
from p4bs.metrics_endpoint import (
    EndpointError,
    add_metrics_address_option,
    serve_metrics,
    with_metrics_address,
)

SINK_METRICS = "sinks.metrics_address"
DISPATCHER_METRICS = "alerts.metrics_address"


def _serve(
    name: str,
    run: Callable[[threading.Event], Any],
    report: Callable[[], str],
    metrics: tuple[Config, str, Collector],
) -> int:
    """Runs a sink until Ctrl-C or SIGTERM, printing its counters every 10 s, its Prometheus
    endpoint beside it (`metrics`: the config, the key of its address, its collector)."""
    try:
        endpoint = serve_metrics(*metrics)
    except EndpointError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if endpoint is not None:
        logs.status_line(f"{name} metrics on {endpoint.url}", metrics_url=endpoint.url)
    try:
        return _run_until_stopped(name, run, report)
    finally:
        if endpoint is not None:
            endpoint.stop()


def _run_until_stopped(
    name: str, run: Callable[[threading.Event], Any], report: Callable[[], str]
) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = threading.Thread(target=run, args=(stop,), name=name)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(10.0)
            logs.status_line(report())
    except KeyboardInterrupt:
        stop.set()
        worker.join()
    logs.status_line(f"{name} stopped: {report()}")
    return 0


def cmd_influx(args: argparse.Namespace) -> int:
    from p4bs_sinks.influx_sink import InfluxSink
    from p4bs_sinks.metrics import SinkCollector

    try:
        config = load_config(args.config).for_kafka_component("sinks")
    except ConfigError as exc:
        print(f"p4bs sinks influx: {exc}", file=sys.stderr)
        return 2
    config = with_metrics_address(config, SINK_METRICS, args.metrics_address)
    sink = InfluxSink(config.influxdb, config.kafka, config.kafka.topics)
    influx = config.influxdb
    logs.status_line(f"InfluxDB sink: {config.kafka.bootstrap} -> {influx.url}/{influx.database}")

    def report() -> str:
        s = sink.stats
        return f"written {s.written:,}, rejected {s.rejected:,}, retries {s.retries:,}" + (
            f", last error: {s.last_error}" if s.last_error else ""
        )

    return _serve(
        "influx sink",
        sink.run,
        report,
        (config, SINK_METRICS, SinkCollector(sink.stats, sink.consumer_stats)),
    )


def cmd_alerts(args: argparse.Namespace) -> int:
    from p4bs_sinks.alerts import AlertDispatcher
    from p4bs_sinks.metrics import DispatcherCollector

    try:
        config = load_config(args.config).for_kafka_component("sinks")
        config = with_metrics_address(config, DISPATCHER_METRICS, args.metrics_address)
        dispatcher = AlertDispatcher(config.kafka, config.kafka.topics, config.alerts)
    except (ConfigError, ValueError) as exc:
        print(f"p4bs sinks alerts: {exc}", file=sys.stderr)
        return 2
    logs.status_line(
        f"alert dispatcher: {config.kafka.topics['sla_alerts']} -> {config.alerts.webhook}"
    )

    def report() -> str:
        s = dispatcher.stats
        return (
            f"read {s.read:,}, delivered {s.delivered:,}, failed {s.failed:,}, "
            f"retries {s.retries:,}"
        )

    collector = DispatcherCollector(dispatcher.stats, dispatcher.consumer_stats)
    return _serve(
        "alert dispatcher", dispatcher.run, report, (config, DISPATCHER_METRICS, collector)
    )


def add_parser(sub: Any) -> None:
    sinks = sub.add_parser("sinks", help="the topics out of Kafka: InfluxDB, alert webhook")
    sinks_sub = sinks.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    paths.add_config_option(common)
    influx = sinks_sub.add_parser("influx", parents=[common], help="Kafka -> InfluxDB sink")
    add_metrics_address_option(influx, SINK_METRICS)
    logs.add_log_format_option(influx)
    influx.set_defaults(func=cmd_influx)
    alerts = sinks_sub.add_parser("alerts", parents=[common], help="SLA alerts -> webhook")
    add_metrics_address_option(alerts, DISPATCHER_METRICS)
    logs.add_log_format_option(alerts)
    alerts.set_defaults(func=cmd_alerts)
