"""GETting a JSON document over HTTP (the JobManager's REST API, InfluxDB's), and a failed
GET said in one line that names the URL."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from p4bs_ops.status.runner import describe_error


def get_json(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return json.loads(reply.read())


def http_reason(url: str, exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"{url}: HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        return f"{url}: {text}"
    if isinstance(exc, TimeoutError):
        return f"{url}: no answer in time"
    if isinstance(exc, ValueError):
        return f"{url}: not JSON ({exc})"
    return f"{url}: {describe_error(exc)}"
