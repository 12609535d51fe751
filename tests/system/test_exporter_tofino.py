"""The tofino exporter target against a fake bfrt_grpc (same calls, in memory) and the real
broker: tables programmed from the config, digests and idle notifications into records,
register differences (with wrap-around) into LinkCounters, bad digests counted, not fatal."""

from __future__ import annotations

import ipaddress
import queue
import re
import sys
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p4bs import paths
from p4bs.bus import Received, RecordConsumer
from p4bs.config import Config, load_config
from p4bs_exporter.target import ExporterError
from p4bs_exporter.tofino import TofinoTarget
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_schemas.rtt_batch import samples_of

RTT_ID, FLOW_ID = 101, 202
LINK0, LINK1 = "r1:eth1", "r1:eth2"


# --- a fake bfrt_grpc.client ---------------------------------------------------------


class KeyTuple:
    def __init__(self, name: str, value: Any = None, mask: Any = None, prefix_len: Any = None):
        self.name, self.value, self.mask, self.prefix_len = name, value, mask, prefix_len


class DataTuple:
    def __init__(self, name: str, val: Any = None):
        self.name, self.val = name, val


class Key:
    def __init__(self, fields: list[KeyTuple]):
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
    def __init__(self, fields: dict[str, Any], action_name: str | None = None):
        self.fields, self.action_name = fields, action_name

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, "action_name": self.action_name, "is_default_entry": False}


class Table:
    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[tuple[Any, ...], tuple[Key, Data]] = {}
        self.calls: list[tuple[str, Any]] = []
        self.full = False

    def make_key(self, fields: list[KeyTuple]) -> Key:
        return Key(fields)

    def make_data(self, fields: list[DataTuple], action_name: str | None = None) -> Data:
        return Data({f.name: f.val for f in fields}, action_name)

    def entry_add(self, target: Any, keys: list[Key], datas: list[Data]) -> None:
        self.calls.append(("add", [k.ident() for k in keys]))
        for key, data in zip(keys, datas, strict=True):
            if key.ident() in self.entries:
                raise RuntimeError("Error: ALREADY_EXISTS")
            if self.full:
                raise RuntimeError("Error: table full, no space")
            self.entries[key.ident()] = (key, data)

    def entry_del(self, target: Any, keys: list[Key] | None = None) -> None:
        self.calls.append(("del", None if keys is None else [k.ident() for k in keys]))
        if keys is None:
            self.entries.clear()
        for key in keys or []:
            self.entries.pop(key.ident(), None)

    def default_entry_set(self, target: Any, data: Data) -> None:
        self.calls.append(("default", data.to_dict()))

    def attribute_idle_time_set(self, target: Any, *args: Any) -> None:
        self.calls.append(("idle", args))


class Register(Table):
    """Register values scripted per read: read n returns script[min(n, last)]; each is
    {index: {field: [per-pipe values]}}."""

    def __init__(self, name: str, script: list[dict[int, dict[str, list[int]]]]) -> None:
        super().__init__(name)
        self.script = script
        self.reads: list[Any] = []

    def entry_get(self, target: Any, keys: list[Key], flags: dict[str, bool]) -> Iterator[Any]:
        self.reads.append(flags)
        values = self.script[min(len(self.reads) - 1, len(self.script) - 1)]
        for key in keys:
            index = key.fields["$REGISTER_INDEX"].value
            fields = values.get(index, {})
            yield Data({f"{self.name}.{n}": v for n, v in fields.items()}), key


class Learn:
    def __init__(self, ident: int) -> None:
        self.info = types.SimpleNamespace(id_get=lambda: ident)

    def make_data_list(self, digest: Any) -> list[Data]:
        return [Data(dict(entry)) for entry in digest.entries]


class Switch:
    """What a ClientInterface connects to: tables, learn objects, notification queues."""

    def __init__(self, registers: dict[str, Register]) -> None:
        names = ("port_to_link", "output_prefixes", "long_flows", "config", "rtt_min_interval")
        self.tables: dict[str, Table] = {f"Ingress.{n}": Table(f"Ingress.{n}") for n in names}
        self.tables.update(registers)
        self.learns = {
            "IngressDeparser.rtt_digest": Learn(RTT_ID),
            "IngressDeparser.flow_digest": Learn(FLOW_ID),
        }
        self.digests: queue.Queue[Any] = queue.Queue()
        self.idle: queue.Queue[Any] = queue.Queue()
        self.connected: list[tuple[Any, ...]] = []

    def digest(self, ident: int, *entries: dict[str, Any]) -> None:
        self.digests.put(types.SimpleNamespace(digest_id=ident, entries=entries))


