"""The network's sections: [dataplane] (the switch program's tables and timeouts),
[[switches]], [[routers]] and [[links]] (with a link's `junos` names). Each entry is read on
its own; `p4bs.config.topology` checks how they refer to each other."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from p4bs.config.authority import read_interfaces, router_buffer
from p4bs.config.fields import (
    Reader,
    buffer_value,
    endpoint,
    fraction,
    int_in,
    non_negative,
    one_of,
    positive,
    positive_durations,
    secret,
    text,
    weight,
)
from p4bs.config.model import (
    JUNOS_CONFIRM_WINDOW_MAX_NS,
    JUNOS_CONFIRM_WINDOW_NS,
    JUNOS_NAME_MAX,
    JUNOS_TEMPORAL_RANGE_NS,
    LONG_FLOW_MODES,
    MIN_BUFFER_BYTES,
    ROUTER_DRIVERS,
    SWITCH_TARGETS,
    DataplaneConfig,
    DirectedTap,
    JunosLinkConfig,
    LinkConfig,
    Port,
    RouterConfig,
    SwitchConfig,
    Tap,
    junos_defaults,
)
from p4bs.exposure import ExposureError, check_exposure
from p4bs.units import parse_duration_ns, parse_rate_bps


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


def read_dataplane(r: Reader, data: dict[str, Any]) -> DataplaneConfig:
    d = DataplaneConfig()
    durations = (
        "rtt_max_age",
        "cms_reset",
        "long_flow_ttl",
        "window",
        "qdelay_max_age",
        "export_interval",
    )
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
    values: dict[str, Any] = positive_durations(r, data, durations, d)
    values["rtt_min_interval_ns"] = r.get(
        data,
        "rtt_min_interval",
        non_negative(parse_duration_ns, "the interval"),
        d.rtt_min_interval_ns,
    )
    for key in slots:
        values[key] = r.get(data, key, _power_of_two, getattr(d, key))
    for key, (low, high) in counts.items():
        values[key] = r.get(data, key, int_in(low, high), getattr(d, key))
    values["long_flows"] = r.get(data, "long_flows", one_of(LONG_FLOW_MODES), d.long_flows)
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


def read_switch(r: Reader, data: dict[str, Any]) -> SwitchConfig:
    r.unknown(data, {"name", "target", "address", "device_id", "metrics_address"})
    # A missing target is reported; "model" stands in so the other fields are checked.
    target = r.get(data, "target", one_of(SWITCH_TARGETS), "model", required=True)
    address = r.get(data, "address", endpoint, required=target == "tofino")
    metrics_address = r.get(
        data, "metrics_address", exporter_metrics_address, SwitchConfig.metrics_address
    )
    return SwitchConfig(
        name=r.get(data, "name", text, "", required=True),
        target=target,
        address=address,
        device_id=r.get(data, "device_id", int_in(0, 255), 0),
        metrics_address=metrics_address,
    )


def exporter_metrics_address(value: Any) -> str:
    """host:port on the loopback, or "" (no endpoint): the exporter's endpoint has no token
    or TLS, which the dashboard's rule (p4bs.exposure) needs beyond the loopback."""
    if value == "":
        return ""
    host, _, _ = endpoint(value).rpartition(":")
    try:
        check_exposure(
            host,
            token=False,
            tls=False,
            where="the address",
            what="the exporter's metrics",
            remedy="it has no token or TLS: bind the loopback (a scraper on this host, or a "
            "TLS proxy in front)",
        )
    except ExposureError as exc:
        raise ValueError(str(exc)) from None
    return str(value)


def _netns_address(value: Any) -> str:
    """A local linux-tc router in another network namespace: "netns:NAME"."""
    address = text(value)
    if not address.startswith("netns:") or not address[len("netns:") :].strip():
        raise ValueError(f'a linux-tc router is local: omit it, or "netns:NAME", got {value!r}')
    return address


def read_router(r: Reader, data: dict[str, Any]) -> RouterConfig:
    known = {"name", "driver", "address", "username", "password", "ca_file", "timeout"}
    r.unknown(
        data,
        known
        | {"max_concurrent_changes", "client_cert", "client_key"}
        | {"confirm_window", "temporal_range"}
        | {"interfaces", "min_buffer", "max_buffer"},
    )
    # A missing driver is reported; "linux-tc" stands in so the other fields are checked.
    driver = r.get(data, "driver", one_of(ROUTER_DRIVERS), "linux-tc", required=True)
    remote = driver != "linux-tc"
    timeout = positive(parse_duration_ns, "the timeout")
    client_cert = r.get(data, "client_cert", text)
    client_key = r.get(data, "client_key", text)
    for given, needed in (("client_cert", "client_key"), ("client_key", "client_cert")):
        if given in data and needed not in data:
            r.problem(needed, f"is required with {given}")
    if "client_cert" in data and driver != "gnmi":
        r.problem(
            "client_cert", f"only the gnmi driver presents a client certificate, not {driver}"
        )
    for key, drivers in (
        ("confirm_window", ("netconf", "netconf-junos")),
        ("temporal_range", ("netconf-junos",)),
    ):
        if key in data and driver not in drivers:
            r.problem(key, f"only for driver {' or '.join(drivers)}, not {driver}")
    low = r.get(data, "min_buffer", router_buffer, MIN_BUFFER_BYTES)
    high = r.get(data, "max_buffer", router_buffer)
    if high is not None and low > high:
        r.problem("min_buffer", f"{low} B is above max_buffer {high} B")
    return RouterConfig(
        name=r.get(data, "name", text, "", required=True),
        driver=driver,
        address=r.get(data, "address", endpoint if remote else _netns_address, required=remote),
        username=r.get(data, "username", secret, required=remote),
        password=r.get(data, "password", secret, required=remote),
        ca_file=r.get(data, "ca_file", text),
        timeout_ns=r.get(data, "timeout", timeout, 10_000_000_000),
        max_concurrent_changes=r.get(data, "max_concurrent_changes", int_in(1, 64), 1),
        client_cert=client_cert,
        client_key=client_key,
        confirm_window_ns=r.get(data, "confirm_window", _confirm_window, JUNOS_CONFIRM_WINDOW_NS),
        temporal_range_ns=r.get(data, "temporal_range", _temporal_range, JUNOS_TEMPORAL_RANGE_NS),
        interfaces=read_interfaces(r, data, driver),
        min_buffer_bytes=low,
        max_buffer_bytes=high,
    )


