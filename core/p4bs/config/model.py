"""The deployment config's model: one frozen dataclass per section, in the system's units (ns,
bytes, bit/s), the vocabularies a section's text field takes, and `ConfigError`. Nothing here
reads a file: `p4bs.config.loader` builds these from TOML."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from p4bs.paths import default_state_dir
from p4bs_schemas.registry import STREAMS, default_topic

ROUTER_DRIVERS = ("gnmi", "netconf", "netconf-junos", "linux-tc")
SWITCH_TARGETS = ("model", "tofino")
FLINK_MODES = ("embedded", "remote")
KAFKA_SECURITY = ("plaintext", "sasl_ssl")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
# The parts that connect to Kafka, each of which may log in as a user of its own
# ([kafka.users.<component>]) with only the ACLs it needs (`p4bs stack acls`): "admin"
# creates topics and sets ACLs, "dashboard" is the dashboard and `p4bs status` (read only),
# "links" is `p4bs links` (the operator's changes to the links topic).
KAFKA_COMPONENTS = ("admin", "exporter", "metrics_job", "optimizer", "sinks", "dashboard", "links")
CCAS = ("cubic", "bbr", "reno")
TOFINO_MAX_PORT = 511
DAY_NS = 86_400_000_000_000


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
class KafkaUser:
    """A SCRAM login of one component."""

    username: SecretRef
    password: SecretRef


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
    # component (KAFKA_COMPONENTS) -> its own login; a component not named logs in as
    # username/password above.
    users: dict[str, KafkaUser] = field(default_factory=dict)

    def for_component(self, component: str) -> KafkaConfig:
        """The settings `component`'s clients connect with: its own user if it has one."""
        if component not in KAFKA_COMPONENTS:
            raise ValueError(f"no Kafka component {component!r} (known: {KAFKA_COMPONENTS})")
        user = self.users.get(component)
        if user is None:
            return self
        return replace(self, username=user.username, password=user.password)


@dataclass(frozen=True)
class InfluxConfig:
    """InfluxDB and how long it keeps what (p4bs/retention.py); a retention of 0 keeps forever."""

    url: str = "http://127.0.0.1:8086"
    database: str = "p4bs"
    retention_ns: int = 0  # every window (the default retention policy)
    retention_1s_ns: int = 30 * DAY_NS  # the windows' per-second summaries
    retention_1m_ns: int = 365 * DAY_NS  # per-minute summaries
    events_retention_ns: int = 365 * DAY_NS  # SLA alerts and buffer decisions
    username: SecretRef | None = None
    password: SecretRef | None = None
    # The CA an https:// url's certificate is verified against; None: the system's (certifi,
    # or $REQUESTS_CA_BUNDLE). A password goes only over https://, or to the loopback.
    ca_file: str | None = None


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
    # The local stack's standalone cluster (mode "remote"): Flink's own Prometheus reporter on
    # this port or range ("9470-9479": the JobManager and each TaskManager one each); "":
    # off. The reporter binds every interface, not the loopback alone (infra/README.md).
    metrics_ports: str = ""


# The policies that decide on the window in hand alone, by default thinned in the optimizer
# feed (the optimizer refuses a link of another policy in a thinned feed).
FEED_POLICIES = ("static", "tiny", "bloated", "bdp", "stanford", "globecom")


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
    # The optimizer feed (streaming-jobs/README.md): a second topic of LinkMetrics that the
    # optimizer reads instead of link_metrics, with every window of a link whose policy needs
    # them all, and for a link whose policy is one of `feed_policies` (policies that decide on
    # the window in hand alone) only the windows that can move its decision and a heartbeat.
    optimizer_feed: bool = False
    feed_policies: tuple[str, ...] = FEED_POLICIES
    # Relative move of SRTT or RTT_min from the previous window that passes a window on.
    feed_deadband: float = 0.02
    # Every window holding a whole multiple of this in (start, end] passes; at most half of
    # optimizer.stale_after, so that a steady link's windows never go stale.
    feed_heartbeat_ns: int = 1_000_000_000

    @property
    def optimizer_stream(self) -> str:
        """The stream the optimizer reads its links' windows from."""
        return "optimizer_feed" if self.optimizer_feed else "link_metrics"


