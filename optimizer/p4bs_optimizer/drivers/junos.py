"""Junos driver ("netconf-junos"): buffers sized the Junos way over NETCONF, in the candidate
datastore with a confirmed commit.

A link's buffer is its scheduler's `buffer-size temporal`, the time of line rate the queue
may hold, in microseconds; the scheduler reaches the link's forwarding class through a
scheduler-map bound to the interface (names from the link's `junos` settings):

  class-of-service schedulers <scheduler> buffer-size temporal <µs>
  class-of-service scheduler-maps <map> forwarding-class <class> scheduler <scheduler>
  class-of-service interfaces <interface> scheduler-map <map>

The configuration is the YANG form Juniper publishes (junos-conf-root and
junos-conf-class-of-service, their namespaces on the elements), which a Junos router with
`netconf yang-compliant` speaks. `temporal` is a free string in that model: the driver
writes a decimal integer of µs, bytes·8/rate rounded to the nearest µs, at least 1. The
router keeps the µs and puts bytes = µs·rate/8 (rounded down) in force; those bytes are
what set_buffer returns.

A change: lock the candidate, discard what others left in it, edit-config (merge), commit
with <confirmed/> and a <confirm-timeout> of the router's timeout, read the running
configuration back and compare all three statements, then the confirming commit. On any
failure: cancel-commit when the router has :confirmed-commit:1.1 (otherwise the router
rolls back when the timeout passes or the session, hung up on the error, ends),
discard-changes and unlock. A link has one forwarding class: the driver sizes queue 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape

from lxml import etree

from p4bs.config import JunosLinkConfig, RouterConfig
from p4bs.units import bytes_for_duration
from p4bs_optimizer.drivers.base import DEFAULT_RETRY, Attempt, ErrorKind, Retry
from p4bs_optimizer.drivers.netconf import (
    CANDIDATE,
    CONFIRMED_COMMIT,
    CONFIRMED_COMMIT_11,
    NetconfDriver,
)

JUNOS_ROOT_NS = "http://yang.juniper.net/junos/conf/root"
JUNOS_COS_NS = "http://yang.juniper.net/junos/conf/class-of-service"
NAMESPACES = {"jc": JUNOS_ROOT_NS, "cos": JUNOS_COS_NS}


def temporal_us(buffer_bytes: int, rate_bps: int) -> int:
    """Bytes -> µs of `rate_bps`, to the nearest µs (halves up), at least 1."""
    if buffer_bytes <= 0 or rate_bps <= 0:
        raise ValueError(f"need a positive size and rate: {buffer_bytes} B, {rate_bps} bit/s")
    return max(1, (buffer_bytes * 16_000_000 + rate_bps) // (2 * rate_bps))


def bytes_in_force(us: int, rate_bps: int) -> int:
    """What a router puts in force for `us` µs of `rate_bps`: the bytes, rounded down."""
    return bytes_for_duration(us * 1000, rate_bps)


def cos_config(link: JunosLinkConfig, us: int) -> str:
    """The edit-config <config> that sizes the link's buffer to `us` µs (XML)."""
    s, m = escape(link.scheduler), escape(link.scheduler_map)
    return (
        f'<config><configuration xmlns="{JUNOS_ROOT_NS}">'
        f'<class-of-service xmlns="{JUNOS_COS_NS}">'
        f"<schedulers><name>{s}</name><buffer-size><temporal>{us}</temporal></buffer-size>"
        f"</schedulers>"
        f"<scheduler-maps><name>{m}</name><forwarding-class>"
        f"<name>{escape(link.forwarding_class)}</name><scheduler>{s}</scheduler>"
        f"</forwarding-class></scheduler-maps>"
        f"<interfaces><interface><name>{escape(link.interface)}</name>"
        f"<scheduler-map>{m}</scheduler-map></interface></interfaces>"
        f"</class-of-service></configuration></config>"
    )


COS_FILTER = (
    f'<configuration xmlns="{JUNOS_ROOT_NS}"><class-of-service xmlns="{JUNOS_COS_NS}"/>'
    "</configuration>"
)


