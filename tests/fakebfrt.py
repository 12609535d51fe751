"""An in-memory bfrt_grpc (the SDE's Python client) and switch, for the tofino exporter's tests
and its benchmark: no Tofino, no SDE runs here.

It has the calls, argument order and field names of the real client (open-p4studio,
pkgsrc/bf-drivers/src/bf_rt/bfruntime_grpc_client/python/client.py) and behaves like the
client and its bf_rt server where the exporter depends on it:

- `DataTuple` carries `val` / `float_val` / `str_val` / `bool_val` and refuses a value of the
  wrong Python type as the real one does; each table's data fields have a kind, and
  `make_data` refuses a field given in another kind (the real client's check of a mandatory
  field's member, or the server's refusal of a float sent as bytes).
- A failed write raises `BfruntimeReadWriteRpcException` whose `sub_errors_get()` lists
  `(index, Error)` with `Error.canonical_code` the google.rpc code the server maps the driver's
  status to (bf_rt_server_impl.hpp `to_grpc_status`: no space -> RESOURCE_EXHAUSTED, table
  locked / not ready / in use -> UNAVAILABLE, ...); the overall gRPC status is UNKNOWN. A
  server that is down gives an UNAVAILABLE status and no sub-errors.
- A register read with `{"from_hw": True}` reads every requested index from the hardware
  (counted in `Switch.hw_index_reads`); with `{"from_hw": False}` it returns the values as of
  the table's last `operations_execute(target, "Sync")` (zero before any). Every value is a
  list, one per pipe.
- An LPF table always has every index: `entry_add` sets it.
- Changing a table's entry scope is refused while it holds entries (pipe_mgr).
- The notification stream has a receiver thread (`stream_recv_thread`). When the switch
  restarts, the thread puts a `BfruntimeSubscribeRpcException` into the interface's
  `exception_q` and ends, while `digest_get` / `idletime_notification_get` go on timing out
  (RuntimeError) exactly as when nothing happens.
- Every call that is one gRPC request is counted in `Switch.rpcs` ("read" or "write"), and
  the CPU time the calling thread spent inside the register and table calls in
  `Switch.fake_cpu_ns` (so a benchmark can take the fake's own work out).
"""

from __future__ import annotations

import queue
import re
import threading
import time
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import grpc

from p4bs import paths

# google.rpc.Code numbers, as the bf_rt server answers.
OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS = 0, 3, 5, 6
RESOURCE_EXHAUSTED, UNIMPLEMENTED, UNAVAILABLE = 8, 12, 14
CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}
MODE_ALL, MODE_SINGLE = 0, 1  # bfruntime_pb2.Mode.PredefinedMode
IDLE_TABLE_NOTIFY_MODE = 1  # bfruntime_pb2.IdleTable.IdleTableMode

# Data field kinds: which member of a DataTuple carries the value.
INT, FLOAT, STRING = "val", "float_val", "str_val"


# --- errors, as the client raises them -----------------------------------------------------


class GrpcError(grpc.RpcError):
    """What grpc raises for a failed call: a status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def debug_error_string(self) -> str:
        return f"{{grpc_status: {self._code.value[0]}, grpc_message: {self._details!r}}}"


class Error:
    """bfruntime_pb2.Error: one entry's failure in a batch."""

    def __init__(self, canonical_code: int, message: str) -> None:
        self.canonical_code, self.message, self.space, self.code = canonical_code, message, "", 0


class BfruntimeRpcException(Exception):
    def __init__(self, grpc_error: GrpcError) -> None:
        super().__init__()
        self.grpc_error = grpc_error
        self.errors: list[tuple[int, Error]] = []

    def grpc_error_get(self) -> GrpcError:
        return self.grpc_error

    def sub_errors_get(self) -> list[tuple[int, Error]]:
        return self.errors


class BfruntimeReadWriteRpcException(BfruntimeRpcException):
    """The real one unpacks the per-entry errors from the status details of an UNKNOWN status;
    here they are given."""

    def __init__(self, grpc_error: GrpcError, errors: list[tuple[int, Error]] = ()) -> None:  # type: ignore[assignment]
        super().__init__(grpc_error)
        self.errors = [(i, e) for i, e in errors if e.canonical_code != OK]

    def __str__(self) -> str:
        return "Error(s):\n" + "".join(
            f"\t* At index {i}: {CODE_NAMES[e.canonical_code]}, '{e.message}'\n"
            for i, e in self.errors
        )


