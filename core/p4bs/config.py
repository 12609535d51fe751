"""The deployment config: one TOML file describing switches, routers, links and endpoints.

`load_config(path)` parses and validates the whole file and raises `ConfigError` listing every
problem as `field.path: what is wrong`, so an operator fixes a file in one pass. Values are
converted to the system's units (ns, bytes, bit/s) here and nowhere else.
Credentials never appear in the file: a secret is `{ env = "VAR" }` or `{ file = "/path" }`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from p4bs.units import (
    UnitError,
    bytes_for_duration,
    parse_duration_ns,
    parse_rate_bps,
    parse_size_bytes,
)
from p4bs_schemas.registry import STREAMS, default_topic

ROUTER_DRIVERS = ("gnmi", "netconf", "netconf-junos", "linux-tc")
SWITCH_TARGETS = ("model", "tofino")
FLINK_MODES = ("embedded", "remote")
KAFKA_SECURITY = ("plaintext", "sasl_ssl")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
CCAS = ("cubic", "bbr", "reno")
TOFINO_MAX_PORT = 511
DAY_NS = 86_400_000_000_000

T = TypeVar("T")


class ConfigError(ValueError):
    """Every problem found in a config file, one `path: reason` per line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class SecretRef:
    """A credential named by where it lives, resolved only when it is used."""

    env: str | None = None
    file: str | None = None

    def resolve(self) -> str:
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise LookupError(f"credential variable ${self.env} is not set")
            return value
        assert self.file is not None
        try:
            return Path(self.file).read_text().strip()
        except OSError as exc:
            raise LookupError(f"credential file {self.file}: {exc.strerror}") from exc


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"
    partitions: int = 4
    replication_factor: int = 1
    topics: dict[str, str] = field(default_factory=lambda: {s: default_topic(s) for s in STREAMS})
    # "sasl_ssl": TLS to the brokers, verified against `ca_file` (None: the system's trust
    # store), and a SASL/SCRAM login as username/password. "plaintext": neither.
    security: str = "plaintext"
    sasl_mechanism: str = "SCRAM-SHA-512"
    ca_file: str | None = None
    username: SecretRef | None = None
    password: SecretRef | None = None


@dataclass(frozen=True)
class InfluxConfig:
    """InfluxDB and how long it keeps what (p4bs/history.py); a retention of 0 keeps forever."""

    url: str = "http://127.0.0.1:8086"
    database: str = "p4bs"
    retention_ns: int = 0  # every window (the default retention policy)
    retention_1s_ns: int = 30 * DAY_NS  # the windows' per-second summaries
    retention_1m_ns: int = 365 * DAY_NS  # per-minute summaries
    events_retention_ns: int = 365 * DAY_NS  # SLA alerts and buffer decisions
    username: SecretRef | None = None
    password: SecretRef | None = None


@dataclass(frozen=True)
class FlinkConfig:
    mode: str = "embedded"
    jobmanager: str = "127.0.0.1:8081"  # REST endpoint, used when mode = "remote"
    parallelism: int = 1
    window_ns: int = 100_000_000
    checkpoint_interval_ns: int = 500_000_000
    # Options for the JVM that `p4bs jobs run|submit` starts (PyFlink's JVM_ARGS): with an
    # embedded job it also runs the job.
    jvm_args: str = ""


@dataclass(frozen=True)
class MetricsConfig:
    """The metrics and SLA jobs' constants (streaming-jobs/README.md says how each is used).
    EWMA weights are the weight of the past: new = alpha * old + (1 - alpha) * sample."""

    max_out_of_orderness_ns: int = 200_000_000  # watermark delay behind the newest record
    source_idle_timeout_ns: int = 1_000_000_000  # a topic partition this quiet is idle
    srtt_alpha: float = 0.875
    loss_alpha: float = 0.875
    queue_delay_alpha: float = 0.875
    rtt_min_horizon_ns: int = 10_000_000_000
    long_flow_ttl_ns: int = 10_000_000_000  # a long flow with no RTT sample this long ends
    zscore_lag: int = 50  # windows
    zscore_threshold: float = 10.0
    zscore_influence: float = 0.1
    sla_windows: int = 5  # K: consecutive windows to raise or to resolve an SLA alert


@dataclass(frozen=True)
class AlertsConfig:
    """Where the alert dispatcher posts SLA alerts (Prometheus Alertmanager v2 API)."""

    webhook: str | None = None  # e.g. http://alertmanager:9093/api/v2/alerts; None: not posted
    timeout_ns: int = 5_000_000_000
    attempts: int = 6  # per alert, then it is counted as failed and logged
    backoff_ns: int = 1_000_000_000  # before the second attempt, doubling up to 30 s


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer service (optimizer/README.md): its consumer group, where it keeps each
    link's state, and the safety guards every link gets."""

    group: str = "p4bs-optimizer"  # Kafka consumer group; processes in it share the links
    # A process that stops heartbeating this long loses its links to the others; Kafka
    # brokers accept 6 s to 30 min by default (group.min/max.session.timeout.ms).
    session_timeout_ns: int = 6_000_000_000
    stale_after_ns: int = 5_000_000_000  # no metrics this long: fall back to the safe buffer
    min_change_interval_ns: int = 1_000_000_000  # between two changes of one link's buffer
    apply_attempts: int = 3  # per change, with backoff between them (transient failures only)
    fit_processes: int = 0  # processes fitting P4BS's GPs; 0: one per core


