"""A service's Prometheus endpoint: `GET /metrics` of its own registry on its config's
`metrics_address`, in a thread of its own until `stop`. On the loopback it is open; beyond
it the config has [prometheus] token and TLS (checked when the config was read, and again
here by p4bs.exposure): the endpoint then speaks TLS and wants `Authorization: Bearer TOKEN`
(a Prometheus scrape job's `authorization.credentials_file`)."""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from p4bs.bus import ConsumerStats
from p4bs.config.fields import optional_endpoint
from p4bs.config.model import Config, PrometheusConfig
from p4bs.exposure import ExposureError, check_exposure

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def registry_of(*collectors: Collector) -> CollectorRegistry:
    """A registry of a service's collectors alone, not the process-wide default one: two
    services in one process (tests, benchmarks) each serve their own."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def add_metrics_address_option(parser: argparse.ArgumentParser, key: str) -> None:
    """`--metrics-address HOST:PORT` on a service's command line: its endpoint there instead
    of the config's `key` (e.g. "optimizer.metrics_address"); "" for none. What runs a second
    process of a service on one host gives it."""
    parser.add_argument(
        "--metrics-address",
        type=optional_endpoint,
        metavar="HOST:PORT",
        help=f'the Prometheus endpoint ("" for none); default: the config\'s {key}',
    )


def with_metrics_address(config: Config, key: str, address: str | None) -> Config:
    """`config` with its `key` ("section.metrics_address") set to `address` (None: as it
    is). The exposure rule is checked when the endpoint starts."""
    if address is None:
        return config
    section = key.partition(".")[0]
    changed = dataclasses.replace(getattr(config, section), metrics_address=address)
    return dataclasses.replace(config, **{section: changed})


def dead_letters_family(name: str, stats: ConsumerStats) -> CounterMetricFamily:
    """`name`_total{stream, reason}: the records a service's consumer sent to the dead
    letters (p4bs.bus), by the stream they came on and why."""
    family = CounterMetricFamily(
        name,
        "Records sent to the dead letters (malformed), by stream and reason",
        labels=["stream", "reason"],
    )
    for (stream, reason), count in sorted(stats.dead_letters.items()):
        family.add_metric([stream, reason], count)
    return family


class EndpointError(Exception):
    """A service's endpoint cannot start (exposed without a token and TLS, a token that
    cannot be read, an address taken): the message names the setting."""


def serve_metrics(config: Config, key: str, *collectors: Collector) -> MetricsEndpoint | None:
    """The service's endpoint serving `collectors` on the config's `key` (e.g.
    "sinks.metrics_address"; None when it is ""). Raises EndpointError."""
    address = getattr(config, key.partition(".")[0]).metrics_address
    try:
        return start_metrics_endpoint(address, registry_of(*collectors), config.prometheus, key=key)
    except ExposureError as exc:
        raise EndpointError(str(exc)) from exc
    except (LookupError, OSError) as exc:
        raise EndpointError(f"{key} {address}: {exc}") from exc


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" (an IPv6 host with or without brackets)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class MetricsEndpoint:
    """A running endpoint: `url` is where it serves (its real port, also for port 0)."""

    server: WSGIServer
    thread: threading.Thread
    scheme: str

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        shown = f"[{name}]" if ":" in name else name
        return f"{self.scheme}://{shown}:{port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def start_metrics_endpoint(
    address: str, registry: CollectorRegistry, access: PrometheusConfig, *, key: str
) -> MetricsEndpoint | None:
    """Serves `registry` on `address` ("host:port"; "" for none: returns None). `key` names
    the setting in errors (e.g. "optimizer.metrics_address"). Raises ExposureError for an
    address beyond the loopback without a token and TLS, LookupError for a token that
    cannot be read, OSError when the address cannot be bound."""
    if not address:
        return None
    host, port = split_address(address)
    tls = access.tls_cert is not None and access.tls_key is not None
    check_exposure(
        host,
        token=access.token is not None,
        tls=tls,
        where=f"{key} {address}",
        what="the service's metrics",
        remedy="set [prometheus] token, tls_cert and tls_key",
    )
    app: WsgiApp = make_wsgi_app(registry)
    if access.token is not None:
        app = _bearer_only(app, access.token.resolve())

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    if tls:
        assert access.tls_cert is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(access.tls_cert, access.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name=f"metrics {address}", daemon=True)
    thread.start()
    return MetricsEndpoint(server, thread, "https" if tls else "http")


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr for every scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _bearer_only(app: WsgiApp, token: str) -> WsgiApp:
    """`app` behind the token: a request without `Authorization: Bearer TOKEN` gets 401."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if hmac.compare_digest(given, expected):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain")])
        return [b"the [prometheus] token as Authorization: Bearer TOKEN\n"]

    return guarded
