"""The deployment config: the example passes, each kind of mistake names its field and why."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from p4bs.config import (
    MIN_BUFFER_BYTES,
    ROUTER_DRIVERS,
    ConfigError,
    FlowGroup,
    JunosLinkConfig,
    SecretRef,
    link_from_table,
    load_config,
    parse_config,
)
from p4bs_cli.main import main
from p4bs_optimizer.drivers import DRIVERS


@pytest.fixture
def example(repo: Path) -> dict[str, Any]:
    return tomllib.loads((repo / "config" / "testbed.toml").read_text())


def test_example_config_passes_with_units_converted(repo: Path) -> None:
    config = load_config(repo / "config" / "testbed.toml")
    (link,) = config.links
    assert link.id == "r1:eth1"
    assert link.capacity_bps == 100_000_000
    assert link.max_queue_delay_ns == 10_000_000
    assert link.max_buffer_bytes == 2_500_000  # "200ms" of 100 Mbit/s
    assert link.min_buffer_bytes == 32 * 1024
    assert config.flink.window_ns == 100_000_000
    assert config.influxdb.retention_ns == 30 * 86_400 * 10**9
    assert config.influxdb.retention_1s_ns == 30 * 86_400 * 10**9  # the defaults
    assert (
        config.influxdb.retention_1m_ns
        == config.influxdb.events_retention_ns
        == 365 * 86_400 * 10**9
    )
    assert config.routers[0].password == SecretRef(env="P4BS_ROUTER_PASSWORD")
    assert config.kafka.topics["link_counters"] == "p4bs.link-counters"
    assert config.optimizer.stale_after_ns == 5_000_000_000
    assert config.optimizer.min_change_interval_ns == 1_000_000_000
    assert (config.optimizer.max_step_ratio, config.optimizer.dry_run) == (0.0, False)
    assert config.routers[0].interfaces == ("eth*",)
    assert not config.metrics.optimizer_feed  # off: the optimizer reads link_metrics
    assert config.metrics.optimizer_stream == "link_metrics"
    assert config.metrics.feed_heartbeat_ns * 2 <= config.optimizer.stale_after_ns


def test_the_optimizer_feed_when_on_is_the_stream_the_optimizer_reads(
    example: dict[str, Any],
) -> None:
    example["metrics"].update(optimizer_feed=True, feed_policies=["globecom"])
    example["metrics"].update(feed_deadband=0.05, feed_heartbeat="2500ms")
    metrics = parse_config(example).metrics
    assert metrics.optimizer_stream == "optimizer_feed"
    assert metrics.feed_policies == ("globecom",)
    assert (metrics.feed_deadband, metrics.feed_heartbeat_ns) == (0.05, 2_500_000_000)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return mutate


def _junos(**table: Any) -> Callable[[dict[str, Any]], None]:
    """The example's router made a netconf-junos one, its link given `junos = table`."""

    def mutate(data: dict[str, Any]) -> None:
        data["routers"][0]["driver"] = "netconf-junos"
        data["routers"][0]["address"] = "10.203.0.2:830"
        data["routers"][0]["interfaces"] = ["eth*", "et-*"]
        data["links"][0]["junos"] = table

    return mutate


_SCRAM = {
    "security": "sasl_ssl",
    "username": {"env": "P4BS_KAFKA_USER"},
    "password": {"file": "/etc/p4bs/kafka-password"},
}

