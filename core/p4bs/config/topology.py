"""The config's cross-checks, once each entry is read: names unique, each link's router and
switch exist, the link within what its router allows (p4bs.config.authority), its tap ports
fit its switch and are used once there, and a link carries Junos names only when its router
is a netconf-junos one."""

from __future__ import annotations

import dataclasses
from typing import Any

from p4bs.config.authority import check_link_authority
from p4bs.config.fields import Reader
from p4bs.config.model import (
    TOFINO_MAX_PORT,
    Config,
    LinkConfig,
    Port,
    RouterConfig,
    SwitchConfig,
)


def junos_only_where_used(
    r: Reader,
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


def check_references(r: Reader, config: Config) -> None:
    switches = {s.name: s for s in config.switches}
    routers = {x.name: x for x in config.routers}
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
            router = routers.get(link.router)
            if router is None:
                r.problem("router", f"no router named {link.router!r} in [[routers]]")
            else:
                check_link_authority(r, link, router)
            switch = switches.get(link.switch)
            if switch is None:
                r.problem("switch", f"no switch named {link.switch!r} in [[switches]]")
                continue
            _check_taps(r, link, switch, switch_ports.setdefault(switch.name, {}))


def _check_taps(r: Reader, link: LinkConfig, switch: SwitchConfig, taken: dict[Port, str]) -> None:
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
