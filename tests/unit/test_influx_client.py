"""The InfluxDB client (p4bs/influx.py) without a server: what it sends (url, parameters,
login, timeout) and how it reads InfluxDB's three ways of saying that something failed (the
status code, the reply's `error`, a statement's `results[i].error`)."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import tomllib
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from p4bs import paths
from p4bs.config import ConfigError, InfluxConfig, SecretRef, parse_config
from p4bs.influx import InfluxClient, InfluxError, Series, reason_of, series_of
from p4bs_infra.pki import make_test_pki


class Replies(BaseAdapter):
    """Answers every request with the next of `replies` (status, body) and keeps what was
    sent, with its timeout and TLS verification."""

    def __init__(self, *replies: tuple[int, Any]) -> None:
        super().__init__()
        self.replies = list(replies)
        self.sent: list[requests.PreparedRequest] = []
        self.options: list[dict[str, Any]] = []

    def send(self, request: requests.PreparedRequest, **options: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append(request)
        self.options.append(options)
        status, body = self.replies.pop(0)
        reply = requests.Response()
        reply.status_code = status
        reply._content = (body if isinstance(body, str) else json.dumps(body)).encode()
        reply.url = str(request.url)
        reply.request = request
        return reply

    def close(self) -> None:
        pass


def _client(settings: InfluxConfig, *replies: tuple[int, Any]) -> tuple[InfluxClient, Replies]:
    client = InfluxClient(settings, timeout_s=7.0)
    adapter = Replies(*replies)
    client._session.mount("http://", adapter)
    client._session.mount("https://", adapter)
    return client, adapter


def _form(request: requests.PreparedRequest) -> dict[str, str]:
    body = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
    return dict(urllib.parse.parse_qsl(body))


def _params(request: requests.PreparedRequest) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(str(request.url)).query))


SERIES = {
    "results": [
        {
            "statement_id": 0,
            "series": [
                {
                    "name": "link_metrics",
                    "tags": {"link": "r1:eth1"},
                    "columns": ["time", "mean"],
                    "values": [[1000, 2.5], [2000, None]],
                }
            ],
        }
    ]
}


def test_query_posts_the_statement_to_the_database_with_epoch_and_timeout() -> None:
    client, adapter = _client(
        InfluxConfig(url="http://db.example:8086/", database="p4bs"), (200, SERIES)
    )
    (series,) = client.query('SELECT mean("f") FROM link_metrics', epoch="ms")
    (request,) = adapter.sent
    assert request.method == "POST"
    assert str(request.url).split("?")[0] == "http://db.example:8086/query"
    assert _params(request) == {"db": "p4bs", "epoch": "ms"}
    assert _form(request) == {"q": 'SELECT mean("f") FROM link_metrics'}
    assert adapter.options[0]["timeout"] == 7.0
    assert "Authorization" not in request.headers  # no credentials configured: no login
    assert series == Series(
        "link_metrics", ["time", "mean"], [[1000, 2.5], [2000, None]], {"link": "r1:eth1"}
    )
    assert series.rows() == [
        {"link": "r1:eth1", "time": 1000, "mean": 2.5},
        {"link": "r1:eth1", "time": 2000, "mean": None},
    ]


def test_write_sends_line_protocol_into_the_retention_policy_in_ns() -> None:
    client, adapter = _client(
        InfluxConfig(url="http://db.example:8086", database="p4bs"), (204, "")
    )
    client.write(["m,link=a f=1 10", "m,link=b f=2 20"], retention_policy="events", timeout_s=30)
    (request,) = adapter.sent
    assert str(request.url).split("?")[0] == "http://db.example:8086/write"
    assert _params(request) == {"db": "p4bs", "rp": "events", "precision": "ns"}
    assert request.body == b"m,link=a f=1 10\nm,link=b f=2 20"
    assert adapter.options[0]["timeout"] == 30


def test_login_from_the_configs_secret_references(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("P4BS_TEST_INFLUX_USER", "reader")
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = InfluxConfig(
        url="https://db.example",
        username=SecretRef(env="P4BS_TEST_INFLUX_USER"),
        password=SecretRef(file=str(secret)),
    )
    client, adapter = _client(settings, (200, {"results": [{"statement_id": 0}]}))
    assert client.query("SHOW DATABASES") == []
    (request,) = adapter.sent
    token = base64.b64encode(b"reader:s3cret").decode()
    assert request.headers["Authorization"] == f"Basic {token}"
    # https: the server's certificate is checked (against a CA bundle path, or certifi's: True)
    assert adapter.options[0]["verify"] not in (False, None)


def test_a_credential_that_does_not_resolve_is_an_influx_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("P4BS_TEST_INFLUX_UNSET", raising=False)
    settings = InfluxConfig(
        username=SecretRef(env="P4BS_TEST_INFLUX_UNSET"),
        password=SecretRef(env="P4BS_TEST_INFLUX_UNSET"),
    )
    with pytest.raises(InfluxError, match=r"influxdb credentials: .*P4BS_TEST_INFLUX_UNSET"):
        InfluxClient(settings)


def test_an_error_in_a_statements_result_is_raised_though_the_status_is_200() -> None:
    reply = {"results": [{"statement_id": 0, "error": "database not found: nope"}]}
    client, _ = _client(InfluxConfig(), (200, reply))
    with pytest.raises(InfluxError, match="SHOW MEASUREMENTS: database not found: nope") as caught:
        client.query("SHOW MEASUREMENTS")
    assert not caught.value.refused


def test_the_replys_own_error_is_raised_with_its_status() -> None:
    client, _ = _client(
        InfluxConfig(),
        (400, {"error": "error parsing query: found FRM"}),
        (401, {"error": "authorization failed"}),
    )
    with pytest.raises(InfluxError, match="HTTP 400: error parsing query: found FRM") as bad:
        client.query("SELECT * FRM x")
    assert bad.value.status == 400 and bad.value.refused
    with pytest.raises(InfluxError, match="HTTP 401: authorization failed"):
        client.query("SHOW DATABASES")


def test_statuses_worth_a_retry_are_not_refusals() -> None:
    client, _ = _client(
        InfluxConfig(),
        (429, {"error": "too many requests"}),
        (503, "<html>Service Unavailable</html>"),
        (400, {"error": "partial write: points beyond retention policy dropped=2"}),
    )
    with pytest.raises(InfluxError) as busy:
        client.write(["m f=1 1"])
    assert busy.value.status == 429 and not busy.value.refused
    with pytest.raises(InfluxError, match=r"HTTP 503: <html>Service Unavailable</html>") as down:
        client.write(["m f=1 1"])
    assert not down.value.refused
    with pytest.raises(InfluxError, match="beyond retention policy") as old:
        client.write(["m f=1 1"])
    assert old.value.refused


def test_an_unreachable_server_is_an_influx_error_without_status() -> None:
    # Port 9 (discard) on loopback: nothing listens there in the tests' machines.
    client = InfluxClient(InfluxConfig(url="http://127.0.0.1:9"), timeout_s=2.0)
    with pytest.raises(InfluxError) as caught:
        client.query("SHOW DATABASES")
    # Said in a few words, as `p4bs status` shows it (not requests' nested retry text).
    assert str(caught.value) == "SHOW DATABASES: http://127.0.0.1:9/query: Connection refused"
    assert caught.value.status is None and not caught.value.refused
    with pytest.raises(InfluxError) as ping:
        client.ping()
    assert str(ping.value) == "http://127.0.0.1:9/ping: Connection refused"
    assert reason_of(requests.ReadTimeout("read timed out")) == "no answer in time"


def test_series_of_reads_every_statement_and_a_top_level_error() -> None:
    two = {
        "results": [
            {"statement_id": 0, "series": [{"name": "a", "columns": ["x"], "values": [[1]]}]},
            {"statement_id": 1, "series": [{"name": "b", "columns": ["y"], "values": [[2]]}]},
        ]
    }
    assert [s.name for s in series_of("q", two)] == ["a", "b"]
    with pytest.raises(InfluxError, match="q: timeout"):
        series_of("q", {"error": "timeout"})
    with pytest.raises(InfluxError, match="not an InfluxDB reply"):
        series_of("q", ["not", "a", "dict"])


# --- issue 38: InfluxDB credentials only over TLS, verified against the config's CA ---


class _Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.send_header("X-Influxdb-Version", "tls-test")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on the loopback answering /ping as InfluxDB does, with a certificate
    of a CA of the test's own: its url and the CA's file."""
    pki = make_test_pki(tmp_path / "pki", "127.0.0.1", netconf_port=830)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server.pem"], pki["server-key.pem"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ping)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", pki["ca.pem"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_https_server_is_verified_against_the_configs_ca(
    tls_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, ca = tls_server
    with InfluxClient(InfluxConfig(url=url, ca_file=str(ca))) as client:
        assert client.ping(timeout_s=5) == "tls-test"
    # Without the CA (the system's trust store) and with another CA: refused in the handshake.
    other = make_test_pki(tmp_path / "other", "127.0.0.1", netconf_port=830)["ca.pem"]
    for settings in (InfluxConfig(url=url), InfluxConfig(url=url, ca_file=str(other))):
        with InfluxClient(settings) as client, pytest.raises(InfluxError) as refused:
            client.ping(timeout_s=5)
        assert "certificate verify failed" in str(refused.value), refused.value


def test_a_password_over_plain_http_is_refused_but_to_the_loopback() -> None:
    password = SecretRef(env="P4BS_TEST_INFLUX_PASSWORD")
    for address in ("http://db.example:8086", "http://10.0.0.5:8086"):
        with pytest.raises(InfluxError, match=f"only over https://.*not to {address}"):
            InfluxClient(InfluxConfig(url=address, password=password))
    for address in ("https://db.example", "http://127.0.0.1:8086", "http://localhost:8086"):
        InfluxClient(InfluxConfig(url=address)).close()  # no password: any address
    # The config says so before any client is made, naming the field and the url.
    text = paths.example_config().read_text()
    text = text.replace(
        'url = "http://127.0.0.1:8086"',
        'url = "http://db.example:8086"\npassword = { env = "P4BS_TEST_INFLUX_PASSWORD" }',
        1,
    )
    with pytest.raises(ConfigError) as problems:
        parse_config(tomllib.loads(text), "p4bs.toml")
    assert problems.value.problems == [
        "influxdb.password: is sent only over https:// (or to this machine's loopback), "
        "not to http://db.example:8086"
    ]
    for allowed in ("https://db.example:8086", "http://[::1]:8086"):
        ok = text.replace("http://db.example:8086", allowed)
        assert parse_config(tomllib.loads(ok), "p4bs.toml").influxdb.url == allowed
