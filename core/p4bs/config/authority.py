"""What the config lets p4bs change on each router: the interfaces it may manage and the
hard bounds of any link's buffer there (`interfaces`, `min_buffer`, `max_buffer` of a
[[routers]] entry), and interface names in the syntax of the router's driver.

A router that does not say takes them from the file's own [[links]] on it: their interfaces,
and the largest of their buffer maxima (the smallest buffer is MIN_BUFFER_BYTES). So a file
that was valid stays valid, and a record of the links topic (`link_from_table`, checked as
the file is) can change a link only within what the file allows: it cannot add an interface
the file does not name or widen a bound.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from p4bs.config.fields import Reader
from p4bs.config.model import MIN_BUFFER_BYTES, LinkConfig, RouterConfig
from p4bs.units import UnitError, parse_size_bytes

# An interface name a driver puts into a request, by driver: gNMI path keys and NETCONF
# elements take letters, digits and _ . / : - (no [ ] = or quotes to escape), up to 64
# characters; Linux (linux-tc) takes at most IFNAMSIZ - 1 = 15, no '/'.
_NAME_CHARACTERS = {
    "gnmi": ("A-Za-z0-9_./:-", 64),
    "netconf": ("A-Za-z0-9_./:-", 64),
    "netconf-junos": ("A-Za-z0-9_./:-", 64),
    "linux-tc": ("A-Za-z0-9_.:-", 15),
}
_WILDCARDS = "*?"


def interface_problem(driver: str, name: str) -> str | None:
    """Why `name` is not an interface name the driver can send; None when it is."""
    characters, longest = _NAME_CHARACTERS[driver]
    if not re.fullmatch(f"[{characters}]{{1,{longest}}}", name) or name in (".", ".."):
        shown = characters.replace("A-Za-z0-9", "letters, digits and ")
        return f"{name!r} is not an interface name for the {driver} driver: 1..{longest} of {shown}"
    return None


def _pattern_problem(driver: str, pattern: str) -> str | None:
    """Why `pattern` (an interface name, '*' and '?' matching any characters) is not one."""
    bare = pattern.translate({ord(c): "x" for c in _WILDCARDS})
    problem = interface_problem(driver, bare)
    return None if problem is None else f"{problem}, or * and ? as wildcards"


def read_interfaces(r: Reader, data: dict[str, Any], driver: str) -> tuple[str, ...]:
    """A router's `interfaces`: a list of names or simple globs valid for its driver."""
    value = data.get("interfaces")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        r.problem("interfaces", f"must be a list of interface names or globs, got {value!r}")
        return ()
    for pattern in value:
        problem = _pattern_problem(driver, pattern)
        if problem is not None:
            r.problem("interfaces", problem)
    return tuple(value)


def router_buffer(value: Any) -> int:
    """A router's buffer bound: a size ('1500B', '64MiB'), at least MIN_BUFFER_BYTES."""
    try:
        size = parse_size_bytes(value)
    except UnitError as exc:
        raise ValueError(f"must be a size such as '64MiB': {exc}") from None
    if size < MIN_BUFFER_BYTES:
        raise ValueError(
            f"must be at least {MIN_BUFFER_BYTES} B (one MTU-sized packet), got {value!r}"
        )
    return size


def with_defaults_from_links(
    r: Reader,
    routers: tuple[RouterConfig, ...],
    raw_routers: list[dict[str, Any]],
    links: tuple[LinkConfig, ...],
    raw_links: list[dict[str, Any]],
) -> tuple[RouterConfig, ...]:
    """Each router's `interfaces` and `max_buffer`, where its entry does not give them, from
    the file's links on it (`links`, those read; `raw_links`, as written). A router with
    `interfaces` and no links in the file must give `max_buffer`."""
    given = {str(raw.get("name")): (i, raw) for i, raw in enumerate(raw_routers)}
    out = []
    for router in routers:
        if router.name not in given:  # its name was refused: the config is refused anyway
            out.append(router)
            continue
        i, raw = given[router.name]
        own = [link for link in links if link.router == router.name]
        changes: dict[str, Any] = {}
        if "interfaces" not in raw:
            changes["interfaces"] = tuple(dict.fromkeys(_interfaces_of(own)))
        if "max_buffer" not in raw:
            if own:
                changes["max_buffer_bytes"] = max(link.max_buffer_bytes for link in own)
            elif "interfaces" in raw and not any(x.get("router") == router.name for x in raw_links):
                r.problem(f"routers[{i}].max_buffer", "is required when no [[links]] use it")
        out.append(dataclasses.replace(router, **changes) if changes else router)
    return tuple(out)


def _interfaces_of(links: list[LinkConfig]) -> list[str]:
    """The interfaces the links name: each link's, and its Junos interface if another."""
    return [
        name
        for link in links
        for name in (link.interface, *([link.junos.interface] if link.junos else []))
    ]


def check_link_authority(r: Reader, link: LinkConfig, router: RouterConfig) -> None:
    """A link within what its router allows: an interface named in the driver's syntax and
    listed by the router, and buffer bounds within the router's."""
    names = [("interface", link.interface)]
    if link.junos is not None and link.junos.interface != link.interface:
        names.append(("junos.interface", link.junos.interface))
    for where, name in names:
        problem = interface_problem(router.driver, name)
        if problem is not None:
            r.problem(where, problem)
        elif not router.manages(name):
            listed = ", ".join(router.interfaces) or "none"
            r.problem(
                where,
                f"router {router.name!r} does not let p4bs manage {name!r} (its interfaces: "
                f"{listed})",
            )
    if link.min_buffer_bytes < router.min_buffer_bytes:
        r.problem(
            "buffer.min",
            f"{link.min_buffer_bytes} B is below the min_buffer of router {router.name!r} "
            f"({router.min_buffer_bytes} B)",
        )
    if router.max_buffer_bytes is not None and link.max_buffer_bytes > router.max_buffer_bytes:
        r.problem(
            "buffer.max",
            f"{link.max_buffer_bytes} B is above the max_buffer of router {router.name!r} "
            f"({router.max_buffer_bytes} B)",
        )