LONG_FLOW_MODES = ("sketch", "window")


@dataclass(frozen=True)
class DataplaneConfig:
    """The data plane's sizes, thresholds and timeouts (p4/SPEC.md; defaults are the spec's)."""

    rtt_slots: int = 65_536
    rtt_max_age_ns: int = 1_000_000_000
    rtt_min_interval_ns: int = 0  # per-flow sampling limit; 0 = off
    long_flows: str = "sketch"  # P4BS count-min sketch, or GLOBECOM's packet "window"
    cms_rows: int = 4
    cms_width: int = 65_536
    cms_reset_ns: int = 10_000_000_000
    long_flow_threshold: int = 2000  # packets within one sketch period
    long_flow_ttl_ns: int = 2_000_000_000
    long_flow_capacity: int = 65_536
    window_ns: int = 1_000_000_000
    window_packets: int = 1000
    loss_slots: int = 65_536
    qdelay_slots: int = 65_536
    qdelay_max_age_ns: int = 1_000_000_000
    export_interval_ns: int = 100_000_000
    # An interval's RTT samples travel in its LinkCounters record; one with more comes in
    # several (about 8 bytes a sample and 40 a flow: 8192 keep a record far below Kafka's 1 MB).
    max_rtt_samples_per_record: int = 8192


@dataclass(frozen=True)
class SwitchConfig:
    name: str
    target: str
    address: str | None  # bfrt gRPC endpoint for a Tofino; unused by the software model
    device_id: int = 0


@dataclass(frozen=True)
class RouterConfig:
    name: str
    driver: str
    address: str | None  # host:port of the management interface; None for local linux-tc
    username: SecretRef | None
    password: SecretRef | None
    ca_file: str | None
    timeout_ns: int
    max_concurrent_changes: int
    # gNMI with mutual TLS: the certificate the client presents and its private key, files
    # named by path (the key is a secret: it stays in its file). Both or neither.
    client_cert: str | None = None
    client_key: str | None = None


Port = int | str  # a Tofino front-panel port, or an interface the software model captures


@dataclass(frozen=True)
class DirectedTap:
    """A tap point captured on one port per direction, as an optical tap gives each fibre
    its own port: `out` carries the data direction, `back` the other one (the ACKs)."""

    out: Port
    back: Port


# One port carrying both directions (the link's output_prefixes tell them apart), or one
# port per direction.
Tap = Port | DirectedTap
TAP_SIDES = ("before", "after")


def tap_ports(tap: Tap) -> list[tuple[Port, str]]:
    """The ports of one tap point, each with the direction it carries: 'out', 'back' or
    'both'."""
    if isinstance(tap, DirectedTap):
        return [(tap.out, "out"), (tap.back, "back")]
    return [(tap, "both")]


@dataclass(frozen=True)
class JunosLinkConfig:
    """How a link's buffer is configured on a Junos router (the netconf-junos driver):
    `class-of-service schedulers <scheduler> buffer-size temporal <µs>`, the scheduler-map
    `<scheduler_map> forwarding-class <forwarding_class> scheduler <scheduler>`, and
    `class-of-service interfaces <interface> scheduler-map <scheduler_map>`."""

    interface: str  # the router's name for the link's interface ("et-0/0/0")
    scheduler: str
    scheduler_map: str
    forwarding_class: str


JUNOS_DEFAULT_FORWARDING_CLASS = "best-effort"  # Junos's default class of queue 0
JUNOS_NAME_MAX = 64  # scheduler, scheduler-map and forwarding-class names (the Junos YANG)


def junos_defaults(interface: str) -> JunosLinkConfig:
    """A link's Junos names when the config gives none: p4bs-<interface> with '/', '.' and
    ':' as '-' (et-0/0/0.0 -> p4bs-et-0-0-0-0), for both the scheduler and its map."""
    name = "p4bs-" + "".join("-" if c in "/.:" else c for c in interface)
    return JunosLinkConfig(interface, name, name, JUNOS_DEFAULT_FORWARDING_CLASS)


@dataclass(frozen=True)
class LinkConfig:
    router: str
    interface: str
    switch: str
    capacity_bps: int
    tap_before: Tap  # what enters the router
    tap_after: Tap  # what left it
    max_queue_delay_ns: int  # SLA d-hat
    max_loss: float  # SLA p-hat, a fraction
    weight_loss: float  # w1 of f
    weight_delay: float  # w2 of f
    min_buffer_bytes: int
    max_buffer_bytes: int
    safe_buffer_bytes: int
    # The optimizer owns the policies (p4bs_optimizer.policies): it checks the name and the
    # options, in `p4bs config check` and before `p4bs optimizer run` starts.
    policy: str
    policy_options: dict[str, Any]
    # IPv4 prefixes reached through `interface`: on a tap carrying both directions, a packet
    # towards one of them is in the data (output) direction. Empty: every packet is.
    output_prefixes: tuple[str, ...] = ()
    # Set for a link of a netconf-junos router (defaults from the interface's name).
    junos: JunosLinkConfig | None = None

    @property
    def id(self) -> str:
        """The link id every record is keyed by: router and interface."""
        return f"{self.router}:{self.interface}"

    def f_terms(self, loss: float, delay_ns: float) -> tuple[float, float]:
        """The loss and delay terms, positive, of the performance function of a window with
        loss rate `loss` and mean queueing delay `delay_ns`: f = -(loss term + delay term),
        as the metrics job computes it (LinkMetrics.java)."""
        return (
            self.weight_loss * loss / self.max_loss,
            self.weight_delay * delay_ns / self.max_queue_delay_ns,
        )

    def ports(self) -> list[tuple[str, Port, str]]:
        """Every port of the link's taps: (side 'before'/'after', port, direction)."""
        taps = (self.tap_before, self.tap_after)
        return [
            (side, port, direction)
            for side, tap in zip(TAP_SIDES, taps, strict=True)
            for port, direction in tap_ports(tap)
        ]