class BfruntimeSubscribeRpcException(BfruntimeRpcException):
    def __str__(self) -> str:
        return f"Error: {self.grpc_error.code()} : {self.grpc_error.debug_error_string()}"


def batch_error(failures: list[tuple[int, int, str]]) -> BfruntimeReadWriteRpcException:
    """A write whose entries failed: (index, google.rpc code, message) each."""
    return BfruntimeReadWriteRpcException(
        GrpcError(grpc.StatusCode.UNKNOWN, "Write Error Status"),
        [(i, Error(code, message)) for i, code, message in failures],
    )


def unavailable() -> BfruntimeReadWriteRpcException:
    return BfruntimeReadWriteRpcException(
        GrpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    )


# --- keys and data -------------------------------------------------------------------------


class KeyTuple:
    def __init__(
        self,
        name: str,
        value: Any = None,
        mask: Any = None,
        prefix_len: Any = None,
        low: Any = None,
        high: Any = None,
        is_valid: Any = None,
    ) -> None:
        self.name, self.value, self.mask, self.prefix_len = name, value, mask, prefix_len


class DataTuple:
    def __init__(
        self,
        name: str,
        val: Any = None,
        float_val: Any = None,
        str_val: Any = None,
        int_arr_val: Any = None,
        bool_arr_val: Any = None,
        bool_val: Any = None,
    ) -> None:
        # The real constructor's checks, in its order: only the first member given is checked.
        if val is not None:
            if not isinstance(val, bytearray | int | str):
                raise TypeError(f"Please pass an int/long or bytearray. you passed {type(val)}")
        elif float_val is not None:
            if not isinstance(float_val, float):
                raise TypeError("Please pass a float for float_val")
        elif str_val is not None:
            if not isinstance(str_val, str):
                raise TypeError("Please pass a string for str_val")
        elif bool_val is not None and not isinstance(bool_val, bool):
            raise TypeError("Please pass a bool for bool_val")
        self.name, self.val, self.float_val, self.str_val = name, val, float_val, str_val
        self.bool_val = bool_val


class Key:
    def __init__(self, fields: list[KeyTuple]) -> None:
        self.fields = {f.name: f for f in fields}

    def ident(self) -> tuple[Any, ...]:
        return tuple(sorted((n, f.value, f.prefix_len) for n, f in self.fields.items()))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, f in self.fields.items():
            out[name] = {"value": f.value}
            if f.prefix_len is not None:
                out[name]["prefix_len"] = f.prefix_len
        return out


class Data:
    def __init__(self, fields: dict[str, Any], action_name: str | None = None) -> None:
        self.fields, self.action_name = fields, action_name

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, "action_name": self.action_name, "is_default_entry": False}


class TableInfo:
    def __init__(self, name: str, attributes: list[str], operations: list[str]) -> None:
        self.name, self.attributes, self.operations = name, attributes, operations

    def name_get(self) -> str:
        return self.name

    def attributes_supported_get(self) -> list[str]:
        return self.attributes

    def operations_supported_get(self) -> list[str]:
        return self.operations


# --- tables --------------------------------------------------------------------------------