def _confirm_window(value: Any) -> int:
    """A confirmed commit's window: 1 s .. 65535 min (Junos's largest confirm-timeout)."""
    ns = parse_duration_ns(value)
    if not 1_000_000_000 <= ns <= JUNOS_CONFIRM_WINDOW_MAX_NS:
        raise ValueError(f"must be 1s..65535min, got {value!r}")
    return ns


def _temporal_range(value: Any) -> tuple[int, int]:
    """The platform's `buffer-size temporal` range: ["1us", "200ms"], whole µs, low <= high."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f'must be [low, high] such as ["1us", "100ms"], got {value!r}')
    low, high = (parse_duration_ns(v) for v in value)
    if low < 1_000 or low > high or low % 1_000 or high % 1_000:
        raise ValueError(f"must be whole µs, 1us <= low <= high, got {value!r}")
    return low, high


_JUNOS_FIELDS = tuple(f.name for f in dataclasses.fields(JunosLinkConfig))


def _junos_name(value: Any) -> str:
    """A Junos configuration name: 1..64 characters, no spaces or quotes."""
    name = text(value)
    if len(name) > JUNOS_NAME_MAX or any(c.isspace() or c in "\"'" for c in name):
        raise ValueError(
            f"must be 1..{JUNOS_NAME_MAX} characters without spaces or quotes, got {value!r}"
        )
    return name


def _read_junos(r: Reader, data: dict[str, Any], interface: str | None) -> JunosLinkConfig | None:
    """The link's `junos` table; every field optional (see junos_defaults)."""
    with r.at("junos"):
        table = r.table(data, "junos")
        r.unknown(table, set(_JUNOS_FIELDS))
        given = {k: r.get(table, k, _junos_name) for k in table}
    if interface is None:
        return None
    # A name that failed its check (None) is reported: its default stands in.
    names = {k: name for k in _JUNOS_FIELDS if (name := given.get(k)) is not None}
    return dataclasses.replace(junos_defaults(names.get("interface", interface)), **names)


def read_link(r: Reader, data: dict[str, Any]) -> LinkConfig | None:
    known = {"router", "interface", "switch", "capacity", "taps", "sla", "weights", "buffer"}
    r.unknown(data, known | {"policy", "policy_options", "output_prefixes", "junos"})
    output_prefixes: tuple[str, ...] = r.get(data, "output_prefixes", _ipv4_prefixes, ())
    capacity = r.get(data, "capacity", positive(parse_rate_bps, "the capacity"), required=True)
    with r.at("taps"):
        taps = r.table(data, "taps")
        r.unknown(taps, {"before", "after"})
        before = r.get(taps, "before", _tap, required=True)
        after = r.get(taps, "after", _tap, required=True)
    with r.at("sla"):
        sla = r.table(data, "sla")
        r.unknown(sla, {"max_queue_delay", "max_loss"})
        d_hat = r.get(sla, "max_queue_delay", positive(parse_duration_ns, "d-hat"), required=True)
        p_hat = r.get(sla, "max_loss", fraction, required=True)
    with r.at("weights"):
        weights = r.table(data, "weights")
        r.unknown(weights, {"loss", "delay"})
        w_loss = r.get(weights, "loss", weight, 0.5)
        w_delay = r.get(weights, "delay", weight, 0.5)
        if w_loss == 0 and w_delay == 0:
            r.problem(None, "loss and delay weights cannot both be 0")
    with r.at("buffer"):
        buf = r.table(data, "buffer")
        r.unknown(buf, {"min", "max", "safe"})
        convert = buffer_value(capacity)
        low = r.get(buf, "min", convert, required=True)
        high = r.get(buf, "max", convert, required=True)
        safe = r.get(buf, "safe", convert, required=True)
        if low is not None and high is not None and low > high:
            r.problem("min", f"{low} B is above max {high} B")
        if low is not None and low < MIN_BUFFER_BYTES:
            r.problem("min", f"{low} B is below {MIN_BUFFER_BYTES} B (one MTU-sized packet)")
        if safe is not None and low is not None and high is not None and not low <= safe <= high:
            r.problem("safe", f"{safe} B is outside [min, max] = [{low}, {high}] B")
    options = r.table(data, "policy_options")
    names = (
        r.get(data, "router", text, required=True),
        r.get(data, "interface", text, required=True),
        r.get(data, "switch", text, required=True),
        r.get(data, "policy", text, required=True),
    )
    values = (capacity, before, after, d_hat, p_hat, low, high, safe)
    junos = _read_junos(r, data, names[1])
    if any(v is None for v in names + values):
        return None
    router, interface, switch, policy = (str(v) for v in names)
    assert capacity and d_hat and p_hat and low and high and safe
    assert before is not None and after is not None
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
        output_prefixes=output_prefixes,
        junos=junos,
    )