@dataclass(frozen=True)
class FlowGroup:
    """Long flows of one kind in the emulated testbed, sent from their own address."""

    name: str
    flows: int
    cca: str
    start_ns: int  # after the traffic starts
    rtt_ns: int | None  # fixed base RTT of the group; None: testbed base + per-flow extra


@dataclass(frozen=True)
class TestbedConfig:
    """The emulated testbed that plays one link's router (infra/)."""

    name: str  # prefix of its network namespaces
    link: str  # id of the link whose router it emulates
    buffer_bytes: int  # router buffer at start
    base_rtt_ns: int
    extra_delay_max_ns: int  # per-flow extra RTT, uniform in [0, this] by 5-tuple hash
    groups: tuple[FlowGroup, ...]


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig
    influxdb: InfluxConfig
    flink: FlinkConfig
    switches: tuple[SwitchConfig, ...]
    routers: tuple[RouterConfig, ...]
    links: tuple[LinkConfig, ...]
    testbed: TestbedConfig | None = None
    dataplane: DataplaneConfig = field(default_factory=DataplaneConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)

    def link(self, link_id: str) -> LinkConfig:
        for link in self.links:
            if link.id == link_id:
                return link
        raise KeyError(link_id)


class _DependsOnBadField(Exception):
    """A value that cannot be checked because a field it depends on was already reported."""