@dataclass(frozen=True)
class AlertsConfig:
    """Where the alert dispatcher posts SLA alerts (Prometheus Alertmanager v2 API)."""

    webhook: str | None = None  # e.g. http://alertmanager:9093/api/v2/alerts; None: not posted
    timeout_ns: int = 5_000_000_000
    attempts: int = 6  # per alert, then it is counted as failed and logged
    backoff_ns: int = 1_000_000_000  # before the second attempt, doubling up to 30 s
    metrics_address: str = "127.0.0.1:9463"  # the dispatcher's Prometheus endpoint; "": none


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
    # One change moves a link's buffer at most this factor up or down (2.0: at most x2 or /2);
    # a larger decision is reached in several changes. 0: no limit.
    max_step_ratio: float = 0.0
    # Changes one router takes per minute, all its links together (over it, changes wait).
    # 0: no limit.
    max_changes_per_router_per_minute: int = 0
    # While this file exists no change is written to any router (`p4bs optimizer freeze`).
    freeze_file: str = field(default_factory=lambda: str(default_state_dir() / "optimizer.freeze"))
    dry_run: bool = False  # decide and record, apply nothing (ORed with --dry-run)
    # The Prometheus endpoint of each process ("": none); a second process on one host
    # takes another port (`p4bs optimizer run --metrics-address`).
    metrics_address: str = "127.0.0.1:9461"


@dataclass(frozen=True)
class SinksConfig:
    """The InfluxDB sink (`p4bs sinks run`)."""

    metrics_address: str = "127.0.0.1:9462"  # its Prometheus endpoint; "": none


@dataclass(frozen=True)
class DashboardConfig:
    """The dashboard (`p4bs dashboard`; its own address, token and TLS are options)."""

    metrics_address: str = "127.0.0.1:9464"  # its Prometheus endpoint; "": none


@dataclass(frozen=True)
class PrometheusConfig:
    """What every Prometheus endpoint ([optimizer], [sinks], [alerts], [dashboard]
    metrics_address) needs on an address beyond the loopback, as the dashboard does: a
    bearer token the scraper sends, and TLS. On the loopback both are optional."""

    token: SecretRef | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


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
    # The switch's exporter's Prometheus endpoint (exporter/README.md); "": none. Loopback
    # only: the endpoint has no token or TLS (p4bs.exposure's rule). A second switch's
    # exporter on one host takes another port.
    metrics_address: str = "127.0.0.1:9465"


# Junos's default confirm-timeout of `commit confirmed` (10 min); Junos takes 1..65535 min.
JUNOS_CONFIRM_WINDOW_NS = 10 * 60_000_000_000
JUNOS_CONFIRM_WINDOW_MAX_NS = 65_535 * 60_000_000_000
# `buffer-size temporal` in µs, per Juniper's "buffer-size (Schedulers)" reference: ranges vary
# by platform (M320 IQ PICs 1..50,000; other IQ PICs 1..100,000; other M Series 1..200,000);
# MX MIC/MPC queues default to 100 ms at 1 Gbit/s and above, 500 ms below. The default is the
# widest listed range; set the platform's with `temporal_range`.
JUNOS_TEMPORAL_RANGE_NS = (1_000, 200_000_000)


# The smallest buffer any link may get: one MTU-sized (1500 B) packet; less holds no packet.
MIN_BUFFER_BYTES = 1500


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
    # netconf and netconf-junos: how long a confirmed commit waits for its confirming commit
    # before the router rolls it back. Junos takes whole minutes (rounded up at the edge).
    confirm_window_ns: int = JUNOS_CONFIRM_WINDOW_NS
    # netconf-junos: the `buffer-size temporal` the platform takes, [low, high] in ns (whole
    # µs); a buffer outside is refused before anything is sent. See JUNOS_TEMPORAL_RANGE_NS.
    temporal_range_ns: tuple[int, int] = JUNOS_TEMPORAL_RANGE_NS
    # What p4bs may change on the router (p4bs.config.authority): the interfaces, as names or
    # globs ('*', '?'), and the bounds of any link's buffer. A parsed config fills them from
    # the file's links where the entry does not give them; None (no bound) only in code.
    interfaces: tuple[str, ...] = ()
    min_buffer_bytes: int = MIN_BUFFER_BYTES
    max_buffer_bytes: int | None = None

    def manages(self, interface: str) -> bool:
        """p4bs may change `interface`'s buffer: one of `interfaces` matches it."""
        return any(fnmatch.fnmatchcase(interface, pattern) for pattern in self.interfaces)


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
    # When its senders stop, after the traffic starts; None: at the traffic's end. Set by
    # eval scenarios (flows that leave); the config's [testbed] groups run to the end.
    stop_ns: int | None = None


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
    sinks: SinksConfig = field(default_factory=SinksConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)

    def for_kafka_component(self, component: str) -> Config:
        """The config as `component` (KAFKA_COMPONENTS) uses it: its clients log in as its
        own Kafka user where [kafka.users] names one."""
        return replace(self, kafka=self.kafka.for_component(component))

    def link(self, link_id: str) -> LinkConfig:
        for link in self.links:
            if link.id == link_id:
                return link
        raise KeyError(link_id)