class Info:
    def __init__(self, switch: Switch) -> None:
        self.switch = switch

    def table_get(self, name: str) -> Table:
        return self.switch.tables[name]

    def learn_get(self, name: str) -> Learn:
        return self.switch.learns[name]

    def key_from_idletime_notification(self, notification: Any) -> Key:
        key: Key = notification.key
        return key


def fake_modules(switch: Switch) -> dict[str, types.ModuleType]:
    class ClientInterface:
        def __init__(self, grpc_addr: str, client_id: int, device_id: int, **kw: Any):
            switch.connected.append((grpc_addr, client_id, device_id))

        def bind_pipeline_config(self, program: str) -> None:
            switch.connected.append(("bind", program))

        def bfrt_info_get(self, program: str) -> Info:
            return Info(switch)

        def digest_get(self, timeout: float = 1) -> Any:
            try:
                return switch.digests.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("Digest list not received.") from None

        def idletime_notification_get(self, timeout: float = 1) -> Any:
            try:
                return switch.idle.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("Idletime notification not received") from None

    client = types.ModuleType("bfrt_grpc.client")
    pb2 = types.ModuleType("bfrt_grpc.bfruntime_pb2")
    package = types.ModuleType("bfrt_grpc")
    client.ClientInterface = ClientInterface  # type: ignore[attr-defined]
    client.KeyTuple = KeyTuple  # type: ignore[attr-defined]
    client.DataTuple = DataTuple  # type: ignore[attr-defined]
    client.Target = lambda device_id=0, pipe_id=0xFFFF: (device_id, pipe_id)  # type: ignore[attr-defined]
    client.Notifications = lambda **kw: kw  # type: ignore[attr-defined]
    pb2.IdleTable = types.SimpleNamespace(IDLE_TABLE_NOTIFY_MODE=1)  # type: ignore[attr-defined]
    package.client, package.bfruntime_pb2 = client, pb2  # type: ignore[attr-defined]
    return {"bfrt_grpc": package, "bfrt_grpc.client": client, "bfrt_grpc.bfruntime_pb2": pb2}


# --- fixtures ------------------------------------------------------------------------

W = 2**32


def counters(packets: list[int], sum_lo: int = 0, sum_hi: int = 0) -> dict[str, Register]:
    """Registers whose link 0 `packets` follows `packets` (two pipes: the value and 3),
    link 1 stays at 0."""
    traffic = [{0: {"packets": [p, 3], "bytes": [p * 100, 0]}} for p in packets]
    # What left the router: its own counts, wrapping too (deltas 30, 40, 880, then 0).
    carried = [W - 50, W - 20, 20, 900][: len(packets)]
    after = [{0: {"packets": [a, 0], "bytes": [a * 80 % W, 0]}} for a in carried]
    qsum = [{0: {"sum_lo": [sum_lo], "sum_hi": [sum_hi]}}, {0: {"sum_lo": [5], "sum_hi": [1]}}]
    regs = {
        "Egress.link_traffic": Register("Egress.link_traffic", traffic),
        "Egress.link_after": Register("Egress.link_after", after),
        "Egress.link_data": Register("Egress.link_data", [{}]),
        "Egress.link_retx": Register("Egress.link_retx", [{}]),
        "Egress.link_qdelay_samples": Register("Egress.link_qdelay_samples", [{}]),
        "Egress.link_qdelay_sum": Register("Egress.link_qdelay_sum", qsum),
        "Egress.link_qdelay_ewma": Register("Egress.link_qdelay_ewma", [{0: {"f1": [0, 700]}}]),
    }
    for reg in regs.values():  # every index answers, zero unless scripted
        for snap in reg.script:
            for index in (0, 1):
                snap.setdefault(index, {})
                for f in ("packets", "bytes", "f1", "sum_lo", "sum_hi"):
                    snap[index].setdefault(f, [0])
    return regs