class _Reader:
    """Walks the parsed TOML, remembering the path of each value for error messages."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._path: list[str] = []

    @contextmanager
    def at(self, name: str) -> Iterator[None]:
        self._path.append(name)
        try:
            yield
        finally:
            self._path.pop()

    def where(self, name: str | None = None) -> str:
        parts = [*self._path, name] if name else self._path
        return ".".join(parts).replace(".[", "[")

    def problem(self, name: str | None, message: str) -> None:
        self.problems.append(f"{self.where(name)}: {message}")

    def table(self, data: Any, name: str) -> dict[str, Any]:
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.problem(name, f"must be a table, got {type(value).__name__}")
            return {}
        return value

    def tables(self, data: dict[str, Any], name: str) -> list[dict[str, Any]]:
        value = data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.problem(name, f"must be an array of tables ([[{name}]])")
            return []
        return value

    def unknown(self, data: dict[str, Any], known: set[str]) -> None:
        for key in sorted(set(data) - known):
            self.problem(key, f"unknown field (known: {', '.join(sorted(known))})")

    def get(
        self,
        data: dict[str, Any],
        name: str,
        convert: Callable[[Any], T],
        default: T | None = None,
        *,
        required: bool = False,
    ) -> T | None:
        if name not in data:
            if required:
                self.problem(name, "is required")
            return default
        try:
            return convert(data[name])
        except _DependsOnBadField:
            return default
        except (UnitError, ValueError, TypeError) as exc:
            self.problem(name, str(exc))
            return default


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return str(value)

    return convert


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be an integer in [{low}, {high}], got {value!r}")
        return value

    return convert


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"must be a fraction strictly between 0 and 1, got {value!r}")
    return float(value)


def _weight(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"must be a non-negative number, got {value!r}")
    return float(value)


def _positive(parse: Callable[[Any], int], what: str) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        result = parse(value)
        if result <= 0:
            raise ValueError(f"{what} must be positive, got {value!r}")
        return result

    return convert


def _non_negative(parse: Callable[[Any], int], what: str) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        result = parse(value)
        if result < 0:
            raise ValueError(f"{what} must not be negative, got {value!r}")
        return result

    return convert


def _endpoint(value: Any) -> str:
    text = _text(value)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be host:port with a port in 1..65535, got {value!r}")
    return text


def _url(value: Any) -> str:
    text = _text(value)
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return text.rstrip("/")


def _secret(value: Any) -> SecretRef:
    if isinstance(value, str):
        raise ValueError(
            'credentials are never written in the config; use { env = "VAR" } or { file = "/path" }'
        )
    if not isinstance(value, dict) or len(value) != 1 or not set(value) <= {"env", "file"}:
        raise ValueError(f'must be {{ env = "VAR" }} or {{ file = "/path" }}, got {value!r}')
    ((kind, ref),) = value.items()
    return SecretRef(**{kind: _text(ref)})


def _port(value: Any) -> Port:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"must be a switch port number or an interface name, got {value!r}")
    return value


def _tap(value: Any) -> Tap:
    if not isinstance(value, dict):
        return _port(value)
    if set(value) != {"out", "back"}:
        raise ValueError(
            "must be one port carrying both directions, or { out = PORT, back = PORT } "
            f"(one port per direction), got {value!r}"
        )
    out, back = _port(value["out"]), _port(value["back"])
    if out == back:
        raise ValueError(f"out and back must be different ports, got {out!r} for both")
    return DirectedTap(out=out, back=back)


def _read_kafka(r: _Reader, data: dict[str, Any]) -> KafkaConfig:
    d = KafkaConfig()
    known = {"bootstrap", "partitions", "replication_factor", "topics", "security"}
    secured = {"sasl_mechanism", "ca_file", "username", "password"}
    r.unknown(data, known | secured)
    security = r.get(data, "security", _one_of(KAFKA_SECURITY), d.security) or d.security
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
                topics[stream] = r.get(overrides, stream, _text, topics[stream]) or topics[stream]
    if len(set(topics.values())) != len(topics):
        r.problem("topics", "two streams share one topic name")
    return KafkaConfig(
        bootstrap=r.get(data, "bootstrap", _endpoint, d.bootstrap) or d.bootstrap,
        partitions=r.get(data, "partitions", _int_in(1, 10_000), d.partitions) or d.partitions,
        replication_factor=r.get(data, "replication_factor", _int_in(1, 32), 1) or 1,
        topics=topics,
        security=security,
        sasl_mechanism=r.get(data, "sasl_mechanism", _one_of(SASL_MECHANISMS), d.sasl_mechanism)
        or d.sasl_mechanism,
        ca_file=r.get(data, "ca_file", _text),
        username=r.get(data, "username", _secret, required=security == "sasl_ssl"),
        password=r.get(data, "password", _secret, required=security == "sasl_ssl"),
    )


def _read_influx(r: _Reader, data: dict[str, Any]) -> InfluxConfig:
    d = InfluxConfig()
    durations = ("retention", "retention_1s", "retention_1m", "events_retention")
    r.unknown(data, {"url", "database", "username", "password", *durations})
    kept: dict[str, int] = {}
    for key in durations:
        kept[key] = r.get(data, key, parse_duration_ns, getattr(d, f"{key}_ns")) or 0
        if 0 < kept[key] < 3_600_000_000_000:
            r.problem(key, "InfluxDB keeps data at least 1h; use 0 for forever or >= 1h")
    return InfluxConfig(
        url=r.get(data, "url", _url, d.url) or d.url,
        database=r.get(data, "database", _text, d.database) or d.database,
        retention_ns=kept["retention"],
        retention_1s_ns=kept["retention_1s"],
        retention_1m_ns=kept["retention_1m"],
        events_retention_ns=kept["events_retention"],
        username=r.get(data, "username", _secret),
        password=r.get(data, "password", _secret),
    )


def _read_flink(r: _Reader, data: dict[str, Any]) -> FlinkConfig:
    d = FlinkConfig()
    r.unknown(
        data, {"mode", "jobmanager", "parallelism", "window", "checkpoint_interval", "jvm_args"}
    )
    window = _positive(parse_duration_ns, "the window")
    interval = _positive(parse_duration_ns, "the checkpoint interval")
    return FlinkConfig(
        mode=r.get(data, "mode", _one_of(FLINK_MODES), d.mode) or d.mode,
        jobmanager=r.get(data, "jobmanager", _endpoint, d.jobmanager) or d.jobmanager,
        parallelism=r.get(data, "parallelism", _int_in(1, 1024), d.parallelism) or 1,
        window_ns=r.get(data, "window", window, d.window_ns) or d.window_ns,
        checkpoint_interval_ns=r.get(data, "checkpoint_interval", interval, None)
        or d.checkpoint_interval_ns,
        jvm_args=r.get(data, "jvm_args", _text, d.jvm_args) or d.jvm_args,
    )


def _read_metrics(r: _Reader, data: dict[str, Any]) -> MetricsConfig:
    d = MetricsConfig()
    durations = {
        "max_out_of_orderness": "max_out_of_orderness_ns",
        "source_idle_timeout": "source_idle_timeout_ns",
        "rtt_min_horizon": "rtt_min_horizon_ns",
        "long_flow_ttl": "long_flow_ttl_ns",
    }
    alphas = ("srtt_alpha", "loss_alpha", "queue_delay_alpha", "zscore_influence")
    r.unknown(data, {*durations, *alphas, "zscore_lag", "zscore_threshold", "sla_windows"})
    values: dict[str, Any] = {}
    for key, attr in durations.items():
        values[attr] = r.get(data, key, _positive(parse_duration_ns, key), getattr(d, attr))
    for key in alphas:
        values[key] = r.get(data, key, _fraction, getattr(d, key))
    values["zscore_lag"] = r.get(data, "zscore_lag", _int_in(2, 100_000), d.zscore_lag)
    values["zscore_threshold"] = r.get(data, "zscore_threshold", _weight, d.zscore_threshold)
    values["sla_windows"] = r.get(data, "sla_windows", _int_in(1, 100_000), d.sla_windows)
    if any(v is None for v in values.values()):
        return d
    return MetricsConfig(**values)


def _read_alerts(r: _Reader, data: dict[str, Any]) -> AlertsConfig:
    d = AlertsConfig()
    r.unknown(data, {"webhook", "timeout", "attempts", "backoff"})
    timeout = r.get(data, "timeout", _positive(parse_duration_ns, "the timeout"), d.timeout_ns)
    backoff = r.get(data, "backoff", _positive(parse_duration_ns, "the backoff"), d.backoff_ns)
    return AlertsConfig(
        webhook=r.get(data, "webhook", _url, None),
        timeout_ns=timeout or d.timeout_ns,
        attempts=r.get(data, "attempts", _int_in(1, 1000), d.attempts) or d.attempts,
        backoff_ns=backoff or d.backoff_ns,
    )


def _read_optimizer(r: _Reader, data: dict[str, Any]) -> OptimizerConfig:
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
        },
    )
    session = r.get(data, "session_timeout", _positive(parse_duration_ns, "session_timeout"), None)
    stale = r.get(data, "stale_after", _positive(parse_duration_ns, "stale_after"), None)
    interval = r.get(
        data, "min_change_interval", _positive(parse_duration_ns, "the interval"), None
    )
    return OptimizerConfig(
        group=r.get(data, "group", _text, d.group) or d.group,
        session_timeout_ns=session or d.session_timeout_ns,
        stale_after_ns=stale or d.stale_after_ns,
        min_change_interval_ns=interval or d.min_change_interval_ns,
        apply_attempts=r.get(data, "apply_attempts", _int_in(1, 100), d.apply_attempts)
        or d.apply_attempts,
        fit_processes=r.get(data, "fit_processes", _int_in(0, 1024), d.fit_processes) or 0,
    )


def _power_of_two(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2 or value > 2**24:
        raise ValueError(f"must be an integer in [2, 2^24], got {value!r}")
    if value & (value - 1):
        raise ValueError(f"must be a power of two (hash tables index by low bits), got {value}")
    return value


# Fields of [dataplane] a release stopped reading, and what took their place.
RETIRED_DATAPLANE_FIELDS = {
    "rtt_batch_interval": "RTT samples travel in their export interval's LinkCounters record "
    "(export_interval)",
    "rtt_batch_max_samples": "renamed max_rtt_samples_per_record",
}


def _read_dataplane(r: _Reader, data: dict[str, Any]) -> DataplaneConfig:
    d = DataplaneConfig()
    durations = {
        "rtt_max_age": "rtt_max_age_ns",
        "cms_reset": "cms_reset_ns",
        "long_flow_ttl": "long_flow_ttl_ns",
        "window": "window_ns",
        "qdelay_max_age": "qdelay_max_age_ns",
        "export_interval": "export_interval_ns",
    }
    slots = ("rtt_slots", "cms_width", "loss_slots", "qdelay_slots")
    counts = {
        "cms_rows": (1, 4),
        "long_flow_threshold": (1, 2**31),
        "long_flow_capacity": (1, 2**24),
        "window_packets": (1, 2**31),
        # Kafka's default largest record is 1 MB: 16,384 samples of as many flows take 0.8 MB.
        "max_rtt_samples_per_record": (1, 16_384),
    }
    for old, new in RETIRED_DATAPLANE_FIELDS.items():
        if old in data:
            r.problem(old, f"no longer read: {new}")
    known = {*durations, *slots, *counts, "rtt_min_interval", "long_flows"}
    r.unknown({k: v for k, v in data.items() if k not in RETIRED_DATAPLANE_FIELDS}, known)
    values: dict[str, Any] = {}
    for key, attr in durations.items():
        values[attr] = r.get(data, key, _positive(parse_duration_ns, key), getattr(d, attr))
    values["rtt_min_interval_ns"] = r.get(
        data, "rtt_min_interval", _non_negative(parse_duration_ns, "the interval"), 0
    )
    for key in slots:
        values[key] = r.get(data, key, _power_of_two, getattr(d, key))
    for key, (low, high) in counts.items():
        values[key] = r.get(data, key, _int_in(low, high), getattr(d, key))
    values["long_flows"] = r.get(data, "long_flows", _one_of(LONG_FLOW_MODES), d.long_flows)
    if any(v is None for v in values.values()):
        return d
    return DataplaneConfig(**values)


def _ipv4_prefixes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of IPv4 prefixes, got {value!r}")
    prefixes = []
    for item in value:
        try:
            prefixes.append(str(ipaddress.IPv4Network(item, strict=True)))
        except (ValueError, TypeError):
            raise ValueError(f"{item!r} is not an IPv4 prefix like 10.0.0.0/24") from None
    return tuple(prefixes)


def _read_switch(r: _Reader, data: dict[str, Any]) -> SwitchConfig:
    r.unknown(data, {"name", "target", "address", "device_id"})
    target = r.get(data, "target", _one_of(SWITCH_TARGETS), required=True) or "model"
    address = r.get(data, "address", _endpoint, required=target == "tofino")
    return SwitchConfig(
        name=r.get(data, "name", _text, required=True) or "",
        target=target,
        address=address,
        device_id=r.get(data, "device_id", _int_in(0, 255), 0) or 0,
    )


def _netns_address(value: Any) -> str:
    """A local linux-tc router in another network namespace: "netns:NAME"."""
    text = _text(value)
    if not text.startswith("netns:") or not text[len("netns:") :].strip():
        raise ValueError(f'a linux-tc router is local: omit it, or "netns:NAME", got {value!r}')
    return text


def _read_router(r: _Reader, data: dict[str, Any]) -> RouterConfig:
    known = {"name", "driver", "address", "username", "password", "ca_file", "timeout"}
    r.unknown(data, known | {"max_concurrent_changes", "client_cert", "client_key"})
    driver = r.get(data, "driver", _one_of(ROUTER_DRIVERS), required=True) or "linux-tc"
    remote = driver != "linux-tc"
    timeout = _positive(parse_duration_ns, "the timeout")
    client_cert = r.get(data, "client_cert", _text)
    client_key = r.get(data, "client_key", _text)
    for given, needed in (("client_cert", "client_key"), ("client_key", "client_cert")):
        if given in data and needed not in data:
            r.problem(needed, f"is required with {given}")
    if "client_cert" in data and driver != "gnmi":
        r.problem(
            "client_cert", f"only the gnmi driver presents a client certificate, not {driver}"
        )
    return RouterConfig(
        name=r.get(data, "name", _text, required=True) or "",
        driver=driver,
        address=r.get(data, "address", _endpoint if remote else _netns_address, required=remote),
        username=r.get(data, "username", _secret, required=remote),
        password=r.get(data, "password", _secret, required=remote),
        ca_file=r.get(data, "ca_file", _text),
        timeout_ns=r.get(data, "timeout", timeout, 10_000_000_000) or 10_000_000_000,
        max_concurrent_changes=r.get(data, "max_concurrent_changes", _int_in(1, 64), 1) or 1,
        client_cert=client_cert,
        client_key=client_key,
    )


def _buffer_value(capacity_bps: int | None) -> Callable[[Any], int]:
    """A buffer is a size ('256KiB') or a time of line rate ('200ms'), as routers take it."""

    def convert(value: Any) -> int:
        if isinstance(value, str) and value.strip().rstrip("0123456789. ").lower() == "":
            raise ValueError(f"a bare number string {value!r} is ambiguous; add a unit")
        try:
            size = parse_size_bytes(value)
        except UnitError:
            if capacity_bps is None:
                raise _DependsOnBadField from None
            size = bytes_for_duration(parse_duration_ns(value), capacity_bps)
        if size <= 0:
            raise ValueError(f"must be positive, got {value!r}")
        return size

    return convert


def _junos_name(value: Any) -> str:
    """A Junos configuration name: 1..64 characters, no spaces or quotes."""
    text = _text(value)
    if len(text) > JUNOS_NAME_MAX or any(c.isspace() or c in "\"'" for c in text):
        raise ValueError(
            f"must be 1..{JUNOS_NAME_MAX} characters without spaces or quotes, got {value!r}"
        )
    return text


def _read_junos(r: _Reader, data: dict[str, Any], interface: str | None) -> JunosLinkConfig | None:
    """The link's `junos` table; every field optional (see junos_defaults)."""
    with r.at("junos"):
        table = r.table(data, "junos")
        r.unknown(table, {"interface", "scheduler", "scheduler_map", "forwarding_class"})
        given = {k: r.get(table, k, _junos_name) for k in table}
    if interface is None:
        return None
    defaults = junos_defaults(str(given.get("interface") or interface))
    return JunosLinkConfig(
        interface=given.get("interface") or defaults.interface,
        scheduler=given.get("scheduler") or defaults.scheduler,
        scheduler_map=given.get("scheduler_map") or defaults.scheduler_map,
        forwarding_class=given.get("forwarding_class") or defaults.forwarding_class,
    )


