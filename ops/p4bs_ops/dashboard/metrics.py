"""The dashboard's Prometheus metrics, served on [dashboard] metrics_address
(p4bs.metrics_endpoint), apart from the pages: its requests by route and status (counted by
`RequestCounter`, the app's outermost middleware, so refused requests count too) and its
Kafka feed, read from the fleet at each scrape (the counts the pages show as "feed")."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from p4bs_ops.dashboard.feed import Fleet

UNMATCHED = "unmatched"  # a path no route serves (its 404), not one label per path


class DashboardMetrics(Collector):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        # registry=None: exposed by this collector, one per app (tests build several).
        self.requests = Counter(
            "p4bs_dashboard_requests",
            "HTTP requests, by route (its path template) and status",
            ["route", "status"],
            registry=None,
        )

    def collect(self) -> Iterator[Metric]:
        yield from self.requests.collect()
        with self.fleet.locked() as links:
            s = self.fleet.stats
            received = dict(s.received)
            counts = {
                "malformed": s.malformed,
                "unknown_link": s.unknown_links,
            }
            dropped, caught_up = s.dropped_events, s.caught_up
            ends = [v.window["window_end_ns"] for v in links.values() if v.window is not None]
        records = CounterMetricFamily(
            "p4bs_dashboard_feed_records", "Records the feed read, by stream", labels=["stream"]
        )
        for stream, count in received.items():
            records.add_metric([stream], count)
        yield records
        passed = CounterMetricFamily(
            "p4bs_dashboard_feed_records_passed_over",
            "Records the feed could not use, by reason",
            labels=["reason"],
        )
        for reason, count in counts.items():
            passed.add_metric([reason], count)
        yield passed
        yield CounterMetricFamily(
            "p4bs_dashboard_events_dropped",
            "Events a page was too far behind to be given",
            value=dropped,
        )
        yield GaugeMetricFamily(
            "p4bs_dashboard_feed_caught_up",
            "1 once the topics' tails read at start are all read",
            value=int(caught_up),
        )
        newest = max(ends, default=None)
        yield GaugeMetricFamily(
            "p4bs_dashboard_feed_lag_seconds",
            "From the newest window the feed holds (any link) to now; NaN before the first",
            value=math.nan if newest is None else max(0.0, (time.time_ns() - newest) / 1e9),
        )


class RequestCounter:
    """ASGI middleware: each HTTP response counted by its route's path template (one label
    per route, not per link) and status, once its status is sent."""

    def __init__(self, app: ASGIApp, metrics: DashboardMetrics, routes: Sequence[BaseRoute]):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._route_of(scope)

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)

    def _route_of(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return str(getattr(route, "path", UNMATCHED)) or UNMATCHED
        return UNMATCHED
