"""The agent's Junos mode: NETCONF with a candidate datastore and confirmed commits, serving
Junos class-of-service as Juniper publishes it in YANG (junos-conf-root and
junos-conf-class-of-service), applied to the Linux router's queues.

Datastores: `running` and `candidate`, RFC 7951 JSON documents that always validate against
the Junos model (p4bs.yang): an edit-config (target candidate, merge) is merged into the
candidate and the result validated whole, or refused with an rpc-error naming the node.
What a commit puts in force: for each managed interface bound to a scheduler-map
(`class-of-service interfaces <if> scheduler-map <m>`), each of the map's forwarding classes
goes to its queue (Junos's default classes: best-effort q0, expedited-forwarding q1,
assured-forwarding q2, network-control q3) with its scheduler's `buffer-size temporal`, a
whole number of µs, which becomes the queue's byte limit (µs of the queue's guaranteed rate,
through RouterQos, which checks bounds and changes the FIFO in place). A commit the router
cannot apply is refused and changes nothing.

Commit confirmed (`<confirmed/>`, `<confirm-timeout>` s, default 600): the change is applied,
and rolled back (the running configuration and the queues' byte limits as they were) when
the agent's own timer expires before a confirming `<commit/>`, on `<cancel-commit/>`, or when
the session that made it ends holding the candidate's lock (the netconf package tells of a
session's end only through its locks). A second confirmed commit before the first is confirmed
restarts the timer and keeps the first rollback point. When the session that holds the
candidate's lock ends, the candidate is reset to running.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from typing import Any

import netconf
from lxml import etree
from netconf import error as ncerror
from netconf import server as ncserver
from netconf import util as ncutil

from p4bs.yang import YangError, YangModel
from p4bs_infra.agent.datastore import AgentError, PathElems, RouterQos
from p4bs_infra.agent.netconf_server import ERROR_TAGS

log = logging.getLogger(__name__)

JUNOS_ROOT_NS = "http://yang.juniper.net/junos/conf/root"
JUNOS_COS_NS = "http://yang.juniper.net/junos/conf/class-of-service"
NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
ROOT = "junos-conf-root:configuration"
COS = "junos-conf-class-of-service:class-of-service"
CAPABILITIES = (
    "urn:ietf:params:netconf:capability:candidate:1.0",
    "urn:ietf:params:netconf:capability:confirmed-commit:1.1",
    f"{JUNOS_ROOT_NS}?module=junos-conf-root&revision=2024-01-01",
    f"{JUNOS_COS_NS}?module=junos-conf-class-of-service&revision=2024-01-01",
)
DEFAULT_CONFIRM_TIMEOUT_S = 600  # RFC 6241
# Junos's default forwarding classes and their queues.
FORWARDING_CLASS_QUEUES = {
    "best-effort": 0,
    "expedited-forwarding": 1,
    "assured-forwarding": 2,
    "network-control": 3,
}
# Subtree filters name these prefixes' namespaces (the netconf package's registry).
netconf.nsmap_add("junos-root", JUNOS_ROOT_NS)
netconf.nsmap_add("junos-cos", JUNOS_COS_NS)

Buffers = dict[tuple[str, int], int]  # (interface, queue) -> µs, or bytes where so named


def temporal_buffers(config: dict[str, Any], interfaces: list[str]) -> Buffers:
    """(interface, queue) -> µs that `config` puts on the managed interfaces. Raises
    AgentError for what this router cannot apply."""
    cos = config.get(ROOT, {}).get(COS, {})
    schedulers = {s["name"]: s for s in cos.get("schedulers", [])}
    maps = {m["name"]: m for m in cos.get("scheduler-maps", [])}
    out: Buffers = {}
    for binding in cos.get("interfaces", {}).get("interface", []):
        interface, map_name = binding["name"], binding.get("scheduler-map")
        if map_name is None:
            continue
        where = f"class-of-service interfaces {interface} scheduler-map {map_name}"
        if interface not in interfaces:
            raise AgentError(AgentError.NOT_FOUND, f"{where}: no interface {interface!r} here")
        if map_name not in maps:
            raise AgentError(AgentError.INVALID, f"{where}: scheduler-map {map_name} not defined")
        for entry in maps[map_name].get("forwarding-class", []):
            fc, scheduler = entry["name"], entry.get("scheduler")
            where = f"class-of-service scheduler-maps {map_name} forwarding-class {fc}"
            if fc not in FORWARDING_CLASS_QUEUES:
                raise AgentError(
                    AgentError.INVALID,
                    f"{where}: forwarding classes here are {', '.join(FORWARDING_CLASS_QUEUES)}",
                )
            if scheduler not in schedulers:
                raise AgentError(AgentError.INVALID, f"{where}: scheduler {scheduler} not defined")
            size = schedulers[scheduler].get("buffer-size", {})
            temporal = size.get("temporal")
            where = f"class-of-service schedulers {scheduler} buffer-size"
            if temporal is None:
                raise AgentError(
                    AgentError.INVALID,
                    f"{where}: this router sizes buffers by temporal only, got {size!r}",
                )
            if not str(temporal).isdigit() or int(temporal) == 0:
                raise AgentError(
                    AgentError.INVALID,
                    f"{where} temporal {temporal!r}: a whole number of microseconds, at least 1",
                )
            out[(interface, FORWARDING_CLASS_QUEUES[fc])] = int(temporal)
    return out


@dataclass
class _Pending:
    """A confirmed commit not yet confirmed: what to go back to."""

    config: dict[str, Any]
    limits: Buffers  # bytes of the queues the commit changed, before it
    session_id: int
    timer: threading.Timer


class JunosDatastores:
    """running and candidate, commits with their rollback, applied to the router's queues."""

    def __init__(self, qos: RouterQos, model: YangModel) -> None:
        self.qos = qos
        self.model = model
        self.running: dict[str, Any] = {}
        self.candidate: dict[str, Any] = {}
        self._pending: _Pending | None = None
        self._lock = threading.RLock()

    # ---- the candidate ---------------------------------------------------------------------
    def edit(self, patch: dict[str, Any]) -> None:
        with self._lock:
            merged = self.model.merge(self.candidate, patch)
            self.model.validate(merged)
            self.candidate = merged

    def candidate_changed(self) -> bool:
        with self._lock:
            return self.candidate != self.running

    def discard(self) -> None:
        with self._lock:
            self.candidate = copy.deepcopy(self.running)

    # ---- commits ----------------------------------------------------------------------------
    def commit(self, session_id: int, confirmed: bool, timeout_s: int) -> None:
        with self._lock:
            before = self._limits()
            changed = {k: before[k] for k in self._apply(self.running, self.candidate)}
            previous, self.running = self.running, copy.deepcopy(self.candidate)
            pending = self._pending
            if not confirmed:
                if pending is not None:
                    pending.timer.cancel()
                    self._pending = None
                    log.info("commit confirmed by session %d", session_id)
                return
            if pending is not None:  # extended: the first rollback point stays
                pending.timer.cancel()
                rollback, limits = pending.config, {**changed, **pending.limits}
            else:
                rollback, limits = previous, changed
            timer = threading.Timer(timeout_s, self._expired)
            timer.daemon = True
            self._pending = _Pending(rollback, limits, session_id, timer)
            timer.start()
            log.info("commit confirmed pending: rolled back unless confirmed in %d s", timeout_s)

    def cancel(self, reason: str) -> None:
        """Rolls back the pending confirmed commit; AgentError if there is none."""
        with self._lock:
            pending = self._pending
            if pending is None:
                raise AgentError(AgentError.INVALID, "no confirmed commit is pending")
            pending.timer.cancel()
            self._pending = None
            self._rollback(pending, reason)

    def session_ended(self, session_id: int) -> None:
        with self._lock:
            pending = self._pending
            if pending is not None and pending.session_id == session_id:
                self.cancel(f"session {session_id}, which made it, ended")

    def _expired(self) -> None:
        with self._lock:
            pending = self._pending
            if pending is None or threading.current_thread() is not pending.timer:
                return  # confirmed or cancelled meanwhile
            self._pending = None
            self._rollback(pending, "not confirmed in time")

    def _rollback(self, pending: _Pending, reason: str) -> None:
        try:
            self._set_bytes(pending.limits)
        except AgentError as err:  # the queues cannot be restored: say so, keep serving
            log.error("rolling back the confirmed commit: %s", err)
        self.running = pending.config
        self.candidate = copy.deepcopy(pending.config)
        log.info("confirmed commit rolled back (%s)", reason)

    # ---- the router's queues ----------------------------------------------------------------
    def _limits_of(self, config: dict[str, Any]) -> Buffers:
        return temporal_buffers(config, self.qos.interfaces)

    def _limits(self) -> Buffers:
        """Every queue's byte limit now."""
        return {(q.interface, int(q.name[1:])): q.limit_bytes for q in self.qos.queues()}

    def _apply(self, running: dict[str, Any], candidate: dict[str, Any]) -> list[tuple[str, int]]:
        """Puts the candidate's temporal buffers that differ from running's in force, all at
        once or none; returns the queues changed."""
        wanted, now = self._limits_of(candidate), self._limits_of(running)
        changes = {k: us for k, us in wanted.items() if now.get(k) != us}
        leaf = "dedicated-buffer-temporal"
        if changes:
            self.qos.set([(_profile_leaf(k, leaf), str(us)) for k, us in changes.items()], [])
        return list(changes)

    def _set_bytes(self, limits: Buffers) -> None:
        if limits:
            self.qos.set(
                [(_profile_leaf(k, "dedicated-buffer"), str(size)) for k, size in limits.items()],
                [],
            )