def _read_link(r: _Reader, data: dict[str, Any]) -> LinkConfig | None:
    known = {"router", "interface", "switch", "capacity", "taps", "sla", "weights", "buffer"}
    r.unknown(data, known | {"policy", "policy_options", "output_prefixes", "junos"})
    output_prefixes = r.get(data, "output_prefixes", _ipv4_prefixes)
    capacity = r.get(data, "capacity", _positive(parse_rate_bps, "the capacity"), required=True)
    with r.at("taps"):
        taps = r.table(data, "taps")
        r.unknown(taps, {"before", "after"})
        before = r.get(taps, "before", _tap, required=True)
        after = r.get(taps, "after", _tap, required=True)
    with r.at("sla"):
        sla = r.table(data, "sla")
        r.unknown(sla, {"max_queue_delay", "max_loss"})
        d_hat = r.get(sla, "max_queue_delay", _positive(parse_duration_ns, "d-hat"), required=True)
        p_hat = r.get(sla, "max_loss", _fraction, required=True)
    with r.at("weights"):
        weights = r.table(data, "weights")
        r.unknown(weights, {"loss", "delay"})
        w_loss = r.get(weights, "loss", _weight, 0.5)
        w_delay = r.get(weights, "delay", _weight, 0.5)
        if w_loss == 0 and w_delay == 0:
            r.problem(None, "loss and delay weights cannot both be 0")
    with r.at("buffer"):
        buf = r.table(data, "buffer")
        r.unknown(buf, {"min", "max", "safe"})
        convert = _buffer_value(capacity)
        low = r.get(buf, "min", convert, required=True)
        high = r.get(buf, "max", convert, required=True)
        safe = r.get(buf, "safe", convert, required=True)
        if low is not None and high is not None and low > high:
            r.problem("min", f"{low} B is above max {high} B")
        if safe is not None and low is not None and high is not None and not low <= safe <= high:
            r.problem("safe", f"{safe} B is outside [min, max] = [{low}, {high}] B")
    options = r.table(data, "policy_options")
    fields = (
        r.get(data, "router", _text, required=True),
        r.get(data, "interface", _text, required=True),
        r.get(data, "switch", _text, required=True),
        r.get(data, "policy", _text, required=True),
    )
    values = (capacity, before, after, d_hat, p_hat, w_loss, w_delay, low, high, safe)
    junos = _read_junos(r, data, fields[1])
    if any(v is None for v in fields + values):
        return None
    router, interface, switch, policy = (str(v) for v in fields)
    assert capacity and d_hat and p_hat and low and high and safe
    assert before is not None and after is not None
    assert w_loss is not None and w_delay is not None
    return LinkConfig(
        router=router,
        interface=interface,
        switch=switch,
        capacity_bps=capacity,
        tap_before=before,
        tap_after=after,
        max_queue_delay_ns=d_hat,
        max_loss=p_hat,
        weight_loss=w_loss,
        weight_delay=w_delay,
        min_buffer_bytes=low,
        max_buffer_bytes=high,
        safe_buffer_bytes=safe,
        policy=policy,
        policy_options=options,
        output_prefixes=output_prefixes or (),
        junos=junos,
    )


