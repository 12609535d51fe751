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

A change, as Junos operators commit: refused before anything is sent when its µs are outside
the router's `temporal_range` (the platform's range); lock the candidate, discard what others
left in it, edit-config (merge), Junos's `<commit-configuration>` with `<confirmed/>` and a
`<confirm-timeout>` of the router's `confirm_window` in whole MINUTES (rounded up; Junos reads
the standard <commit>'s confirm-timeout differently, see the optimizer README), read the running
configuration back and compare all three statements, the confirming commit (an empty
`<commit-configuration/>`), then read running again: the change is reported applied only if
it is in force after the confirmation (a rollback that fired first shows the old value). On a
failure before the confirmation: cancel-commit when the router has :confirmed-commit:1.1;
with 1.0 the session, hung up on the error, ends, and the router rolls back (or at the confirm
window's end); then discard-changes and unlock. A link has one forwarding class: the driver
sizes queue 0.
"""

from __future__ import annotations

import contextlib
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
MINUTE_NS = 60_000_000_000


def temporal_us(buffer_bytes: int, rate_bps: int) -> int:
    """Bytes -> µs of `rate_bps`, to the nearest µs (halves up), at least 1."""
    if buffer_bytes <= 0 or rate_bps <= 0:
        raise ValueError(f"need a positive size and rate: {buffer_bytes} B, {rate_bps} bit/s")
    return max(1, (buffer_bytes * 16_000_000 + rate_bps) // (2 * rate_bps))


def bytes_in_force(us: int, rate_bps: int) -> int:
    """What a router puts in force for `us` µs of `rate_bps`: the bytes, rounded down."""
    return bytes_for_duration(us * 1000, rate_bps)


def confirm_minutes(window_ns: int) -> int:
    """A confirm window as Junos's <confirm-timeout>: whole minutes, rounded up, at least 1."""
    return max(1, -(-window_ns // MINUTE_NS))


def commit_configuration(confirm_timeout_min: int | None) -> etree._Element:
    """Junos's <commit-configuration>: confirmed with a confirm-timeout in minutes, or (None)
    the plain commit that confirms a pending one."""
    rpc = etree.Element("commit-configuration")
    if confirm_timeout_min is not None:
        etree.SubElement(rpc, "confirmed")
        etree.SubElement(rpc, "confirm-timeout").text = str(confirm_timeout_min)
    return rpc


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
        low_ns, high_ns = self.router.temporal_range_ns
        if not low_ns <= us * 1000 <= high_ns:
            raise self._error(
                ErrorKind.REJECTED,
                f"{interface}: {buffer_bytes} B is buffer-size temporal {us} µs at "
                f"{rate} bit/s, outside this router's temporal_range "
                f"[{low_ns // 1000}, {high_ns // 1000}] µs; nothing was sent",
            )
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
        minutes = confirm_minutes(self.router.confirm_window_ns)
        session.discard_changes()  # commit only this change, not edits others left
        try:
            session.edit_config(target="candidate", config=cos_config(link, us))
            session.dispatch(commit_configuration(minutes))
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
            session.dispatch(commit_configuration(None))
        except BaseException:
            if CONFIRMED_COMMIT_11 in session.server_capabilities:
                with contextlib.suppress(Exception):
                    session.cancel_commit()
            with contextlib.suppress(Exception):
                session.discard_changes()
            raise
        confirmed = self._read_temporal(session, link)
        if confirmed != str(us):
            raise self._error(
                ErrorKind.MISMATCH,
                f"{interface}: after the confirming commit the running configuration has "
                f"temporal {confirmed!r}, not {us} µs: the confirmed commit was rolled back "
                "before its confirmation",
            )
