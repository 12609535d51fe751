"""The gNMI side's OpenConfig QoS configuration, shaped like a router's and checked like one.

The agent starts, as a router does, with its interfaces only: no queues under /qos/queues, no
buffer-allocation profile, nothing bound. A Set is applied to a copy of the configuration
(deletes, then the updates merged as RFC 7951 JSON) and the result validated against
openconfig-qos (p4bs.yang, the published models): keys, types, ranges, leafrefs with
instance-required, module-qualified member names. A Set that does not validate is refused
whole (AgentError INVALID: gNMI INVALID_ARGUMENT) and nothing changes.

What is in force follows the configuration as a router's would:
- an interface's output queues (`output/queues/queue[name=qN]`, q0..q15 here) are its tc
  queues: one configured that tc lacks is made, one removed from the configuration goes;
- a buffer reaches tc only through a profile bound to the interface's output
  (`output/config/buffer-allocation-profile`): that profile's `queues/queue[name=qN]/config/
  dedicated-buffer` (bytes) or `dedicated-buffer-temporal` (µs) is the FIFO's limit of qN.
  A profile bound to nothing changes nothing;
- the terms of the classifier bound to the interface's output (`output/classifiers/
  classifier[type=IPV4]`) are its tc filters; a term's target-group is a forwarding group,
  whose output-queue is the queue the flow goes to.
The change is put in force through RouterQos (all of it or, undone, none), then kept.

State (Get without type CONFIG) adds what is in force: the interface's output/state naming
the bound profile, each output queue's counters (tc's queues, configured or not), and a
profile queue's state/dedicated-buffer: the FIFO's limit where the profile is bound, its
configured value where it is not.
"""

from __future__ import annotations

import copy
import re
import threading
from dataclasses import dataclass
from typing import Any

from p4bs.yang import YangError, YangModel, delete, embed, yang_model
from p4bs_infra.agent.datastore import (
    UNSIGNED,
    AgentError,
    PathElems,
    RouterQos,
    format_path,
    nodes_at,
    queue_state,
)