def _namespace_prefix(value: Any) -> str:
    text = _text(value)
    if not (text.isascii() and text.replace("-", "").isalnum() and len(text) <= 8):
        raise ValueError(f"must be up to 8 letters, digits or '-', got {value!r}")
    return text


def _read_group(r: _Reader, data: dict[str, Any]) -> FlowGroup | None:
    r.unknown(data, {"name", "flows", "cca", "start", "rtt"})
    name = r.get(data, "name", _text, required=True)
    flows = r.get(data, "flows", _int_in(0, 1000), required=True)
    cca = r.get(data, "cca", _one_of(CCAS), "cubic")
    start = r.get(data, "start", _non_negative(parse_duration_ns, "the start"), 0)
    rtt = r.get(data, "rtt", _positive(parse_duration_ns, "the RTT"))
    if name is None or flows is None or cca is None or start is None:
        return None
    return FlowGroup(name=name, flows=flows, cca=cca, start_ns=start, rtt_ns=rtt)


def _read_testbed(
    r: _Reader, data: dict[str, Any], links: tuple[LinkConfig, ...], link_ids: set[str]
) -> TestbedConfig | None:
    r.unknown(data, {"name", "link", "buffer", "base_rtt", "extra_delay_max", "groups"})
    link_id = r.get(data, "link", _text, required=True)
    link = next((x for x in links if x.id == link_id), None)
    if link_id is not None and link_id not in link_ids:  # a listed but broken link is reported
        r.problem("link", f"no link {link_id!r} in [[links]] (ids are router:interface)")
    capacity = link.capacity_bps if link else None
    buffer = r.get(data, "buffer", _buffer_value(capacity), None)
    base_rtt = r.get(data, "base_rtt", _positive(parse_duration_ns, "the base RTT"), 20_000_000)
    extra = r.get(
        data, "extra_delay_max", _non_negative(parse_duration_ns, "the delay"), 15_000_000
    )
    groups = []
    for i, item in enumerate(r.tables(data, "groups")):
        with r.at(f"groups[{i}]"):
            group = _read_group(r, item)
        if group is not None:
            groups.append(group)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        r.problem("groups", "group names must be unique")
    if link is None or base_rtt is None or extra is None:
        return None
    return TestbedConfig(
        name=r.get(data, "name", _namespace_prefix, "p4bs") or "p4bs",
        link=link.id,
        buffer_bytes=buffer or bytes_for_duration(200_000_000, link.capacity_bps),
        base_rtt_ns=base_rtt,
        extra_delay_max_ns=extra,
        groups=tuple(groups) or (FlowGroup("all", 10, "cubic", 0, None),),
    )


