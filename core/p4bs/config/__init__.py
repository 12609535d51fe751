"""The deployment config: one TOML file describing switches, routers, links and endpoints.

`load_config(path)` parses and validates the whole file and raises `ConfigError` listing every
problem as `field.path: what is wrong`, so an operator fixes a file in one pass. Values are
converted to the system's units (ns, bytes, bit/s) here and nowhere else; a field that is
absent takes its default, a present one is kept or refused, never replaced.
Credentials never appear in the file: a secret is `{ env = "VAR" }` or `{ file = "/path" }`.

The modules, bottom up: `model` (the dataclasses), `fields` (the reader and the field
converters), `authority` (what each router lets p4bs manage), `services` and `network` (the
sections), `testbed`, `topology` (the cross-checks), `loader` (the whole file). Config
data is written back as TOML by `tomli_w.dumps` (tomllib only reads).
"""

from p4bs.config.loader import link_from_table, load_config, parse_config
from p4bs.config.model import (
    CCAS,
    DAY_NS,
    FEED_POLICIES,
    FLINK_MODES,
    JUNOS_DEFAULT_FORWARDING_CLASS,
    JUNOS_NAME_MAX,
    KAFKA_SECURITY,
    LONG_FLOW_MODES,
    MIN_BUFFER_BYTES,
    ROUTER_DRIVERS,
    SASL_MECHANISMS,
    SWITCH_TARGETS,
    TAP_SIDES,
    TOFINO_MAX_PORT,
    AlertsConfig,
    Config,
    ConfigError,
    DashboardConfig,
    DataplaneConfig,
    DirectedTap,
    FlinkConfig,
    FlowGroup,
    InfluxConfig,
    JunosLinkConfig,
    KafkaConfig,
    LinkConfig,
    MetricsConfig,
    OptimizerConfig,
    Port,
    PrometheusConfig,
    RouterConfig,
    SecretRef,
    SinksConfig,
    SwitchConfig,
    Tap,
    TestbedConfig,
    junos_defaults,
    tap_ports,
)

__all__ = [
    "CCAS",
    "DAY_NS",
    "FEED_POLICIES",
    "FLINK_MODES",
    "JUNOS_DEFAULT_FORWARDING_CLASS",
    "JUNOS_NAME_MAX",
    "KAFKA_SECURITY",
    "LONG_FLOW_MODES",
    "MIN_BUFFER_BYTES",
    "ROUTER_DRIVERS",
    "SASL_MECHANISMS",
    "SWITCH_TARGETS",
    "TAP_SIDES",
    "TOFINO_MAX_PORT",
    "AlertsConfig",
    "Config",
    "ConfigError",
    "DashboardConfig",
    "DataplaneConfig",
    "DirectedTap",
    "FlinkConfig",
    "FlowGroup",
    "InfluxConfig",
    "JunosLinkConfig",
    "KafkaConfig",
    "LinkConfig",
    "MetricsConfig",
    "OptimizerConfig",
    "Port",
    "PrometheusConfig",
    "RouterConfig",
    "SecretRef",
    "SinksConfig",
    "SwitchConfig",
    "Tap",
    "TestbedConfig",
    "junos_defaults",
    "link_from_table",
    "load_config",
    "parse_config",
    "tap_ports",
]
