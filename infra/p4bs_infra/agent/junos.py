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

Commits, as Junos takes them: the NETCONF `<commit>` (`<confirmed/>`, `<confirm-timeout>` in
SECONDS, default 600) and Junos's own `<commit-configuration>` (`<confirmed/>`,
`<confirm-timeout>` in MINUTES, 1..65535, default 10; an empty `<commit-configuration/>` is
the confirming commit). A confirmed commit is applied, and rolled back (the running
configuration and the queues' byte limits as they were) when its timer expires before a
confirming commit, on `<cancel-commit/>` (confirmed-commit 1.1 only), or when the session
that made it ends. It belongs to that session (RFC 6241 8.4, no `<persist>` here): another
session's commit, commit-configuration or cancel-commit is refused while it is pending. A
second confirmed commit of the same session restarts the timer and keeps the first rollback
point. The agent advertises `:confirmed-commit:1.0` as Junos does (1.1 with
`--confirmed-commit-1.1`). `minute_s` is how long a confirm-timeout minute lasts: 60, or less
in tests only (`--confirm-minute-s`). Every commit is logged with its RPC, session and
confirm-timeout. When the session that holds the candidate's lock ends, the candidate is
reset to running.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

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
CONFIRMED_COMMIT_10 = "urn:ietf:params:netconf:capability:confirmed-commit:1.0"
CONFIRMED_COMMIT_11 = "urn:ietf:params:netconf:capability:confirmed-commit:1.1"
CAPABILITIES = (
    "urn:ietf:params:netconf:capability:candidate:1.0",
    f"{JUNOS_ROOT_NS}?module=junos-conf-root&revision=2024-01-01",
    f"{JUNOS_COS_NS}?module=junos-conf-class-of-service&revision=2024-01-01",
)
DEFAULT_CONFIRM_TIMEOUT_S = 600  # RFC 6241 <commit>
DEFAULT_CONFIRM_TIMEOUT_MIN = 10  # Junos <commit-configuration>
MAX_CONFIRM_TIMEOUT_MIN = 65_535
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


class Queues(Protocol):
    """The router's queues a commit puts in force: byte limits, set from µs of each queue's
    guaranteed rate, or restored in bytes; all of a call or none (AgentError)."""

    interfaces: list[str]

    def limits(self) -> Buffers: ...

    def set_temporal(self, us: Buffers) -> None: ...

    def set_bytes(self, limits: Buffers) -> None: ...


class KernelQueues:
    """The Linux router's queues (RouterQos: tc's FIFOs, bounds checked)."""

    def __init__(self, qos: RouterQos) -> None:
        self.qos = qos
        self.interfaces = qos.interfaces

    def limits(self) -> Buffers:
        return {(q.interface, int(q.name[1:])): q.limit_bytes for q in self.qos.queues()}

    def set_temporal(self, us: Buffers) -> None:
        self._set("dedicated-buffer-temporal", us)

    def set_bytes(self, limits: Buffers) -> None:
        self._set("dedicated-buffer", limits)

    def _set(self, leaf: str, values: Buffers) -> None:
        if values:
            self.qos.set([(_profile_leaf(k, leaf), str(v)) for k, v in values.items()], [])


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


class NotYours(Exception):
    """A session acting on another session's pending confirmed commit (RFC 6241 8.4)."""


@dataclass
class _Pending:
    """A confirmed commit not yet confirmed: what to go back to, and whose it is."""

    config: dict[str, Any]
    limits: Buffers  # bytes of the queues the commit changed, before it
    session_id: int
    timer: threading.Timer


class JunosDatastores:
    """running and candidate, commits with their rollback, applied to the router's queues."""

    def __init__(self, queues: Queues, model: YangModel, minute_s: float = 60.0) -> None:
        self.queues = queues
        self.model = model
        self.minute_s = minute_s
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
    def commit(self, session_id: int, confirmed: bool, timeout_s: float) -> None:
        """Puts the candidate in force. Confirmed: rolled back unless the same session
        confirms within `timeout_s`. AgentError if another session's confirmed commit is
        pending or the router cannot apply the candidate (then nothing changed)."""
        with self._lock:
            pending = self._pending
            if pending is not None and pending.session_id != session_id:
                raise NotYours(
                    f"a confirmed commit of session {pending.session_id} is pending: only "
                    "that session may confirm or extend it"
                )
            before = self.queues.limits()
            changed = {k: before[k] for k in self._apply(self.running, self.candidate)}
            previous, self.running = self.running, copy.deepcopy(self.candidate)
            if not confirmed:
                if pending is not None:
                    pending.timer.cancel()
                    self._pending = None
                    log.info(
                        "session %d: its commit confirmed by session %d",
                        pending.session_id,
                        session_id,
                    )
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

    def cancel(self, session_id: int) -> None:
        """Rolls back the session's pending confirmed commit (cancel-commit)."""
        with self._lock:
            pending = self._pending
            if pending is None:
                raise AgentError(AgentError.INVALID, "no confirmed commit is pending")
            if pending.session_id != session_id:
                raise NotYours(
                    f"the pending confirmed commit is session {pending.session_id}'s: "
                    "only that session may cancel it"
                )
            self._roll_back(pending, f"cancel-commit from session {session_id}")

    def pending_session(self) -> int | None:
        """The session whose confirmed commit is pending, if one is."""
        with self._lock:
            return None if self._pending is None else self._pending.session_id

    def session_ended(self, session_id: int) -> None:
        with self._lock:
            pending = self._pending
            if pending is not None and pending.session_id == session_id:
                self._roll_back(pending, f"session {session_id}, which made it, ended")

    def _expired(self) -> None:
        with self._lock:
            pending = self._pending
            if pending is None or threading.current_thread() is not pending.timer:
                return  # confirmed or cancelled meanwhile
            self._roll_back(pending, "not confirmed in time")

    def _roll_back(self, pending: _Pending, reason: str) -> None:
        pending.timer.cancel()
        self._pending = None
        try:
            self.queues.set_bytes(pending.limits)
        except AgentError as err:  # the queues cannot be restored: say so, keep serving
            log.error("rolling back the confirmed commit: %s", err)
        self.running = pending.config
        self.candidate = copy.deepcopy(pending.config)
        log.info("session %d: confirmed commit rolled back (%s)", pending.session_id, reason)

    # ---- the router's queues ----------------------------------------------------------------
    def _apply(self, running: dict[str, Any], candidate: dict[str, Any]) -> list[tuple[str, int]]:
        """Puts the candidate's temporal buffers that differ from running's in force, all at
        once or none; returns the queues changed."""
        interfaces = self.queues.interfaces
        wanted = temporal_buffers(candidate, interfaces)
        now = temporal_buffers(running, interfaces)
        changes = {k: us for k, us in wanted.items() if now.get(k) != us}
        self.queues.set_temporal(changes)
        return list(changes)


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


def _params(rpc: Any, params: tuple[etree._Element, ...], known: set[str]) -> set[str]:
    """The names of a commit's parameters; an rpc-error for any other."""
    names = {etree.QName(p).localname for p in params}
    if names - known:
        unknown = ", ".join(sorted(names - known))
        raise _rpc_error(rpc, "operation-not-supported", f"{unknown} not supported here")
    return names


def _whole(rpc: Any, params: tuple[etree._Element, ...], low: int, high: int, unit: str) -> int:
    """<confirm-timeout> as a whole number in [low, high] of `unit`."""
    found = [p for p in params if etree.QName(p).localname == "confirm-timeout"]
    text = (found[0].text or "").strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise _rpc_error(
            rpc, "invalid-value", f"confirm-timeout: whole {unit} in {low}..{high}, got {text!r}"
        )
    return int(text)


class JunosMethods(ncserver.NetconfMethods):  # type: ignore[misc]
    def __init__(self, stores: JunosDatastores, confirmed_commit_11: bool = False) -> None:
        self.stores = stores
        self.confirmed_commit = CONFIRMED_COMMIT_11 if confirmed_commit_11 else CONFIRMED_COMMIT_10

    def nc_append_capabilities(self, capabilities: etree._Element) -> None:
        for capability in (*CAPABILITIES, self.confirmed_commit):
            ncutil.subelm(capabilities, "capability").text = capability

    def nc_session_ended(self, session: Any) -> None:
        """Called by the server (netconf_server.serve) when a session ends, however."""
        self.stores.session_ended(session.session_id)

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
        log.info("session %d: get-config %s", session.session_id, name)
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
            log.info("session %d: edit-config refused: %s", session.session_id, err)
            raise _rpc_error(rpc, "invalid-value", str(err)) from err
        log.info("session %d: edit-config: candidate changed", session.session_id)
        return etree.Element("ok")

    def rpc_discard_changes(self, session: Any, rpc: Any, *params: Any) -> Any:
        self._check_lock(session, rpc)
        self.stores.discard()
        log.info("session %d: discard-changes", session.session_id)
        return etree.Element("ok")

    # ---- commits ----------------------------------------------------------------------------
    def rpc_commit(self, session: Any, rpc: Any, *params: etree._Element) -> Any:
        """RFC 6241 <commit>: confirm-timeout in seconds."""
        names = _params(rpc, params, {"confirmed", "confirm-timeout"})
        timeout_s = DEFAULT_CONFIRM_TIMEOUT_S
        if "confirm-timeout" in names:
            timeout_s = _whole(rpc, params, 1, 2**32 - 1, "seconds")
        what = f"commit confirmed, confirm-timeout {timeout_s} s"
        return self._commit(session, rpc, "confirmed" in names, timeout_s, what)

    def rpc_commit_configuration(self, session: Any, rpc: Any, *params: etree._Element) -> Any:
        """Junos's <commit-configuration>: confirm-timeout in minutes."""
        names = _params(rpc, params, {"confirmed", "confirm-timeout"})
        if "confirm-timeout" in names and "confirmed" not in names:
            raise _rpc_error(rpc, "missing-element", "confirm-timeout needs <confirmed/>")
        minutes = DEFAULT_CONFIRM_TIMEOUT_MIN
        if "confirm-timeout" in names:
            minutes = _whole(rpc, params, 1, MAX_CONFIRM_TIMEOUT_MIN, "minutes")
        timeout_s = minutes * self.stores.minute_s
        what = f"commit-configuration confirmed, confirm-timeout {minutes} min ({timeout_s:g} s)"
        return self._commit(session, rpc, "confirmed" in names, timeout_s, what)

    def _commit(self, session: Any, rpc: Any, confirmed: bool, timeout_s: float, what: str) -> Any:
        name = etree.QName(rpc[0]).localname
        self._check_lock(session, rpc)
        try:
            self.stores.commit(session.session_id, confirmed, timeout_s)
        except NotYours as err:
            log.info("session %d: %s refused: %s", session.session_id, name, err)
            raise _rpc_error(rpc, "in-use", str(err)) from err
        except AgentError as err:
            log.info("session %d: %s refused: %s", session.session_id, name, err)
            raise _rpc_error(rpc, ERROR_TAGS[err.kind], str(err)) from err
        if confirmed:
            log.info("session %d: %s: rolled back unless confirmed", session.session_id, what)
        else:
            log.info("session %d: %s applied", session.session_id, name)
        return etree.Element("ok")

    def rpc_cancel_commit(self, session: Any, rpc: Any, *params: Any) -> Any:
        if self.confirmed_commit != CONFIRMED_COMMIT_11:
            raise _rpc_error(
                rpc,
                "operation-not-supported",
                "cancel-commit is confirmed-commit 1.1; this router offers 1.0",
                "protocol",
            )
        try:
            self.stores.cancel(session.session_id)
        except NotYours as err:
            log.info("session %d: cancel-commit refused: %s", session.session_id, err)
            raise _rpc_error(rpc, "in-use", str(err)) from err
        except AgentError as err:
            raise _rpc_error(rpc, ERROR_TAGS[err.kind], str(err)) from err
        return etree.Element("ok")

    def rpc_lock(self, session: Any, rpc: Any, target: str) -> Any:
        # RFC 6241 8.3.5.1: no lock on a candidate holding changes not committed.
        if target == "candidate" and self.stores.candidate_changed():
            raise _rpc_error(
                rpc, "lock-denied", "the candidate has changes not committed", "protocol"
            )
        log.info("session %d: lock %s", session.session_id, target)
        return etree.Element("ok")

    def rpc_unlock(self, session: Any, rpc: Any, target: str) -> Any:
        if rpc is None and target == "candidate":  # the session holding it ended
            self.stores.discard()
        log.info("session %s: unlock %s", session.session_id, target)
        return etree.Element("ok")


def _datastore(rpc: Any, element: etree._Element) -> str:
    names = [etree.QName(child).localname for child in element]
    if names not in (["running"], ["candidate"]):
        raise _rpc_error(rpc, "invalid-value", f"no datastore {names}: running or candidate")
    return str(names[0])
