"""The dashboard's web server: three pages (fleet, link, search), their JSON API and the
event stream that pushes a link's new records to its page (Server-Sent Events).

Routes (every one behind the token when one is set):

- `/`: the fleet; `/api/fleet`: its rows, filtered, sorted and paged by the server
  (`q`, `sla`, `sort`, `order`, `offset`, `limit`), so a fleet of thousands of links sends
  a page of rows, never all of them;
- `/link/{id}`: one link; `/api/links/{id}`: what the feed holds of it, `/api/links/{id}/
  history?start_ns=&end_ns=`: its charts, decisions and alerts from InfluxDB;
- `/search/{id}`: its Bayesian search; `/api/links/{id}/search`;
- `/api/events?link={id}`: the link's new windows, decisions, alerts and optimizer states
  as they are read from Kafka;
- `/assets/...`: the pages' scripts; `/vendor/uplot/...`: the charting library `make setup`
  installed (ASSETS_DIR), served from this machine.

An unknown link is a 404 naming it (a page, or JSON under /api). Authentication: with a
token, every request needs it as HTTP basic auth's password (any user name; a browser asks
for it once) or as `Authorization: Bearer TOKEN`; without, 401.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import html
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from importlib import resources
from numbers import Real
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from p4bs import exposure, paths
from p4bs.metrics_endpoint import EndpointError, serve_metrics
from p4bs.units import duration_for_bytes
from p4bs_ops.dashboard.feed import Event, FeedReader, Fleet, LinkView
from p4bs_ops.dashboard.link_history import CHARTS, HistoryError, link_history
from p4bs_ops.dashboard.metrics import DashboardMetrics, RequestCounter
from p4bs_ops.dashboard.search import NoSearch, search_view

ASSETS_DIR = paths.cache_dir() / "dashboard" / "node_modules" / "uplot" / "dist"
ASSET_FILES = ("uPlot.iife.min.js", "uPlot.min.css")
DEFAULT_RANGE_NS = 15 * 60 * 10**9
MAX_PAGE = 500  # rows of the fleet per request
HEARTBEAT_S = 15.0  # an event stream's comment line, so proxies keep it open
SLA_STATES = ("violated", "ok", "no data")
SORT_KEYS = ("link", "sla", "buffer", "policy", "phase", "decision", "alerts", "f", "utilisation")


class SetupError(Exception):
    """The server cannot start as asked; the message says what to do."""


def check_assets(assets: Path = ASSETS_DIR) -> None:
    missing = [name for name in ASSET_FILES if not (assets / name).is_file()]
    if missing:
        raise SetupError(
            f"the charting library is not installed ({assets / missing[0]} is missing): "
            "run make setup"
        )


def check_exposure(bind: str, token: str | None, tls: bool) -> None:
    """A server reachable beyond this machine needs a token and TLS (p4bs.exposure: the rule
    every metrics endpoint follows too)."""
    try:
        exposure.check_exposure(
            bind,
            token=bool(token),
            tls=tls,
            where=f"--bind {bind}",
            what="the dashboard",
            remedy="give a token (--token-env or --token-file) and TLS (--tls-cert and --tls-key)",
        )
    except exposure.ExposureError as exc:
        raise SetupError(str(exc)) from None


# ---- authentication ----------------------------------------------------------------------------


class TokenAuth:
    """ASGI middleware: every HTTP request carries the token, or gets 401."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        response = Response(
            "authentication required: the dashboard's token as the password\n",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="p4bs dashboard", charset="UTF-8"'},
        )
        await response(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        assert self.token is not None
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, value = header.partition(b" ")
        given = b""
        if scheme.lower() == b"bearer":
            given = value.strip()
        elif scheme.lower() == b"basic":
            try:
                given = base64.b64decode(value.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        return bool(given) and hmac.compare_digest(given, self.token)


# ---- shaping what the feed holds -----------------------------------------------------------


def number(value: Any) -> float | int | None:
    """A value shown or sorted as a number: None (shown as "—") unless it is a finite one.
    The codec refuses NaN and infinities; this keeps one odd value of one link (a record
    written before that, or a field read otherwise) from failing the fleet's page."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    return value if math.isfinite(value) else None  # type: ignore[return-value]


def finite_json(value: Any, odd: list[str], where: str = "") -> Any:
    """`value` with every NaN or infinite number replaced by None (JSON's null), where each
    was appended to `odd`."""
    if isinstance(value, float) and not math.isfinite(value):
        odd.append(f"{where}: {value}")
        return None
    if isinstance(value, dict):
        return {k: finite_json(v, odd, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v, odd, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def buffer_in_force(view: LinkView) -> int | None:
    """Queue 0's buffer now: as the optimizer read it back, else the last applied decision."""
    if view.state is not None:
        for entry in view.state["in_force"]:
            if entry["queue"] == 0:
                return int(entry["buffer_bytes"])
    applied = [d for d in view.decisions if d["outcome"] == "applied" and d["queue"] == 0]
    return int(applied[0]["buffer_bytes"]) if applied else None


def sla_state(view: LinkView) -> str:
    if view.open_alerts:
        return "violated"
    return "ok" if view.window is not None else "no data"


def phase(view: LinkView) -> str | None:
    """The policy's phase: its snapshot's, else that of its last decision."""
    snapshot = view.state["policy_state"] if view.state is not None else None
    if isinstance(snapshot, dict) and isinstance(snapshot.get("phase"), str):
        return str(snapshot["phase"])
    return str(view.decisions[0]["phase"]) if view.decisions else None


def decision_json(decision: dict[str, Any]) -> dict[str, Any]:
    """A decision for the pages, with `id`: its ns timestamp and queue as text (JavaScript's
    numbers hold ns timestamps only to a few hundred ns)."""
    return {**decision, "id": f"{decision['ts_ns']}/{decision['queue']}"}


def fleet_row(view: LinkView) -> dict[str, Any]:
    link, window = view.link, view.window
    last = view.decisions[0] if view.decisions else None
    buffer = buffer_in_force(view)
    return {
        "link_id": link.id,
        "router": link.router,
        "interface": link.interface,
        "capacity_bps": link.capacity_bps,
        "sla": sla_state(view),
        "open_alerts": sorted(
            (_alert_json(a) for a in view.open_alerts.values()), key=lambda a: a["ts_ns"]
        ),
        "buffer_bytes": buffer,
        "buffer_ns": duration_for_bytes(buffer, link.capacity_bps) if buffer else None,
        "policy": view.state["policy"] if view.state is not None else link.policy,
        "phase": phase(view),
        "last_decision": decision_json(last) if last is not None else None,
        "window_end_ns": number(window.get("window_end_ns")) if window else None,
        "f": number(window.get("f")) if window else None,
        "utilisation": number(window.get("utilisation")) if window else None,
        "srtt_ns": number(window.get("srtt_ns")) if window else None,
        "long_flows": number(window.get("long_flows")) if window else None,
    }


def _alert_json(alert: dict[str, Any]) -> dict[str, Any]:
    return {k: alert[k] for k in ("alert_id", "kind", "value", "bound", "ts_ns")}


def _sort_fields(view: LinkView) -> dict[str, Any]:
    """What the fleet is filtered and sorted by, one entry per SORT_KEYS (None: no value),
    cheap enough to make for every link on every request."""
    window, state = view.window, view.state
    return {
        "link": view.link.id,
        "sla": SLA_STATES.index(sla_state(view)),
        "buffer": number(buffer_in_force(view)),
        "policy": state["policy"] if state is not None else view.link.policy,
        "phase": phase(view),
        "decision": number(view.decisions[0].get("ts_ns")) if view.decisions else None,
        "alerts": len(view.open_alerts),
        "f": number(window.get("f")) if window else None,
        "utilisation": number(window.get("utilisation")) if window else None,
    }


def fleet_page(
    fleet: Fleet,
    *,
    query: str = "",
    sla: str = "",
    sort: str = "link",
    descending: bool = False,
    offset: int = 0,
    limit: int = 100,
) -> dict[str, Any]:
    """One page of the fleet's rows: those whose link, policy or phase contain `query` and
    (if given) whose SLA state is `sla`, sorted by `sort`, rows without the value last (by
    link). Only the page's rows are made in full."""
    needle = query.strip().lower()
    with fleet.locked() as links:
        total = len(links)
        matched = []
        for view in links.values():
            fields = _sort_fields(view)
            if needle and not any(
                needle in str(fields[k] or "").lower() for k in ("link", "policy", "phase")
            ):
                continue
            matched.append((fields, view))
        counts = {
            state: sum(f["sla"] == i for f, _ in matched) for i, state in enumerate(SLA_STATES)
        }
        if sla:
            matched = [(f, v) for f, v in matched if f["sla"] == SLA_STATES.index(sla)]
        present = [(f, v) for f, v in matched if f[sort] is not None]
        absent = [(f, v) for f, v in matched if f[sort] is None]
        present.sort(key=lambda item: item[0][sort], reverse=descending)
        absent.sort(key=lambda item: item[0]["link"])
        ordered = present + absent
        rows = [fleet_row(view) for _, view in ordered[offset : offset + limit]]
        stats = _stats_json(fleet)
    return {
        "total": total,
        "matched": len(ordered),
        "offset": offset,
        "rows": rows,
        "sla_counts": counts,
        "feed": stats,
        "now_ns": time.time_ns(),
    }


def _stats_json(fleet: Fleet) -> dict[str, Any]:
    s = fleet.stats
    return {
        "received": dict(s.received),
        "malformed": s.malformed,
        "malformed_reasons": list(s.reasons),
        "unknown_links": s.unknown_links,
        "kafka_error": s.kafka_error,
        "caught_up": s.caught_up,
        "dropped_events": s.dropped_events,
        "odd_values": s.odd_values,
    }


def link_json(fleet: Fleet, link_id: str) -> dict[str, Any] | None:
    with fleet.locked() as links:
        view = links.get(link_id)
        if view is None:
            return None
        link = view.link
        return {
            "row": fleet_row(view),
            "config": {
                "max_queue_delay_ns": link.max_queue_delay_ns,
                "max_loss": link.max_loss,
                "min_buffer_bytes": link.min_buffer_bytes,
                "max_buffer_bytes": link.max_buffer_bytes,
                "safe_buffer_bytes": link.safe_buffer_bytes,
                "policy_options": link.policy_options,
            },
            "window": view.window,
            "decisions": [decision_json(d) for d in view.decisions],
            "open_alerts": list(view.open_alerts.values()),
            "state": view.state,
            "feed": _stats_json(fleet),
            "charts": [
                {"key": c.key, "title": c.panel, "unit": c.unit, "fields": c.fields} for c in CHARTS
            ],
        }


# ---- the app ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    kind: str  # fleet, link or search: its script
    title: str
    link_id: str = ""


def _page_html(page: Page) -> str:
    title = html.escape(page.title)
    link = html.escape(page.link_id, quote=True)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{title} · p4bs</title>
<link rel="stylesheet" href="/vendor/uplot/uPlot.min.css">
<link rel="stylesheet" href="/assets/dashboard.css">
</head>
<body data-page="{page.kind}" data-link="{link}">
<header><a href="/">p4bs fleet</a><span id="crumb">{title}</span><span id="feed"></span></header>
<main id="main"></main>
<script src="/vendor/uplot/uPlot.iife.min.js"></script>
<script src="/assets/common.js"></script>
<script src="/assets/{page.kind}.js"></script>
</body></html>
"""


def _not_found(request: Request, link_id: str, known: int) -> Response:
    message = f"no link {link_id!r} in this deployment ({known} links known)"
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=404)
    body = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Not found · p4bs"
        "</title><link rel='stylesheet' href='/assets/dashboard.css'></head><body>"
        f"<main><h1>Link not found</h1><p id='error'>{html.escape(message)}.</p>"
        "<p><a href='/'>See the fleet</a>.</p></main></body></html>"
    )
    return HTMLResponse(body, status_code=404)


def _int_param(request: Request, name: str, default: int, low: int = 0) -> int:
    try:
        return max(low, int(request.query_params.get(name, default)))
    except ValueError:
        return default


def build_app(
    fleet: Fleet,
    *,
    token: str | None = None,
    assets: Path = ASSETS_DIR,
    metrics: DashboardMetrics | None = None,
) -> Starlette:
    """The dashboard on `fleet` (filled by a `FeedReader`, or by a test); its requests
    counted in `metrics` when given."""
    static = resources.files("p4bs_ops.dashboard") / "static"
    influx = fleet.config.influxdb
    search_lock = asyncio.Lock()  # one fit at a time: each takes a core for a moment

    def known(link_id: str) -> bool:
        with fleet.locked() as links:
            return link_id in links

    def count() -> int:
        with fleet.locked() as links:
            return len(links)

    async def fleet_html(_request: Request) -> Response:
        return HTMLResponse(_page_html(Page("fleet", "Fleet")))

    async def link_html(request: Request) -> Response:
        link_id = request.path_params["link_id"]
        if not known(link_id):
            return _not_found(request, link_id, count())
        return HTMLResponse(_page_html(Page("link", link_id, link_id)))

    async def search_html(request: Request) -> Response:
        link_id = request.path_params["link_id"]
        if not known(link_id):
            return _not_found(request, link_id, count())
        return HTMLResponse(_page_html(Page("search", f"search · {link_id}", link_id)))

    def finite_response(data: dict[str, Any]) -> JSONResponse:
        """The data as JSON, NaN and infinities as null, each counted (`odd_values`)."""
        odd: list[str] = []
        clean = finite_json(data, odd)
        if odd:
            fleet.odd_values(odd)
        return JSONResponse(clean)

    async def api_fleet(request: Request) -> Response:
        params = request.query_params
        sort = params.get("sort", "link")
        if sort not in SORT_KEYS:
            return JSONResponse({"error": f"sort: one of {', '.join(SORT_KEYS)}"}, 400)
        sla = params.get("sla", "")
        if sla and sla not in SLA_STATES:
            return JSONResponse({"error": f"sla: one of {', '.join(SLA_STATES)}"}, 400)
        page = fleet_page(
            fleet,
            query=params.get("q", ""),
            sla=sla,
            sort=sort,
            descending=params.get("order") == "desc",
            offset=_int_param(request, "offset", 0),
            limit=min(MAX_PAGE, _int_param(request, "limit", 100, low=1)),
        )
        return finite_response(page)

    async def api_link(request: Request) -> Response:
        link_id = request.path_params["link_id"]
        data = link_json(fleet, link_id)
        if data is None:
            return _not_found(request, link_id, count())
        return finite_response(data)

    async def api_history(request: Request) -> Response:
        link_id = request.path_params["link_id"]
        if not known(link_id):
            return _not_found(request, link_id, count())
        now = time.time_ns()
        end = _int_param(request, "end_ns", now, low=1)
        start = _int_param(request, "start_ns", end - DEFAULT_RANGE_NS, low=0)
        if start >= end:
            return JSONResponse({"error": "start_ns must be before end_ns"}, 400)
        try:
            data = await asyncio.to_thread(link_history, influx, link_id, start, end)
        except HistoryError as exc:
            return JSONResponse({"error": f"InfluxDB: {exc}"}, 502)
        return finite_response(data)

    async def api_search(request: Request) -> Response:
        link_id = request.path_params["link_id"]
        with fleet.locked() as links:
            view = links.get(link_id)
            link, state = (view.link, view.state) if view is not None else (None, None)
        if link is None:
            return _not_found(request, link_id, count())
        try:
            async with search_lock:
                data = await asyncio.to_thread(search_view, link, state)
        except NoSearch as exc:
            return JSONResponse({"error": str(exc), "no_search": True}, 404)
        return finite_response(data)

    async def api_events(request: Request) -> Response:
        link_id = request.query_params.get("link", "")
        if not known(link_id):
            return _not_found(request, link_id, count())
        return StreamingResponse(
            _events(request, fleet, link_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/", fleet_html),
        Route("/link/{link_id}", link_html),
        Route("/search/{link_id}", search_html),
        Route("/api/fleet", api_fleet),
        Route("/api/links/{link_id}", api_link),
        Route("/api/links/{link_id}/history", api_history),
        Route("/api/links/{link_id}/search", api_search),
        Route("/api/events", api_events),
        Mount("/assets", StaticFiles(directory=str(static)), name="assets"),
        Mount("/vendor/uplot", StaticFiles(directory=str(assets)), name="uplot"),
    ]
    middleware = [Middleware(TokenAuth, token=token)]
    if metrics is not None:  # outermost: a request the token refused counts too
        middleware.insert(0, Middleware(RequestCounter, metrics=metrics, routes=routes))
    return Starlette(routes=routes, middleware=middleware)


async def _events(request: Request, fleet: Fleet, link_id: str) -> AsyncIterator[str]:
    """The link's events as Server-Sent Events, until the page goes away."""
    queue = fleet.subscribe(link_id)
    try:
        yield "retry: 2000\n\n"
        while not await request.is_disconnected():
            try:
                event = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
            except TimeoutError:
                yield ": heartbeat\n\n"
                continue
            odd: list[str] = []
            data = json.dumps(finite_json(_event_record(event), odd))
            if odd:
                fleet.odd_values(odd)
            yield f"event: {event['kind']}\ndata: {data}\n\n"
    finally:
        fleet.unsubscribe(link_id, queue)


def _event_record(event: Event) -> dict[str, Any]:
    record = event["record"]
    return decision_json(record) if event["kind"] == "buffer_decisions" else record


@dataclass(frozen=True)
class ServeOptions:
    bind: str = "127.0.0.1"
    port: int = 8050
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None


def serve(fleet: Fleet, options: ServeOptions, on_start: Callable[[str], None] = print) -> None:
    """Reads the feed into `fleet` and serves the dashboard until SIGINT or SIGTERM; tells
    `on_start` where (SetupError, before anything starts, for missing assets or an exposed
    bind without a token and TLS)."""
    check_assets()
    check_exposure(options.bind, options.token, options.tls_cert is not None)
    metrics = DashboardMetrics(fleet)
    try:
        endpoint = serve_metrics(fleet.config, "dashboard.metrics_address", metrics)
    except EndpointError as exc:
        raise SetupError(str(exc)) from None
    if endpoint is not None:
        on_start(f"p4bs dashboard metrics on {endpoint.url}")
    reader = FeedReader(fleet)
    reader.start()
    scheme = "https" if options.tls_cert else "http"
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(fleet, token=options.token, metrics=metrics),
            host=options.bind,
            port=options.port,
            ssl_certfile=options.tls_cert,
            ssl_keyfile=options.tls_key,
            log_level="warning",
            log_config=None,  # its records through p4bs.logs' handlers (--log-format)
            # Event streams stay open: a stop does not wait for the pages to close them.
            timeout_graceful_shutdown=2,
        )
    )
    on_start(f"p4bs dashboard on {scheme}://{options.bind}:{options.port}/")
    try:
        server.run()
    finally:
        reader.stop()
        if endpoint is not None:
            endpoint.stop()
