"""The sinks' Prometheus metrics, read at each scrape from the counts each already keeps
(`SinkStats`, `DispatchStats`: what its progress line prints). `p4bs sinks influx` serves
them on [sinks] metrics_address, `p4bs sinks alerts` on [alerts] metrics_address
(p4bs.metrics_endpoint)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from p4bs_sinks.alerts import DispatchStats
from p4bs_sinks.influx_sink import SinkStats


class SinkCollector(Collector):
    """The InfluxDB sink's counts."""

    def __init__(self, stats: SinkStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield CounterMetricFamily(
            "p4bs_sink_points_written", "Points InfluxDB took", value=s.written
        )
        yield CounterMetricFamily(
            "p4bs_sink_batches_written",
            "Batches written (their Kafka offsets committed)",
            value=s.batches,
        )
        yield CounterMetricFamily(
            "p4bs_sink_write_retries",
            "Writes tried again after a failure InfluxDB may recover from",
            value=s.retries,
        )
        dead = CounterMetricFamily(
            "p4bs_sink_dead_letters",
            "Points passed over: InfluxDB rejected them for good (they stay in Kafka)",
            labels=["reason"],
        )
        dead.add_metric(["rejected_by_influxdb"], s.rejected)
        yield dead
        yield CounterMetricFamily(
            "p4bs_sink_late_rollups",
            "Rollups made again for windows written too late for their continuous query",
            value=s.late_rollups,
        )


class DispatcherCollector(Collector):
    """The alert dispatcher's counts."""

    def __init__(self, stats: DispatchStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield CounterMetricFamily("p4bs_alerts_read", "SLA alerts read from Kafka", value=s.read)
        yield CounterMetricFamily(
            "p4bs_alerts_sent", "Alerts the webhook took (a 2xx)", value=s.delivered
        )
        yield CounterMetricFamily(
            "p4bs_alerts_failed", "Alerts not delivered after every attempt", value=s.failed
        )
        yield CounterMetricFamily(
            "p4bs_alerts_post_retries", "Webhook posts tried again", value=s.retries
        )