def write_config(directory: Path, bootstrap: str, topics: dict[str, str]) -> Path:
    """The example config on a Tofino: link r1:eth1 on ports 4/5 (both directions each) with
    its prefix, and r1:eth2 on an optical tap's per-direction ports (before: 8 out, 10 back;
    after: 9 out, 11 back) without any."""
    text = (paths.default_config()).read_text()
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    text = re.sub(
        r"^bootstrap = .*$", f'bootstrap = "{bootstrap}"\ntopics = {{ {table} }}', text, flags=re.M
    )
    text = text.replace('target = "model"', 'target = "tofino"\naddress = "127.0.0.1:50052"')
    text = text.replace('switch = "model0"', 'switch = "tof0"').replace('"model0"', '"tof0"')
    text = re.sub(r"^taps = .*$", "taps = { before = 4, after = 5 }", text, flags=re.M)
    text = re.sub(r"^export_interval = .*$", 'export_interval = "50ms"', text, flags=re.M)
    block = re.search(r"^\[\[links\]\]\n(.*?)^policy = .*?$", text, flags=re.M | re.S)
    assert block is not None
    second = block.group(0).replace('interface = "eth1"', 'interface = "eth2"')
    second = second.replace(
        "before = 4, after = 5",
        "before = { out = 8, back = 10 }, after = { out = 9, back = 11 }",
    )
    second = re.sub(r"^output_prefixes = .*$", "", second, flags=re.M)
    path = directory / "config.toml"
    path.write_text(text + "\n" + second + "\n")
    return path


@pytest.fixture
def config(stack: Stack, topics: dict[str, str], tmp_path: Path) -> Config:
    return load_config(write_config(tmp_path, stack.kafka.bootstrap, topics))


class Run:
    def __init__(self, config: Config, topics: dict[str, str], switch: Switch, tmp: Path):
        self.switch = switch
        self.target = TofinoTarget(config, topics=topics, stats_path=tmp / "stats.json")
        self.consumer = RecordConsumer(
            config.kafka.bootstrap,
            f"test-{uuid.uuid4().hex[:8]}",
            ["rtt_samples", "flow_events", "link_counters"],
            topics,
        )
        self.received: list[Received] = []

    def records(self, stream: str) -> list[Received]:
        """What arrived so far (counters stream on, so read for a bounded time)."""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and (got := self.consumer.poll(0.1)) is not None:
            self.received.append(got)
        return [r for r in self.received if r.stream == stream]

    def wait_records(self, stream: str, n: int, timeout_s: float = 90) -> list[Received]:
        assert wait_until(lambda: len(self.records(stream)) >= n, timeout_s), (
            f"{stream}: {len(self.records(stream))} of {n}; stats {self.target.stats()}"
        )
        return self.records(stream)


@pytest.fixture
def run(
    config: Config, topics: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Run]:
    switch = Switch(counters([W - 100, W - 10, 40, 1040], sum_lo=W - 5))
    for name, module in fake_modules(switch).items():
        monkeypatch.setitem(sys.modules, name, module)
    r = Run(config, topics, switch, tmp_path)
    r.target.start()
    yield r
    r.target.stop(30)
    r.consumer.close()