class Table:
    """A table of the program: entries by key; data fields of known kinds (any field of an
    unknown name is taken as an int)."""

    def __init__(
        self,
        switch: Switch,
        name: str,
        kinds: dict[str, str] | None = None,
        attributes: tuple[str, ...] = ("EntryScope",),
        operations: tuple[str, ...] = (),
    ) -> None:
        self.switch, self.name, self.kinds = switch, name, kinds or {}
        self.info = TableInfo(name, list(attributes), list(operations))
        self.entries: dict[tuple[Any, ...], tuple[Key, Data]] = {}
        self.calls: list[tuple[str, Any]] = []
        self.scope = MODE_ALL
        self.full = False
        self.refuse: list[tuple[int, str]] = []  # (google.rpc code, text): the next inserts

    def _rpc(self, kind: str) -> None:
        if self.switch.refuse_connects:
            raise unavailable()
        self.switch.rpcs[kind] += 1

    def make_key(self, fields: list[KeyTuple]) -> Key:
        return Key(fields)

    def make_data(
        self,
        fields: list[DataTuple] | None = None,
        action_name: str | None = None,
        get: bool = False,
    ) -> Data:
        values = {}
        for f in fields or []:
            member = self.kinds.get(f.name, INT)
            value = getattr(f, member)
            if value is None and not get:
                raise ValueError(f"mandatory = True field.{member} = None field {f.name}")
            values[f.name] = value
        return Data(values, action_name)

    def entry_add(self, target: Any, key_list: list[Key], data_list: list[Data], **_: Any) -> None:
        start = time.thread_time_ns()
        self._rpc("write")
        self.calls.append(("add", [k.ident() for k in key_list]))
        failures = []
        for i, (key, data) in enumerate(zip(key_list, data_list, strict=True)):
            problem = self._check(data)
            if problem is None and self.refuse:
                code, text = self.refuse.pop(0)
                problem = (code, f"Table Add failed table:{self.name} {text}")
            elif problem is None and key.ident() in self.entries:
                problem = (ALREADY_EXISTS, f"Table Add failed table:{self.name} Already exists")
            elif problem is None and self.full:
                problem = (
                    RESOURCE_EXHAUSTED,
                    f"Table Add failed table:{self.name} Not enough space",
                )
            if problem is None:
                self.entries[key.ident()] = (key, data)
            else:
                failures.append((i, *problem))
        self.switch.fake_cpu_ns += time.thread_time_ns() - start
        if failures:
            raise batch_error(failures)

    def _check(self, data: Data) -> tuple[int, str] | None:
        return None

    def entry_del(self, target: Any, key_list: list[Key] | None = None, **_: Any) -> None:
        self._rpc("write")
        self.calls.append(("del", None if key_list is None else [k.ident() for k in key_list]))
        if not key_list:
            self.entries.clear()
        for key in key_list or []:
            self.entries.pop(key.ident(), None)

    def default_entry_set(self, target: Any, data: Data, **_: Any) -> None:
        self._rpc("write")
        self.calls.append(("default", data.to_dict()))

    def attribute_idle_time_set(
        self,
        target: Any,
        enable: bool = False,
        idle_table_mode: int = IDLE_TABLE_NOTIFY_MODE,
        ttl_query_interval: int = 5000,
        max_ttl: int = 3600000,
        min_ttl: int = 1000,
        **_: Any,
    ) -> None:
        self._rpc("write")
        self.calls.append(("idle", (enable, idle_table_mode, ttl_query_interval, max_ttl, min_ttl)))

    def attribute_entry_scope_set(
        self,
        target: Any,
        config_gress_scope: bool = False,
        predefined_gress_scope_val: int = MODE_ALL,
        config_pipe_scope: bool = True,
        predefined_pipe_scope: bool = True,
        predefined_pipe_scope_val: int = MODE_ALL,
        user_defined_pipe_scope_val: int = 0xFFFF,
        pipe_scope_args: int = 0xFF,
        **_: Any,
    ) -> None:
        self._rpc("write")
        if "EntryScope" not in self.info.attributes:
            raise batch_error([(0, UNIMPLEMENTED, f"{self.name}: Attribute not supported")])
        scope = predefined_pipe_scope_val if predefined_pipe_scope else user_defined_pipe_scope_val
        if config_pipe_scope and scope != self.scope:
            if self.entries:
                message = f"{self.name}: Cannot change symmetric mode, usage {len(self.entries)}"
                raise batch_error([(0, UNIMPLEMENTED, message)])
            self.scope = scope
        self.calls.append(("scope", (config_pipe_scope, predefined_pipe_scope, scope)))

    def operations_execute(self, target: Any, table_op: str, **_: Any) -> None:
        self._rpc("write")
        if table_op not in self.info.operations:
            raise batch_error([(0, UNIMPLEMENTED, f"{self.name}: Operation not supported")])
        self.calls.append(("operation", table_op))

    def reset(self) -> None:
        """What a restarted switch has: no entries, the compiled scope."""
        self.entries.clear()
        self.scope = MODE_ALL


