"""The router's queues in Linux tc, driven through a subset of OpenConfig QoS in p4bs's own
shape: what NETCONF (OpenConfig dialect) serves and the Junos mode applies its commits with.
gNMI serves a router-shaped configuration instead (p4bs_infra.agent.openconfig), which puts its
changes in force through this one.

Every managed interface has an htb root whose classes 1:10, 1:11, ... each feed a bfifo: those
are the interface's output queues q0, q1, ... (q<k> = class 1:<0x10 + k>). One
buffer-allocation-profile per interface, named like the interface, is bound to its output:

  /qos/buffer-allocation-profiles/buffer-allocation-profile[name=IF]/queues/queue[name=Q]/config/
      dedicated-buffer           bytes: the bfifo's limit                          (writable)
      dedicated-buffer-temporal  microseconds of the queue's guaranteed htb rate   (writable)
  /qos/interfaces/interface[interface-id=IF]/output/config/buffer-allocation-profile   (= IF)
  /qos/interfaces/interface[interface-id=IF]/output/queues/queue[name=Q]/config/name
      setting q1..q15 creates the queue: an htb class beside the others, each guaranteed an
      equal share of the link and free to borrow all of it, with its own bfifo; deleting
      the queue removes it
  /qos/interfaces/interface[interface-id=IF]/output/queues/queue[name=Q]/state/
      transmit-pkts transmit-octets dropped-pkts current-queue-len (p4bs: backlog in bytes)
  /qos/classifiers/classifier[name=IF]/terms/term[id=N]/   (N in 1..999: its tc priority)
      conditions/ipv4/config/{source-address,destination-address,protocol}
      conditions/transport/config/{source-port,destination-port}
      actions/config/target-group   the queue the matching packets go to (the forwarding
                                    group is the queue of the same name)
      each term is a u32 filter on the interface's htb root; deleting the term removes it

  /qos/queues/queue[name=Q], /qos/forwarding-groups/forwarding-group[name=Q]   (declarations:
      every queue is declared once, and is the forwarding group of the same name, whose
      output-queue it is; writing them changes nothing)

Values follow RFC 7951: 64-bit integers are JSON strings, and a JSON number for one is
refused, as a real target refuses it. A request is validated as a whole first
(paths, types, bounds, references), then applied: buffer sizes as in-place netlink changes of
the FIFOs (never a replace, which would flush the queue), queues and terms with tc. If the
kernel refuses a step, the buffers are restored and what the request added is removed.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p4bs_linux_tc.netlink import NetlinkError, Rtnetlink
from p4bs_linux_tc.queues import MIN_BUFFER_BYTES, QUEUE_CLASS_BASE, htb_shaping

PathElems = list[tuple[str, dict[str, str]]]
UNSIGNED = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() takes "²" and fullwidth digits


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


def _uint(value: Any, where: str, bits: int = 64) -> int:
    """An unsigned integer leaf. RFC 7951 writes a uint64 as a JSON string of digits ("625000")
    and smaller ones as JSON numbers; XML (NETCONF) and gNMI's typed scalars give text, which
    is taken for any width. A JSON number for a uint64 is refused, as a real target does."""
    if bits == 64 and isinstance(value, int) and not isinstance(value, bool):
        raise AgentError(
            AgentError.INVALID,
            f'{where}: a uint64 is a JSON string in RFC 7951 ("{value}"), got the JSON '
            f"number {value}",
        )
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise AgentError(
            AgentError.INVALID, f"{where}: expected an unsigned integer, got {value!r}"
        )
    text = str(value)
    if not UNSIGNED.fullmatch(text):
        raise AgentError(
            AgentError.INVALID, f"{where}: expected an unsigned integer, got {value!r}"
        )
    number = int(text)
    if number >= 2**bits:
        raise AgentError(AgentError.INVALID, f"{where}: {number} does not fit uint{bits}")
    return number


class RouterQos:
    def __init__(
        self, interfaces: list[str], max_buffer_bytes: int, state_file: Path | None = None
    ) -> None:
        self.interfaces = interfaces
        self.max_buffer_bytes = max_buffer_bytes
        self.state_file = state_file
        self.terms = self._load()  # classifier terms, as tc cannot give them back as written
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
            out_queues = [{"name": q.name, "config": {"name": q.name}} for q in mine]
            output["queues"] = {"queue": out_queues}
            if not config_only:
                output["state"] = {"buffer-allocation-profile": interface}
                for entry, q in zip(out_queues, mine, strict=True):
                    entry["state"] = queue_state(q)
            profiles.append(profile)
            interfaces.append(
                {"interface-id": interface, "config": {"interface-id": interface}, "output": output}
            )
        classifiers = []
        for interface in self.interfaces:
            terms = [
                _term_tree(term_id, term)
                for (owner, term_id), term in sorted(self.terms.items())
                if owner == interface
            ]
            classifiers.append(
                {
                    "name": interface,
                    "config": {"name": interface, "type": "IPV4"},
                    "terms": {"term": terms},
                }
            )
        # OpenConfig declares queues once under /qos/queues (a profile's and an interface's
        # queues refer to them), and a classifier targets a forwarding group: here each queue
        # name is one forwarding group into that queue.
        names = sorted({q.name for q in queues}, key=lambda name: int(name[1:]))
        return {
            "queues": {"queue": [{"name": n, "config": {"name": n}} for n in names]},
            "forwarding-groups": {
                "forwarding-group": [
                    {"name": n, "config": {"name": n, "output-queue": n}} for n in names
                ]
            },
            "buffer-allocation-profiles": {"buffer-allocation-profile": profiles},
            "interfaces": {"interface": interfaces},
            "classifiers": {"classifier": classifiers},
        }

    def get(self, path: PathElems, config_only: bool = False) -> list[tuple[PathElems, Any]]:
        """Every node matching `path` (keys may be omitted or '*': wildcards) with its value."""
        return nodes_at(self.tree(config_only), _strip_root(path), path)

    # ---- writing ---------------------------------------------------------------------------
    def set(self, updates: list[tuple[PathElems, Any]], deletes: list[PathElems]) -> None:
        """Validates the whole request first, then applies all of it or (undoing) none."""
        with self._lock:
            queues = {(q.interface, q.name): q for q in self.queues()}
            plan = _Plan(queues=queues, terms={k: dict(v) for k, v in self.terms.items()})
            for path in deletes:
                self._plan_delete(plan, [("qos", {}), *_strip_root(path)])
            for path, value in updates:
                for leaf_path, leaf in flatten([("qos", {}), *_strip_root(path)], value):
                    self._plan_leaf(plan, leaf_path, leaf)
            self._check(plan)
            self._apply(plan)

    def _plan_delete(self, plan: _Plan, path: PathElems) -> None:
        where = format_path(path)
        names = [name for name, _ in path]
        if names == ["qos", "classifiers", "classifier", "terms", "term"]:
            key = (path[2][1].get("name", ""), _term_id(path[4][1].get("id", ""), where))
            if key not in plan.terms:
                raise AgentError(AgentError.NOT_FOUND, f"{where}: no such term")
            del plan.terms[key]
            return
        if names == ["qos", "interfaces", "interface", "output", "queues", "queue"]:
            queue = (path[2][1].get("interface-id", ""), path[5][1].get("name", ""))
            if queue not in plan.queues or queue in plan.dropped:
                raise AgentError(AgentError.NOT_FOUND, f"{where}: no such queue")
            if queue[1] == DEFAULT_QUEUE:
                raise AgentError(AgentError.READ_ONLY, f"{where}: the default queue stays")
            plan.dropped.add(queue)
            return
        raise AgentError(
            AgentError.READ_ONLY,
            f"{where}: only classifier terms and added queues can be deleted; "
            "set a buffer size instead",
        )

    def _plan_leaf(self, plan: _Plan, path: PathElems, value: Any) -> None:
        where = format_path(path)
        names = tuple(name for name, _ in path)
        keys = [k for _, k in path]
        if names[:3] in (
            ("qos", "queues", "queue"),
            ("qos", "forwarding-groups", "forwarding-group"),
        ):
            # Declarations only: an interface's output queue makes the queue, and the
            # forwarding group of a queue is the queue itself.
            name = keys[2].get("name", "")
            if name != DEFAULT_QUEUE and _queue_index(name) is None:
                raise AgentError(
                    AgentError.INVALID, f"{where}: queues are named q0..q{MAX_QUEUES - 1}"
                )
            if names[3:] not in (("config", "name"), ("config", "output-queue")) or (
                names[1] == "queues" and names[4] != "name"
            ):
                raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")
            _same(value, name, where)
            return
        if names[:3] == ("qos", "interfaces", "interface"):
            interface = self._interface(keys[2].get("interface-id", ""), where)
            if names[3:] == ("config", "interface-id"):
                _same(value, interface, where)
            elif names[3:] == ("output", "config", "buffer-allocation-profile"):
                if value != interface:
                    raise AgentError(
                        AgentError.READ_ONLY,
                        f"{where}: the output binding is fixed (profile {interface!r})",
                    )
            elif names[3:] == ("output", "queues", "queue", "config", "name"):
                queue = keys[5].get("name", "")
                _same(value, queue, where)
                if (interface, queue) not in plan.queues:
                    if _queue_index(queue) is None:
                        raise AgentError(
                            AgentError.INVALID, f"{where}: queues are named q1..q{MAX_QUEUES - 1}"
                        )
                    plan.created.add((interface, queue))
            else:
                raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")
            return
        if names[:3] == ("qos", "buffer-allocation-profiles", "buffer-allocation-profile"):
            interface = self._interface(keys[2].get("name", ""), where)
            if names[3:] == ("config", "name"):
                _same(value, interface, where)
                return
            if names[3:6] != ("queues", "queue", "config") or len(names) != 7:
                raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")
            queue = keys[4].get("name", "")
            key = (interface, queue)
            if key not in plan.queues and key not in plan.created:
                raise AgentError(
                    AgentError.NOT_FOUND, f"{where}: no queue {queue!r} in {interface!r}"
                )
            leaf = names[6]
            if leaf == "name":
                _same(value, queue, where)
                return
            if leaf == "dedicated-buffer":
                size = _uint(value, where)
            elif leaf == "dedicated-buffer-temporal":
                size = _uint(value, where) * self._rate(plan, key) // 8_000_000
            else:
                raise AgentError(
                    AgentError.NOT_FOUND, f"{where}: unknown or read-only leaf {leaf!r}"
                )
            if key in plan.buffers and plan.buffers[key] != size:
                raise AgentError(
                    AgentError.INVALID,
                    f"{where}: conflicts with another value for the same queue in this "
                    f"request ({plan.buffers[key]} B vs {size} B)",
                )
            if not MIN_BUFFER_BYTES <= size <= self.max_buffer_bytes:
                raise AgentError(
                    AgentError.INVALID,
                    f"{where}: {size} B is outside [{MIN_BUFFER_BYTES}, {self.max_buffer_bytes}] B",
                )
            plan.buffers[key] = size
            return
        if names[:3] == ("qos", "classifiers", "classifier"):
            interface = self._interface(keys[2].get("name", ""), where)
            if names[3:] == ("config", "name"):
                _same(value, interface, where)
                return
            if names[3:] == ("config", "type"):
                _same(value, "IPV4", where)
                return
            if names[3:5] != ("terms", "term"):
                raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")
            term_id = _term_id(keys[4].get("id", ""), where)
            term = plan.terms.setdefault((interface, term_id), {})
            leaf_path = names[5:]
            if leaf_path == ("config", "id"):
                _same(str(value), str(term_id), where)
            elif leaf_path in TERM_LEAVES:
                field = TERM_LEAVES[leaf_path]
                term[field] = _term_value(field, value, where)
            else:
                raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")
            return
        raise AgentError(AgentError.NOT_FOUND, f"{where}: not a writable path")

    def _interface(self, name: str, where: str) -> str:
        if name not in self.interfaces:
            raise AgentError(AgentError.NOT_FOUND, f"{where}: no managed interface {name!r}")
        return name

    def _rate(self, plan: _Plan, key: tuple[str, str]) -> int:
        """A queue's guaranteed rate once the request's queues exist: an equal share."""
        interface = key[0]
        count = len(plan.final_queues(interface))
        return self._link_rate(interface) // max(1, count)

    def _link_rate(self, interface: str) -> int:
        with Rtnetlink() as nl:
            classes = nl.htb_classes(socket.if_nametoindex(interface))
        return next((c.rate_bps for c in classes if c.handle == HTB_LINK_CLASS), 0)

    def _check(self, plan: _Plan) -> None:
        for interface in self.interfaces:
            if len(plan.final_queues(interface)) > MAX_QUEUES:
                raise AgentError(AgentError.INVALID, f"{interface}: at most {MAX_QUEUES} queues")
        for (interface, term_id), term in plan.terms.items():
            where = f"/qos/classifiers/classifier[name={interface}]/terms/term[id={term_id}]"
            target = term.get("target-group")
            if target is None:
                raise AgentError(AgentError.INVALID, f"{where}: needs actions/config/target-group")
            if target not in plan.final_queues(interface):
                raise AgentError(AgentError.INVALID, f"{where}: no queue {target!r} to target")

    def _apply(self, plan: _Plan) -> None:
        undo: list[list[str]] = []
        buffers_before = {k: q.limit_bytes for k, q in plan.queues.items()}
        try:
            touched = {k[0] for k in plan.created | plan.dropped}
            for interface, queue in sorted(plan.created):
                rate = self._link_rate(interface)
                share = rate // len(plan.final_queues(interface))
                classid, fifo = _class_of(queue), _fifo_of(queue)
                default = plan.queues[(interface, DEFAULT_QUEUE)].limit_bytes
                limit = plan.buffers.pop((interface, queue), default)
                _tc(
                    f"class add dev {interface} parent 1:1 classid {classid} "
                    + htb_shaping(share, rate)
                )
                undo.append(f"class del dev {interface} classid {classid}".split())
                _tc(f"qdisc add dev {interface} parent {classid} handle {fifo} bfifo limit {limit}")
            self._set_buffers(plan)
            for (interface, term_id), term in sorted(plan.terms.items()):
                if self.terms.get((interface, term_id)) != term:
                    _replace_filter(interface, term_id, term)
                    undo.append(f"filter del dev {interface} parent 1: prio {term_id}".split())
            for interface, term_id in set(self.terms) - set(plan.terms):
                _tc(f"filter del dev {interface} parent 1: prio {term_id}")
            for interface, queue in sorted(plan.dropped):
                _tc(f"class del dev {interface} classid {_class_of(queue)}")
            for interface in touched:
                self._share_rates(interface)
        except (NetlinkError, OSError, AgentError) as exc:
            for command in reversed(undo):
                subprocess.run(["tc", *command], capture_output=True, check=False)
            self._restore_buffers(buffers_before)
            raise AgentError(AgentError.FAILED, f"the kernel refused a change: {exc}") from exc
        self.terms = plan.terms
        self._save()
        now = {(q.interface, q.name): q.limit_bytes for q in self.queues()}
        wrong = {k: v for k, v in plan.buffers.items() if now.get(k) != v}
        if wrong:
            raise AgentError(AgentError.FAILED, f"read back differs from what was set: {wrong}")

    def _set_buffers(self, plan: _Plan) -> None:
        with Rtnetlink() as nl:
            for key, size in plan.buffers.items():
                q = plan.queues[key]
                nl.change_fifo_limit(q.ifindex, q.qdisc, q.classid, size)

    def _restore_buffers(self, limits: dict[tuple[str, str], int]) -> None:
        current = {(q.interface, q.name): q for q in self.queues()}
        with Rtnetlink() as nl:
            for key, limit in limits.items():
                q = current.get(key)
                if q is not None and q.limit_bytes != limit:
                    nl.change_fifo_limit(q.ifindex, q.qdisc, q.classid, limit)

    def _share_rates(self, interface: str) -> None:
        """Every queue of the interface guaranteed an equal share, each free to use it all."""
        rate = self._link_rate(interface)
        mine = [q for q in self.queues() if q.interface == interface]
        for q in mine:
            _tc(
                f"class change dev {interface} parent 1:1 classid {_class_of(q.name)} "
                + htb_shaping(rate // len(mine), rate)
            )

    def _save(self) -> None:
        if self.state_file is None:
            return
        data = {f"{interface}/{term_id}": term for (interface, term_id), term in self.terms.items()}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_file)

    def _load(self) -> dict[tuple[str, int], dict[str, Any]]:
        if self.state_file is None or not self.state_file.exists():
            return {}
        data = json.loads(self.state_file.read_text())
        out = {}
        for key, term in data.items():
            interface, _, term_id = key.rpartition("/")
            out[(interface, int(term_id))] = term
        return out


DEFAULT_QUEUE = "q0"
MAX_QUEUES = 16
HTB_LINK_CLASS = 0x10001  # 1:1, the link's rate; queues are its children 1:10, 1:11, ...
TERM_LEAVES = {
    ("conditions", "ipv4", "config", "source-address"): "source-address",
    ("conditions", "ipv4", "config", "destination-address"): "destination-address",
    ("conditions", "ipv4", "config", "protocol"): "protocol",
    ("conditions", "transport", "config", "source-port"): "source-port",
    ("conditions", "transport", "config", "destination-port"): "destination-port",
    ("actions", "config", "target-group"): "target-group",
}


@dataclass
class _Plan:
    """What a request would change, built and checked before anything is applied."""

    queues: dict[tuple[str, str], Queue]
    terms: dict[tuple[str, int], dict[str, Any]]
    buffers: dict[tuple[str, str], int] = field(default_factory=dict)
    created: set[tuple[str, str]] = field(default_factory=set)
    dropped: set[tuple[str, str]] = field(default_factory=set)

    def final_queues(self, interface: str) -> set[str]:
        names = {q for i, q in self.queues if i == interface}
        names |= {q for i, q in self.created if i == interface}
        return names - {q for i, q in self.dropped if i == interface}


def _term_tree(term_id: int, term: dict[str, Any]) -> dict[str, Any]:
    # RFC 7951: the protocol (uint8) and ports (uint16) are JSON numbers.
    ipv4: dict[str, Any] = {
        k: str(term[k]) for k in ("source-address", "destination-address") if k in term
    }
    if "protocol" in term:
        ipv4["protocol"] = int(term["protocol"])
    transport = {k: int(term[k]) for k in ("source-port", "destination-port") if k in term}
    return {
        "id": str(term_id),
        "config": {"id": str(term_id)},
        "conditions": {"ipv4": {"config": ipv4}, "transport": {"config": transport}},
        "actions": {"config": {"target-group": term["target-group"]}},
    }


def _same(value: Any, expected: str, where: str) -> None:
    if str(value) != expected:
        raise AgentError(AgentError.INVALID, f"{where}: must be {expected!r}, got {value!r}")


def _queue_index(name: str) -> int | None:
    digits = name[1:]
    if name.startswith("q") and UNSIGNED.fullmatch(digits) and 1 <= int(digits) < MAX_QUEUES:
        return int(digits)
    return None


def _class_of(queue: str) -> str:
    return f"1:{QUEUE_CLASS_BASE + int(queue[1:]):x}"


def _fifo_of(queue: str) -> str:
    return f"{QUEUE_CLASS_BASE + int(queue[1:]):x}:"


def _term_id(text: str, where: str) -> int:
    if not UNSIGNED.fullmatch(text) or not 1 <= int(text) <= 999:
        raise AgentError(AgentError.INVALID, f"{where}: term ids are integers 1..999")
    return int(text)


def _term_value(field: str, value: Any, where: str) -> Any:
    if field in ("source-address", "destination-address"):
        try:
            return str(ipaddress.IPv4Network(str(value), strict=False))
        except ValueError:
            raise AgentError(
                AgentError.INVALID, f"{where}: not an IPv4 prefix: {value!r}"
            ) from None
    if field == "protocol":
        number = _uint(value, where, bits=8)
        if number > 255:
            raise AgentError(AgentError.INVALID, f"{where}: protocol must be 0..255")
        return number
    if field in ("source-port", "destination-port"):
        number = _uint(value, where, bits=16)
        if number > 65535:
            raise AgentError(AgentError.INVALID, f"{where}: ports are 0..65535")
        return number
    return str(value)


def _tc(command: str) -> None:
    result = subprocess.run(["tc", *command.split()], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OSError(f"tc {command}: {result.stderr.strip()}")


def _replace_filter(interface: str, term_id: int, term: dict[str, Any]) -> None:
    """The term as a u32 filter at priority `term_id` steering into its queue's class."""
    subprocess.run(
        ["tc", "filter", "del", "dev", interface, "parent", "1:", "prio", str(term_id)],
        capture_output=True,
        check=False,
    )
    matches = []
    if "source-address" in term:
        matches.append(f"match ip src {term['source-address']}")
    if "destination-address" in term:
        matches.append(f"match ip dst {term['destination-address']}")
    if "protocol" in term:
        matches.append(f"match ip protocol {term['protocol']} 0xff")
    if "source-port" in term:
        matches.append(f"match ip sport {term['source-port']} 0xffff")
    if "destination-port" in term:
        matches.append(f"match ip dport {term['destination-port']} 0xffff")
    _tc(
        f"filter add dev {interface} parent 1: protocol ip prio {term_id} u32 "
        + (" ".join(matches) or "match u32 0 0")
        + f" flowid {_class_of(term['target-group'])}"
    )