def ip(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def rtt(link: int = 0, rtt_ns: int = 20_000_000, ts: int = 5_000_000_000) -> dict[str, Any]:
    return {
        "link": link,
        "ts": ts,
        "src_addr": ip("10.201.1.10"),
        "dst_addr": ip("10.201.2.2"),
        "src_port": 40000,
        "dst_port": 5201,
        "rtt": rtt_ns,
    }


def flow(event: int, link: int = 0, count: int = 2000) -> dict[str, Any]:
    return {
        "link": link,
        "event": event,
        "ts": 6_000_000_000,
        "src_addr": ip("10.201.1.11"),
        "dst_addr": ip("10.201.2.2"),
        "src_port": 40001,
        "dst_port": 5201,
        **{f"count{i}": count + i for i in range(4)},
    }


# --- tests ---------------------------------------------------------------------------


def test_tables_programmed_from_config(run: Run) -> None:
    assert run.switch.connected[:2] == [("127.0.0.1:50052", 0, 0), ("bind", "p4bs")]
    ports = run.switch.tables["Ingress.port_to_link"]
    got = {k[0][1]: d.to_dict() for k, d in ports.entries.values() for k in [k.ident()]}
    assert {p: (d["link"], d["tap"], d["direction"]) for p, d in got.items()} == {
        4: (0, 0, 2),  # (link index, TAP_BEFORE, DIR_BOTH)
        5: (0, 1, 2),
        8: (1, 0, 0),  # DIR_OUT
        10: (1, 0, 1),  # DIR_BACK
        9: (1, 1, 0),
        11: (1, 1, 1),
    }
    assert all(d["action_name"] == "Ingress.set_link" for d in got.values())
    prefixes = run.switch.tables["Ingress.output_prefixes"]
    assert sorted(k for k in prefixes.entries) == sorted(
        [
            (("hdr.ipv4.dst_addr", ip("10.201.2.0"), 24), ("ig_intr_md.ingress_port", 4, None)),
            (("hdr.ipv4.dst_addr", ip("10.201.2.0"), 24), ("ig_intr_md.ingress_port", 5, None)),
        ]
    )
    idle = [c for c in run.switch.tables["Ingress.long_flows"].calls if c[0] == "idle"]
    assert idle == [("idle", (True, 1, 50, 2000, 2000))]  # notify mode, 50 ms, TTL 2 s


def test_rtt_digest_becomes_rtt_sample_in_a_batch(run: Run) -> None:
    before = time.time_ns()
    run.switch.digest(RTT_ID, rtt(link=1, rtt_ns=20_000_064))
    got = run.wait_records("rtt_samples", 1)[0]  # once the export tick closes its batch
    after = time.time_ns()
    assert got.key == LINK1
    batch = got.record
    assert batch["link_id"] == LINK1
    assert batch["interval_ns"] == run.target.config.dataplane.rtt_batch_interval_ns
    (record,) = samples_of(batch)
    assert batch["ts_ns"] - batch["interval_ns"] <= record["ts_ns"] < batch["ts_ns"]
    assert {k: v for k, v in record.items() if k != "ts_ns"} == {
        "link_id": LINK1,
        "src_ip": "10.201.1.10",
        "dst_ip": "10.201.2.2",
        "src_port": 40000,
        "dst_port": 5201,
        "protocol": 6,
        "rtt_ns": 20_000_064,
    }
    assert before <= record["ts_ns"] <= after  # switch clock mapped to Unix time


def test_long_flow_start_repeat_and_idle_end(run: Run) -> None:
    table = run.switch.tables["Ingress.long_flows"]
    run.switch.digest(FLOW_ID, flow(1))
    start = run.wait_records("flow_events", 1)[0]
    assert start.key == LINK0
    assert start.record["kind"] == "start" and start.record["reason"] == "threshold"
    assert start.record["packets"] == 2000 and start.record["src_port"] == 40001
    assert len(table.entries) == 1
    ((key, data),) = table.entries.values()
    assert key.to_dict()["md.link"]["value"] == 0
    assert key.to_dict()["hdr.ipv4.src_addr"]["value"] == ip("10.201.1.11")
    assert data.to_dict()["$ENTRY_TTL"] == 2000
    assert data.to_dict()["action_name"] == "Ingress.long_flow_hit"

    run.switch.digest(FLOW_ID, flow(1))  # a repeat before the insertion landed: ignored
    assert wait_until(lambda: run.target.stats().pipeline.get("repeated_start_digests") == 1, 10)
    assert len([c for c in table.calls if c[0] == "add"]) == 1

    run.switch.idle.put(types.SimpleNamespace(key=key))
    events = run.wait_records("flow_events", 2)
    assert len(events) == 2
    end = events[1].record
    assert (end["kind"], end["reason"], end["packets"]) == ("end", "idle_timeout", 0)
    assert (end["src_ip"], end["dst_port"]) == ("10.201.1.11", 5201)
    assert table.entries == {}
    assert table.calls[-1][0] == "del"

    run.switch.idle.put(types.SimpleNamespace(key=key))  # already gone: nothing
    run.switch.digest(FLOW_ID, flow(3))  # a FIN for a flow no longer listed: nothing
    assert wait_until(
        lambda: (
            run.target.stats().pipeline.get("end_digests_unlisted") == 1
            and run.target.stats().pipeline.get("idle_notifications_unlisted") == 1
        ),
        10,
    )
    assert run.target.stats().produced["flow_events"] == 2


def test_counters_deltas_with_wrap(run: Run) -> None:
    got = run.wait_records("link_counters", 6)
    link0 = [r.record for r in got if r.key == LINK0]
    link1 = [r.record for r in got if r.key == LINK1]
    assert [r["seq"] for r in link0[:3]] == [0, 1, 2]
    assert [r["seq"] for r in link1[:3]] == [0, 1, 2]
    # packets: W-100+3 → W-10+3 → 40+3 (wrapped) → 1040+3
    assert [r["packets"] for r in link0[:3]] == [90, 50, 1000]
    assert [r["bytes"] for r in link0[:3]] == [
        ((W - 10) * 100 - (W - 100) * 100) % W,
        (40 * 100 - (W - 10) * 100) % W,
        100_000,
    ]
    assert [r["after_packets"] for r in link0[:3]] == [30, 40, 880]
    assert [r["after_bytes"] for r in link0[:3]] == [2400, 3200, 70_400]
    assert link0[0]["queue_delay_sum_ns"] == 10  # {lo: W-5, hi: 0} → {lo: 5, hi: 1}
    assert [r["queue_delay_sum_ns"] for r in link0[1:3]] == [0, 0]
    assert all(r["queue_delay_ewma_ns"] == 700 for r in link0[:3])
    assert all(r["packets"] == 0 and r["queue_delay_ewma_ns"] == 0 for r in link1[:3])
    assert all(r["after_packets"] == r["after_bytes"] == 0 for r in link1[:3])
    assert all(r["interval_ns"] > 0 and r["ts_ns"] % 50_000_000 == 0 for r in link0)
    reads = run.switch.tables["Egress.link_traffic"]
    assert all(flags == {"from_hw": True} for flags in reads.reads)  # type: ignore[attr-defined]


def test_malformed_digests_counted_loop_goes_on(run: Run) -> None:
    short = rtt()
    del short["rtt"]
    run.switch.digest(RTT_ID, short)
    run.switch.digest(RTT_ID, rtt(link=7))
    run.switch.digest(RTT_ID, rtt(rtt_ns=0))
    run.switch.digest(FLOW_ID, flow(9))
    run.switch.digest(999, rtt())
    run.switch.digest(RTT_ID, rtt(rtt_ns=12_345_600))  # a good one after them
    got = run.wait_records("rtt_samples", 1)
    assert [rtt for r in got for rtt in r.record["rtt_ns"]] == [12_345_600]
    assert wait_until(lambda: run.target.stats().pipeline.get("malformed_digests") == 5, 10)
    problems = "\n".join(run.target.stats().problems)
    assert "6 fields, expected 7; missing rtt" in problems
    assert "unknown link index 7" in problems
    assert "rtt 0 ns is outside" in problems
    assert "event 9 is not one of 1..4" in problems
    assert "digest id 999" in problems
    stats = run.target.stats()
    assert stats.state == "running" and stats.frames >= 6


def test_stats_fields_and_stop(run: Run) -> None:
    run.switch.digest(RTT_ID, rtt())
    run.wait_records("rtt_samples", 1)
    assert wait_until(lambda: run.target.stats().delivered >= 1, 10)
    final = run.target.stop(30)
    assert final.state == "done" and final.target == "tofino"
    assert final.produced["rtt_samples"] == final.rtt_samples_produced == 1
    assert final.produced_total == sum(final.produced.values())
    assert final.delivered == final.produced_total and final.in_flight == 0
    assert final.failed == 0 and final.dropped == 0 and final.undelivered_at_exit == 0
    assert run.target.wait(0)


def test_missing_sde_gives_clear_error(
    config: Config, topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bfrt_grpc", None)
    target = TofinoTarget(config, topics=topics)
    with pytest.raises(ExporterError, match=r"PYTHONPATH.*SDE_INSTALL.*site-packages/tofino"):
        target.start()
