"""A subset of OpenConfig QoS served by the router agent, mapped onto Linux tc.

Every managed interface has an htb root whose classes 1:10, 1:11, ... each feed a bfifo: those
are the interface's output queues q0, q1, ... (q<k> = class 1:<0x10 + k>). One
buffer-allocation-profile per interface, named like the interface, is bound to its output:

  /qos/buffer-allocation-profiles/buffer-allocation-profile[name=IF]/queues/queue[name=Q]/config/
      dedicated-buffer           bytes: the bfifo's limit                          (writable)
      dedicated-buffer-temporal  microseconds of the queue's guaranteed htb rate   (writable)
  /qos/interfaces/interface[interface-id=IF]/output/config/buffer-allocation-profile   (= IF)
  /qos/interfaces/interface[interface-id=IF]/output/queues/queue[name=Q]/state/
      transmit-pkts transmit-octets dropped-pkts current-queue-len (p4bs: backlog in bytes)

Values follow RFC 7951 (64-bit integers as strings). A change is validated as a whole first
(paths, types, bounds), then applied as in-place netlink changes of the FIFOs (never a
replace, which would flush the queue) and rolled back if any of them fails.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from p4bs_infra.netlink_tc import NetlinkError, Rtnetlink

PathElems = list[tuple[str, dict[str, str]]]

QUEUE_CLASS_BASE = 0x10
MIN_BUFFER_BYTES = 1514  # one full frame: a smaller FIFO could never hold a packet


class AgentError(Exception):
    """A request the agent refuses; `kind` picks the gRPC/NETCONF error."""

    NOT_FOUND = "not-found"
    INVALID = "invalid"
    READ_ONLY = "read-only"
    FAILED = "failed"

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Queue:
    interface: str
    ifindex: int
    name: str
    classid: int
    qdisc: int
    limit_bytes: int
    rate_bps: int
    transmit_pkts: int
    transmit_octets: int
    dropped_pkts: int
    backlog_bytes: int

    def temporal_us(self) -> int:
        return self.limit_bytes * 8 * 1_000_000 // self.rate_bps if self.rate_bps else 0


def format_path(elems: PathElems) -> str:
    parts = []
    for name, keys in elems:
        parts.append(name + "".join(f"[{k}={v}]" for k, v in sorted(keys.items())))
    return "/" + "/".join(parts)


def _uint(value: Any, where: str) -> int:
    """An RFC 7951 uint64: a JSON number or a string of digits."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise AgentError(
            AgentError.INVALID, f"{where}: expected an unsigned integer, got {value!r}"
        )
    text = str(value).strip()
    if not text.isdigit():
        raise AgentError(
            AgentError.INVALID, f"{where}: expected an unsigned integer, got {value!r}"
        )
    number = int(text)
    if number >= 2**64:
        raise AgentError(AgentError.INVALID, f"{where}: {number} does not fit uint64")
    return number


