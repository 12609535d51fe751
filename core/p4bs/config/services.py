"""The services' sections: [kafka], [influxdb], [flink], [metrics], [alerts] and [optimizer].
Each is optional, as is each of its fields: an absent one takes the model's default."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from typing import Any

from p4bs.config.fields import (
    Reader,
    boolean,
    endpoint,
    fraction,
    int_in,
    one_of,
    optional_endpoint,
    positive,
    positive_durations,
    secret,
    text,
    url,
    weight,
)
from p4bs.config.model import (
    FLINK_MODES,
    KAFKA_COMPONENTS,
    KAFKA_SECURITY,
    SASL_MECHANISMS,
    AlertsConfig,
    DashboardConfig,
    FlinkConfig,
    InfluxConfig,
    KafkaConfig,
    KafkaUser,
    MetricsConfig,
    OptimizerConfig,
    PrometheusConfig,
    SinksConfig,
)
from p4bs.exposure import ExposureError, check_exposure
from p4bs.units import parse_duration_ns
from p4bs_schemas.registry import STREAMS

_POLICY_NAME = re.compile(r"[A-Za-z0-9_-]+")


def read_kafka(r: Reader, data: dict[str, Any]) -> KafkaConfig:
    d = KafkaConfig()
    known = {"bootstrap", "partitions", "replication_factor", "topics", "security"}
    secured = {"sasl_mechanism", "ca_file", "username", "password", "users"}
    r.unknown(data, known | secured)
    security = r.get(data, "security", one_of(KAFKA_SECURITY), d.security)
    for name in sorted(secured & set(data)):
        if security == "plaintext":
            r.problem(name, 'is used only with security = "sasl_ssl"')
    topics = dict(d.topics)
    with r.at("topics"):
        overrides = r.table(data, "topics") if "topics" in data else {}
        for stream in overrides:
            if stream not in STREAMS:
                r.problem(stream, f"unknown stream (known: {', '.join(STREAMS)})")
            else:
                topics[stream] = r.get(overrides, stream, text, topics[stream])
    if len(set(topics.values())) != len(topics):
        r.problem("topics", "two streams share one topic name")
    users = {}
    with r.at("users"):
        given = r.table(data, "users") if "users" in data else {}
        for component in given:
            if component not in KAFKA_COMPONENTS:
                components = ", ".join(KAFKA_COMPONENTS)
                r.problem(component, f"unknown component (known: {components})")
                continue
            with r.at(component):
                login = r.table(given, component)
                r.unknown(login, {"username", "password"})
                username = r.get(login, "username", secret, required=True)
                password = r.get(login, "password", secret, required=True)
            if username is not None and password is not None:
                users[component] = KafkaUser(username, password)
    return KafkaConfig(
        bootstrap=r.get(data, "bootstrap", endpoint, d.bootstrap),
        partitions=r.get(data, "partitions", int_in(1, 10_000), d.partitions),
        replication_factor=r.get(data, "replication_factor", int_in(1, 32), d.replication_factor),
        topics=topics,
        security=security,
        sasl_mechanism=r.get(data, "sasl_mechanism", one_of(SASL_MECHANISMS), d.sasl_mechanism),
        ca_file=r.get(data, "ca_file", text),
        username=r.get(data, "username", secret, required=security == "sasl_ssl"),
        password=r.get(data, "password", secret, required=security == "sasl_ssl"),
        users=users,
    )


def read_influx(r: Reader, data: dict[str, Any]) -> InfluxConfig:
    d = InfluxConfig()
    durations = ("retention", "retention_1s", "retention_1m", "events_retention")
    r.unknown(data, {"url", "database", "username", "password", "ca_file", *durations})
    kept: dict[str, int] = {}
    for key in durations:
        kept[key] = r.get(data, key, parse_duration_ns, int(getattr(d, f"{key}_ns")))
        if 0 < kept[key] < 3_600_000_000_000:
            r.problem(key, "InfluxDB keeps data at least 1h; use 0 for forever or >= 1h")
    address = r.get(data, "url", url, d.url)
    password = r.get(data, "password", secret)
    if password is not None and not private_transport(address):
        r.problem(
            "password",
            f"is sent only over https:// (or to this machine's loopback), not to {address}",
        )
    return InfluxConfig(
        url=address,
        database=r.get(data, "database", text, d.database),
        retention_ns=kept["retention"],
        retention_1s_ns=kept["retention_1s"],
        retention_1m_ns=kept["retention_1m"],
        events_retention_ns=kept["events_retention"],
        username=r.get(data, "username", secret),
        password=password,
        ca_file=r.get(data, "ca_file", text),
    )


def private_transport(address: str) -> bool:
    """Whether a request to `address` (an http:// or https:// URL) is read by nobody on the
    way: TLS, or the loopback (the local stack's InfluxDB)."""
    parts = urllib.parse.urlsplit(address)
    if parts.scheme == "https":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_flink(r: Reader, data: dict[str, Any]) -> FlinkConfig:
    d = FlinkConfig()
    r.unknown(
        data,
        {
            "mode",
            "jobmanager",
            "parallelism",
            "window",
            "checkpoint_interval",
            "jvm_args",
            "metrics_ports",
        },
    )
    window = positive(parse_duration_ns, "the window")
    interval = positive(parse_duration_ns, "the checkpoint interval")
    return FlinkConfig(
        mode=r.get(data, "mode", one_of(FLINK_MODES), d.mode),
        jobmanager=r.get(data, "jobmanager", endpoint, d.jobmanager),
        parallelism=r.get(data, "parallelism", int_in(1, 1024), d.parallelism),
        window_ns=r.get(data, "window", window, d.window_ns),
        checkpoint_interval_ns=r.get(
            data, "checkpoint_interval", interval, d.checkpoint_interval_ns
        ),
        jvm_args=r.get(data, "jvm_args", text, d.jvm_args),
        metrics_ports=r.get(data, "metrics_ports", _port_range, d.metrics_ports),
    )


def _port_range(value: Any) -> str:
    """ "" (none), a port, or a range "first-last" of ports in 1024..65535."""
    if value == "":
        return ""
    first, _, last = text(value).partition("-")
    ports = [first, last or first]
    if not all(p.isdigit() and 1024 <= int(p) <= 65535 for p in ports) or int(ports[0]) > int(
        ports[1]
    ):
        raise ValueError(
            f'must be "" (off), a port or a range "first-last" (1024..65535), got {value!r}'
        )
    return str(value)


def read_metrics(r: Reader, data: dict[str, Any]) -> MetricsConfig:
    d = MetricsConfig()
    durations = ("max_out_of_orderness", "source_idle_timeout", "rtt_min_horizon", "long_flow_ttl")
    alphas = ("srtt_alpha", "loss_alpha", "queue_delay_alpha", "zscore_influence")
    feed = ("optimizer_feed", "feed_policies", "feed_deadband", "feed_heartbeat")
    r.unknown(data, {*durations, *alphas, "zscore_lag", "zscore_threshold", "sla_windows", *feed})
    values: dict[str, Any] = positive_durations(r, data, (*durations, "feed_heartbeat"), d)
    for key in alphas:
        values[key] = r.get(data, key, fraction, getattr(d, key))
    values["zscore_lag"] = r.get(data, "zscore_lag", int_in(2, 100_000), d.zscore_lag)
    values["zscore_threshold"] = r.get(data, "zscore_threshold", weight, d.zscore_threshold)
    values["sla_windows"] = r.get(data, "sla_windows", int_in(1, 100_000), d.sla_windows)
    values["optimizer_feed"] = r.get(data, "optimizer_feed", boolean, d.optimizer_feed)
    values["feed_policies"] = r.get(data, "feed_policies", _policy_names, d.feed_policies)
    values["feed_deadband"] = r.get(data, "feed_deadband", _deadband, d.feed_deadband)
    return MetricsConfig(**values)


def _policy_names(value: Any) -> tuple[str, ...]:
    """A list of policy names (the metrics job reads them as one comma-separated field)."""
    if not isinstance(value, list) or not all(
        isinstance(v, str) and _POLICY_NAME.fullmatch(v) for v in value
    ):
        raise ValueError(
            f"must be a list of policy names (letters, digits, _ and -), got {value!r}"
        )
    return tuple(value)


def _deadband(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(f"must be a number in [0, 1), got {value!r}")
    return float(value)


def read_alerts(r: Reader, data: dict[str, Any]) -> AlertsConfig:
    d = AlertsConfig()
    r.unknown(data, {"webhook", "timeout", "attempts", "backoff", "metrics_address"})
    timeout = r.get(data, "timeout", positive(parse_duration_ns, "the timeout"), d.timeout_ns)
    backoff = r.get(data, "backoff", positive(parse_duration_ns, "the backoff"), d.backoff_ns)
    return AlertsConfig(
        webhook=r.get(data, "webhook", url),
        timeout_ns=timeout,
        attempts=r.get(data, "attempts", int_in(1, 1000), d.attempts),
        backoff_ns=backoff,
        metrics_address=r.get(data, "metrics_address", optional_endpoint, d.metrics_address),
    )


def read_optimizer(r: Reader, data: dict[str, Any]) -> OptimizerConfig:
    d = OptimizerConfig()
    r.unknown(
        data,
        {
            "group",
            "session_timeout",
            "stale_after",
            "min_change_interval",
            "apply_attempts",
            "fit_processes",
            "max_step_ratio",
            "max_changes_per_router_per_minute",
            "freeze_file",
            "dry_run",
            "metrics_address",
        },
    )
    session = r.get(
        data,
        "session_timeout",
        positive(parse_duration_ns, "session_timeout"),
        d.session_timeout_ns,
    )
    stale = r.get(data, "stale_after", positive(parse_duration_ns, "stale_after"), d.stale_after_ns)
    interval = r.get(
        data,
        "min_change_interval",
        positive(parse_duration_ns, "the interval"),
        d.min_change_interval_ns,
    )
    return OptimizerConfig(
        group=r.get(data, "group", text, d.group),
        session_timeout_ns=session,
        stale_after_ns=stale,
        min_change_interval_ns=interval,
        apply_attempts=r.get(data, "apply_attempts", int_in(1, 100), d.apply_attempts),
        fit_processes=r.get(data, "fit_processes", int_in(0, 1024), d.fit_processes),
        max_step_ratio=r.get(data, "max_step_ratio", _step_ratio, d.max_step_ratio),
        max_changes_per_router_per_minute=r.get(
            data,
            "max_changes_per_router_per_minute",
            int_in(0, 100_000),
            d.max_changes_per_router_per_minute,
        ),
        freeze_file=r.get(data, "freeze_file", text, d.freeze_file),
        dry_run=r.get(data, "dry_run", boolean, d.dry_run),
        metrics_address=r.get(data, "metrics_address", optional_endpoint, d.metrics_address),
    )


def read_sinks(r: Reader, data: dict[str, Any]) -> SinksConfig:
    r.unknown(data, {"metrics_address"})
    address = r.get(data, "metrics_address", optional_endpoint, SinksConfig().metrics_address)
    return SinksConfig(metrics_address=address)


def read_dashboard(r: Reader, data: dict[str, Any]) -> DashboardConfig:
    r.unknown(data, {"metrics_address"})
    default = DashboardConfig().metrics_address
    return DashboardConfig(
        metrics_address=r.get(data, "metrics_address", optional_endpoint, default)
    )


def read_prometheus(r: Reader, data: dict[str, Any]) -> PrometheusConfig:
    r.unknown(data, {"token", "tls_cert", "tls_key"})
    tls_cert = r.get(data, "tls_cert", text)
    tls_key = r.get(data, "tls_key", text)
    if (tls_cert is None) != (tls_key is None):
        r.problem("tls_cert" if tls_cert is None else "tls_key", "tls_cert and tls_key go together")
    return PrometheusConfig(token=r.get(data, "token", secret), tls_cert=tls_cert, tls_key=tls_key)


def check_metrics_exposure(
    r: Reader, addresses: dict[str, str], prometheus: PrometheusConfig
) -> None:
    """Each service's metrics_address (`addresses`: by its key, e.g. "optimizer.
    metrics_address") beyond the loopback needs [prometheus] token and TLS, as the
    dashboard's --bind does (p4bs.exposure)."""
    tls = prometheus.tls_cert is not None and prometheus.tls_key is not None
    for key, address in addresses.items():
        if not address:
            continue
        try:
            check_exposure(
                address.rpartition(":")[0],
                token=prometheus.token is not None,
                tls=tls,
                where=address,
                what="the service's metrics",
                remedy="set [prometheus] token, tls_cert and tls_key",
            )
        except ExposureError as exc:
            r.problem(key, str(exc))


def _step_ratio(value: Any) -> float:
    """The largest factor of one change: 0 (no limit) or above 1."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value == 0 or 1 < value <= 1000)
    ):
        raise ValueError(f"must be 0 (no limit) or a factor in (1, 1000], got {value!r}")
    return float(value)