def _junos_only_where_used(
    r: _Reader,
    links: tuple[LinkConfig, ...],
    raw_links: list[dict[str, Any]],
    routers: tuple[RouterConfig, ...],
) -> tuple[LinkConfig, ...]:
    """A link's Junos names belong to a netconf-junos router: a `junos` table elsewhere is a
    mistake, and other links carry none."""
    drivers = {router.name: router.driver for router in routers}
    for i, raw in enumerate(raw_links):
        driver = drivers.get(str(raw.get("router")))
        if "junos" in raw and driver is not None and driver != "netconf-junos":
            r.problem(
                f"links[{i}].junos",
                f"only for a netconf-junos router; router {raw.get('router')!r} uses {driver}",
            )
    return tuple(
        link
        if drivers.get(link.router) == "netconf-junos"
        else dataclasses.replace(link, junos=None)
        for link in links
    )


def _check_references(r: _Reader, config: Config) -> None:
    switches = {s.name: s for s in config.switches}
    routers = {x.name for x in config.routers}
    for kind, names in (("switches", [s.name for s in config.switches]), ("routers", routers)):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                r.problem(kind, f"name {name!r} is used twice")
            seen.add(name)
    seen_links: set[str] = set()
    switch_ports: dict[str, dict[Port, str]] = {}  # per switch: port -> the tap that has it
    for i, link in enumerate(config.links):
        with r.at(f"links[{i}]"):
            if link.id in seen_links:
                r.problem(None, f"link {link.id!r} is defined twice")
            seen_links.add(link.id)
            if link.router not in routers:
                r.problem("router", f"no router named {link.router!r} in [[routers]]")
            switch = switches.get(link.switch)
            if switch is None:
                r.problem("switch", f"no switch named {link.switch!r} in [[switches]]")
                continue
            _check_taps(r, link, switch, switch_ports.setdefault(switch.name, {}))