class JunosDriver(NetconfDriver):
    """Junos class-of-service over NETCONF (sessions, host keys and errors as NetconfDriver)."""

    classifier_unsupported = (
        "Junos classifies with firewall filters and forwarding classes, which this driver "
        "does not configure; use the gnmi driver for flow separation"
    )

    def __init__(
        self,
        router: RouterConfig,
        *,
        links: Mapping[str, tuple[JunosLinkConfig, int]],
        retry: Retry = DEFAULT_RETRY,
    ) -> None:
        """`links`: the link's interface (as the config names it) -> its Junos names and
        line rate in bit/s."""
        super().__init__(router, retry)
        self.links = dict(links)

    def _link(self, interface: str, queue: int) -> tuple[JunosLinkConfig, int]:
        if interface not in self.links:
            raise ValueError(
                f"router {self.router.name}: no link on {interface!r}; the netconf-junos "
                "driver needs the link's junos names and capacity"
            )
        if queue != 0:
            link = self.links[interface][0]
            raise self._error(
                ErrorKind.REJECTED,
                f"{interface} q{queue}: a link has one forwarding class here "
                f"({link.forwarding_class}, sized as q0)",
            )
        return self.links[interface]

    # ---- reading ----------------------------------------------------------------------------
    def _read_temporal(self, session: Any, link: JunosLinkConfig) -> str | None:
        """The running `temporal` of the link's scheduler if the scheduler-map binds it to
        the forwarding class and the interface to the map; None if any of it is missing."""
        reply = session.get_config(source="running", filter=("subtree", COS_FILTER))
        cos = etree.fromstring(reply.data_xml.encode()).xpath(
            "//jc:configuration/cos:class-of-service", namespaces=NAMESPACES
        )
        if len(cos) != 1:
            return None
        found = cos[0].xpath
        bound = found(
            "cos:interfaces/cos:interface[cos:name=$i]/cos:scheduler-map/text()",
            namespaces=NAMESPACES,
            i=link.interface,
        )
        chosen = found(
            "cos:scheduler-maps[cos:name=$m]/cos:forwarding-class[cos:name=$f]"
            "/cos:scheduler/text()",
            namespaces=NAMESPACES,
            m=link.scheduler_map,
            f=link.forwarding_class,
        )
        temporal = found(
            "cos:schedulers[cos:name=$s]/cos:buffer-size/cos:temporal/text()",
            namespaces=NAMESPACES,
            s=link.scheduler,
        )
        if [str(x) for x in bound] != [link.scheduler_map] or [str(x) for x in chosen] != [
            link.scheduler
        ]:
            return None
        return str(temporal[0]).strip() if len(temporal) == 1 else None

    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int:
        link, rate = self._link(interface, queue)
        with self._session(attempt) as session:
            temporal = self._read_temporal(session, link)
        if temporal is None or not temporal.isdigit():
            raise self._error(
                ErrorKind.REJECTED,
                f"{interface}: no buffer-size temporal in µs for scheduler {link.scheduler} "
                f"through scheduler-map {link.scheduler_map} (forwarding class "
                f"{link.forwarding_class}) on {link.interface}: {temporal!r}",
            )
        return bytes_in_force(int(temporal), rate)

    # ---- writing ----------------------------------------------------------------------------
    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        link, rate = self._link(interface, queue)
        us = temporal_us(buffer_bytes, rate)
        with self._session(attempt) as session:
            capabilities = session.server_capabilities
            if CANDIDATE not in capabilities or not (
                CONFIRMED_COMMIT in capabilities or CONFIRMED_COMMIT_11 in capabilities
            ):
                raise self._error(
                    ErrorKind.REJECTED,
                    "the router offers no :candidate with :confirmed-commit, which this "
                    "driver commits through",
                )
            session.lock("candidate")
            try:
                self._commit_confirmed_cos(session, link, interface, us)
            finally:
                # On an error already in flight the session is hung up (which unlocks).
                with contextlib.suppress(Exception):
                    session.unlock("candidate")
        return bytes_in_force(us, rate)

    def _commit_confirmed_cos(
        self, session: Any, link: JunosLinkConfig, interface: str, us: int
    ) -> None:
        # If this process dies before confirming, the router rolls back by itself.
        confirm_timeout_s = max(1, math.ceil(self.timeout_s))
        session.discard_changes()  # commit only this change, not edits others left
        try:
            session.edit_config(target="candidate", config=cos_config(link, us))
            session.commit(confirmed=True, timeout=str(confirm_timeout_s))
        except BaseException:
            with contextlib.suppress(Exception):
                session.discard_changes()
            raise
        try:
            reported = self._read_temporal(session, link)
            if reported != str(us):
                raise self._error(
                    ErrorKind.MISMATCH,
                    f"{interface}: set temporal {us} µs on scheduler {link.scheduler}, the "
                    f"running configuration has {reported!r}; the commit is rolled back",
                )
            session.commit()
        except BaseException:
            if CONFIRMED_COMMIT_11 in session.server_capabilities:
                with contextlib.suppress(Exception):
                    session.cancel_commit()
            with contextlib.suppress(Exception):
                session.discard_changes()
            raise