class RouterQos:
    def __init__(self, interfaces: list[str], max_buffer_bytes: int) -> None:
        self.interfaces = interfaces
        self.max_buffer_bytes = max_buffer_bytes
        self._lock = threading.Lock()  # one change at a time; reads see whole changes
        for name in interfaces:
            try:
                socket.if_nametoindex(name)
            except OSError:
                raise AgentError(AgentError.NOT_FOUND, f"no interface {name!r} here") from None

    # ---- reading ---------------------------------------------------------------------------
    def queues(self) -> list[Queue]:
        out = []
        with Rtnetlink() as nl:
            for interface in self.interfaces:
                ifindex = socket.if_nametoindex(interface)
                rates = {c.handle: c.rate_bps for c in nl.htb_classes(ifindex)}
                for q in nl.qdiscs(ifindex):
                    minor = q.parent & 0xFFFF
                    if q.kind != "bfifo" or q.parent not in rates or minor < QUEUE_CLASS_BASE:
                        continue
                    out.append(
                        Queue(
                            interface=interface,
                            ifindex=ifindex,
                            name=f"q{minor - QUEUE_CLASS_BASE}",
                            classid=q.parent,
                            qdisc=q.handle,
                            limit_bytes=q.limit or 0,
                            rate_bps=rates[q.parent],
                            transmit_pkts=q.packets,
                            transmit_octets=q.bytes,
                            dropped_pkts=q.drops,
                            backlog_bytes=q.backlog,
                        )
                    )
        return sorted(out, key=lambda q: (q.interface, q.classid))

    def tree(self, config_only: bool = False) -> dict[str, Any]:
        """The /qos subtree as RFC 7951 JSON (without the module prefix)."""
        queues = self.queues()
        profiles = []
        interfaces = []
        for interface in self.interfaces:
            mine = [q for q in queues if q.interface == interface]
            profile_queues = []
            for q in mine:
                config = {
                    "name": q.name,
                    "dedicated-buffer": str(q.limit_bytes),
                    "dedicated-buffer-temporal": str(q.temporal_us()),
                }
                entry: dict[str, Any] = {"name": q.name, "config": config}
                if not config_only:
                    entry["state"] = dict(config)
                profile_queues.append(entry)
            profile: dict[str, Any] = {
                "name": interface,
                "config": {"name": interface},
                "queues": {"queue": profile_queues},
            }
            output: dict[str, Any] = {"config": {"buffer-allocation-profile": interface}}
            if not config_only:
                profile["state"] = {"name": interface}
                output["state"] = {"buffer-allocation-profile": interface}
                output["queues"] = {
                    "queue": [
                        {
                            "name": q.name,
                            "state": {
                                "name": q.name,
                                "transmit-pkts": str(q.transmit_pkts),
                                "transmit-octets": str(q.transmit_octets),
                                "dropped-pkts": str(q.dropped_pkts),
                                "current-queue-len": str(q.backlog_bytes),
                            },
                        }
                        for q in mine
                    ]
                }
            profiles.append(profile)
            interfaces.append(
                {"interface-id": interface, "config": {"interface-id": interface}, "output": output}
            )
        return {
            "buffer-allocation-profiles": {"buffer-allocation-profile": profiles},
            "interfaces": {"interface": interfaces},
        }

    def get(self, path: PathElems, config_only: bool = False) -> list[tuple[PathElems, Any]]:
        """Every node matching `path` (keys may be omitted or '*': wildcards) with its value."""
        elems = _strip_root(path)
        matches = list(_select({"qos": self.tree(config_only)}, [("qos", {}), *elems], []))
        if not matches:
            raise AgentError(AgentError.NOT_FOUND, f"{format_path(path)}: no such node")
        return matches

    # ---- writing ---------------------------------------------------------------------------
    def set(self, updates: list[tuple[PathElems, Any]], deletes: list[PathElems]) -> None:
        """Validates every update, then applies all of them or none."""
        if deletes:
            raise AgentError(
                AgentError.READ_ONLY,
                f"{format_path(deletes[0])}: deleting buffer configuration is not supported; "
                "set a size instead",
            )
        with self._lock:
            queues = {(q.interface, q.name): q for q in self.queues()}
            targets = self._validate(updates, queues)
            self._apply(targets, queues)

    def _validate(
        self, updates: list[tuple[PathElems, Any]], queues: dict[tuple[str, str], Queue]
    ) -> dict[tuple[str, str], int]:
        targets: dict[tuple[str, str], int] = {}
        for path, value in updates:
            for leaf_path, leaf in _flatten([("qos", {}), *_strip_root(path)], value):
                key, size = self._leaf_target(leaf_path, leaf, queues)
                if key is None:
                    continue
                where = format_path(leaf_path)
                if key in targets and targets[key] != size:
                    raise AgentError(
                        AgentError.INVALID,
                        f"{where}: conflicts with another value for the same queue in this "
                        f"request ({targets[key]} B vs {size} B)",
                    )
                if not MIN_BUFFER_BYTES <= size <= self.max_buffer_bytes:
                    raise AgentError(
                        AgentError.INVALID,
                        f"{where}: {size} B is outside [{MIN_BUFFER_BYTES}, "
                        f"{self.max_buffer_bytes}] B",
                    )
                targets[key] = size
        return targets

    def _leaf_target(
        self, path: PathElems, value: Any, queues: dict[tuple[str, str], Queue]
    ) -> tuple[tuple[str, str] | None, int]:
        where = format_path(path)
        names = [name for name, _ in path]
        if names[:5] == ["qos", "interfaces", "interface", "output", "config"] and len(path) == 6:
            interface = path[2][1].get("interface-id", "")
            if interface not in self.interfaces:
                raise AgentError(AgentError.NOT_FOUND, f"{where}: no interface {interface!r}")
            if names[5] != "buffer-allocation-profile" or value != interface:
                raise AgentError(
                    AgentError.READ_ONLY,
                    f"{where}: the output binding is fixed (profile {interface!r})",
                )
            return None, 0
        shape = [
            "qos",
            "buffer-allocation-profiles",
            "buffer-allocation-profile",
            "queues",
            "queue",
            "config",
        ]
        if names[:6] != shape or len(path) != 7:
            raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")
        profile = path[2][1].get("name", "")
        queue = path[4][1].get("name", "")
        if (profile, queue) not in queues:
            raise AgentError(AgentError.NOT_FOUND, f"{where}: no queue {queue!r} in {profile!r}")
        leaf = names[6]
        if leaf == "name":
            if value != queue:
                raise AgentError(AgentError.INVALID, f"{where}: the name is the key {queue!r}")
            return None, 0
        if leaf == "dedicated-buffer":
            return (profile, queue), _uint(value, where)
        if leaf == "dedicated-buffer-temporal":
            rate = queues[(profile, queue)].rate_bps
            return (profile, queue), _uint(value, where) * rate // 8_000_000
        raise AgentError(AgentError.NOT_FOUND, f"{where}: unknown or read-only leaf {leaf!r}")

    def _apply(
        self, targets: dict[tuple[str, str], int], queues: dict[tuple[str, str], Queue]
    ) -> None:
        done: list[Queue] = []
        with Rtnetlink() as nl:
            try:
                for key, size in targets.items():
                    q = queues[key]
                    nl.change_fifo_limit(q.ifindex, q.qdisc, q.classid, size)
                    done.append(q)
            except NetlinkError as exc:
                for q in reversed(done):
                    nl.change_fifo_limit(q.ifindex, q.qdisc, q.classid, q.limit_bytes)
                raise AgentError(AgentError.FAILED, f"the kernel refused a change: {exc}") from exc
        # Read back: every applied change must be what the kernel now holds.
        now = {(q.interface, q.name): q.limit_bytes for q in self.queues()}
        wrong = {k: v for k, v in targets.items() if now.get(k) != v}
        if wrong:
            raise AgentError(AgentError.FAILED, f"read back differs from what was set: {wrong}")


