"""The alert dispatcher: SLA alerts from Kafka to a webhook in the Prometheus Alertmanager v2
format (`POST /api/v2/alerts`, a JSON array of postable alerts).

It runs beside the Flink job, never inside it, so a webhook that is down or slow only
delays the dispatcher: each alert is tried `attempts` times with a doubling backoff, then
counted as failed and logged, and the dispatcher goes on with the next one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from p4bs.bus import Cluster, ConsumerStats, RecordConsumer
from p4bs.config import AlertsConfig

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
ALERT_NAMES = {"queue_delay": "P4bsQueueDelaySla", "loss": "P4bsLossSla"}


def _rfc3339(ts_ns: int) -> str:
    moment = datetime.fromtimestamp(ts_ns // 1_000_000_000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ts_ns % 1_000_000_000:09d}Z"


def alertmanager_alerts(alert: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The postable alerts for one SlaAlert: a raise starts it, a resolve ends it (same
    labels, so Alertmanager matches them)."""
    router, _, interface = alert["link_id"].partition(":")
    unit = "ns" if alert["kind"] == "queue_delay" else "fraction"
    posted: dict[str, Any] = {
        "labels": {
            "alertname": ALERT_NAMES[alert["kind"]],
            "link": alert["link_id"],
            "router": router,
            "interface": interface,
            "kind": alert["kind"],
            "alert_id": alert["alert_id"],
            "severity": "warning",
        },
        "annotations": {
            "summary": f"{alert['kind']} on {alert['link_id']} "
            f"{'above' if alert['state'] == 'raise' else 'back within'} its SLA bound "
            f"for {alert['windows']} windows",
            "value": f"{alert['value']:g} {unit}",
            "bound": f"{alert['bound']:g} {unit}",
        },
    }
    key = "startsAt" if alert["state"] == "raise" else "endsAt"
    posted[key] = _rfc3339(alert["ts_ns"])
    return [posted]


@dataclass
class DispatchStats:
    read: int = 0  # alerts read from Kafka
    delivered: int = 0
    failed: int = 0
    retries: int = 0
    last_error: str | None = None


def post_with_retries(
    url: str,
    payload: list[dict[str, Any]],
    settings: AlertsConfig,
    stats: DispatchStats,
    stop: threading.Event,
) -> bool:
    """POSTs until a 2xx, `settings.attempts` times at most; True if delivered."""
    backoff = settings.backoff_ns / 1e9
    for attempt in range(1, settings.attempts + 1):
        try:
            reply = requests.post(url, json=payload, timeout=settings.timeout_ns / 1e9)
            if 200 <= reply.status_code < 300:
                return True
            error = f"HTTP {reply.status_code}: {reply.text[:200]}"
        except requests.RequestException as exc:
            error = f"{type(exc).__name__}: {exc}"
        stats.last_error = error
        log.warning("webhook %s, attempt %d/%d: %s", url, attempt, settings.attempts, error)
        if attempt == settings.attempts or stop.wait(backoff):
            break
        stats.retries += 1
        backoff = min(backoff * 2, MAX_BACKOFF_S)
    return False


def dispatch_alert(
    alert: Mapping[str, Any],
    webhook: str,
    settings: AlertsConfig,
    stats: DispatchStats,
    stop: threading.Event,
) -> bool:
    """One SlaAlert read: posted to the webhook (`post_with_retries`), counted as read and
    as delivered or failed (logged); True if delivered."""
    stats.read += 1
    ok = post_with_retries(webhook, alertmanager_alerts(alert), settings, stats, stop)
    if ok:
        stats.delivered += 1
    else:
        stats.failed += 1
        log.error(
            "alert %s (%s) not delivered after %d attempts: %s",
            alert["alert_id"],
            alert["state"],
            settings.attempts,
            stats.last_error,
        )
    return ok


class AlertDispatcher:
    def __init__(
        self,
        cluster: Cluster,
        topics: Mapping[str, str],
        settings: AlertsConfig,
        group: str = "p4bs-alert-dispatcher",
    ) -> None:
        if settings.webhook is None:
            raise ValueError("no [alerts] webhook in the config: nowhere to post alerts")
        self.webhook = settings.webhook
        self.settings = settings
        self.stats = DispatchStats()
        self._consumer = RecordConsumer(cluster, group, ["sla_alerts"], topics)

    @property
    def consumer_stats(self) -> ConsumerStats:
        """Its consumer's counts: the alerts it took, the records sent to the dead letters."""
        return self._consumer.stats

    def run(
        self, stop: threading.Event, on_alert: Callable[[dict[str, Any], bool], None] | None = None
    ) -> DispatchStats:
        """Dispatches until `stop` is set."""
        try:
            while not stop.is_set():
                received = self._consumer.poll(0.5)
                if received is None:
                    continue
                alert = received.record
                ok = dispatch_alert(alert, self.webhook, self.settings, self.stats, stop)
                if on_alert is not None:
                    on_alert(alert, ok)
        finally:
            self._consumer.close()
        return self.stats
