"""The `tofino` target: the P4 program of p4/tofino on a switch, driven over bfrt_grpc.

`TofinoTarget` programs the port → link tables from the deployment config, gathers the data
plane's digests (RTT samples, long-flow starts and ends) and the long-flow table's idle
notifications by link and export interval, and every export interval reads the per-link
registers from the hardware: their differences close the link's interval, which goes out as
`LinkCounters` records (v3: counters, flow events and RTT samples of the interval, assembled
by `p4bs_schemas.intervals.IntervalAssembler` as the model exporter does). Names, field
orders and units are the control-plane contract of p4/tofino/README.md, kept in
tofino_contract.py.

`bfrt_grpc` (the SDE's Python client) is imported only when a target starts; nothing else in
the project needs the SDE.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import math
import os
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from p4bs.bus import RecordProducer
from p4bs.config import Config, ConfigError, LinkConfig, SwitchConfig
from p4bs_exporter.target import ExporterError, ExporterStats, SpecError
from p4bs_exporter.tofino_contract import (
    CMS_EPOCH,
    CMS_EPOCH_BITS,
    CONFIG_TABLE,
    COUNTER_BITS,
    COUNTER_REGISTERS,
    DIRECTION_CODES,
    DST_IS_OUTPUT,
    ENTRY_SCOPE,
    ENTRY_TTL,
    FLOW_DIGEST,
    FLOW_DIGEST_LAYOUT,
    FLOW_FIELDS,
    FLOW_REASONS,
    LONG_FLOW_HIT,
    LONG_FLOW_KEYS,
    LONG_FLOWS,
    LPF_DECAY_TIME_CONSTANT,
    LPF_GAIN_TIME_CONSTANT,
    LPF_INDEX,
    LPF_OUT_SCALE_DOWN,
    LPF_SAMPLE,
    LPF_SPEC_TYPE,
    MAX_LINKS,
    PORT_KEY,
    PORT_TABLE,
    PREFIX_KEY,
    PREFIX_TABLE,
    PROGRAM,
    QDELAY_EWMA,
    QDELAY_EWMA_FIELD,
    QDELAY_EWMA_SHIFT,
    QDELAY_LPF,
    QDELAY_SUM,
    QDELAY_SUM_BITS,
    QDELAY_SUM_HI,
    QDELAY_SUM_LO,
    QDELAY_SUM_LO_BITS,
    REGISTER_INDEX,
    REGISTER_PARAM_VALUE,
    REGISTER_READS,
    REGISTER_SYNC,
    RPC_ALREADY_EXISTS,
    RPC_RESOURCE_EXHAUSTED,
    RPC_UNAVAILABLE,
    RTT_DIGEST,
    RTT_DIGEST_LAYOUT,
    RTT_FIELDS,
    RTT_MIN_INTERVAL,
    RTT_MIN_INTERVAL_UNIT_NS,
    SET_CONFIG,
    SET_LINK,
    SET_LINK_PARAMS,
    TAP_CODES,
    TCP,
)
from p4bs_schemas.codec import RecordError
from p4bs_schemas.intervals import IntervalAssembler

COUNTER_FIELDS = tuple(f for _, fields in COUNTER_REGISTERS for _, f in fields)
COUNTER_WRAP = 1 << COUNTER_BITS
QDELAY_SUM_WRAP = 1 << QDELAY_SUM_BITS
CLOCK_REANCHOR_NS = 60 * 10**9  # a switch clock that jumps (reset, 48-bit wrap): re-anchor
MAX_PROBLEMS = 100
DIGESTS_PER_ROUND = 1000
# The queueing-delay LPF's time constant (see lpf_time_constant_ns). Before a link has counted
# samples, its gap is taken as that of full-size packets at line rate; it is re-tuned when
# an interval's sample rate asks for a constant off by more than LPF_RETUNE_RATIO.
FULL_PACKET_BITS = 1500 * 8
LPF_RETUNE_RATIO = 1.25
# pipe_mgr encodes the constant in clock cycles as a 9-bit mantissa and a 5-bit exponent:
# below 2^32 cycles (2.8 s at 1.5 GHz), and at least one cycle.
LPF_MIN_TIME_CONSTANT_NS = 100.0
LPF_MAX_TIME_CONSTANT_NS = 1e9
# Reconnecting after the notification stream broke: the first attempt at once, then waits
# doubling up to the maximum; the loop checks for stop this often meanwhile.
RECONNECT_FIRST_S, RECONNECT_MAX_S, RECONNECT_POLL_S = 0.5, 5.0, 0.05
STREAM = "link_counters"  # the one stream the target writes (LinkCounters v3)

SDE_HINT = (
    "the tofino target needs the SDE's Python client bfrt_grpc: set PYTHONPATH to "
    "$SDE_INSTALL/lib/python3.X/site-packages/tofino:$SDE_INSTALL/lib/python3.X/site-packages"
    " (3.X = this Python's version; the first holds bfrt_grpc, the second its dependencies)"
)

FlowKey = tuple[int, int, int, int, int]  # link index, src, dst, sport, dport


class DigestError(ValueError):
    """A digest or notification the contract does not allow; the message says what is wrong."""


def import_client() -> tuple[Any, Any]:
    """`bfrt_grpc.client` and `bfrt_grpc.bfruntime_pb2`, or an ExporterError naming the fix."""
    try:
        client = importlib.import_module("bfrt_grpc.client")
        pb2 = importlib.import_module("bfrt_grpc.bfruntime_pb2")
    except ImportError as exc:
        raise ExporterError(f"{SDE_HINT} ({exc})") from exc
    return client, pb2


def tofino_links(config: Config, switch: SwitchConfig) -> list[LinkConfig]:
    """The switch's links in link-index order; SpecError lists whatever the program cannot
    take (at most MAX_LINKS links). The taps' ports were checked when the config was read
    (`p4bs.config`: Tofino port numbers, each used once on its switch)."""
    problems: list[str] = []
    if switch.target != "tofino":
        problems.append(f"switch {switch.name!r}: target is {switch.target!r}, not 'tofino'")
    if not switch.address:
        problems.append(f"switch {switch.name!r}: no address (the bfrt gRPC endpoint)")
    links = [link for link in config.links if link.switch == switch.name]
    if not links:
        problems.append(f"switch {switch.name!r} serves no link")
    if len(links) > MAX_LINKS:
        problems.append(f"switch {switch.name!r}: {len(links)} links, the program has {MAX_LINKS}")
    if problems:
        raise SpecError(problems)
    return links


def lpf_time_constant_ns(sample_gap_ns: float) -> float:
    """The LPF time constant that gives a sample coming `sample_gap_ns` after the previous one
    the weight SPEC §6's EWMA gives every sample, 2^-QDELAY_EWMA_SHIFT.

    In SAMPLE mode the filter moves its output y toward each input x by y += (x - y) · a with
    a = 1 - e^(-dt/tau), dt the time since its previous input: a = 2^-s when
    tau = dt / -ln(1 - 2^-s), i.e. dt / ln(8/7) = 7.49 dt for s = 3. Clamped to what the
    hardware can hold."""
    tau = sample_gap_ns / -math.log1p(-(2.0**-QDELAY_EWMA_SHIFT))
    return min(max(tau, LPF_MIN_TIME_CONSTANT_NS), LPF_MAX_TIME_CONSTANT_NS)


def rpc_codes(error: BaseException, client: Any) -> set[int]:
    """The google.rpc codes of a failed bfrt_grpc call: those of the failed entries of a batch
    (the exception's sub-errors), else the call's own gRPC status (the server unreachable, a
    deadline); empty for an exception that is not a bfrt RPC error."""
    if not isinstance(error, client.BfruntimeRpcException):
        return set()
    codes = {int(e.canonical_code) for _, e in error.sub_errors_get()}
    status = getattr(error, "grpc_error", None)
    if not codes and status is not None:
        value = status.code().value  # grpc.StatusCode: (number, name)
        codes.add(int(value[0] if isinstance(value, tuple) else value))
    return codes


def _as_int(value: Any, what: str) -> int:
    """A digest or register value: an int, big-endian bytes, a dotted quad, or (from_hw) one
    value per pipe, summed."""
    if isinstance(value, bool):
        raise DigestError(f"{what}: {value!r} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big")
    if isinstance(value, str):
        try:
            return int(ipaddress.IPv4Address(value)) if "." in value else int(value, 0)
        except ValueError:
            raise DigestError(f"{what}: {value!r} is not a number") from None
    if isinstance(value, list | tuple):
        return sum(_as_int(v, what) for v in value)
    raise DigestError(f"{what}: {value!r} is not a number")


def _fields(data: Any, expected: tuple[str, ...], what: str) -> dict[str, int]:
    """The digest's fields by name, checked against the contract's layout."""
    try:
        raw = data.to_dict()
    except Exception as exc:
        raise DigestError(f"{what}: unreadable ({exc})") from exc
    if not isinstance(raw, Mapping):
        raise DigestError(f"{what}: not a field map ({type(raw).__name__})")
    names = [k for k in raw if k not in ("action_name", "is_default_entry")]
    missing = [n for n in expected if n not in raw]
    extra = [n for n in names if n not in expected]
    if missing or extra:
        raise DigestError(
            f"{what}: {len(names)} fields, expected {len(expected)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unexpected {', '.join(map(str, extra))}" if extra else "")
        )
    return {n: _as_int(raw[n], f"{what} {n}") for n in expected}


def _check_range(values: Mapping[str, int], layout: tuple[tuple[str, int], ...], what: str) -> None:
    """Every field fits its width in the digest's layout."""
    limits = {name: (1 << bits) - 1 for name, bits in layout}
    for name, value in values.items():
        top = limits.get(name)
        if value < 0 or (top is not None and value > top):
            raise DigestError(f"{what}: {name} = {value} is out of range")


def _dotted(address: int) -> str:
    return str(ipaddress.IPv4Address(address))


class _ClockMap:
    """Maps the switch's 48-bit ns clock to Unix ns: offset = min(host - switch) over the
    digests seen (delivery only adds delay), re-anchored when the switch clock jumps."""

    def __init__(self) -> None:
        self.offset: int | None = None
        self.reanchored = 0

    def to_unix(self, switch_ns: int, host_ns: int) -> int:
        observed = host_ns - switch_ns
        if self.offset is None or observed < self.offset:
            self.offset = observed
        elif observed - self.offset > CLOCK_REANCHOR_NS:
            self.offset = observed
            self.reanchored += 1
        return switch_ns + self.offset


@dataclass
class _LinkState:
    index: int
    link: LinkConfig
    last: dict[str, int] | None = None  # cumulative register values at the last read


class TofinoTarget:
    """One Tofino switch of the deployment config, exported to Kafka (see module doc).

    `client_module`/`pb2_module` replace the lazily imported bfrt_grpc (tests pass a fake).
    `topics` overrides the config's [kafka.topics]; `stats_path`, if given, receives the stats
    JSON every `stats_interval_s` and at the end, like the model target's.
    """

    name = "tofino"

    def __init__(
        self,
        config: Config,
        switch: str | None = None,
        *,
        program: str = PROGRAM,
        client_id: int = 0,
        topics: Mapping[str, str] | None = None,
        stats_path: Path | None = None,
        stats_interval_s: float = 1.0,
        client_module: Any = None,
        pb2_module: Any = None,
    ) -> None:
        chosen = [s for s in config.switches if switch is None or s.name == switch]
        if not chosen:
            known = ", ".join(s.name for s in config.switches) or "none"
            raise ConfigError("--switch", [f"no switch {switch!r} (switches: {known})"])
        self.config = config
        self.switch = chosen[0]
        self.program = program
        self.client_id = client_id
        self.topics = {**config.kafka.topics, **(topics or {})}
        self.stats_path = stats_path
        self.stats_interval_s = stats_interval_s
        self._client_module = client_module
        self._pb2_module = pb2_module
        self.links = [
            _LinkState(i, link) for i, link in enumerate(tofino_links(config, self.switch))
        ]
        self.interval_ns = config.dataplane.export_interval_ns
        self._intervals = IntervalAssembler(
            self.interval_ns, config.dataplane.max_rtt_samples_per_record
        )
        self._lock = threading.Lock()
        self._stats = ExporterStats(target=self.name, pid=os.getpid())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer: RecordProducer | None = None
        self._started = time.monotonic()
        self._clock = _ClockMap()
        self.listed: set[FlowKey] = set()  # flows in Ingress.long_flows
        self._cms_epoch = 0
        self._last_tick_ns = 0
        self._rate_mark = (time.monotonic(), 0, 0)
        self._gc: Any = None
        self._interface: Any = None
        self._info: Any = None
        self._target: Any = None
        self._learn_ids: dict[int, str] = {}
        self._register_keys: dict[str, list[Any]] = {}  # per register, the links' indexes
        self._lpf_tau: dict[int, float] = {}  # per link index, the LPF's time constant, ns
        self._next_reconnect = 0.0
        self._reconnect_delay = RECONNECT_FIRST_S
        self._first_record: float | None = None

    # --- Target interface -------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise ExporterError("already started")
        if self._client_module is None:
            self._client_module, self._pb2_module = import_client()
        self._gc = self._client_module
        try:
            self._connect()
            self._program_tables()
            self._baseline()
        except ExporterError:
            raise
        except Exception as exc:
            self._set(state="failed", last_error=f"{type(exc).__name__}: {exc}")
            raise ExporterError(
                f"tofino {self.switch.name} ({self.switch.address}): {exc}"
            ) from exc
        self._producer = RecordProducer(
            self.config.kafka,
            {STREAM: self.topics[STREAM]},
            client_id=f"p4bs-exporter-{self.switch.name}",
        )
        self._started = time.monotonic()
        self._set(state="running")
        self._thread = threading.Thread(target=self._run, name=f"tofino-{self.switch.name}")
        self._thread.daemon = True
        self._thread.start()

    def stats(self) -> ExporterStats:
        with self._lock:
            stats = ExporterStats.from_json(asdict(self._stats))
        producer = self._producer
        if producer is not None:
            p = producer.stats
            stats.delivered, stats.failed = p.delivered, p.failed
            stats.in_flight = max(0, p.sent - p.delivered - p.failed)
            stats.last_error = p.last_error or stats.last_error
        stats.uptime_s = round(time.monotonic() - self._started, 3)
        return stats

    def wait(self, timeout_s: float) -> bool:
        """True once the loop has ended (it failed, or it was stopped)."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> ExporterStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        failed = self.stats().state == "failed"
        if self._producer is not None:
            # The loop has ended: what is left of the open intervals goes out, counts 0 (the
            # registers of a partial interval are not read).
            for record in self._intervals.close_all():
                self._produce(record)
            self._set(state="flushing")
            remaining = self._producer.flush(timeout_s)
            self._set(undelivered_at_exit=remaining)
        if self._first_record is not None:
            self._set(active_s=round(time.monotonic() - self._first_record, 3))
        self._close_interface()
        self._set(state="failed" if failed else "done")
        final = self.stats()
        self._write_stats(final)
        return final

    # --- setup ------------------------------------------------------------------------

    def _connect(self) -> None:
        gc = self._gc
        notifications = gc.Notifications(
            enable_learn=True, enable_idletimeout=True, enable_port_status_change=False
        )
        self._interface = gc.ClientInterface(
            self.switch.address, self.client_id, self.switch.device_id, notifications=notifications
        )
        self._interface.bind_pipeline_config(self.program)
        self._info = self._interface.bfrt_info_get(self.program)
        self._target = gc.Target(device_id=self.switch.device_id, pipe_id=0xFFFF)
        self._register_keys = {}
        for learn_name in (RTT_DIGEST, FLOW_DIGEST):
            learn = self._info.learn_get(learn_name)
            self._learn_ids[int(learn.info.id_get())] = learn_name

    def _close_interface(self) -> None:
        interface, self._interface = self._interface, None
        if interface is not None and hasattr(interface, "tear_down_stream"):
            try:
                interface.tear_down_stream()
            except Exception as exc:  # the stream may be gone already
                self._problem(f"tear_down_stream: {exc}")

    def _table(self, name: str) -> Any:
        return self._info.table_get(name)

    def _program_tables(self) -> None:
        gc, target = self._gc, self._target
        ports, prefixes = self._table(PORT_TABLE), self._table(PREFIX_TABLE)
        flows = self._table(LONG_FLOWS)
        for table in (ports, prefixes, flows):
            table.entry_del(target)  # start from what the config says, nothing stale
        self._set_entry_scope()
        keys, data = [], []
        prefix_keys, prefix_data = [], []
        for state in self.links:
            link = state.link
            for side, port, direction in link.ports():
                keys.append(ports.make_key([gc.KeyTuple(PORT_KEY, port)]))
                values = (state.index, TAP_CODES[side], DIRECTION_CODES[direction])
                params = zip(SET_LINK_PARAMS, values, strict=True)
                data.append(ports.make_data([gc.DataTuple(n, v) for n, v in params], SET_LINK))
                # Only a port carrying both directions asks the prefixes (`p4bs config
                # check` makes sure such a link has some).
                for net in link.output_prefixes if direction == "both" else ():
                    prefix = ipaddress.IPv4Network(net, strict=False)
                    prefix_keys.append(
                        prefixes.make_key(
                            [
                                gc.KeyTuple(PORT_KEY, port),
                                gc.KeyTuple(
                                    PREFIX_KEY,
                                    int(prefix.network_address),
                                    prefix_len=prefix.prefixlen,
                                ),
                            ]
                        )
                    )
                    prefix_data.append(prefixes.make_data([], DST_IS_OUTPUT))
        ports.entry_add(target, keys, data)
        prefixes.entry_add(target, prefix_keys, prefix_data)

        dp = self.config.dataplane
        ttl_ms = self._ttl_ms()
        query_ms = max(1, math.ceil(self.interval_ns / 1_000_000))
        flows.attribute_idle_time_set(
            target,
            True,
            self._pb2_module.IdleTable.IDLE_TABLE_NOTIFY_MODE,
            query_ms,
            ttl_ms,
            ttl_ms,
        )
        rtt_param = self._table(RTT_MIN_INTERVAL)
        units = math.ceil(dp.rtt_min_interval_ns / RTT_MIN_INTERVAL_UNIT_NS)
        value = gc.DataTuple(REGISTER_PARAM_VALUE, units)
        rtt_param.default_entry_set(target, rtt_param.make_data([value]))
        self._set_cms_epoch()
        self._program_lpf(
            {
                s.index: lpf_time_constant_ns(FULL_PACKET_BITS * 1e9 / max(1, s.link.capacity_bps))
                for s in self.links
            }
        )

    def _set_entry_scope(self) -> None:
        """The tables the exporter adds entries to hold them in all pipes: the program's
        default, set again because a scope an earlier session changed outlives it. A
        table's scope can only change while it is empty, so this follows the clears. A
        refusal is reported, not fatal: the default scope is this one, and an entry the
        scope really refuses fails its own add."""
        for name in (PORT_TABLE, PREFIX_TABLE, LONG_FLOWS):
            table = self._table(name)
            if ENTRY_SCOPE not in table.info.attributes_supported_get():
                continue
            try:
                table.attribute_entry_scope_set(
                    self._target,
                    predefined_pipe_scope=True,
                    predefined_pipe_scope_val=self._pb2_module.Mode.ALL,
                )
            except Exception as exc:
                self._problem(f"{name}: entry scope not set: {type(exc).__name__}: {exc}")

    def _program_lpf(self, taus: Mapping[int, float]) -> None:
        """Sets the queueing-delay filter of each link index to SAMPLE mode with the time
        constant given (ns, see lpf_time_constant_ns), in one write; the output unscaled."""
        gc, table = self._gc, self._table(QDELAY_LPF)
        keys, data = [], []
        for index, tau in sorted(taus.items()):
            keys.append(table.make_key([gc.KeyTuple(LPF_INDEX, index)]))
            spec = [
                gc.DataTuple(LPF_SPEC_TYPE, str_val=LPF_SAMPLE),
                gc.DataTuple(LPF_GAIN_TIME_CONSTANT, float_val=float(tau)),
                gc.DataTuple(LPF_DECAY_TIME_CONSTANT, float_val=float(tau)),
                gc.DataTuple(LPF_OUT_SCALE_DOWN, 0),
            ]
            data.append(table.make_data(spec))
        table.entry_add(self._target, keys, data)
        self._lpf_tau.update(taus)

    def _retune_lpf(self, samples: Mapping[int, int], interval_ns: int) -> None:
        """Follows each link's sample rate: a link whose samples of the last interval ask for
        a time constant off by more than LPF_RETUNE_RATIO from its filter's gets it (one
        write for all of them). A link without samples keeps its constant."""
        changed = {}
        for index, count in samples.items():
            if count > 0 and interval_ns > 0:
                tau = lpf_time_constant_ns(interval_ns / count)
                now = self._lpf_tau.get(index)
                if now is None or abs(math.log(tau / now)) > math.log(LPF_RETUNE_RATIO):
                    changed[index] = tau
        if changed:
            try:
                self._program_lpf(changed)
            except Exception as exc:  # kept as they were; the next interval tries again
                self._problem(f"{QDELAY_LPF} re-tune: {type(exc).__name__}: {exc}")

    def _ttl_ms(self) -> int:
        return max(1, math.ceil(self.config.dataplane.long_flow_ttl_ns / 1_000_000))

    def _set_cms_epoch(self) -> None:
        table = self._table(CONFIG_TABLE)
        data = table.make_data([self._gc.DataTuple(CMS_EPOCH, self._cms_epoch)], SET_CONFIG)
        table.default_entry_set(self._target, data)

    def _baseline(self) -> None:
        values = self._read_registers()
        for state in self.links:
            state.last = values[state.index]
        self._last_tick_ns = self._tick_floor(time.time_ns())

    # --- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        next_stats = time.monotonic()
        cms_reset_s = self.config.dataplane.cms_reset_ns / 1e9
        next_epoch = time.monotonic() + cms_reset_s
        try:
            while not self._stop.is_set():
                if self._interface is not None and (failure := self._stream_failure()):
                    self._lose_stream(failure)
                if self._interface is None:
                    self._try_reconnect()
                if self._interface is not None:
                    self._poll_digests()
                    self._poll_idle()
                    now = time.time_ns()
                    tick = self._tick_floor(now)
                    if tick > self._last_tick_ns:
                        self._export(tick)
                    if time.monotonic() >= next_epoch:
                        self._cms_epoch = (self._cms_epoch + 1) % (1 << CMS_EPOCH_BITS)
                        self._set_cms_epoch()
                        next_epoch = max(next_epoch + cms_reset_s, time.monotonic())
                else:  # out of reach: paced until the next attempt, stop wakes it at once
                    self._stop.wait(RECONNECT_POLL_S)
                assert self._producer is not None
                self._producer.flush(0)  # serves delivery reports
                if time.monotonic() >= next_stats:
                    self._update_rates()
                    self._write_stats(self.stats())
                    next_stats = time.monotonic() + self.stats_interval_s
        except Exception as exc:
            self._set(state="failed", last_error=f"{type(exc).__name__}: {exc}")
            self._problem(f"loop stopped: {type(exc).__name__}: {exc}")

    def _tick_floor(self, now_ns: int) -> int:
        return now_ns - now_ns % self.interval_ns

    # --- the notification stream, and reconnecting ------------------------------------

    def _stream_failure(self) -> str | None:
        """Why the notification stream is gone, or None while it lives. When the stream
        fails (bf_switchd restarted or is gone) the client's receiver thread puts the gRPC
        error into `exception_q` and ends, and digest_get / idletime_notification_get go on
        timing out exactly as when the switch is idle: only these two tell."""
        errors = getattr(self._interface, "exception_q", None)
        if errors is not None:
            try:
                error = errors.get_nowait()
            except queue.Empty:
                pass
            else:
                return f"{type(error).__name__}: {error}".strip()
        receiver = getattr(self._interface, "stream_recv_thread", None)
        if receiver is not None and not receiver.is_alive():
            return "the stream's receiver thread has ended"
        return None

    def _lose_stream(self, reason: str) -> None:
        """Stops reading a switch whose stream is gone. Its long-flow table is lost or about
        to be cleared, so the flows listed end now (`idle_timeout`, packets 0) and start
        again when the data plane reports them; `_try_reconnect` follows."""
        self._count_pipeline("stream_errors")
        self._problem(f"notification stream lost ({reason}); reconnecting")
        self._set(state="reconnecting", last_error=f"bfrt notification stream lost: {reason}")
        self._close_interface()
        now = time.time_ns()
        for key in sorted(self.listed):
            self._add_event(self.links[key[0]], key, "end", "idle_timeout", 0, now)
        self.listed.clear()
        self._next_reconnect = time.monotonic()
        self._reconnect_delay = RECONNECT_FIRST_S

    def _try_reconnect(self) -> None:
        """Connects, programs the tables as at start and takes new register baselines (a
        restarted switch counts from 0 again, so the counts of the outage are lost; the first
        record after it covers the time since the new baseline). A failure waits longer
        before the next attempt, up to RECONNECT_MAX_S."""
        if time.monotonic() < self._next_reconnect:
            return
        try:
            self._connect()
            self._program_tables()
            self._baseline()
        except Exception as exc:
            self._close_interface()
            self._problem(f"reconnect to {self.switch.address} failed: {type(exc).__name__}: {exc}")
            self._next_reconnect = time.monotonic() + self._reconnect_delay
            self._reconnect_delay = min(2 * self._reconnect_delay, RECONNECT_MAX_S)
            return
        self._count_pipeline("reconnects")
        self._set(state="running")

    def _poll_digests(self) -> None:
        timeout = min(0.01, self.interval_ns / 4e9)
        for _ in range(DIGESTS_PER_ROUND):
            try:
                digest = self._interface.digest_get(timeout)
            except RuntimeError:  # bfrt_grpc's "nothing within the timeout"
                return
            timeout = 0.001
            self._count("frames")
            try:
                self._handle_digest(digest)
            except DigestError as exc:
                self._malformed(str(exc))

    def _poll_idle(self) -> None:
        for _ in range(DIGESTS_PER_ROUND):
            try:
                notification = self._interface.idletime_notification_get(0.001)
            except RuntimeError:
                return
            try:
                self._handle_idle(notification)
            except DigestError as exc:
                self._malformed(str(exc))

    def _handle_digest(self, digest: Any) -> None:
        try:
            digest_id = int(digest.digest_id)
        except (AttributeError, TypeError, ValueError) as exc:
            raise DigestError(f"digest without a usable digest_id ({exc})") from None
        name = self._learn_ids.get(digest_id)
        if name is None:
            raise DigestError(f"digest id {digest_id} is neither {RTT_DIGEST} nor {FLOW_DIGEST}")
        try:
            entries = list(self._info.learn_get(name).make_data_list(digest))
        except Exception as exc:
            raise DigestError(f"{name}: undecodable ({exc})") from exc
        for i, data in enumerate(entries):
            what = f"{name}[{i}]"
            try:
                if name == RTT_DIGEST:
                    self._rtt(_fields(data, RTT_FIELDS, what), what)
                else:
                    self._flow(_fields(data, FLOW_FIELDS, what), what)
            except DigestError as exc:  # the rest of the list is still good
                self._malformed(str(exc))

    def _link(self, index: int, what: str) -> _LinkState:
        if not 0 <= index < len(self.links):
            raise DigestError(f"{what}: unknown link index {index} ({len(self.links)} links)")
        return self.links[index]

    def _rtt(self, v: dict[str, int], what: str) -> None:
        _check_range(v, RTT_DIGEST_LAYOUT, what)
        state = self._link(v["link"], what)
        max_age = self.config.dataplane.rtt_max_age_ns
        if not 0 < v["rtt"] <= max_age:
            raise DigestError(f"{what}: rtt {v['rtt']} ns is outside (0, {max_age}]")
        sample = {
            "ts_ns": self._clock.to_unix(v["ts"], time.time_ns()),
            "src_ip": _dotted(v["src_addr"]),
            "dst_ip": _dotted(v["dst_addr"]),
            "src_port": v["src_port"],
            "dst_port": v["dst_port"],
            "protocol": TCP,
            "rtt_ns": v["rtt"],
        }
        for part in self._intervals.add_sample(state.link.id, sample):
            self._produce(part)

    def _flow(self, v: dict[str, int], what: str) -> None:
        _check_range(v, FLOW_DIGEST_LAYOUT, what)
        state = self._link(v["link"], what)
        if v["event"] not in FLOW_REASONS:
            raise DigestError(
                f"{what}: event {v['event']} is not one of {min(FLOW_REASONS)}..{max(FLOW_REASONS)}"
            )
        kind, reason = FLOW_REASONS[v["event"]]
        key: FlowKey = (state.index, v["src_addr"], v["dst_addr"], v["src_port"], v["dst_port"])
        packets = min(v["count0"], v["count1"], v["count2"], v["count3"])
        if kind == "start":
            if key in self.listed:
                self._count_pipeline("repeated_start_digests")
                return
            if not self._insert(key):
                return
        else:
            if key not in self.listed:
                self._count_pipeline("end_digests_unlisted")
                return
            self._delete(key)
        ts = self._clock.to_unix(v["ts"], time.time_ns())
        self._add_event(state, key, kind, reason, packets, ts)

    def _add_event(
        self, state: _LinkState, key: FlowKey, kind: str, reason: str, packets: int, ts: int
    ) -> None:
        """A long flow's start or end, into its link's interval (it goes out with the
        interval's counters)."""
        event = {
            "ts_ns": ts,
            "kind": kind,
            "reason": reason,
            "src_ip": _dotted(key[1]),
            "dst_ip": _dotted(key[2]),
            "src_port": key[3],
            "dst_port": key[4],
            "protocol": TCP,
            "packets": packets,
        }
        self._intervals.add_event(state.link.id, event)

    def _flow_key(self, table: Any, key: FlowKey) -> Any:
        return table.make_key(
            [
                self._gc.KeyTuple(name, value)
                for name, value in zip(LONG_FLOW_KEYS, key, strict=True)
            ]
        )

    def _insert(self, key: FlowKey) -> bool:
        """Lists the flow; False if the table had no room or refused it, sorted by the
        server's error code. A transient refusal (table locked, device not ready, in use) is
        counted and dropped, not retried here: while the flow is unlisted the data plane sends
        its start digest again (at most every LF_REPORT_GAP_NS, 10 ms), and that is the retry
        — it costs the loop no wait and ends by itself when the flow does."""
        table = self._table(LONG_FLOWS)
        data = table.make_data([self._gc.DataTuple(ENTRY_TTL, self._ttl_ms())], LONG_FLOW_HIT)
        try:
            table.entry_add(self._target, [self._flow_key(table, key)], [data])
        except Exception as exc:
            codes = rpc_codes(exc, self._gc)
            if codes == {RPC_ALREADY_EXISTS}:  # inserted already (a race with ourselves)
                self.listed.add(key)
                self._count_pipeline("long_flow_already_listed")
            elif RPC_RESOURCE_EXHAUSTED in codes:
                self._count_pipeline("long_flow_table_full")
            elif RPC_UNAVAILABLE in codes:
                self._count_pipeline("long_flow_insert_transient")
            else:
                self._count_pipeline("long_flow_insert_failed")
                self._problem(f"{LONG_FLOWS} insert {key}: {type(exc).__name__}: {exc}")
            return False
        self.listed.add(key)
        return True

    def _delete(self, key: FlowKey) -> None:
        self.listed.discard(key)
        table = self._table(LONG_FLOWS)
        try:
            table.entry_del(self._target, [self._flow_key(table, key)])
        except Exception as exc:  # gone already (aged out and deleted twice): harmless
            self._problem(f"{LONG_FLOWS} delete {key}: {exc}")

    def _handle_idle(self, notification: Any) -> None:
        self._count("frames")
        try:
            raw = self._info.key_from_idletime_notification(notification).to_dict()
        except Exception as exc:
            raise DigestError(f"idle notification: undecodable ({exc})") from exc
        what = "idle notification"
        try:
            values = [
                _as_int(raw[n]["value"] if isinstance(raw[n], Mapping) else raw[n], f"{what} {n}")
                for n in LONG_FLOW_KEYS
            ]
        except KeyError as exc:
            raise DigestError(f"{what}: key field {exc} missing") from None
        key: FlowKey = (values[0], values[1], values[2], values[3], values[4])
        state = self._link(key[0], what)
        if key not in self.listed:
            self._count_pipeline("idle_notifications_unlisted")
            return
        self._delete(key)
        self._add_event(state, key, "end", "idle_timeout", 0, time.time_ns())

    # --- counters ---------------------------------------------------------------------

    def _read_registers(self) -> dict[int, dict[str, int]]:
        """Cumulative values per link index: 32-bit counters summed over pipes (mod 2^32),
        the 64-bit queueing-delay sum, and the EWMA (a gauge, the largest pipe's)."""
        out: dict[int, dict[str, int]] = {s.index: {} for s in self.links}
        for register, fields in COUNTER_REGISTERS:
            for index, data in self._read_register(register):
                for field, name in fields:
                    out[index][name] = _as_int(data[f"{register}.{field}"], name) % COUNTER_WRAP
        for index, data in self._read_register(QDELAY_SUM):
            lo = _per_pipe(data[f"{QDELAY_SUM}.{QDELAY_SUM_LO}"])
            hi = _per_pipe(data[f"{QDELAY_SUM}.{QDELAY_SUM_HI}"])
            total = sum((h << QDELAY_SUM_LO_BITS) + low for h, low in zip(hi, lo, strict=True))
            out[index]["queue_delay_sum_ns"] = total % QDELAY_SUM_WRAP
        for index, data in self._read_register(QDELAY_EWMA):
            out[index]["queue_delay_ewma_ns"] = max(
                _per_pipe(data[f"{QDELAY_EWMA}.{QDELAY_EWMA_FIELD}"])
            )
        return out

    def _read_register(self, register: str) -> Iterable[tuple[int, Mapping[str, Any]]]:
        """The links' cells of one register: a Sync copies the whole table from the hardware
        at once (one DMA per pipe), then one read takes the links' cells from that copy
        (from_hw False) — instead of one hardware read per index and pipe."""
        table = self._table(register)
        keys = self._register_keys.get(register)
        if keys is None:
            index_key = self._gc.KeyTuple
            keys = [table.make_key([index_key(REGISTER_INDEX, s.index)]) for s in self.links]
            self._register_keys[register] = keys
        wanted = {s.index for s in self.links}
        seen = set()
        self._count_pipeline(REGISTER_READS)
        table.operations_execute(self._target, REGISTER_SYNC)
        for data, key, *_ in table.entry_get(self._target, keys, {"from_hw": False}):
            index = _as_int(key.to_dict()[REGISTER_INDEX]["value"], REGISTER_INDEX)
            if index in wanted:
                seen.add(index)
                yield index, data.to_dict()
        if seen != wanted:
            raise ExporterError(f"{register}: no value for index {sorted(wanted - seen)}")

    def _export(self, tick_ns: int) -> None:
        try:
            values = self._read_registers()
        except Exception as exc:  # next tick's record covers this interval too
            self._problem(f"register read at {tick_ns}: {type(exc).__name__}: {exc}")
            return
        interval = tick_ns - self._last_tick_ns
        samples: dict[int, int] = {}
        for state in self.links:
            now, last = values[state.index], state.last or values[state.index]
            counts = {name: (now[name] - last[name]) % COUNTER_WRAP for name in COUNTER_FIELDS}
            counts["queue_delay_sum_ns"] = (
                now["queue_delay_sum_ns"] - last["queue_delay_sum_ns"]
            ) % QDELAY_SUM_WRAP
            counts["queue_delay_ewma_ns"] = now["queue_delay_ewma_ns"]
            state.last = now
            for record in self._intervals.close(state.link.id, tick_ns, interval, counts):
                self._produce(record)
            samples[state.index] = counts["queue_delay_samples"]
        self._last_tick_ns = tick_ns
        self._retune_lpf(samples, interval)

    # --- stats ------------------------------------------------------------------------

    def _produce(self, record: dict[str, Any]) -> None:
        assert self._producer is not None
        try:
            self._producer.produce(STREAM, record)
        except RecordError as exc:
            with self._lock:
                self._stats.invalid += 1
            self._problem(f"{STREAM}: record refused by its schema: {exc}")
            return
        with self._lock:
            s = self._stats
            s.produced[STREAM] = s.produced.get(STREAM, 0) + 1
            s.produced_total += 1
            s.rtt_samples_produced += len(record["rtt_ns"])
        if self._first_record is None:
            self._first_record = time.monotonic()

    def _set(self, **values: Any) -> None:
        with self._lock:
            for name, value in values.items():
                setattr(self._stats, name, value)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + 1)

    def _count_pipeline(self, name: str) -> None:
        with self._lock:
            self._stats.pipeline[name] = self._stats.pipeline.get(name, 0) + 1

    def _problem(self, text: str) -> None:
        with self._lock:
            self._stats.problems = [*self._stats.problems[-MAX_PROBLEMS + 1 :], text]

    def _malformed(self, reason: str) -> None:
        self._count_pipeline("malformed_digests")
        self._problem(reason)

    def _update_rates(self) -> None:
        now = time.monotonic()
        producer = self._producer
        delivered = producer.stats.delivered if producer is not None else 0
        with self._lock:
            produced = self._stats.produced_total
            then, produced_then, delivered_then = self._rate_mark
            if now > then:
                self._stats.records_per_s = round((produced - produced_then) / (now - then), 3)
                self._stats.delivered_per_s = round((delivered - delivered_then) / (now - then), 3)
            self._rate_mark = (now, produced, delivered)

    def _write_stats(self, stats: ExporterStats) -> None:
        if self.stats_path is None:
            return
        self.stats_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(stats), indent=2) + "\n")
        tmp.replace(self.stats_path)


def _per_pipe(value: Any) -> list[int]:
    values = value if isinstance(value, list | tuple) else [value]
    return [_as_int(v, "register") for v in values]
