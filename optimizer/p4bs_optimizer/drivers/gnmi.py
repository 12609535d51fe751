"""gNMI driver (pygnmi): OpenConfig QoS over TLS, for a router p4bs did not set up.

Queue `N` of an interface is the OpenConfig queue named `qN`. The driver owns one
buffer-allocation profile per interface, named `p4bs-<interface>` (PROFILE_PREFIX). A buffer
change is ONE Set request (the router applies it as a transaction) of three updates, so that it
works on a router that has none of it yet and changes only what it must on one that has:

  /qos/queues/queue[name=qN]                           the queue declared (config/name)
  /qos/buffer-allocation-profiles/buffer-allocation-profile[name=p4bs-IF]
      config/name, queues/queue[name=qN]/config/{name, dedicated-buffer}   the bytes
  /qos/interfaces/interface[interface-id=IF]
      config/interface-id, output/config/buffer-allocation-profile = p4bs-IF   the binding,
      output/queues/queue[name=qN]/config/name                                 the output queue

It then reads back what shows the change in force on the interface: the interface's
output/state/buffer-allocation-profile must name p4bs-IF, and that profile's
queues/queue[name=qN]/state/dedicated-buffer is the bytes reported; a router that reports
another binding or value fails the change (MISMATCH). get_buffer reads the profile the
interface's output state names, whoever bound it.

Values go as RFC 7951 JSON (JSON_IETF): the uint64 buffer as a string ("625000"); a buffer
outside 1..2^64-1 is refused before sending (the router's own bounds are the config's).
Key values go into pygnmi's path strings, which it splits without the gNMI path conventions'
escapes (`\\]` and `\\\\` inside a key): a name that needs an escape, holds `=` (which pygnmi
splits on) or `*` (a wildcard), or that pygnmi would not carry intact, is refused before
anything is sent (REJECTED, naming the key and the character).

Classifier rules are the terms of the classifier `p4bs-<interface>` (type IPV4), bound to the
interface's output (output/classifiers/classifier[type=IPV4]), one exact 5-tuple match per flow
with the target-group of its queue (the forwarding group `qN`, whose output-queue is `qN`);
each queue the rules name is declared under /qos/queues, given that forwarding group and made
an output queue of the interface. One Set request replaces all of the classifier's terms, which
the router applies as a whole or not at all.

The router's certificate is verified against `ca_file` (required: without it pygnmi would
trust whatever certificate the router presents). With `client_cert` and `client_key` the
driver presents that certificate (mutual TLS, for routers that require one). Username and
password travel as the gNMI per-RPC metadata. One gRPC channel per router carries every
call, concurrent ones included.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from pygnmi.client import gNMIclient, gNMIException
from pygnmi.create_gnmi_path import gnmi_path_generator

from p4bs.config import RouterConfig
from p4bs_optimizer.drivers.base import (
    DEFAULT_RETRY,
    Attempt,
    ErrorKind,
    FlowMatch,
    Retry,
    RouterDriver,
    split_endpoint,
)

ENCODING = "json_ietf"
PROFILE_PREFIX = "p4bs-"  # the driver's buffer-allocation profile and classifier: p4bs-<IF>
CLASSIFIER_TYPE = "IPV4"
UINT64_MAX = 2**64 - 1
# Characters a key value cannot hold in a pygnmi path string: `]` and `\` need the gNMI path
# escapes, which pygnmi does not undo; it splits a key on `=`; `*` is a wildcard.
UNCARRIED = frozenset("]\\=*")

STATUS_KINDS = {
    grpc.StatusCode.UNAVAILABLE: ErrorKind.UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorKind.TIMEOUT,
    # The driver cancels calls itself only when it cuts a timed-out attempt's channel.
    grpc.StatusCode.CANCELLED: ErrorKind.TIMEOUT,
    grpc.StatusCode.UNAUTHENTICATED: ErrorKind.AUTH,
    grpc.StatusCode.PERMISSION_DENIED: ErrorKind.AUTH,
}

PathElems = list[tuple[str, dict[str, str]]]


class PathKeyError(ValueError):
    """A key value the driver cannot put into a gNMI path as pygnmi sends it."""


def json_text(value: Any) -> str:
    """A Set value as its JSON text. pygnmi sends a str as it is and JSON-encodes anything
    else, so a string leaf given as a str would go unquoted (not JSON at all); as JSON text
    every value goes as JSON_IETF wants it."""
    return json.dumps(value)


def uint64(value: int) -> str:
    """RFC 7951 writes a 64-bit integer as a JSON string ("625000"): a JSON number for one is
    refused by targets that check their schema (openconfig-qos's dedicated-buffer is uint64).
    Raises ValueError outside 0..2^64-1."""
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"{value} is outside uint64 (0..{UINT64_MAX})")
    return str(value)


def escaped(value: str) -> str:
    """A key value as the gNMI path conventions write it: `\\` and `]` escaped."""
    return value.replace("\\", "\\\\").replace("]", "\\]")


def gnmi_path(*elems: tuple[str, dict[str, str]]) -> str:
    """The path string pygnmi takes for `elems`; raises PathKeyError for a key value it
    would not carry intact (checked by parsing it back as pygnmi does)."""
    for name, keys in elems:
        for key, value in keys.items():
            bad = sorted({c for c in value if c in UNCARRIED or not c.isprintable()})
            if not value or bad:
                raise PathKeyError(
                    f"{name}[{key}={escaped(value)}]: cannot go into a gNMI path as pygnmi "
                    f"sends it ({'empty' if not value else f'holds {bad}'})"
                )
    text = "/" + "/".join(
        name + "".join(f"[{k}={v}]" for k, v in keys.items()) for name, keys in elems
    )
    try:
        parsed = [(e.name, dict(e.key)) for e in gnmi_path_generator(text).elem]
    except ValueError:
        parsed = []
    if parsed != list(elems):
        raise PathKeyError(f"{text}: pygnmi would send another path ({parsed})")
    return text


def profile_name(interface: str) -> str:
    return f"{PROFILE_PREFIX}{interface}"


def interface_elems(interface: str) -> PathElems:
    return [("qos", {}), ("interfaces", {}), ("interface", {"interface-id": interface})]


def profile_elems(profile: str) -> PathElems:
    return [
        ("qos", {}),
        ("buffer-allocation-profiles", {}),
        ("buffer-allocation-profile", {"name": profile}),
    ]


def queue_name(queue: int) -> str:
    return f"q{queue}"


def buffer_updates(interface: str, queue: int, buffer_bytes: int) -> list[tuple[str, str]]:
    """The Set of a buffer change: the queue declared, the profile holding its buffer, the
    interface's output queue and the profile bound to the interface's output."""
    name, profile = queue_name(queue), profile_name(interface)
    entry = {"name": name, "config": {"name": name}}
    buffer = {"name": name, "config": {"name": name, "dedicated-buffer": uint64(buffer_bytes)}}
    return [
        (gnmi_path(("qos", {}), ("queues", {}), ("queue", {"name": name})), json_text(entry)),
        (
            gnmi_path(*profile_elems(profile)),
            json_text({"config": {"name": profile}, "queues": {"queue": [buffer]}}),
        ),
        (
            gnmi_path(*interface_elems(interface)),
            json_text(
                {
                    "config": {"interface-id": interface},
                    "output": {
                        "config": {"buffer-allocation-profile": profile},
                        "queues": {"queue": [entry]},
                    },
                }
            ),
        ),
    ]


def queue_declarations(interface: str, queue: int) -> list[tuple[str, str]]:
    """What makes queue `queue` of `interface` in OpenConfig: the queue declared under
    /qos/queues, a forwarding group into it (what a classifier term targets) and the
    interface's output queue."""
    name = queue_name(queue)
    entry = {"name": name, "config": {"name": name}}
    return [
        (gnmi_path(("qos", {}), ("queues", {}), ("queue", {"name": name})), json_text(entry)),
        (
            gnmi_path(("qos", {}), ("forwarding-groups", {}), ("forwarding-group", {"name": name})),
            json_text({"name": name, "config": {"name": name, "output-queue": name}}),
        ),
        (
            gnmi_path(*interface_elems(interface), ("output", {}), ("queues", {})),
            json_text({"queue": [entry]}),
        ),
    ]


def classifier_updates(interface: str) -> list[tuple[str, str]]:
    """The classifier p4bs-IF itself and its binding to the interface's output."""
    name = profile_name(interface)
    config = {"type": CLASSIFIER_TYPE, "name": name}
    return [
        (
            gnmi_path(("qos", {}), ("classifiers", {}), ("classifier", {"name": name})),
            json_text({"config": {"name": name, "type": CLASSIFIER_TYPE}}),
        ),
        (
            gnmi_path(*interface_elems(interface)),
            json_text(
                {
                    "config": {"interface-id": interface},
                    "output": {
                        "classifiers": {"classifier": [{"type": CLASSIFIER_TYPE, "config": config}]}
                    },
                }
            ),
        ),
    ]


def classifier_terms(interface: str) -> PathElems:
    return [
        ("qos", {}),
        ("classifiers", {}),
        ("classifier", {"name": profile_name(interface)}),
        ("terms", {}),
    ]


def term_tree(term_id: int, queue: int, flow: FlowMatch) -> dict[str, Any]:
    """An OpenConfig classifier term matching exactly `flow`, sending it to queue `queue`."""
    return {
        "config": {"id": str(term_id)},
        "conditions": {
            "ipv4": {
                "config": {
                    "source-address": f"{flow.source}/32",
                    "destination-address": f"{flow.destination}/32",
                    "protocol": flow.protocol,
                }
            },
            "transport": {
                "config": {
                    "source-port": flow.source_port,
                    "destination-port": flow.destination_port,
                }
            },
        },
        "actions": {"config": {"target-group": queue_name(queue)}},
    }


def term_summary(term: Mapping[str, Any]) -> tuple[str, ...]:
    """What a term (as written or as read back) matches and where it sends it, as strings:
    the router echoes RFC 7951 values, where integers may come back as strings."""
    ipv4 = term.get("conditions", {}).get("ipv4", {}).get("config", {})
    transport = term.get("conditions", {}).get("transport", {}).get("config", {})
    return (
        str(term.get("config", {}).get("id", term.get("id"))),
        str(ipv4.get("source-address")),
        str(ipv4.get("destination-address")),
        str(ipv4.get("protocol")),
        str(transport.get("source-port")),
        str(transport.get("destination-port")),
        str(term.get("actions", {}).get("config", {}).get("target-group")),
    )


class GnmiDriver(RouterDriver):
    classifier_unsupported = None

    def __init__(self, router: RouterConfig, retry: Retry = DEFAULT_RETRY) -> None:
        super().__init__(router, retry)
        if router.address is None:
            raise ValueError(f"router {router.name}: gnmi needs an address (host:port)")
        if router.ca_file is None:
            raise ValueError(
                f"router {router.name}: gnmi needs ca_file, the CA that signed the router's "
                "certificate (without it the client would trust any certificate)"
            )
        self._target = split_endpoint(router.address)
        self._client: gNMIclient | None = None
        self._client_lock = threading.Lock()

    # ---- the connection ---------------------------------------------------------------------
    def _connected(self, attempt: Attempt) -> gNMIclient:
        """The router's channel, opened (credentials resolved now) if there is none. The lock
        is never held while talking to the router: aborts take it on the event loop."""
        with self._client_lock:
            client = self._client
        if client is not None:
            attempt.on_abort(lambda: self._drop(client))
            return client
        # With a client certificate pygnmi takes the CA as path_root (mutual TLS); without,
        # path_cert is the CA the router's certificate is checked against.
        mutual = self.router.client_cert is not None
        fresh = gNMIclient(
            target=self._target,
            username=self._secret(self.router.username, "username"),
            password=self._secret(self.router.password, "password"),
            path_cert=self.router.client_cert if mutual else self.router.ca_file,
            path_key=self.router.client_key if mutual else None,
            path_root=self.router.ca_file if mutual else None,
        )
        attempt.on_abort(lambda: self._drop(fresh))
        # timeout=0: no separate wait for the channel (whose fallback would also set
        # GRPC_SSL_CIPHER_SUITES for the whole process); the Capabilities call connect() makes
        # fails at once when the router refuses the connection.
        fresh.connect(timeout=0)
        with self._client_lock:
            if self._client is None:
                self._client = fresh
                return fresh
            kept: gNMIclient = self._client  # another call connected meanwhile
        fresh.close()
        attempt.on_abort(lambda: self._drop(kept))
        return kept

    def _drop(self, client: gNMIclient) -> None:
        """Closes `client`'s channel, which ends every call on it (CANCELLED)."""
        client.close()
        with self._client_lock:
            if self._client is client:
                self._client = None

    def _forget_connection(self) -> None:
        client = self._client
        if client is not None:
            self._drop(client)

    # ---- calls ------------------------------------------------------------------------------
    def _get_value(self, client: gNMIclient, path: str) -> Any:
        reply = client.get(path=[path], encoding=ENCODING)
        try:
            (notification,) = reply["notification"]
            (update,) = notification["update"]
            return update["val"]
        except (KeyError, TypeError, ValueError):
            raise self._error(ErrorKind.MISMATCH, f"{path}: unexpected reply {reply!r}") from None

    def _paths(self, build: Any, *args: Any) -> Any:
        """`build(*args)`, a key value it cannot carry refused before anything is sent."""
        try:
            return build(*args)
        except ValueError as exc:  # PathKeyError, or a buffer outside uint64
            raise self._error(ErrorKind.REJECTED, str(exc)) from None

    def _in_force(self, client: gNMIclient, interface: str, queue: int) -> tuple[str, int]:
        """The profile the interface's output state names, and that profile's queue's
        dedicated-buffer state: the buffer in force on the interface."""
        binding = gnmi_path(*interface_elems(interface), ("output", {}), ("state", {}))
        state = self._get_value(client, binding)
        profile = state.get("buffer-allocation-profile") if isinstance(state, dict) else None
        if not isinstance(profile, str):
            raise self._error(
                ErrorKind.MISMATCH,
                f"{interface}: no buffer-allocation-profile in force on its output ({state!r})",
            )
        name = queue_name(queue)
        path = gnmi_path(
            *profile_elems(profile),
            ("queues", {}),
            ("queue", {"name": name}),
            ("state", {}),
            ("dedicated-buffer", {}),
        )
        value = self._get_value(client, path)
        try:
            return profile, int(value)
        except (TypeError, ValueError):
            raise self._error(ErrorKind.MISMATCH, f"{path}: not a byte count: {value!r}") from None

    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        updates = self._paths(buffer_updates, interface, queue, buffer_bytes)
        client = self._connected(attempt)
        client.set(update=updates, encoding=ENCODING)
        profile, reported = self._in_force(client, interface, queue)
        if profile != profile_name(interface):
            raise self._error(
                ErrorKind.MISMATCH,
                f"{interface}: its output reports profile {profile!r} in force, not "
                f"{profile_name(interface)!r}: the buffer is not applied",
            )
        self._check_readback(interface, queue, buffer_bytes, reported)
        return reported

    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int:
        self._paths(gnmi_path, *interface_elems(interface))
        return self._in_force(self._connected(attempt), interface, queue)[1]

    def _terms(self, client: gNMIclient, interface: str) -> list[dict[str, Any]]:
        """The classifier's terms; none if the router has no such classifier yet."""
        path = gnmi_path(*classifier_terms(interface))
        try:
            value = self._get_value(client, path)
        except gNMIException as exc:
            cause = exc.orig_exc
            if isinstance(cause, grpc.Call) and cause.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise
        terms = value.get("term", []) if isinstance(value, dict) else None
        if not isinstance(terms, list):
            raise self._error(ErrorKind.MISMATCH, f"{interface}: unexpected terms {value!r}")
        return terms

    def _set_classifier(
        self, attempt: Attempt, interface: str, rules: Mapping[int, Sequence[FlowMatch]]
    ) -> None:
        terms_elems = classifier_terms(interface)
        self._paths(gnmi_path, *terms_elems)
        client = self._connected(attempt)
        # Old terms are deleted in the same request: a term id written again afterwards
        # starts empty instead of keeping conditions of the old flow.
        old_ids = [str(term.get("id")) for term in self._terms(client, interface)]
        updates = classifier_updates(interface)
        updates += [d for queue in rules for d in queue_declarations(interface, queue)]
        wanted = []
        term_id = 0
        for queue, flows in rules.items():
            for flow in flows:
                term_id += 1  # numbered 1..n (the agent's tc priorities)
                term = term_tree(term_id, queue, flow)
                term_path = gnmi_path(*terms_elems, ("term", {"id": str(term_id)}))
                updates.append((term_path, json_text(term)))
                wanted.append(term_summary(term))
        deletes = [gnmi_path(*terms_elems, ("term", {"id": old})) for old in old_ids]
        client.set(delete=deletes or None, update=updates, encoding=ENCODING)
        reported = sorted(term_summary(term) for term in self._terms(client, interface))
        if reported != sorted(wanted):
            raise self._error(
                ErrorKind.MISMATCH,
                f"{interface}: classifier set to {len(wanted)} terms, the router reports "
                f"{reported}",
            )

    # ---- errors -----------------------------------------------------------------------------
    def _classify(self, error: Exception) -> ErrorKind | None:
        cause = error.orig_exc if isinstance(error, gNMIException) else error
        if isinstance(cause, grpc.RpcError) and isinstance(cause, grpc.Call):
            # Everything else the router answers (INVALID_ARGUMENT, NOT_FOUND, ABORTED after
            # undoing a change the kernel refused, ...) is a refusal of the request itself.
            return STATUS_KINDS.get(cause.code(), ErrorKind.REJECTED)
        if isinstance(cause, OSError):  # the CA file cannot be read
            return ErrorKind.AUTH
        if isinstance(error, gNMIException):
            return ErrorKind.REJECTED
        return None