def _strip_root(path: PathElems) -> PathElems:
    """Paths may start at /qos or /openconfig-qos:qos, or below it."""
    if path and path[0][0].split(":")[-1] == "qos":
        return path[1:]
    return path


def queue_state(q: Queue) -> dict[str, str]:
    """An interface output queue's state as OpenConfig has it (counter64s as strings)."""
    return {
        "name": q.name,
        "transmit-pkts": str(q.transmit_pkts),
        "transmit-octets": str(q.transmit_octets),
        "dropped-pkts": str(q.dropped_pkts),
        "current-queue-len": str(q.backlog_bytes),
    }


def nodes_at(qos: dict[str, Any], below: PathElems, path: PathElems) -> list[tuple[PathElems, Any]]:
    """Every node of the QoS tree `qos` at `below` (its path under /qos) with its value;
    NOT_FOUND, naming `path` as asked, when there is none."""
    matches = list(select({"qos": qos}, [("qos", {}), *below], []))
    if not matches:
        raise AgentError(AgentError.NOT_FOUND, f"{format_path(path)}: no such node")
    return matches


def select(node: Any, path: PathElems, seen: PathElems) -> Iterator[tuple[PathElems, Any]]:
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
                yield from select(entry, rest, [*seen, (name, own_keys)])
        return
    yield from select(child, rest, [*seen, (name, keys)])