def _profile_leaf(key: tuple[str, int], leaf: str) -> PathElems:
    interface, queue = key
    return [
        ("qos", {}),
        ("buffer-allocation-profiles", {}),
        ("buffer-allocation-profile", {"name": interface}),
        ("queues", {}),
        ("queue", {"name": f"q{queue}"}),
        ("config", {}),
        (leaf, {}),
    ]


def _rpc_error(rpc: Any, tag: str, message: str, kind: str = "application") -> Exception:
    error: Exception = ncerror.RPCServerError(rpc, kind, tag, message=message)
    return error


class JunosMethods(ncserver.NetconfMethods):  # type: ignore[misc]
    def __init__(self, stores: JunosDatastores) -> None:
        self.stores = stores

    def nc_append_capabilities(self, capabilities: etree._Element) -> None:
        for capability in CAPABILITIES:
            ncutil.subelm(capabilities, "capability").text = capability

    # ---- reading ----------------------------------------------------------------------------
    def _data(self, rpc: Any, config: dict[str, Any], filter_or_none: Any) -> Any:
        data = ncutil.elm("nc:data")
        if config:
            for top in self.stores.model.to_xml(config):
                data.append(top)
        return ncutil.filter_results(rpc, data, filter_or_none)

    def rpc_get(self, session: Any, rpc: Any, filter_or_none: Any) -> Any:
        return self._data(rpc, self.stores.running, filter_or_none)

    def rpc_get_config(self, session: Any, rpc: Any, source: Any, filter_or_none: Any) -> Any:
        name = _datastore(rpc, source)
        config = self.stores.candidate if name == "candidate" else self.stores.running
        return self._data(rpc, config, filter_or_none)

    # ---- the candidate ----------------------------------------------------------------------
    def _check_lock(self, session: Any, rpc: Any) -> None:
        holder = session.server.is_target_locked("candidate")
        if holder and holder != session.session_id:
            raise _rpc_error(rpc, "in-use", f"the candidate is locked by session {holder}")

    def rpc_edit_config(self, session: Any, rpc: Any, *params: etree._Element) -> Any:
        by_name = {etree.QName(p).localname: p for p in params}
        if "target" not in by_name or _datastore(rpc, by_name["target"]) != "candidate":
            raise _rpc_error(
                rpc,
                "operation-not-supported",
                "running is not writable here: edit the candidate, then commit",
                "protocol",
            )
        operation = by_name.get("default-operation")
        if operation is not None and (operation.text or "").strip() != "merge":
            raise _rpc_error(rpc, "operation-not-supported", "only the merge operation")
        config = by_name.get("config")
        if config is None:
            raise ncerror.MissingElementProtoError(rpc, ncutil.qname("nc:config"))
        for node in config.iter():
            if node.get(f"{{{NC_NS}}}operation") not in (None, "merge"):
                raise _rpc_error(
                    rpc,
                    "operation-not-supported",
                    f"{etree.QName(node).localname}: only the merge operation",
                )
        self._check_lock(session, rpc)
        try:
            self.stores.edit(self.stores.model.from_xml(config))
        except YangError as err:
            log.info("NETCONF edit-config refused: %s", err)
            raise _rpc_error(rpc, "invalid-value", str(err)) from err
        log.info("NETCONF edit-config: candidate changed")
        return etree.Element("ok")

    def rpc_discard_changes(self, session: Any, rpc: Any, *params: Any) -> Any:
        self._check_lock(session, rpc)
        self.stores.discard()
        return etree.Element("ok")

    # ---- commits ----------------------------------------------------------------------------
    def rpc_commit(self, session: Any, rpc: Any, *params: etree._Element) -> Any:
        by_name = {etree.QName(p).localname: p for p in params}
        if set(by_name) - {"confirmed", "confirm-timeout"}:
            unknown = ", ".join(sorted(set(by_name) - {"confirmed", "confirm-timeout"}))
            raise _rpc_error(rpc, "operation-not-supported", f"commit: {unknown} not supported")
        timeout_s = DEFAULT_CONFIRM_TIMEOUT_S
        if "confirm-timeout" in by_name:
            text = (by_name["confirm-timeout"].text or "").strip()
            if not text.isdigit() or not 1 <= int(text) <= 2**32 - 1:
                raise _rpc_error(rpc, "invalid-value", f"confirm-timeout: seconds, got {text!r}")
            timeout_s = int(text)
        self._check_lock(session, rpc)
        try:
            self.stores.commit(session.session_id, "confirmed" in by_name, timeout_s)
        except AgentError as err:
            log.info("NETCONF commit refused: %s", err)
            raise _rpc_error(rpc, ERROR_TAGS[err.kind], str(err)) from err
        log.info("NETCONF commit%s applied", " confirmed" if "confirmed" in by_name else "")
        return etree.Element("ok")

    def rpc_cancel_commit(self, session: Any, rpc: Any, *params: Any) -> Any:
        try:
            self.stores.cancel(f"cancel-commit from session {session.session_id}")
        except AgentError as err:
            raise _rpc_error(rpc, ERROR_TAGS[err.kind], str(err)) from err
        return etree.Element("ok")

    def rpc_lock(self, session: Any, rpc: Any, target: str) -> Any:
        # RFC 6241 8.3.5.1: no lock on a candidate holding changes not committed.
        if target == "candidate" and self.stores.candidate_changed():
            raise _rpc_error(
                rpc, "lock-denied", "the candidate has changes not committed", "protocol"
            )
        return etree.Element("ok")

    def rpc_unlock(self, session: Any, rpc: Any, target: str) -> Any:
        if rpc is None:  # the netconf package's call when the session holding it ends
            self.stores.session_ended(session.session_id)
            if target == "candidate":
                self.stores.discard()
        return etree.Element("ok")


def _datastore(rpc: Any, element: etree._Element) -> str:
    names = [etree.QName(child).localname for child in element]
    if names not in (["running"], ["candidate"]):
        raise _rpc_error(rpc, "invalid-value", f"no datastore {names}: running or candidate")
    return str(names[0])
