"""The Tofino exporter's Prometheus endpoint (issue 40): the counters of its `ExporterStats`,
read when scraped, under the names the model's binary serves (exporter/src/metrics.rs):

- `p4bs_exporter_records_total{topic}`: records handed to Kafka;
- `p4bs_exporter_records_dropped_total{reason}`: `queue_full` (the client's queue was full),
  `invalid` (the schema cannot carry it, or the client refused it), `delivery_failed`;
- `p4bs_exporter_in_flight`: produced, not yet acknowledged;
- `p4bs_exporter_digests_total`: digests taken from the data plane;
- `p4bs_exporter_register_reads_total`: register reads (a Sync and a read of one register).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from p4bs.config.model import PrometheusConfig
from p4bs.metrics_endpoint import MetricsEndpoint, registry_of, start_metrics_endpoint
from p4bs_exporter.target import ExporterStats
from p4bs_exporter.tofino_contract import REGISTER_READS


class ExporterCollector(Collector):
    """The metrics of `stats()` at each scrape."""

    def __init__(self, stats: Callable[[], ExporterStats], topic: str) -> None:
        self.stats = stats
        self.topic = topic

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        records = CounterMetricFamily(
            "p4bs_exporter_records", "Records handed to Kafka", labels=["topic"]
        )
        records.add_metric([self.topic], s.produced_total)
        dropped = CounterMetricFamily(
            "p4bs_exporter_records_dropped",
            "Records lost, by reason: queue_full, invalid, delivery_failed",
            labels=["reason"],
        )
        for reason, count in (
            ("queue_full", s.dropped),
            ("invalid", s.invalid),
            ("delivery_failed", s.failed),
        ):
            dropped.add_metric([reason], count)
        yield records
        yield dropped
        yield GaugeMetricFamily(
            "p4bs_exporter_in_flight",
            "Records produced and not yet acknowledged by Kafka",
            value=s.in_flight,
        )
        yield CounterMetricFamily(
            "p4bs_exporter_digests", "Digests taken from the data plane", value=s.frames
        )
        yield CounterMetricFamily(
            "p4bs_exporter_register_reads",
            "Register reads from the data plane",
            value=s.pipeline.get(REGISTER_READS, 0),
        )


def serve_exporter_metrics(
    address: str, stats: Callable[[], ExporterStats], topic: str
) -> MetricsEndpoint:
    """Serves the metrics on `address` (the switch's checked `metrics_address`, loopback
    only: the model's binary has no token or TLS, so neither has a switch's endpoint) from a
    thread until `stop`; OSError if it cannot be bound."""
    endpoint = start_metrics_endpoint(
        address,
        registry_of(ExporterCollector(stats, topic)),
        PrometheusConfig(),
        key="switches.metrics_address",
    )
    assert endpoint is not None  # an address was given
    return endpoint