LIST_KEYS = {
    "forwarding-group": "name",
    "buffer-allocation-profile": "name",
    "queue": "name",
    "interface": "interface-id",
    "classifier": "name",  # an interface's classifiers are keyed by "type"
    "term": "id",
}


def _list_key(name: str, entry: dict[str, Any]) -> str | None:
    key = LIST_KEYS.get(name)
    if name == "classifier" and key not in entry and "type" in entry:
        return "type"
    return key


def _list_keys(name: str, entry: dict[str, Any]) -> dict[str, str]:
    key = _list_key(name, entry)
    return {key: str(entry[key])} if key and key in entry else {}


def flatten(path: PathElems, value: Any) -> Iterator[tuple[PathElems, Any]]:
    """A JSON value at `path` -> (leaf path, scalar) pairs, list entries addressed by their
    keys: how a Set's value is read, and how Subscribe follows a subtree's leaves."""
    if isinstance(value, dict):
        for name, child in value.items():
            name = name.split(":")[-1]
            if isinstance(child, list):
                if name not in LIST_KEYS:
                    raise AgentError(
                        AgentError.NOT_FOUND, f"{format_path(path)}/{name}: no such list"
                    )
                for entry in child:
                    key = _list_key(name, entry) if isinstance(entry, dict) else None
                    if key is None or not isinstance(entry, dict) or key not in entry:
                        raise AgentError(
                            AgentError.INVALID,
                            f"{format_path(path)}/{name}: list entries need their key {key!r}",
                        )
                    yield from flatten(
                        [*path, (name, {key: str(entry[key])})],
                        {k: v for k, v in entry.items() if k != key},
                    )
            else:
                yield from flatten([*path, (name, {})], child)
    else:
        yield path, value