def _check_taps(r: _Reader, link: LinkConfig, switch: SwitchConfig, taken: dict[Port, str]) -> None:
    """A link's tap ports on its switch: of the switch's kind, each used once on the switch,
    and its data direction told apart (a Tofino port carrying both directions needs the
    link's output_prefixes; without them the program would count every packet as `out`,
    see no ACK and measure no RTT)."""
    for side, port, direction in link.ports():
        where = f"taps.{side}" if direction == "both" else f"taps.{side}.{direction}"
        if switch.target == "tofino" and not (
            isinstance(port, int) and 0 <= port <= TOFINO_MAX_PORT
        ):
            r.problem(where, f"a Tofino tap is a port 0..{TOFINO_MAX_PORT}")
        if switch.target == "model" and not isinstance(port, str):
            r.problem(where, "a software-model tap is an interface name")
        if port in taken:
            r.problem(where, f"port {port!r} is already {taken[port]} on switch {switch.name!r}")
        else:
            taken[port] = f"{where} of link {link.id!r}"
        if switch.target == "tofino" and direction == "both" and not link.output_prefixes:
            r.problem(
                where,
                f"port {port} carries both directions and the link has no output_prefixes, "
                "so its data direction cannot be told: list the prefixes reached through "
                f"the interface in output_prefixes, or give one port per direction "
                f"(taps.{side} = {{ out = PORT, back = PORT }})",
            )


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    r = _Reader()
    sections = {
        "kafka",
        "influxdb",
        "flink",
        "dataplane",
        "metrics",
        "alerts",
        "optimizer",
        "switches",
        "routers",
        "links",
    }
    r.unknown(data, sections | {"testbed"})
    with r.at("kafka"):
        kafka = _read_kafka(r, r.table(data, "kafka"))
    with r.at("influxdb"):
        influx = _read_influx(r, r.table(data, "influxdb"))
    with r.at("flink"):
        flink = _read_flink(r, r.table(data, "flink"))
    with r.at("dataplane"):
        dataplane = _read_dataplane(r, r.table(data, "dataplane"))
    with r.at("metrics"):
        metrics = _read_metrics(r, r.table(data, "metrics"))
    with r.at("alerts"):
        alerts = _read_alerts(r, r.table(data, "alerts"))
    with r.at("optimizer"):
        optimizer = _read_optimizer(r, r.table(data, "optimizer"))
    if flink.window_ns % dataplane.export_interval_ns:
        # A window then holds whole export intervals, each one record (or its parts).
        r.problem(
            "flink.window",
            f"must be a multiple of dataplane.export_interval ({dataplane.export_interval_ns} "
            f"ns), got {flink.window_ns} ns",
        )

    tables = {name: r.tables(data, name) for name in ("switches", "routers", "links")}

    def each(name: str, read: Callable[[_Reader, dict[str, Any]], T | None]) -> tuple[T, ...]:
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
    routers = each("routers", _read_router)
    links = _junos_only_where_used(r, each("links", _read_link), raw_links, routers)
    testbed = None
    if "testbed" in data and raw_links:
        link_ids = {f"{x.get('router')}:{x.get('interface')}" for x in raw_links}
        with r.at("testbed"):
            testbed = _read_testbed(r, r.table(data, "testbed"), links, link_ids)
    config = Config(
        kafka=kafka,
        influxdb=influx,
        flink=flink,
        switches=each("switches", _read_switch),
        routers=routers,
        links=links,
        testbed=testbed,
        dataplane=dataplane,
        metrics=metrics,
        alerts=alerts,
        optimizer=optimizer,
    )
    _check_references(r, config)
    if r.problems:
        raise ConfigError(source, r.problems)
    return config


def link_from_table(config: Config, table: dict[str, Any], source: str) -> LinkConfig:
    """One [[links]] entry (as tomllib reads it) read as `load_config` reads it, and checked
    against `config`'s routers, switches and other links (it replaces the link of its id).
    Raises ConfigError listing every problem."""
    r = _Reader()
    with r.at("links[0]"):
        link = _read_link(r, table)
    if link is not None:
        (link,) = _junos_only_where_used(r, (link,), [table], config.routers)
        others = tuple(x for x in config.links if x.id != link.id)
        _check_references(r, dataclasses.replace(config, links=(*others, link)))
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


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def config_toml(data: dict[str, Any]) -> str:
    """TOML text for a config's raw data (what tomllib read from a file, changed by a
    program): `load_config` of the text reads the same data. Top-level tables and arrays of
    tables are written as sections, anything nested deeper inline."""
    lines = [
        f"{k} = {_toml_value(v)}"
        for k, v in data.items()
        if not isinstance(v, dict) and not _is_tables(v)
    ]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in value.items() if not _is_tables(v)]
            for k, v in value.items():
                if _is_tables(v):
                    for item in v:
                        lines += ["", f"[[{key}.{k}]]"]
                        lines += [f"{ik} = {_toml_value(iv)}" for ik, iv in item.items()]
        elif _is_tables(value):
            for item in value:
                lines += ["", f"[[{key}]]"]
                lines += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
    return "\n".join(lines) + "\n"


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
