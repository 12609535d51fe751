"""gNMI driver (pygnmi): OpenConfig QoS over TLS, as the router agent (infra/) serves it.

A queue's buffer is its buffer-allocation-profile queue's `dedicated-buffer`, in bytes; the
profile is named like the interface and bound to its output (see p4bs_infra.agent.datastore):

  /qos/buffer-allocation-profiles/buffer-allocation-profile[name=IF]/queues/queue[name=qN]/
      config/dedicated-buffer   set (with config/name, the entry's key)
      state/dedicated-buffer    read back: what the router has in force

Values go as RFC 7951 JSON (JSON_IETF): the uint64 buffer as a string ("625000").

Classifier rules are terms of the classifier named like the interface, one exact 5-tuple
match per flow with the target-group of its queue (the forwarding group of the queue's name);
each queue the rules name is declared under /qos/queues, given that forwarding group and
made under /qos/interfaces/interface[interface-id=IF]/output/queues. One Set request replaces all of
the interface's terms, which the router applies as a whole or not at all.

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

STATUS_KINDS = {
    grpc.StatusCode.UNAVAILABLE: ErrorKind.UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorKind.TIMEOUT,
    # The driver cancels calls itself only when it cuts a timed-out attempt's channel.
    grpc.StatusCode.CANCELLED: ErrorKind.TIMEOUT,
    grpc.StatusCode.UNAUTHENTICATED: ErrorKind.AUTH,
    grpc.StatusCode.PERMISSION_DENIED: ErrorKind.AUTH,
}


def json_text(value: Any) -> str:
    """A Set value as its JSON text. pygnmi sends a str as it is and JSON-encodes anything
    else, so a string leaf given as a str would go unquoted (not JSON at all); as JSON text
    every value goes as JSON_IETF wants it."""
    return json.dumps(value)


def uint64(value: int) -> str:
    """RFC 7951 writes a 64-bit integer as a JSON string ("625000"): a JSON number for one is
    refused by targets that check their schema (openconfig-qos's dedicated-buffer is uint64)."""
    return str(value)


def queue_declarations(interface: str, queue: int) -> list[tuple[str, str]]:
    """What makes queue `queue` of `interface` in OpenConfig: the queue declared under
    /qos/queues, a forwarding group into it (what a classifier term targets) and the
    interface's output queue."""
    name = f"q{queue}"
    return [
        (f"/qos/queues/queue[name={name}]", json_text({"config": {"name": name}})),
        (
            f"/qos/forwarding-groups/forwarding-group[name={name}]",
            json_text({"config": {"name": name, "output-queue": name}}),
        ),
        (output_queue(interface, queue), json_text({"config": {"name": name}})),
    ]


def profile_queue(interface: str, queue: int) -> str:
    return (
        f"/qos/buffer-allocation-profiles/buffer-allocation-profile[name={interface}]"
        f"/queues/queue[name=q{queue}]"
    )


def output_queue(interface: str, queue: int) -> str:
    return f"/qos/interfaces/interface[interface-id={interface}]/output/queues/queue[name=q{queue}]"


def classifier_terms(interface: str) -> str:
    return f"/qos/classifiers/classifier[name={interface}]/terms"


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
        "actions": {"config": {"target-group": f"q{queue}"}},
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

    def _read_bytes(self, client: gNMIclient, interface: str, queue: int) -> int:
        path = f"{profile_queue(interface, queue)}/state/dedicated-buffer"
        value = self._get_value(client, path)
        try:
            return int(value)
        except (TypeError, ValueError):
            raise self._error(ErrorKind.MISMATCH, f"{path}: not a byte count: {value!r}") from None

    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        client = self._connected(attempt)
        # The entry's own name comes along: a profile's queue entry is keyed by it.
        config = {"name": f"q{queue}", "dedicated-buffer": uint64(buffer_bytes)}
        client.set(
            update=[(profile_queue(interface, queue), json_text({"config": config}))],
            encoding=ENCODING,
        )
        reported = self._read_bytes(client, interface, queue)
        self._check_readback(interface, queue, buffer_bytes, reported)
        return reported

    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int:
        return self._read_bytes(self._connected(attempt), interface, queue)

    def _terms(self, client: gNMIclient, interface: str) -> list[dict[str, Any]]:
        value = self._get_value(client, classifier_terms(interface))
        terms = value.get("term", []) if isinstance(value, dict) else None
        if not isinstance(terms, list):
            raise self._error(ErrorKind.MISMATCH, f"{interface}: unexpected terms {value!r}")
        return terms

    def _set_classifier(
        self, attempt: Attempt, interface: str, rules: Mapping[int, Sequence[FlowMatch]]
    ) -> None:
        client = self._connected(attempt)
        terms_path = classifier_terms(interface)
        # Old terms are deleted in the same request: a term id written again afterwards
        # starts empty instead of keeping conditions of the old flow.
        old_ids = [str(term.get("id")) for term in self._terms(client, interface)]
        updates = [d for queue in rules for d in queue_declarations(interface, queue)]
        wanted = []
        term_id = 0
        for queue, flows in rules.items():
            for flow in flows:
                term_id += 1  # the router's terms are numbered 1..n (their tc priorities)
                term = term_tree(term_id, queue, flow)
                updates.append((f"{terms_path}/term[id={term_id}]", json_text(term)))
                wanted.append(term_summary(term))
        client.set(
            delete=[f"{terms_path}/term[id={old}]" for old in old_ids] or None,
            update=updates,
            encoding=ENCODING,
        )
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