BAD = [
    (_set("links.0.capacity", "100 furlongs"), "links[0].capacity: unknown unit 'furlongs'"),
    (_set("links.0.capacity", "0Mbit"), "links[0].capacity: the capacity must be positive"),
    (_delete("links.0.capacity"), "links[0].capacity: is required"),
    (_set("links.0.sla.max_loss", 1.5), "links[0].sla.max_loss: must be a fraction"),
    (_set("links.0.sla.max_queue_delay", "-1ms"), "links[0].sla.max_queue_delay: expected"),
    (_set("links.0.weights.loss", -1), "links[0].weights.loss: must be a non-negative"),
    (_set("links.0.buffer.min", "300ms"), "links[0].buffer.min: 3750000 B is above max"),
    (_set("links.0.buffer.safe", "1KiB"), "links[0].buffer.safe: 1024 B is outside [min, max]"),
    (_set("links.0.buffer.max", "100"), "links[0].buffer.max: a bare number string"),
    (_set("links.0.policy", ""), "links[0].policy: must be a non-empty string"),
    (_set("links.0.router", "r9"), "links[0].router: no router named 'r9'"),
    (_set("links.0.switch", "tofino9"), "links[0].switch: no switch named 'tofino9'"),
    (_set("links.0.taps", {"before": 3, "after": "x"}), "links[0].taps.before: a software-model"),
    (_set("links.0.taps", {"before": "a", "after": "a"}), "links[0].taps.after: port 'a' is"),
    (_set("links.0.taps.before", {"out": "a"}), "links[0].taps.before: must be one port"),
    (_set("links.0.taps.before", {"out": "a", "back": "a"}), "links[0].taps.before: out and"),
    (_set("links.0.taps.after", {"out": "b", "back": 7}), "links[0].taps.after.back: a softwa"),
    (_set("links.0.colour", "blue"), "links[0].colour: unknown field"),
    (_set("routers.0.password", "hunter22"), "routers[0].password: credentials are never"),
    (_set("routers.0.username", {"vault": "x"}), "routers[0].username: must be { env"),
    (_delete("routers.0.address"), "routers[0].address: is required"),
    (_set("routers.0.driver", "telnet"), "routers[0].driver: must be one of gnmi"),
    (_set("switches.0.target", "tofino"), "switches[0].address: is required"),
    (_set("kafka.bootstrap", "localhost"), "kafka.bootstrap: must be host:port"),
    (_set("kafka.partitions", 0), "kafka.partitions: must be an integer in [1, 10000]"),
    (_set("kafka.topics", {"rtt": "x"}), "kafka.topics.rtt: unknown stream"),
    (_set("kafka.security", "ssl"), "kafka.security: must be one of plaintext, sasl_ssl"),
    (_set("kafka.ca_file", "/ca.pem"), 'kafka.ca_file: is used only with security = "sasl_ssl"'),
    (_set("kafka.security", "sasl_ssl"), "kafka.username: is required"),
    (_set("kafka.security", "sasl_ssl"), "kafka.password: is required"),
    (_set("kafka", _SCRAM | {"password": "hunter22"}), "kafka.password: credentials are never"),
    (_set("kafka", _SCRAM | {"sasl_mechanism": "PLAIN"}), "kafka.sasl_mechanism: must be one"),
    (_set("influxdb.url", "influx:8086"), "influxdb.url: must be an http:// or https:// URL"),
    (_set("influxdb.retention", "10min"), "influxdb.retention: InfluxDB keeps data at least 1h"),
    (_set("influxdb.retention_1s", "1s"), "influxdb.retention_1s: InfluxDB keeps data at least"),
    (_set("flink.mode", "yarn"), "flink.mode: must be one of embedded, remote"),
    (_set("flink.window", "0ms"), "flink.window: the window must be positive"),
    (_set("flink.window", "150ms"), "flink.window: must be a multiple of dataplane.export"),
    (_set("flink.jvm_args", ["-Xmx1g"]), "flink.jvm_args: must be a non-empty string"),
    (_set("dataplane.rtt_batch_interval", "10ms"), "dataplane.rtt_batch_interval: no longer read"),
    (
        _set("dataplane.rtt_batch_max_samples", 9),
        "dataplane.rtt_batch_max_samples: no longer read: renamed",
    ),
    (_set("dataplane.max_rtt_samples_per_record", 0), "dataplane.max_rtt_samples_per_record: must"),
    (_set("metrics.srtt_alpha", 1.0), "metrics.srtt_alpha: must be a fraction"),
    (_set("metrics.zscore_lag", 1), "metrics.zscore_lag: must be an integer in [2"),
    (_set("metrics.long_flow_ttl", "0s"), "metrics.long_flow_ttl: long_flow_ttl must be"),
    (_set("metrics.sla_window", 3), "metrics.sla_window: unknown field"),
    (_set("metrics.optimizer_feed", "yes"), "metrics.optimizer_feed: must be true or false"),
    (_set("metrics.feed_policies", "globecom"), "metrics.feed_policies: must be a list of"),
    (_set("metrics.feed_policies", ["a,b"]), "metrics.feed_policies: must be a list of"),
    (_set("metrics.feed_deadband", 1), "metrics.feed_deadband: must be a number in [0, 1)"),
    (_set("metrics.feed_heartbeat", "0s"), "metrics.feed_heartbeat: feed_heartbeat must be"),
    (
        lambda data: data["metrics"].update(optimizer_feed=True, feed_heartbeat="3s"),
        "metrics.feed_heartbeat: must be at most half of optimizer.stale_after",
    ),
    (_set("alerts.webhook", "ftp://am:9093"), "alerts.webhook: must be an http:// or https://"),
    (_set("alerts.attempts", 0), "alerts.attempts: must be an integer in [1, 1000]"),
    (_set("optimizer.stale_after", "0s"), "optimizer.stale_after: stale_after must be"),
    (_set("optimizer.apply_attempts", 0), "optimizer.apply_attempts: must be an integer in"),
    (_set("optimizer.dry", True), "optimizer.dry: unknown field"),
    (_set("optimizer.dry_run", "yes"), "optimizer.dry_run: must be true or false"),
    (_set("optimizer.max_step_ratio", 0.5), "optimizer.max_step_ratio: must be 0 (no limit) or"),
    (
        _set("optimizer.max_changes_per_router_per_minute", -1),
        "optimizer.max_changes_per_router_per_minute: must be an integer in [0,",
    ),
    (_set("optimizer.freeze_file", ""), "optimizer.freeze_file: must be a non-empty string"),
    (_set("routers.0.driver", "linux-tc"), "routers[0].address: a linux-tc router is local"),
    (_set("links", []), "links: at least one [[links]] entry is required"),
    (_set("links.0.junos", {}), "links[0].junos: only for a netconf-junos router; router 'r1'"),
    (_junos(scheduler="has space"), "links[0].junos.scheduler: must be 1..64 characters"),
    (_junos(scheduler_map="m" * 65), "links[0].junos.scheduler_map: must be 1..64 characters"),
    (_junos(forwarding_class=""), "links[0].junos.forwarding_class: must be a non-empty"),
    (_junos(interface=7), "links[0].junos.interface: must be a non-empty string"),
    (_set("routers.0.client_cert", "/etc/p4bs/client.pem"), "routers[0].client_key: is required"),
    (_set("routers.0.client_key", "/etc/p4bs/client.key"), "routers[0].client_cert: is required"),
    (_junos(queue=0), "links[0].junos.queue: unknown field (known: forwarding_class,"),
    # What a router lets p4bs manage (p4bs.config.authority).
    (
        _set("links.0.interface", "eth1]/x[name=y"),
        "links[0].interface: 'eth1]/x[name=y' is not an interface name for the gnmi driver",
    ),
    (_set("links.0.interface", "ge-0/0/1"), "links[0].interface: router 'r1' does not let p4bs"),
    (_set("links.0.buffer.min", "1000B"), "links[0].buffer.min: 1000 B is below 1500 B (one MTU"),
    (_set("routers.0.interfaces", ["eth[1]"]), "routers[0].interfaces: 'eth[1]' is not an"),
    (_set("routers.0.interfaces", "eth*"), "routers[0].interfaces: must be a list of interface"),
    (
        _set("routers.0.max_buffer", "1MiB"),
        "links[0].buffer.max: 2500000 B is above the max_buffer of router 'r1'",
    ),
    (
        _set("routers.0.min_buffer", "64KiB"),
        "links[0].buffer.min: 32768 B is below the min_buffer of router 'r1'",
    ),
    (_set("routers.0.min_buffer", "1KiB"), "routers[0].min_buffer: must be at least 1500 B"),
    (_set("routers.0.max_buffer", "200ms"), "routers[0].max_buffer: must be a size such as"),
    (
        lambda data: data["routers"][0].update(min_buffer="64KiB", max_buffer="32KiB"),
        "routers[0].min_buffer: 65536 B is above max_buffer 32768 B",
    ),
    (_junos(interface="et-0/0/0 x"), "links[0].junos.interface: must be 1..64 characters"),
    (_junos(interface="xe-0/0/0"), "links[0].junos.interface: router 'r1' does not let p4bs"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD, ids=[m for _, m in BAD])
def test_each_bad_value_names_its_field_and_why(
    example: dict[str, Any], mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    data = copy.deepcopy(example)
    mutate(data)
    with pytest.raises(ConfigError) as err:
        parse_config(data, "bad.toml")
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


# A present value is kept or refused, never replaced by the default (only an absent key takes
# it). Where 0 means something, it is kept: each of these defaults to something else.
ZERO_KEPT = [
    ("influxdb.retention_1s", "0s", lambda c: c.influxdb.retention_1s_ns),  # kept forever
    ("influxdb.events_retention", 0, lambda c: c.influxdb.events_retention_ns),
    ("links.0.weights.loss", 0, lambda c: c.links[0].weight_loss),
    ("metrics.zscore_threshold", 0, lambda c: c.metrics.zscore_threshold),
    ("metrics.feed_deadband", 0, lambda c: c.metrics.feed_deadband),
    ("testbed.extra_delay_max", "0ms", lambda c: c.testbed.extra_delay_max_ns),
    ("testbed.groups.0.flows", 0, lambda c: c.testbed.groups[0].flows),  # required
]


@pytest.mark.parametrize(("path", "value", "read"), ZERO_KEPT, ids=[p for p, _, _ in ZERO_KEPT])
def test_a_present_zero_where_zero_is_legal_is_kept(
    example: dict[str, Any], path: str, value: Any, read: Callable[[Any], Any]
) -> None:
    _set(path, value)(example)
    assert read(parse_config(example)) == 0


# Where 0 (or "") is not a legal value, a present one is refused naming its field, as a
# missing required one is named: these are the fields whose reading ended in `or default`.
ZERO_REFUSED = [
    ("kafka.bootstrap", ""),
    ("kafka.replication_factor", 0),
    ("influxdb.database", ""),
    ("flink.parallelism", 0),
    ("flink.checkpoint_interval", "0ms"),
    ("flink.jvm_args", ""),
    ("alerts.timeout", "0s"),
    ("alerts.backoff", 0),
    ("optimizer.group", ""),
    ("optimizer.session_timeout", "0s"),
    ("optimizer.min_change_interval", 0),
    ("switches.0.name", ""),
    ("routers.0.name", ""),
    ("routers.0.timeout", "0s"),
    ("routers.0.max_concurrent_changes", 0),
    ("testbed.name", ""),
    ("testbed.buffer", "0B"),
    ("testbed.base_rtt", "0ms"),
]


@pytest.mark.parametrize(("path", "value"), ZERO_REFUSED, ids=[p for p, _ in ZERO_REFUSED])
def test_a_present_zero_where_the_field_needs_more_is_refused_naming_the_field(
    example: dict[str, Any], path: str, value: Any
) -> None:
    _set(path, value)(example)
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    where = re.sub(r"\.(\d+)", r"[\1]", path)  # routers.0.name -> routers[0].name
    assert [p for p in err.value.problems if p.startswith(f"{where}: ")], err.value.problems


def test_an_empty_list_of_testbed_groups_is_kept_an_absent_one_defaults(
    example: dict[str, Any],
) -> None:
    """`groups = []` is a testbed without flows of its own, as a group of 0 flows is (it was
    replaced by the default group); without `groups`, one group of 10 Cubic flows."""
    example["testbed"]["groups"] = []
    testbed = parse_config(example).testbed
    assert testbed is not None and testbed.groups == ()
    del example["testbed"]["groups"]
    testbed = parse_config(example).testbed
    assert testbed is not None and testbed.groups == (FlowGroup("all", 10, "cubic", 0, None),)


TOFINO = [
    _set("switches.0.target", "tofino"),
    _set("switches.0.address", "127.0.0.1:50052"),
    _set("links.0.taps", {"before": 1, "after": 2}),
]


def test_a_tofino_link_whose_data_direction_cannot_be_told_is_refused(
    example: dict[str, Any],
) -> None:
    """Ports carrying both directions need output_prefixes; per-direction ports do not; a
    port is one tap of one link on its switch."""
    for mutate in TOFINO:
        mutate(example)
    parse_config(example)  # the example's output_prefixes tell the directions apart
    del example["links"][0]["output_prefixes"]
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    assert err.value.problems == [
        "links[0].taps.before: port 1 carries both directions and the link has no "
        "output_prefixes, so its data direction cannot be told: list the prefixes reached "
        "through the interface in output_prefixes, or give one port per direction "
        "(taps.before = { out = PORT, back = PORT })",
        "links[0].taps.after: port 2 carries both directions and the link has no "
        "output_prefixes, so its data direction cannot be told: list the prefixes reached "
        "through the interface in output_prefixes, or give one port per direction "
        "(taps.after = { out = PORT, back = PORT })",
    ]
    example["links"][0]["taps"] = {"before": {"out": 1, "back": 2}, "after": {"out": 3, "back": 4}}
    (link,) = parse_config(example).links
    assert link.ports() == [
        ("before", 1, "out"),
        ("before", 2, "back"),
        ("after", 3, "out"),
        ("after", 4, "back"),
    ]
    second = copy.deepcopy(example["links"][0])
    second["interface"] = "eth2"
    second["taps"] = {"before": {"out": 5, "back": 3}, "after": {"out": 6, "back": 7}}
    example["links"].append(second)
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    assert err.value.problems == [
        "links[1].taps.before.back: port 3 is already taps.after.out of link 'r1:eth1' on "
        "switch 'model0'"
    ]


def test_all_problems_are_reported_at_once(example: dict[str, Any]) -> None:
    _set("links.0.capacity", "fast")(example)
    _set("kafka.partitions", -3)(example)
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    assert len(err.value.problems) == 2


def test_secret_reference_resolves_only_from_env_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("P4BS_TEST_SECRET", "s3cret")
    assert SecretRef(env="P4BS_TEST_SECRET").resolve() == "s3cret"
    (tmp_path / "pw").write_text("from-file\n")
    assert SecretRef(file=str(tmp_path / "pw")).resolve() == "from-file"
    monkeypatch.delenv("P4BS_TEST_SECRET")
    with pytest.raises(LookupError, match=r"\$P4BS_TEST_SECRET is not set"):
        SecretRef(env="P4BS_TEST_SECRET").resolve()


def test_cli_check_exit_codes(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "check", str(repo / "config" / "testbed.toml")]) == 0
    assert "r1:eth1" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka]\nbootstrap = 12\n")
    assert main(["config", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "kafka.bootstrap: must be a non-empty string" in err
    broken = tmp_path / "broken.toml"
    broken.write_text("[kafka\n")
    assert main(["config", "check", str(broken)]) == 1
    assert "not valid TOML" in capsys.readouterr().err


def test_cli_check_asks_the_optimizer_for_each_links_policy_and_options(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Policies are the optimizer's: core reads the name, `config check` makes each policy."""
    example = (repo / "config" / "testbed.toml").read_text()
    assert 'policy = "p4bs"' in example
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(example.replace('policy = "p4bs"', 'policy = "magic"'))
    assert main(["config", "check", str(unknown)]) == 1
    err = capsys.readouterr().err
    assert "link r1:eth1: policy: no policy 'magic' (one of static, bdp," in err
    bad_option = tmp_path / "option.toml"
    bad_option.write_text(
        example.replace('policy = "p4bs"', 'policy = "globecom"\npolicy_options = { nope = 1 }')
    )
    assert main(["config", "check", str(bad_option)]) == 1
    err = capsys.readouterr().err
    assert "link r1:eth1:" in err and "nope" in err, err


@pytest.mark.parametrize(
    ("table", "names"),
    [  # given fields -> (interface, scheduler, scheduler_map, forwarding_class)
        ({}, ("eth1", "p4bs-eth1", "p4bs-eth1", "best-effort")),
        (
            {"interface": "et-0/0/0.0", "forwarding_class": "expedited-forwarding"},
            ("et-0/0/0.0", "p4bs-et-0-0-0-0", "p4bs-et-0-0-0-0", "expedited-forwarding"),
        ),
        (
            {"scheduler": "be-sched", "scheduler_map": "be-map"},
            ("eth1", "be-sched", "be-map", "best-effort"),
        ),
    ],
)
def test_junos_names_default_from_the_interface(
    example: dict[str, Any], table: dict[str, str], names: tuple[str, str, str, str]
) -> None:
    _junos(**table)(example)
    assert parse_config(example).links[0].junos == JunosLinkConfig(*names)


def test_client_certificates_by_path_for_gnmi_only(example: dict[str, Any]) -> None:
    router = example["routers"][0]
    router.update(client_cert="/etc/p4bs/client.pem", client_key="/etc/p4bs/client-key.pem")
    parsed = parse_config(example).routers[0]
    assert (parsed.client_cert, parsed.client_key) == (
        "/etc/p4bs/client.pem",
        "/etc/p4bs/client-key.pem",
    )
    router.update(driver="netconf", address="10.203.0.2:830")
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    assert err.value.problems == [
        "routers[0].client_cert: only the gnmi driver presents a client certificate, not netconf"
    ]


def test_only_links_of_junos_routers_carry_junos_names(example: dict[str, Any]) -> None:
    assert parse_config(example).links[0].junos is None  # a gnmi router


def test_every_router_driver_the_config_accepts_has_a_driver() -> None:
    assert set(DRIVERS) == set(ROUTER_DRIVERS)


def _linux_tc(data: dict[str, Any], interface: str) -> None:
    router = data["routers"][0]
    router.update(driver="linux-tc", interfaces=["*"])
    for key in ("address", "username", "password", "timeout"):
        router.pop(key, None)
    data["links"][0]["interface"] = interface
    data["testbed"]["link"] = f"r1:{interface}"


@pytest.mark.parametrize(
    ("interface", "problem"),
    [
        ("eth1", None),
        ("veth-r1-egress0", None),  # 15 characters: Linux's longest
        ("veth-r1-egress01", "links[0].interface: 'veth-r1-egress01' is not an interface name "),
        ("et-0/0/0", "links[0].interface: 'et-0/0/0' is not an interface name for the linux-tc"),
    ],
)
def test_a_linux_tc_interface_is_a_linux_name(
    example: dict[str, Any], interface: str, problem: str | None
) -> None:
    _linux_tc(example, interface)
    if problem is None:
        assert parse_config(example).links[0].interface == interface
        return
    with pytest.raises(ConfigError) as err:
        parse_config(example)
    assert [p for p in err.value.problems if p.startswith(problem)], err.value.problems


def test_a_router_without_interfaces_or_bounds_takes_its_links(example: dict[str, Any]) -> None:
    """The file's links on the router give its interfaces and its largest buffer; the
    smallest is one MTU-sized packet."""
    del example["routers"][0]["interfaces"]
    second = copy.deepcopy(example["links"][0])
    second.update(interface="eth7", taps={"before": "t7-in", "after": "t7-out"})
    second["buffer"] = {"min": "8KiB", "max": "3MB", "safe": "1MB"}
    example["links"].append(second)
    (router,) = parse_config(example).routers
    assert router.interfaces == ("eth1", "eth7")
    assert (router.min_buffer_bytes, router.max_buffer_bytes) == (MIN_BUFFER_BYTES, 3_000_000)
    assert router.manages("eth7") and not router.manages("eth2")


def test_a_links_topic_record_cannot_go_past_its_router(example: dict[str, Any]) -> None:
    """`link_from_table`, the path of a links-topic record, refuses what the file's router
    does not allow: an interface it does not list, a buffer bound past its own, a 1-byte
    buffer, a name that is not one in its driver's syntax; the file's own entry passes."""
    del example["routers"][0]["interfaces"]  # the default: the file's links (eth1)
    config = parse_config(example)
    entry = example["links"][0]
    assert link_from_table(config, copy.deepcopy(entry), "links topic").id == "r1:eth1"

    def refused(**changes: Any) -> list[str]:
        table = copy.deepcopy(entry)
        table.update(changes)
        with pytest.raises(ConfigError) as err:
            link_from_table(config, table, "links topic")
        return err.value.problems

    bounds = {"min": "32KiB", "max": "200ms", "safe": "50ms"}
    taps = {"before": "tap2-in", "after": "tap2-out"}
    assert refused(interface="eth2", taps=taps) == [  # the new link comes after the file's
        "links[1].interface: router 'r1' does not let p4bs manage 'eth2' (its interfaces: eth1)"
    ]
    assert refused(buffer=bounds | {"max": "400ms"}) == [
        "links[0].buffer.max: 5000000 B is above the max_buffer of router 'r1' (2500000 B)"
    ]
    assert refused(buffer={"min": "1B", "max": "1B", "safe": "1B"}) == [
        "links[0].buffer.min: 1 B is below 1500 B (one MTU-sized packet)",
        "links[0].buffer.min: 1 B is below the min_buffer of router 'r1' (1500 B)",
    ]
    assert refused(interface="eth1]/x[name=y", taps=taps)[0].startswith(
        "links[1].interface: 'eth1]/x[name=y' is not an interface name for the gnmi driver"
    )
