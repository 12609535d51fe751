"""The project's one InfluxDB 1.x client: InfluxQL queries and line-protocol writes over the
HTTP API, with the login and TLS of `InfluxConfig`.

Login: HTTP basic authentication with the config's username and password, resolved from their
references when the client is made (a reference that does not resolve raises InfluxError).
TLS: an `https://` url is verified against the config's `ca_file`, or without one against
requests' trust store (certifi, or the bundle that $REQUESTS_CA_BUNDLE names). A password is
sent only over TLS or to the loopback: a client for another http:// url with one is refused.

InfluxDB says what went wrong in three places: the HTTP status code, the reply's JSON `error`
(a request it refused, a failed login) and, with status 200, each statement's own
`results[i].error`. All three, and a server that cannot be reached, raise InfluxError, whose
`status` tells a request refused for good from a failure worth trying again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import requests

from p4bs.config import InfluxConfig
from p4bs.config.services import private_transport

# How much of a reply that is not InfluxDB's JSON goes into an error's message.
REPLY_EXCERPT = 300


class InfluxError(Exception):
    """InfluxDB did not do what was asked; the message says what and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, None when no reply came

    @property
    def refused(self) -> bool:
        """InfluxDB refused the request itself (a 4xx but 429, too many requests): sending it
        again cannot help, e.g. points older than their retention policy."""
        return self.status is not None and 400 <= self.status < 500 and self.status != 429


@dataclass(frozen=True)
class Series:
    """One series of a statement's result."""

    name: str
    columns: list[str]
    values: list[list[Any]]
    tags: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """Each row as a dict of its columns and the series' tags."""
        return [{**self.tags, **dict(zip(self.columns, row, strict=True))} for row in self.values]


def series_of(statement: str, answer: Any) -> list[Series]:
    """The series of every statement of a `/query` reply; InfluxError if the reply or one of
    its statements carries an `error`."""
    if not isinstance(answer, dict):
        raise InfluxError(f"{statement}: not an InfluxDB reply: {str(answer)[:REPLY_EXCERPT]}")
    if "error" in answer:
        raise InfluxError(f"{statement}: {answer['error']}")
    found: list[Series] = []
    for result in answer.get("results", []):
        if "error" in result:
            raise InfluxError(f"{statement}: {result['error']}")
        for series in result.get("series") or []:
            found.append(
                Series(
                    series.get("name", ""),
                    list(series.get("columns", [])),
                    [list(row) for row in series.get("values") or []],
                    dict(series.get("tags") or {}),
                )
            )
    return found


def reason_of(exc: requests.RequestException) -> str:
    """What a request that got no reply ran into, in a few words ("Connection refused", "no
    answer in time"): requests' own text nests urllib3's retries and pools around it."""
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    cause: BaseException | None = exc
    for _ in range(10):  # the chain of causes is short; a cycle must not hang
        if cause is None:
            break
        if isinstance(cause, OSError) and cause.strerror:
            return str(cause.strerror)
        inner = getattr(cause, "reason", None)  # urllib3's MaxRetryError keeps it there
        cause = inner if isinstance(inner, BaseException) else cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {exc}"


def _failure(what: str, reply: requests.Response) -> InfluxError:
    """The error of a reply whose status says it failed: InfluxDB's own `error` if the body
    is its JSON, else the start of the body."""
    try:
        body = reply.json()
        message = str(body["error"]) if isinstance(body, dict) and "error" in body else None
    except ValueError:
        message = None
    if message is None:
        message = reply.text.strip()[:REPLY_EXCERPT] or reply.reason
    return InfluxError(f"{what}: HTTP {reply.status_code}: {message}", reply.status_code)


class InfluxClient:
    """A connection to the config's InfluxDB; one per thread (it holds a requests Session)."""

    def __init__(self, settings: InfluxConfig, timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.url = settings.url.rstrip("/")
        self.timeout_s = timeout_s
        if settings.password is not None and not private_transport(self.url):
            raise InfluxError(
                f"influxdb: a password is sent only over https:// (or to the loopback), "
                f"not to {self.url}"
            )
        self._session = requests.Session()
        # An https url's certificate, always: against the config's CA if it names one. Given
        # with each request: requests lets $REQUESTS_CA_BUNDLE override a Session's `verify`.
        self._verify: str | bool = settings.ca_file or True
        try:
            if settings.username is not None and settings.password is not None:
                self._session.auth = (settings.username.resolve(), settings.password.resolve())
        except LookupError as exc:
            self._session.close()
            raise InfluxError(f"influxdb credentials: {exc}") from None

    def __enter__(self) -> InfluxClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._session.close()

    def _post(
        self, path: str, what: str, params: dict[str, str], timeout_s: float | None, **kw: Any
    ) -> requests.Response:
        url = f"{self.url}/{path}"
        try:
            reply = self._session.post(
                url,
                params=params,
                timeout=self.timeout_s if timeout_s is None else timeout_s,
                verify=self._verify,
                **kw,
            )
        except requests.RequestException as exc:
            raise InfluxError(f"{what}: {url}: {reason_of(exc)}") from None
        if not 200 <= reply.status_code < 300:
            raise _failure(what, reply)
        return reply

    def ping(self, timeout_s: float | None = None) -> str | None:
        """The server's version, as it says it (a build from source says `unknown`);
        InfluxError if it does not answer 204."""
        url = f"{self.url}/ping"
        try:
            reply = self._session.get(
                url, timeout=self.timeout_s if timeout_s is None else timeout_s, verify=self._verify
            )
        except requests.RequestException as exc:
            raise InfluxError(f"{url}: {reason_of(exc)}") from None
        if reply.status_code != 204:
            raise InfluxError(f"{url}: HTTP {reply.status_code}, not 204", reply.status_code)
        return reply.headers.get("X-Influxdb-Version")

    def query(
        self, statement: str, *, epoch: str | None = None, timeout_s: float | None = None
    ) -> list[Series]:
        """The series of an InfluxQL statement, run against the config's database (POST,
        which every statement accepts). `epoch` ("ns", "ms", ...) gives times as integers
        in that unit instead of RFC 3339 text."""
        params = {"db": self.settings.database}
        if epoch is not None:
            params["epoch"] = epoch
        reply = self._post("query", statement, params, timeout_s, data={"q": statement})
        try:
            answer = reply.json()
        except ValueError:
            raise InfluxError(
                f"{statement}: not JSON: {reply.text.strip()[:REPLY_EXCERPT]}", reply.status_code
            ) from None
        return series_of(statement, answer)

    def write(
        self,
        lines: Sequence[str],
        *,
        retention_policy: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Writes points (line protocol, times in ns) into the config's database, into
        `retention_policy` or the database's default one."""
        params = {"db": self.settings.database, "precision": "ns"}
        if retention_policy is not None:
            params["rp"] = retention_policy
        what = f"write of {len(lines)} points"
        self._post("write", what, params, timeout_s, data="\n".join(lines).encode())
