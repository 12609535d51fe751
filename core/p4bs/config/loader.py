"""Reading a config: `load_config` (a file), `parse_config` (what tomllib read) and
`link_from_table` (one [[links]] entry checked against a config), each refusing with every
problem at once."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from p4bs.config.authority import with_defaults_from_links
from p4bs.config.fields import Reader
from p4bs.config.model import Config, ConfigError, LinkConfig
from p4bs.config.network import read_dataplane, read_link, read_router, read_switch
from p4bs.config.services import (
    check_metrics_exposure,
    read_alerts,
    read_dashboard,
    read_flink,
    read_influx,
    read_kafka,
    read_metrics,
    read_optimizer,
    read_prometheus,
    read_sinks,
)
from p4bs.config.testbed import read_testbed
from p4bs.config.topology import check_references, junos_only_where_used

T = TypeVar("T")


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    r = Reader()
    sections = {
        "kafka",
        "influxdb",
        "flink",
        "dataplane",
        "metrics",
        "alerts",
        "optimizer",
        "sinks",
        "dashboard",
        "prometheus",
        "switches",
        "routers",
        "links",
    }
    r.unknown(data, sections | {"testbed"})

    def section(name: str, read: Callable[[Reader, dict[str, Any]], T]) -> T:
        with r.at(name):
            return read(r, r.table(data, name))

    kafka = section("kafka", read_kafka)
    influx = section("influxdb", read_influx)
    flink = section("flink", read_flink)
    dataplane = section("dataplane", read_dataplane)
    metrics = section("metrics", read_metrics)
    alerts = section("alerts", read_alerts)
    optimizer = section("optimizer", read_optimizer)
    sinks = section("sinks", read_sinks)
    dashboard = section("dashboard", read_dashboard)
    prometheus = section("prometheus", read_prometheus)
    check_metrics_exposure(
        r,
        {
            "optimizer.metrics_address": optimizer.metrics_address,
            "sinks.metrics_address": sinks.metrics_address,
            "alerts.metrics_address": alerts.metrics_address,
            "dashboard.metrics_address": dashboard.metrics_address,
        },
        prometheus,
    )
    if flink.window_ns % dataplane.export_interval_ns:
        # A window then holds whole export intervals, each one record (or its parts).
        r.problem(
            "flink.window",
            f"must be a multiple of dataplane.export_interval ({dataplane.export_interval_ns} "
            f"ns), got {flink.window_ns} ns",
        )

    if metrics.optimizer_feed and 2 * metrics.feed_heartbeat_ns > optimizer.stale_after_ns:
        # A steady link's only windows are the heartbeats: their gap plus the job's latency
        # must stay well inside the time after which the optimizer takes metrics for stale.
        r.problem(
            "metrics.feed_heartbeat",
            f"must be at most half of optimizer.stale_after ({optimizer.stale_after_ns} ns), "
            f"got {metrics.feed_heartbeat_ns} ns",
        )

    tables = {name: r.tables(data, name) for name in ("switches", "routers", "links")}

    def each(name: str, read: Callable[[Reader, dict[str, Any]], T | None]) -> tuple[T, ...]:
        out = []
        for i, item in enumerate(tables[name]):
            with r.at(f"{name}[{i}]"):
                value = read(r, item)
            if value is not None:
                out.append(value)
        return tuple(out)

    raw_links = tables["links"]
    if not raw_links:
        r.problem("links", "at least one [[links]] entry is required")
    routers = each("routers", read_router)
    links = junos_only_where_used(r, each("links", read_link), raw_links, routers)
    routers = with_defaults_from_links(r, routers, tables["routers"], links, raw_links)
    testbed = None
    if "testbed" in data and raw_links:
        link_ids = {f"{x.get('router')}:{x.get('interface')}" for x in raw_links}
        with r.at("testbed"):
            testbed = read_testbed(r, r.table(data, "testbed"), links, link_ids)
    config = Config(
        kafka=kafka,
        influxdb=influx,
        flink=flink,
        switches=each("switches", read_switch),
        routers=routers,
        links=links,
        testbed=testbed,
        dataplane=dataplane,
        metrics=metrics,
        alerts=alerts,
        optimizer=optimizer,
        sinks=sinks,
        dashboard=dashboard,
        prometheus=prometheus,
    )
    check_references(r, config)
    if r.problems:
        raise ConfigError(source, r.problems)
    return config


def link_from_table(config: Config, table: dict[str, Any], source: str) -> LinkConfig:
    """One [[links]] entry (as tomllib reads it) read as `load_config` reads it, and checked
    against `config`'s routers (what each lets p4bs manage: p4bs.config.authority), switches
    and other links (it replaces the link of its id). Raises ConfigError listing every
    problem."""
    r = Reader()
    with r.at("links[0]"):
        link = read_link(r, table)
    if link is not None:
        (link,) = junos_only_where_used(r, (link,), [table], config.routers)
        others = tuple(x for x in config.links if x.id != link.id)
        check_references(r, dataclasses.replace(config, links=(*others, link)))
    if link is None or r.problems:
        raise ConfigError(source, r.problems)
    return link


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from exc
    return parse_config(data, str(path))
