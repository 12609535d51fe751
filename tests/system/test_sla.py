"""SLA alerts end to end: a synthetic queueing-delay violation through the metrics job raises
exactly one alert and resolves it once, and the dispatcher posts both to a real HTTP server
in the Alertmanager v2 format, retrying a webhook that fails at first."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from p4bs.bus import RecordConsumer, RecordProducer
from p4bs.config import AlertsConfig, load_config
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import flink_configuration
from p4bs_jobs.metrics import run_metrics_job
from p4bs_sinks.alerts import AlertDispatcher

LINK = "r1:eth1"
WINDOW = 100_000_000
START = 1_790_000_000_000_000_000
# Windows 10-19 queue 20 ms (the SLA bound is 10 ms), the rest 2 ms; K = 5.
DELAYS_MS = [2] * 10 + [20] * 10 + [2] * 10


def _counters(i: int, delay_ms: int) -> dict[str, Any]:
    return {
        "link_id": LINK,
        "ts_ns": START + (i + 1) * WINDOW,
        "interval_ns": WINDOW,
        "seq": i,
        "packets": 1000,
        "bytes": 1_000_000,
        "after_packets": 990,
        "after_bytes": 990_000,
        "data_packets": 900,
        "data_bytes": 950_000,
        "retransmissions": 0,
        "queue_delay_samples": 100,
        "queue_delay_sum_ns": 100 * delay_ms * 1_000_000,
        "queue_delay_ewma_ns": delay_ms * 1_000_000,
    }


class _Webhook(BaseHTTPRequestHandler):
    posted: ClassVar[list[Any]] = []
    refuse_first = 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if _Webhook.refuse_first:
            _Webhook.refuse_first -= 1
            self.send_response(503)
        else:
            _Webhook.posted.append((self.path, json.loads(body)))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_violation_raises_one_alert_and_resolves_it_and_the_webhook_gets_both(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    config = load_config(repo / "config" / "testbed.toml")
    config = dataclasses.replace(
        config, kafka=dataclasses.replace(config.kafka, bootstrap=stack.kafka.bootstrap)
    )
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    for i, delay in enumerate(DELAYS_MS):
        producer.produce("link_counters", _counters(i, delay))
    assert producer.flush(30) == 0
    conf = flink_configuration(checkpoint_interval_ns=1_000_000_000, checkpoint_dir=tmp_path)
    run_metrics_job(config, topics, conf, group_id="sla-test", bounded=True).wait(300_000)

    consumer = RecordConsumer(stack.kafka.bootstrap, "sla-reader", ["sla_alerts"], topics)
    alerts = []
    deadline = time.monotonic() + 30
    while len(alerts) < 2 and time.monotonic() < deadline:
        received = consumer.poll(0.5)
        if received is not None:
            alerts.append(received.record)
    # Nothing after the resolve: the window that resolved was the last change.
    assert consumer.poll(2.0) is None
    consumer.close()
    k = config.metrics.sla_windows
    raised, resolved = alerts
    assert (raised["state"], raised["kind"]) == ("raise", "queue_delay")
    assert raised["ts_ns"] == START + (10 + k) * WINDOW  # the K-th window out of bounds
    assert raised["value"] == 20_000_000 and raised["bound"] == 10_000_000
    assert (resolved["state"], resolved["alert_id"]) == ("resolve", raised["alert_id"])
    assert resolved["ts_ns"] == START + (20 + k) * WINDOW

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v2/alerts"
    settings = AlertsConfig(webhook=url, timeout_ns=2_000_000_000, backoff_ns=50_000_000)
    dispatcher = AlertDispatcher(stack.kafka.bootstrap, topics, settings, group="sla-dispatch")
    stop = threading.Event()
    dispatching = threading.Thread(target=dispatcher.run, args=(stop,))
    dispatching.start()
    try:
        assert wait_until(lambda: len(_Webhook.posted) >= 2, 30)
    finally:
        stop.set()
        dispatching.join(10)
        server.shutdown()
    assert dispatcher.stats.delivered == 2 and dispatcher.stats.retries == 1
    (path1, (first,)), (path2, (second,)) = _Webhook.posted
    assert path1 == path2 == "/api/v2/alerts"
    assert first["labels"] == second["labels"]
    assert first["labels"]["alertname"] == "P4bsQueueDelaySla"
    assert first["labels"]["link"] == LINK and "endsAt" not in first
    assert first["startsAt"].startswith("2026-09-21T") and second["endsAt"] > first["startsAt"]
