"""`p4bs dashboard` as a process of a test's own: started on a free 127.0.0.1 port, waited on
until it answers, stopped by its PID whatever the test did; and requests to it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p4bs_infra.procs import free_ports, stop_session, wait_until


@dataclass
class Reply:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Dashboard:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    token: str | None = None
    ca_file: Path | None = None  # the certificate a TLS dashboard is trusted by
    metrics_url: str = ""  # its Prometheus endpoint

    def get(self, path: str, auth: str | None = "token", timeout_s: float = 30.0) -> Reply:
        """GET `path`; `auth` "token" (basic auth with the dashboard's token), "bearer",
        None, or a header value of its own."""
        headers = {}
        if auth == "token" and self.token:
            credentials = base64.b64encode(f"operator:{self.token}".encode()).decode()
            headers["Authorization"] = f"Basic {credentials}"
        elif auth == "bearer" and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        elif auth not in (None, "token", "bearer"):
            headers["Authorization"] = auth
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=context) as reply:
                return Reply(reply.status, reply.read(), dict(reply.headers))
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.read(), dict(exc.headers))

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def running_dashboard(
    config: Path,
    work_dir: Path,
    *,
    token: str | None = None,
    tls: tuple[Path, Path] | None = None,
    timeout_s: float = 60.0,
) -> Iterator[Dashboard]:
    """`p4bs dashboard --config CONFIG` on a free port (the token in an environment
    variable, as an operator gives it), until it answers `/`; stopped by PID at the end."""
    port, metrics_port = free_ports(2)
    argv = [sys.executable, "-m", "p4bs_cli", "dashboard", "--config", str(config)]
    argv += ["--port", str(port), "--metrics-address", f"127.0.0.1:{metrics_port}"]
    env = dict(os.environ)
    if token is not None:
        env["P4BS_DASHBOARD_TOKEN"] = token
        argv += ["--token-env", "P4BS_DASHBOARD_TOKEN"]
    if tls is not None:
        argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    work_dir.mkdir(parents=True, exist_ok=True)
    log = work_dir / f"dashboard-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    scheme = "https" if tls else "http"
    dashboard = Dashboard(
        f"{scheme}://127.0.0.1:{port}",
        process,
        log,
        token,
        tls[0] if tls else None,
        f"http://127.0.0.1:{metrics_port}/metrics",
    )

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"p4bs dashboard exited: {dashboard.log_text()}")
        try:
            return dashboard.get("/", timeout_s=2).status == 200
        except OSError:
            return False

    try:
        assert wait_until(answers, timeout_s, interval_s=0.2), dashboard.log_text()
        yield dashboard
    finally:
        stop_session(process, 15)