class LpfTable(Table):
    """An Lpf extern's table: key $LPF_INDEX, every index exists, entry_add sets it."""

    KINDS: ClassVar[dict[str, str]] = {
        "$LPF_SPEC_TYPE": STRING,
        "$LPF_SPEC_GAIN_TIME_CONSTANT_NS": FLOAT,
        "$LPF_SPEC_DECAY_TIME_CONSTANT_NS": FLOAT,
        "$LPF_SPEC_OUT_SCALE_DOWN_FACTOR": INT,
    }

    def __init__(self, switch: Switch, name: str) -> None:
        super().__init__(switch, name, dict(self.KINDS))

    def _check(self, data: Data) -> tuple[int, str] | None:
        spec = data.fields
        if set(spec) != set(self.KINDS):
            return INVALID_ARGUMENT, f"{self.name}: fields {sorted(spec)}"
        if spec["$LPF_SPEC_TYPE"] not in ("RATE", "SAMPLE"):
            return INVALID_ARGUMENT, f"{self.name}: LPF type {spec['$LPF_SPEC_TYPE']!r}"
        if not 0 <= spec["$LPF_SPEC_OUT_SCALE_DOWN_FACTOR"] <= 31:  # a 5-bit field
            return (
                INVALID_ARGUMENT,
                f"{self.name}: scale down {spec['$LPF_SPEC_OUT_SCALE_DOWN_FACTOR']}",
            )
        return None

    def entry_add(self, target: Any, key_list: list[Key], data_list: list[Data], **_: Any) -> None:
        for key in key_list:  # an index always exists: adding sets it
            self.entries.pop(key.ident(), None)
        super().entry_add(target, key_list, data_list)

    def spec(self, index: int) -> dict[str, Any]:
        return self.entries[(("$LPF_INDEX", index, None),)][1].fields


class Register(Table):
    """A Register extern's table. The hardware's values follow `script`: the n-th look at the
    hardware (a Sync, or a from_hw read) sees script[min(n, last)], each {index: {field:
    [per-pipe values]}}; indexes or fields not scripted read 0 in every pipe."""

    def __init__(
        self,
        switch: Switch,
        name: str,
        fields: tuple[str, ...],
        script: list[dict[int, dict[str, list[int]]]],
        pipes: int,
    ) -> None:
        super().__init__(switch, name, operations=("Sync",))
        self.cell_fields, self.script, self.pipes = fields, script, pipes
        self.looks = 0
        self.shadow: dict[int, dict[str, list[int]]] = {}
        self.reads: list[dict[str, bool]] = []

    def _hardware(self) -> dict[int, dict[str, list[int]]]:
        values = self.script[min(self.looks, len(self.script) - 1)]
        self.looks += 1
        return values

    def operations_execute(self, target: Any, table_op: str, **kw: Any) -> None:
        start = time.thread_time_ns()
        super().operations_execute(target, table_op, **kw)
        self.shadow = self._hardware()
        self.switch.fake_cpu_ns += time.thread_time_ns() - start

    def entry_get(
        self,
        target: Any,
        key_list: list[Key] | None = None,
        flags: dict[str, bool] | None = None,
        **_: Any,
    ) -> Iterator[tuple[Data, Key]]:
        start = time.thread_time_ns()
        self._rpc("read")
        flags = {"from_hw": True} if flags is None else flags
        self.reads.append(dict(flags))
        if flags.get("from_hw", False):
            values = self._hardware()
            self.switch.hw_index_reads += len(key_list or [])
        else:
            values = self.shadow
        answers = []
        for key in key_list or []:
            index = key.fields["$REGISTER_INDEX"].value
            cell = values.get(index, {})
            fields = {
                f"{self.name}.{f}": list(cell.get(f, [0] * self.pipes)) for f in self.cell_fields
            }
            answers.append((Data(fields), key))
        self.switch.fake_cpu_ns += time.thread_time_ns() - start
        return iter(answers)

    def reset(self) -> None:
        """A restarted switch: every register back to 0."""
        super().reset()
        self.script, self.looks, self.shadow = [{}], 0, {}


# --- the switch and the client -------------------------------------------------------------


class Learn:
    def __init__(self, ident: int) -> None:
        self.info = types.SimpleNamespace(id_get=lambda: ident)

    def make_data_list(self, digest: Any) -> list[Data]:
        return [Data(dict(entry)) for entry in digest.entries]


MATCH_TABLES = ("port_to_link", "output_prefixes", "long_flows", "config")
COUNTER_FIELDS = {  # register -> its bfrt data fields
    "Egress.link_traffic": ("packets", "bytes"),
    "Egress.link_after": ("packets", "bytes"),
    "Egress.link_data": ("packets", "bytes"),
    "Egress.link_retx": ("f1",),
    "Egress.link_qdelay_samples": ("f1",),
    "Egress.link_qdelay_sum": ("sum_hi", "sum_lo"),
    "Egress.link_qdelay_ewma": ("f1",),
}