MODULE = "openconfig-qos"
TOP = f"{MODULE}:qos"
QUEUE_NAME = re.compile(r"q([0-9]|1[0-5])")
BUFFER_LEAVES = ("dedicated-buffer", "dedicated-buffer-temporal")
Buffers = dict[tuple[str, str], tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Scalar:
    """A gNMI typed scalar (uint_val, string_val, ...) as text: its JSON form is the leaf's
    type's, known only from the schema."""

    text: str


def _entries(node: Any, container: str, name: str) -> list[dict[str, Any]]:
    found = node.get(container, {}).get(name, []) if isinstance(node, dict) else []
    return [e for e in found if isinstance(e, dict)]


class OpenConfigQos:
    def __init__(self, qos: RouterQos, model: YangModel | None = None) -> None:
        self.qos = qos
        self.model = model or yang_model("openconfig")
        interfaces = [{"interface-id": i, "config": {"interface-id": i}} for i in qos.interfaces]
        self.config: dict[str, Any] = {TOP: {"interfaces": {"interface": interfaces}}}
        self.model.validate(self.config)
        self._lock = threading.Lock()

    # ---- reading ---------------------------------------------------------------------------
    def tree(self, config_only: bool = False) -> dict[str, Any]:
        """The /qos subtree as RFC 7951 JSON (without the module prefix)."""
        qos: dict[str, Any] = copy.deepcopy(self.config[TOP])
        if not config_only:
            self._add_state(qos)
        return qos

    def get(self, path: PathElems, config_only: bool = False) -> list[tuple[PathElems, Any]]:
        """Every node matching `path` (keys may be omitted or '*': wildcards) with its value."""
        return nodes_at(self.tree(config_only), _below_qos(path), path)

    def _add_state(self, qos: dict[str, Any]) -> None:
        queues = self.qos.queues()
        bound: dict[str, list[str]] = {}
        for interface in _entries(qos, "interfaces", "interface"):
            name = str(interface.get("interface-id"))
            output = interface.setdefault("output", {})
            profile = output.get("config", {}).get("buffer-allocation-profile")
            output["state"] = {}  # what is in force: no profile, unless one is bound
            if profile is not None:
                output["state"]["buffer-allocation-profile"] = profile
                bound.setdefault(profile, []).append(name)
            entries = output.setdefault("queues", {}).setdefault("queue", [])
            by_name = {e.get("name"): e for e in entries}
            for q in queues:
                if q.interface != name:
                    continue
                entry = by_name.get(q.name)
                if entry is None:
                    entry = {"name": q.name}
                    entries.append(entry)
                entry["state"] = queue_state(q)
        in_force = {(q.interface, q.name): q for q in queues}
        for entry in _entries(qos, "buffer-allocation-profiles", "buffer-allocation-profile"):
            entry["state"] = dict(entry.get("config", {}))
            for queue in _entries(entry, "queues", "queue"):
                state = dict(queue.get("config", {}))
                for owner in bound.get(str(entry.get("name")), []):
                    fifo = in_force.get((owner, str(queue.get("name"))))
                    if fifo is not None:
                        state["dedicated-buffer"] = str(fifo.limit_bytes)
                        state["dedicated-buffer-temporal"] = str(fifo.temporal_us())
                queue["state"] = state

    # ---- writing ---------------------------------------------------------------------------
    def set(self, updates: list[tuple[PathElems, Any]], deletes: list[PathElems]) -> None:
        """Validates the configuration the Set makes, then puts it in force, all or nothing.
        A value at the root names its top members as RFC 7951 does (openconfig-qos:qos)."""
        with self._lock:
            doc = copy.deepcopy(self.config)
            try:
                for path in deletes:
                    delete(doc, [("qos", {}), *_below_qos(path)], MODULE)
                given: dict[tuple[str, str], set[str]] = {}
                for path, value in updates:
                    patch = self._document(path, value)
                    _one_buffer_leaf(doc, patch, given)
                    doc = self.model.merge(doc, patch)
                self.model.validate(doc)
                _strict_buffers(doc)
            except YangError as exc:
                raise AgentError(AgentError.INVALID, f"the schema refuses it: {exc}") from None
            self._put_in_force(self.config, doc)
            self.config = doc

    def _document(self, path: PathElems, value: Any) -> dict[str, Any]:
        if not path:  # the root: the value names its top members
            if not isinstance(value, dict):
                raise AgentError(AgentError.INVALID, "a Set at the root takes a JSON object")
            return dict(value)
        elems = [("qos", {}), *_below_qos(path)]
        if isinstance(value, Scalar):
            names = [name for name, _ in elems]
            try:
                value = self.model.scalar(MODULE, names, value.text)
            except YangError as exc:
                raise AgentError(AgentError.INVALID, str(exc)) from None
        if isinstance(value, list):
            raise AgentError(AgentError.INVALID, f"{format_path(path)}: a list needs its entry")
        if not isinstance(value, dict):  # a leaf: placed in its parent
            (name, keys), elems = elems[-1], elems[:-1]
            if keys:
                raise AgentError(AgentError.INVALID, f"{format_path(path)}: not a leaf")
            value = {name: value}
        return embed(elems, value, MODULE)

    # ---- what is in force ------------------------------------------------------------------
    def _put_in_force(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        for interface in {str(e.get("interface-id")) for e in _interfaces(new)}:
            if interface not in self.qos.interfaces:
                raise AgentError(AgentError.NOT_FOUND, f"no interface {interface!r} here")
        updates: list[tuple[PathElems, Any]] = []
        deletes: list[PathElems] = []
        kernel = {(q.interface, q.name) for q in self.qos.queues()}
        was, now = _output_queues(old), _output_queues(new)
        for interface, name in sorted(now - was - kernel):
            if QUEUE_NAME.fullmatch(name) is None:
                raise AgentError(
                    AgentError.INVALID, f"{interface} output queue {name!r}: queues are q0..q15"
                )
            updates.append((_output_queue(interface, name), {"config": {"name": name}}))
        dropped = (was - now) & kernel
        for interface, name in sorted(dropped):
            deletes.append(_output_queue(interface, name))
        # Every bound buffer, changed or not: what the configuration says is what is in force,
        # also after another client (NETCONF, Junos) changed the FIFO.
        for (interface, name), buffer in sorted(_buffers(new).items()):
            if (interface, name) in (now | kernel) - dropped:
                updates.append((_profile_queue(interface, name), {"config": dict(buffer)}))
        for interface in self.qos.interfaces:
            wanted = _terms(new, interface)
            had = {tid: t for (i, tid), t in self.qos.terms.items() if i == interface}
            for term_id in had:
                if wanted.get(term_id) != _as_written(had[term_id]):
                    deletes.append(_term(interface, term_id))
            for term_id, term in wanted.items():
                if _as_written(had.get(term_id, {})) != term:
                    updates.append((_term(interface, term_id), _term_value(term)))
        if updates or deletes:
            try:
                self.qos.set(updates, deletes)
            except AgentError as error:  # its paths are the kernel side's: say so
                raise AgentError(error.kind, f"cannot be put in force: {error}") from error


def _below_qos(path: PathElems) -> PathElems:
    """A gNMI path without its first element, which must be (openconfig-qos:)qos."""
    if not path:
        return []
    if path[0][0] not in ("qos", TOP):
        raise AgentError(AgentError.NOT_FOUND, f"{format_path(path)}: this agent serves /qos")
    return path[1:]


def _one_buffer_leaf(
    doc: dict[str, Any], patch: dict[str, Any], given: dict[tuple[str, str], set[str]]
) -> None:
    """dedicated-buffer and dedicated-buffer-temporal exclude each other (the model says so
    in words): setting one removes the other; both in one request conflict."""
    qos = patch.get(TOP, {})
    for profile in _entries(qos, "buffer-allocation-profiles", "buffer-allocation-profile"):
        for queue in _entries(profile, "queues", "queue"):
            key = (str(profile.get("name")), str(queue.get("name")))
            leaves = given.setdefault(key, set())
            leaves.update(leaf for leaf in BUFFER_LEAVES if leaf in queue.get("config", {}))
            if len(leaves) > 1:
                raise YangError(
                    f"{key[0]}/{key[1]}: dedicated-buffer and dedicated-buffer-temporal "
                    "conflict: set one per request"
                )
            for other in set(BUFFER_LEAVES) - leaves if leaves else ():
                delete(doc, [*_profile_queue(key[0], key[1]), ("config", {}), (other, {})], MODULE)


def _strict_buffers(doc: dict[str, Any]) -> None:
    """yangson takes " 12" and non-ASCII digits for a uint64; YANG's lexical form does not."""
    qos = doc.get(TOP, {})
    for profile in _entries(qos, "buffer-allocation-profiles", "buffer-allocation-profile"):
        for entry in _entries(profile, "queues", "queue"):
            for leaf in BUFFER_LEAVES:
                value = entry.get("config", {}).get(leaf)
                if value is not None and not UNSIGNED.fullmatch(str(value)):
                    where = f"{profile.get('name')}/{entry.get('name')}/config/{leaf}"
                    raise YangError(f"{where}: {value!r} is not an unsigned integer")


def _interfaces(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return _entries(doc.get(TOP, {}), "interfaces", "interface")


def _output_queues(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (str(i.get("interface-id")), str(q.get("name")))
        for i in _interfaces(doc)
        for q in _entries(i.get("output", {}), "queues", "queue")
    }


def _buffers(doc: dict[str, Any]) -> Buffers:
    """(interface, queue) -> the buffer leaves of the profile bound to its output."""
    qos = doc.get(TOP, {})
    profiles = {
        p.get("name"): p
        for p in _entries(qos, "buffer-allocation-profiles", "buffer-allocation-profile")
    }
    out: Buffers = {}
    for interface in _interfaces(doc):
        bound = interface.get("output", {}).get("config", {}).get("buffer-allocation-profile")
        for entry in _entries(profiles.get(bound, {}), "queues", "queue"):
            config = entry.get("config", {})
            leaves = tuple((k, str(config[k])) for k in BUFFER_LEAVES if k in config)
            if leaves:
                out[(str(interface.get("interface-id")), str(entry.get("name")))] = leaves
    return out


def _terms(doc: dict[str, Any], interface: str) -> dict[int, dict[str, Any]]:
    """The terms of the classifier bound to the interface's output, as RouterQos keeps them
    (the target a queue name)."""
    qos = doc.get(TOP, {})
    entry = next((i for i in _interfaces(doc) if i.get("interface-id") == interface), {})
    names = {
        c.get("config", {}).get("name")
        for c in _entries(entry.get("output", {}), "classifiers", "classifier")
    }
    groups = {
        g.get("name"): g.get("config", {}).get("output-queue")
        for g in _entries(qos, "forwarding-groups", "forwarding-group")
    }
    out: dict[int, dict[str, Any]] = {}
    for classifier in _entries(qos, "classifiers", "classifier"):
        if classifier.get("name") not in names:
            continue
        for term in _entries(classifier, "terms", "term"):
            fields: dict[str, Any] = {}
            conditions = term.get("conditions", {})
            fields.update(conditions.get("ipv4", {}).get("config", {}))
            fields.update(conditions.get("transport", {}).get("config", {}))
            target = term.get("actions", {}).get("config", {}).get("target-group")
            if target is not None:
                fields["target-group"] = groups.get(target, target)
            term_id = str(term.get("id"))
            if not term_id.isascii() or not term_id.isdigit():
                raise AgentError(AgentError.INVALID, f"term {term_id!r}: ids here are 1..999")
            out[int(term_id)] = {k: v for k, v in fields.items() if k in TERM_FIELDS}
    return out


TERM_FIELDS = (
    "source-address",
    "destination-address",
    "protocol",
    "source-port",
    "destination-port",
    "target-group",
)


def _as_written(term: dict[str, Any]) -> dict[str, Any]:
    """A term as RouterQos keeps it, compared as the configuration writes it."""
    return {k: term[k] for k in TERM_FIELDS if k in term}


def _term_value(term: dict[str, Any]) -> dict[str, Any]:
    ipv4 = {k: term[k] for k in ("source-address", "destination-address", "protocol") if k in term}
    transport = {k: term[k] for k in ("source-port", "destination-port") if k in term}
    value: dict[str, Any] = {"conditions": {"ipv4": {"config": ipv4}}}
    value["conditions"]["transport"] = {"config": transport}
    if "target-group" in term:
        value["actions"] = {"config": {"target-group": term["target-group"]}}
    return value


def _output_queue(interface: str, name: str) -> PathElems:
    return [
        ("qos", {}),
        ("interfaces", {}),
        ("interface", {"interface-id": interface}),
        ("output", {}),
        ("queues", {}),
        ("queue", {"name": name}),
    ]


def _profile_queue(interface: str, name: str) -> PathElems:
    """RouterQos's own profile of the interface: how it takes a FIFO's limit."""
    return [
        ("qos", {}),
        ("buffer-allocation-profiles", {}),
        ("buffer-allocation-profile", {"name": interface}),
        ("queues", {}),
        ("queue", {"name": name}),
    ]


def _term(interface: str, term_id: int) -> PathElems:
    return [
        ("qos", {}),
        ("classifiers", {}),
        ("classifier", {"name": interface}),
        ("terms", {}),
        ("term", {"id": str(term_id)}),
    ]
