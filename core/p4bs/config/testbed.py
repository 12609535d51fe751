"""The [testbed] section: the emulated testbed that plays one link's router (infra/), and its
groups of long flows."""

from __future__ import annotations

from typing import Any

from p4bs.config.fields import Reader, buffer_value, int_in, non_negative, one_of, positive, text
from p4bs.config.model import CCAS, FlowGroup, LinkConfig, TestbedConfig
from p4bs.units import bytes_for_duration, parse_duration_ns

# The testbed's traffic when its config lists no groups. An empty list is kept: a testbed
# without flows of its own (as a group of 0 flows is).
DEFAULT_GROUPS = (FlowGroup("all", 10, "cubic", 0, None),)


def _namespace_prefix(value: Any) -> str:
    prefix = text(value)
    if not (prefix.isascii() and prefix.replace("-", "").isalnum() and len(prefix) <= 8):
        raise ValueError(f"must be up to 8 letters, digits or '-', got {value!r}")
    return prefix


def _read_group(r: Reader, data: dict[str, Any]) -> FlowGroup | None:
    r.unknown(data, {"name", "flows", "cca", "start", "rtt"})
    name = r.get(data, "name", text, required=True)
    flows = r.get(data, "flows", int_in(0, 1000), required=True)
    cca = r.get(data, "cca", one_of(CCAS), "cubic")
    start = r.get(data, "start", non_negative(parse_duration_ns, "the start"), 0)
    rtt = r.get(data, "rtt", positive(parse_duration_ns, "the RTT"))
    if name is None or flows is None:
        return None
    return FlowGroup(name=name, flows=flows, cca=cca, start_ns=start, rtt_ns=rtt)


def read_testbed(
    r: Reader, data: dict[str, Any], links: tuple[LinkConfig, ...], link_ids: set[str]
) -> TestbedConfig | None:
    r.unknown(data, {"name", "link", "buffer", "base_rtt", "extra_delay_max", "groups"})
    link_id = r.get(data, "link", text, required=True)
    link = next((x for x in links if x.id == link_id), None)
    if link_id is not None and link_id not in link_ids:  # a listed but broken link is reported
        r.problem("link", f"no link {link_id!r} in [[links]] (ids are router:interface)")
    capacity = link.capacity_bps if link else None
    at_start = bytes_for_duration(200_000_000, capacity) if capacity else None  # 200 ms
    buffer = r.get(data, "buffer", buffer_value(capacity), at_start)
    base_rtt = r.get(data, "base_rtt", positive(parse_duration_ns, "the base RTT"), 20_000_000)
    extra = r.get(data, "extra_delay_max", non_negative(parse_duration_ns, "the delay"), 15_000_000)
    groups: list[FlowGroup] = []
    for i, item in enumerate(r.tables(data, "groups")):
        with r.at(f"groups[{i}]"):
            group = _read_group(r, item)
        if group is not None:
            groups.append(group)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        r.problem("groups", "group names must be unique")
    if link is None or buffer is None:  # the link is reported (its buffer depends on it)
        return None
    return TestbedConfig(
        name=r.get(data, "name", _namespace_prefix, "p4bs"),
        link=link.id,
        buffer_bytes=buffer,
        base_rtt_ns=base_rtt,
        extra_delay_max_ns=extra,
        groups=tuple(groups) if "groups" in data else DEFAULT_GROUPS,
    )
