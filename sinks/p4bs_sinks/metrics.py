"""The sinks' Prometheus metrics, read at each scrape from the counts each already keeps
(`SinkStats`, `DispatchStats`: what its progress line prints). `p4bs sinks influx` serves
them on [sinks] metrics_address, `p4bs sinks alerts` on [alerts] metrics_address
(p4bs.metrics_endpoint)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from p4bs.bus import ConsumerStats
from p4bs.metrics_endpoint import dead_letters_family
from p4bs_sinks.alerts import DispatchStats
from p4bs_sinks.influx_sink import SinkStats


class SinkCollector(Collector):
    """The InfluxDB sink's counts, and its consumer's dead letters."""

    def __init__(self, stats: SinkStats, consumer: ConsumerStats) -> None:
        self.stats = stats
        self.consumer = consumer

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
        yield CounterMetricFamily(
            "p4bs_sink_points_rejected",
            "Points passed over: InfluxDB rejected them for good (they stay in Kafka)",
            value=s.rejected,
        )
        yield dead_letters_family("p4bs_sink_dead_letters", self.consumer)
        yield CounterMetricFamily(
            "p4bs_sink_late_rollups",
            "Rollups made again for windows written too late for their continuous query",
            value=s.late_rollups,
        )


class DispatcherCollector(Collector):
    """The alert dispatcher's counts, and its consumer's dead letters."""

    def __init__(self, stats: DispatchStats, consumer: ConsumerStats) -> None:
        self.stats = stats
        self.consumer = consumer

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
        yield dead_letters_family("p4bs_alerts_dead_letters", self.consumer)
