"""gNMI (0.8) server for the router agent: Capabilities, Get, Set, Subscribe.

Subscribe supports ONCE, POLL and STREAM with SAMPLE (every sample_interval), ON_CHANGE (sent
when a leaf's value changes, checked every ON_CHANGE_CHECK_S) and TARGET_DEFINED (as SAMPLE).
Every RPC must carry `username` and `password` metadata (the gNMI convention that pygnmi and
gnmi_cli's per-RPC auth use); they are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2 as pb
from pygnmi.spec.v080 import gnmi_pb2_grpc as pb_grpc

from p4bs_infra.agent.datastore import (
    UNSIGNED,
    AgentError,
    PathElems,
    RouterQos,
    flatten,
    format_path,
)
from p4bs_infra.agent.openconfig import TOP, OpenConfigQos, Scalar

log = logging.getLogger(__name__)

GNMI_VERSION = "0.8.0"
ON_CHANGE_CHECK_S = 0.1
DEFAULT_SAMPLE_NS = 1_000_000_000
STATUS = {
    AgentError.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    AgentError.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    AgentError.READ_ONLY: grpc.StatusCode.INVALID_ARGUMENT,
    AgentError.FAILED: grpc.StatusCode.ABORTED,
}


def elems_of(prefix: pb.Path | None, path: pb.Path) -> PathElems:
    elems = list(prefix.elem) if prefix is not None else []
    elems += list(path.elem)
    return [(e.name, dict(e.key)) for e in elems]


def path_of(elems: PathElems) -> pb.Path:
    return pb.Path(elem=[pb.PathElem(name=name, key=keys) for name, keys in elems])


def typed(value: Any, encoding: int) -> pb.TypedValue:
    if isinstance(value, dict | list):
        data = json.dumps(value).encode()
        return (
            pb.TypedValue(json_ietf_val=data)
            if encoding == pb.JSON_IETF
            else pb.TypedValue(json_val=data)
        )
    text = str(value)
    if UNSIGNED.fullmatch(text) and int(text) < 2**64:
        return pb.TypedValue(uint_val=int(text))
    return pb.TypedValue(string_val=text)


def value_of(value: pb.TypedValue, at_root: bool = False) -> Any:
    """A Set's value: JSON as RFC 7951 gives it (a uint64 is then a string; the schema refuses
    a JSON number for one), a typed scalar as Scalar (its JSON form is the leaf type's). At
    the root, JSON_IETF names the top member with its module (openconfig-qos:qos, else
    refused), plain JSON may leave it out."""
    kind = value.WhichOneof("value")
    if kind in ("json_val", "json_ietf_val"):
        raw = getattr(value, kind)
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise AgentError(
                AgentError.INVALID,
                f"the JSON value {raw.decode(errors='replace')[:80]!r} does not parse: {exc} "
                '(a string leaf is a quoted JSON string: "q1")',
            ) from exc
        if at_root and kind == "json_val" and isinstance(parsed, dict):
            parsed = {TOP if member == "qos" else member: v for member, v in parsed.items()}
        return parsed
    if kind in ("uint_val", "int_val", "string_val", "bool_val", "double_val", "float_val"):
        scalar = getattr(value, kind)
        return Scalar(str(scalar).lower() if kind == "bool_val" else str(scalar))
    raise AgentError(AgentError.INVALID, f"unsupported value encoding {kind!r}")


@dataclass
class _Sample:
    due_ns: int
    interval_ns: int
    path: PathElems


class Gnmi(pb_grpc.gNMIServicer):  # type: ignore[misc]
    def __init__(self, qos: RouterQos, username: str, password: str) -> None:
        self.qos = OpenConfigQos(qos)
        self._username = username.encode()
        self._password = password.encode()

    def _authorise(self, context: grpc.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata())
        user = str(metadata.get("username", "")).encode()
        password = str(metadata.get("password", "")).encode()
        ok = hmac.compare_digest(user, self._username) & hmac.compare_digest(
            password, self._password
        )
        if not ok:
            log.warning("gNMI request from %s refused: bad credentials", context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad username or password")

    def _fail(self, context: grpc.ServicerContext, error: AgentError) -> None:
        log.info("gNMI request refused: %s", error)
        context.abort(STATUS[error.kind], str(error))

    def Capabilities(self, request: pb.CapabilityRequest, context: grpc.ServicerContext) -> Any:
        self._authorise(context)
        return pb.CapabilityResponse(
            supported_models=[
                pb.ModelData(
                    name="openconfig-qos", organization="OpenConfig working group", version="2.2.0"
                )
            ],
            supported_encodings=[pb.JSON, pb.JSON_IETF],
            gNMI_version=GNMI_VERSION,
        )

    def _notifications(
        self, paths: list[PathElems], encoding: int, config_only: bool = False
    ) -> list[pb.Notification]:
        now = time.time_ns()
        out = []
        for elems in paths:
            for path, value in self.qos.get(elems, config_only):
                out.append(
                    pb.Notification(
                        timestamp=now,
                        update=[pb.Update(path=path_of(path), val=typed(value, encoding))],
                    )
                )
        return out

    def Get(self, request: pb.GetRequest, context: grpc.ServicerContext) -> Any:
        self._authorise(context)
        if request.encoding not in (pb.JSON, pb.JSON_IETF):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "only JSON and JSON_IETF encodings")
        paths = [elems_of(request.prefix, p) for p in request.path] or [[("qos", {})]]
        try:
            notifications = self._notifications(
                paths, request.encoding, config_only=request.type == pb.GetRequest.CONFIG
            )
        except AgentError as error:
            self._fail(context, error)
        return pb.GetResponse(notification=notifications)

    def Set(self, request: pb.SetRequest, context: grpc.ServicerContext) -> Any:
        self._authorise(context)
        try:
            updates = []
            for update in [*request.replace, *request.update]:
                path = elems_of(request.prefix, update.path)
                updates.append((path, value_of(update.val, at_root=not path)))
            deletes = [elems_of(request.prefix, p) for p in request.delete]
            began = time.perf_counter_ns()
            self.qos.set(updates, deletes)
        except AgentError as error:
            self._fail(context, error)
        took_us = (time.perf_counter_ns() - began) / 1000
        log.info(
            "gNMI Set applied %d update(s) in %.0f us: %s",
            len(updates),
            took_us,
            ", ".join(format_path(p) for p, _ in updates),
        )
        ops = [(u, pb.UpdateResult.REPLACE) for u in request.replace]
        ops += [(u, pb.UpdateResult.UPDATE) for u in request.update]
        return pb.SetResponse(
            prefix=request.prefix,
            timestamp=time.time_ns(),
            response=[pb.UpdateResult(path=u.path, op=op) for u, op in ops],
        )

    def Subscribe(
        self, requests: Iterator[pb.SubscribeRequest], context: grpc.ServicerContext
    ) -> Any:
        self._authorise(context)
        first = next(requests, None)
        if first is None or not first.HasField("subscribe"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first request must subscribe")
            return
        sub = first.subscribe
        paths = [elems_of(sub.prefix, s.path) for s in sub.subscription]
        try:
            initial = [] if sub.updates_only else self._notifications(paths, sub.encoding)
        except AgentError as error:
            self._fail(context, error)
        for notification in initial:
            yield pb.SubscribeResponse(update=notification)
        yield pb.SubscribeResponse(sync_response=True)
        if sub.mode == pb.SubscriptionList.ONCE:
            return
        if sub.mode == pb.SubscriptionList.POLL:
            for request in requests:
                if request.HasField("poll"):
                    for notification in self._notifications(paths, sub.encoding):
                        yield pb.SubscribeResponse(update=notification)
                    yield pb.SubscribeResponse(sync_response=True)
            return
        yield from self._stream(sub, context)

    def _stream(self, sub: pb.SubscriptionList, context: grpc.ServicerContext) -> Iterator[Any]:
        samples: list[_Sample] = []
        on_change: dict[str, Any] = {}
        watched = []
        now = time.monotonic_ns()
        for s in sub.subscription:
            elems = elems_of(sub.prefix, s.path)
            if s.mode == pb.ON_CHANGE:
                watched.append(elems)
            else:
                interval = s.sample_interval or DEFAULT_SAMPLE_NS
                samples.append(_Sample(now + interval, interval, elems))
        for elems in watched:
            for leaf, value in self._leaves(elems):
                on_change[format_path(leaf)] = value
        next_check = now
        while context.is_active():
            now = time.monotonic_ns()
            for sample in samples:
                if sample.due_ns <= now:
                    for notification in self._notifications([sample.path], sub.encoding):
                        yield pb.SubscribeResponse(update=notification)
                    missed = (now - sample.due_ns) // sample.interval_ns
                    sample.due_ns += sample.interval_ns * (missed + 1)
            if watched and next_check <= now:
                changed = []
                for elems in watched:
                    for leaf, value in self._leaves(elems):
                        key = format_path(leaf)
                        if on_change.get(key) != value:
                            on_change[key] = value
                            changed.append(
                                pb.Update(path=path_of(leaf), val=typed(value, sub.encoding))
                            )
                if changed:
                    yield pb.SubscribeResponse(
                        update=pb.Notification(timestamp=time.time_ns(), update=changed)
                    )
                next_check = now + int(ON_CHANGE_CHECK_S * 1e9)
            due = [sample.due_ns for sample in samples] + ([next_check] if watched else [])
            time.sleep(max(0.0, min(due, default=now + 10**9) - time.monotonic_ns()) / 1e9)

    def _leaves(self, elems: PathElems) -> Iterator[tuple[PathElems, Any]]:
        for path, value in self.qos.get(elems):
            yield from flatten(path, value)