class Switch:
    """What a ClientInterface connects to: the program's tables, learn objects and
    notification queues. `scripts` gives registers their values (see Register)."""

    def __init__(
        self,
        scripts: dict[str, list[dict[int, dict[str, list[int]]]]] | None = None,
        rtt_id: int = 101,
        flow_id: int = 202,
        pipes: int = 2,
    ) -> None:
        self.pipes = pipes
        self.rpcs: Counter[str] = Counter()
        self.hw_index_reads = 0
        self.fake_cpu_ns = 0
        self.refuse_connects = 0  # the next connections fail (a switch still starting)
        self.interfaces: list[Any] = []
        self.connected: list[tuple[Any, ...]] = []
        self.tables: dict[str, Table] = {
            f"Ingress.{n}": Table(self, f"Ingress.{n}") for n in MATCH_TABLES
        }
        self.tables["Ingress.rtt_min_interval"] = Table(
            self, "Ingress.rtt_min_interval", attributes=()
        )
        self.tables["Egress.link_qdelay_lpf"] = LpfTable(self, "Egress.link_qdelay_lpf")
        for name, fields in COUNTER_FIELDS.items():
            script = (scripts or {}).get(name) or [{}]
            self.tables[name] = Register(self, name, fields, script, pipes)
        self.learns = {
            "IngressDeparser.rtt_digest": Learn(rtt_id),
            "IngressDeparser.flow_digest": Learn(flow_id),
        }
        self.digests: queue.Queue[Any] = queue.Queue()
        self.idle: queue.Queue[Any] = queue.Queue()

    def table(self, name: str) -> Any:
        return self.tables[name]

    def digest(self, ident: int, *entries: dict[str, Any]) -> None:
        self.digests.put(types.SimpleNamespace(digest_id=ident, entries=entries))

    def restart(self, refuse_connects: int = 0) -> None:
        """bf_switchd restarts: every client's stream breaks, tables and registers come back
        empty, and the next `refuse_connects` connections fail while it starts."""
        for interface in self.interfaces:
            interface.break_stream(GrpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
        self.interfaces.clear()
        for table in self.tables.values():
            table.reset()
        self.refuse_connects = refuse_connects


class Info:
    def __init__(self, switch: Switch) -> None:
        self.switch = switch

    def table_get(self, name: str) -> Any:
        return self.switch.tables[name]

    def learn_get(self, name: str) -> Learn:
        return self.switch.learns[name]

    def key_from_idletime_notification(self, notification: Any) -> Key:
        key: Key = notification.key
        return key


def fake_modules(switch: Switch) -> dict[str, types.ModuleType]:
    """`bfrt_grpc`, `bfrt_grpc.client` and `bfrt_grpc.bfruntime_pb2` talking to `switch`."""

    class ClientInterface:
        def __init__(
            self,
            grpc_addr: str,
            client_id: int,
            device_id: int,
            notifications: Any = None,
            timeout: float = 1,
            num_tries: int = 5,
            perform_subscribe: bool = True,
        ) -> None:
            if switch.refuse_connects:
                switch.refuse_connects -= 1
                raise RuntimeError("Failed to subscribe to server at %s", grpc_addr)
            switch.connected.append((grpc_addr, client_id, device_id))
            switch.interfaces.append(self)
            self.exception_q: queue.Queue[Any] = queue.Queue()
            self._ended = threading.Event()
            self._silence: queue.Queue[Any] = queue.Queue()  # a broken stream: nothing comes
            self.stream_recv_thread = threading.Thread(target=self._ended.wait, daemon=True)
            self.stream_recv_thread.start()

        def break_stream(self, error: GrpcError) -> None:
            """The receiver thread's end on a gRPC error, as in the real set_up_stream."""
            self.exception_q.put(BfruntimeSubscribeRpcException(error))
            self._ended.set()

        def bind_pipeline_config(self, p4_name: str) -> None:
            switch.connected.append(("bind", p4_name))

        def bfrt_info_get(self, p4_name: str | None = None) -> Info:
            return Info(switch)

        def _stream(self) -> queue.Queue[Any]:
            return self._silence if self._ended.is_set() else switch.digests

        def digest_get(self, timeout: float = 1) -> Any:
            try:
                return self._stream().get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("Digest list not received.") from None

        def idletime_notification_get(self, timeout: float = 1) -> Any:
            source = self._silence if self._ended.is_set() else switch.idle
            try:
                return source.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("Idletime notification not received") from None

        def tear_down_stream(self) -> None:
            self._ended.set()
            self.stream_recv_thread.join()

    class Target:
        def __init__(
            self,
            device_id: int = 0,
            pipe_id: int = 0xFFFF,
            direction: int = 0xFF,
            prsr_id: int = 0xFF,
        ) -> None:
            self.device_id_, self.pipe_id_ = device_id, pipe_id
            self.direction_, self.prsr_id_ = direction, prsr_id

    class Notifications:
        def __init__(
            self,
            enable_learn: bool = True,
            enable_idletimeout: bool = True,
            enable_port_status_change: bool = True,
            enable_entry_active: bool = False,
            enable_selector_update_change: bool = True,
        ) -> None:
            self.enable_learn_notifications = enable_learn
            self.enable_idletimeout_notifications = enable_idletimeout

    client = types.ModuleType("bfrt_grpc.client")
    pb2 = types.ModuleType("bfrt_grpc.bfruntime_pb2")
    package = types.ModuleType("bfrt_grpc")
    members = {
        "ClientInterface": ClientInterface,
        "KeyTuple": KeyTuple,
        "DataTuple": DataTuple,
        "Target": Target,
        "Notifications": Notifications,
        "BfruntimeRpcException": BfruntimeRpcException,
        "BfruntimeReadWriteRpcException": BfruntimeReadWriteRpcException,
        "BfruntimeSubscribeRpcException": BfruntimeSubscribeRpcException,
    }
    for name, member in members.items():
        setattr(client, name, member)
    pb2.IdleTable = types.SimpleNamespace(IDLE_TABLE_NOTIFY_MODE=IDLE_TABLE_NOTIFY_MODE)  # type: ignore[attr-defined]
    pb2.Mode = types.SimpleNamespace(ALL=MODE_ALL, SINGLE=MODE_SINGLE)  # type: ignore[attr-defined]
    package.client, package.bfruntime_pb2 = client, pb2  # type: ignore[attr-defined]
    return {"bfrt_grpc": package, "bfrt_grpc.client": client, "bfrt_grpc.bfruntime_pb2": pb2}


def write_config(
    directory: Path,
    bootstrap: str,
    topics: dict[str, str],
    links: int = 2,
    export_interval: str = "50ms",
    first_port: int = 4,
    port_step: int = 4,
    optical_from: int | None = None,
) -> Path:
    """The example config on a Tofino `tof0` at 127.0.0.1:50052: link i is r1:eth<i+1> on port
    p = first_port + i*port_step (before) and p + 1 (after), each carrying both directions
    told apart by the example's output_prefixes; from link `optical_from` on, an optical
    tap's per-direction ports instead (before: p out, p + 2 back; after: p + 1 out, p + 3
    back) and no prefixes."""
    text = paths.example_config().read_text()
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    text = re.sub(
        r"^bootstrap = .*$", f'bootstrap = "{bootstrap}"\ntopics = {{ {table} }}', text, flags=re.M
    )
    text = text.replace('target = "model"', 'target = "tofino"\naddress = "127.0.0.1:50052"')
    text = text.replace('switch = "model0"', 'switch = "tof0"').replace('"model0"', '"tof0"')
    text = re.sub(
        r"^export_interval = .*$", f'export_interval = "{export_interval}"', text, flags=re.M
    )
    block = re.search(r"^\[\[links\]\]\n(.*?)^policy = .*?$", text, flags=re.M | re.S)
    assert block is not None
    text = text.replace(block.group(0), "")
    blocks = []
    for i in range(links):
        port = first_port + i * port_step
        one = block.group(0).replace('interface = "eth1"', f'interface = "eth{i + 1}"')
        taps = f"before = {port}, after = {port + 1}"
        if optical_from is not None and i >= optical_from:
            taps = (
                f"before = {{ out = {port}, back = {port + 2} }}, "
                f"after = {{ out = {port + 1}, back = {port + 3} }}"
            )
            one = re.sub(r"^output_prefixes = .*$", "", one, flags=re.M)
        one = re.sub(r"^taps = .*$", f"taps = {{ {taps} }}", one, flags=re.M)
        blocks.append(one)
    path = directory / "config.toml"
    path.write_text(text + "\n" + "\n\n".join(blocks) + "\n")
    return path