def _strip_root(path: PathElems) -> PathElems:
    """Paths may start at /qos or /openconfig-qos:qos, or below it."""
    if path and path[0][0].split(":")[-1] == "qos":
        return path[1:]
    return path


def _select(node: Any, path: PathElems, seen: PathElems) -> Iterator[tuple[PathElems, Any]]:
    if not path:
        yield seen, node
        return
    (name, keys), rest = path[0], path[1:]
    if not isinstance(node, dict) or name not in node:
        return
    child = node[name]
    if isinstance(child, list):  # a YANG list: entries chosen by their keys
        for entry in child:
            entry_keys = {k: str(entry[k]) for k in keys if k in entry}
            if all(v == "*" or entry_keys.get(k) == v for k, v in keys.items()):
                own_keys = _list_keys(name, entry)
                yield from _select(entry, rest, [*seen, (name, own_keys)])
        return
    yield from _select(child, rest, [*seen, (name, keys)])


LIST_KEYS = {"buffer-allocation-profile": "name", "queue": "name", "interface": "interface-id"}


def _list_keys(name: str, entry: dict[str, Any]) -> dict[str, str]:
    key = LIST_KEYS.get(name)
    return {key: str(entry[key])} if key and key in entry else {}


def _flatten(path: PathElems, value: Any) -> Iterator[tuple[PathElems, Any]]:
    """A JSON value set at `path` -> (leaf path, scalar) pairs; lists need their keys."""
    if isinstance(value, dict):
        for name, child in value.items():
            name = name.split(":")[-1]
            if isinstance(child, list):
                key = LIST_KEYS.get(name)
                if key is None:
                    raise AgentError(
                        AgentError.NOT_FOUND, f"{format_path(path)}/{name}: no such list"
                    )
                for entry in child:
                    if not isinstance(entry, dict) or key not in entry:
                        raise AgentError(
                            AgentError.INVALID,
                            f"{format_path(path)}/{name}: list entries need their key {key!r}",
                        )
                    yield from _flatten(
                        [*path, (name, {key: str(entry[key])})],
                        {k: v for k, v in entry.items() if k != key},
                    )
            else:
                yield from _flatten([*path, (name, {})], child)
    else:
        yield path, value
