"""The tofino exporter target against a fake bfrt_grpc (tests/fakebfrt.py: the real client's
calls and, where the exporter depends on it, its behaviour) and the real broker: tables
programmed from the config with their entry scope, the queueing-delay filter programmed and
re-tuned, registers synced and read in bulk, their differences (with wrap-around) closing
each link's interval as a LinkCounters record that also carries the interval's RTT digests
and long-flow events (several records for a busy interval, the open one sent at stop),
insert errors sorted by their code, a broken notification stream detected and reconnected,
bad digests counted, not fatal."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from fakebfrt import (
    INVALID_ARGUMENT,
    MODE_ALL,
    MODE_SINGLE,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    DataTuple,
    Key,
    KeyTuple,
    Switch,
    fake_modules,
    write_config,
)

from p4bs.bus import Received, RecordConsumer
from p4bs.config import Config, load_config
from p4bs_exporter.target import ExporterError
from p4bs_exporter.tofino import TofinoTarget
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_schemas.intervals import COUNT_FIELDS, events_of, layout_problem, samples_of

RTT_ID, FLOW_ID = 101, 202
LINK0, LINK1 = "r1:eth1", "r1:eth2"
ENTRY_TABLES = ("port_to_link", "output_prefixes", "long_flows")  # the exporter adds to them


# --- fixtures ------------------------------------------------------------------------

W = 2**32


Script = list[dict[int, dict[str, list[int]]]]


def counters(packets: list[int], sum_lo: int = 0, sum_hi: int = 0) -> dict[str, Script]:
    """Register scripts (fakebfrt.Register) whose link 0 `packets` follows `packets` (two
    pipes: the value and 3), link 1 stays at 0."""
    traffic = [{0: {"packets": [p, 3], "bytes": [p * 100, 0]}} for p in packets]
    # What left the router: its own counts, wrapping too (deltas 30, 40, 880, then 0).
    carried = [W - 50, W - 20, 20, 900][: len(packets)]
    after = [{0: {"packets": [a, 0], "bytes": [a * 80 % W, 0]}} for a in carried]
    qsum = [{0: {"sum_lo": [sum_lo], "sum_hi": [sum_hi]}}, {0: {"sum_lo": [5], "sum_hi": [1]}}]
    return {
        "Egress.link_traffic": traffic,
        "Egress.link_after": after,
        "Egress.link_qdelay_sum": qsum,
        "Egress.link_qdelay_ewma": [{0: {"f1": [0, 700]}}],
    }


@pytest.fixture
def config(stack: Stack, topics: dict[str, str], tmp_path: Path) -> Config:
    return load_config(write_config(tmp_path, stack.kafka.bootstrap, topics, optical_from=1))


Record = dict[str, Any]
T = TypeVar("T")


class Run:
    def __init__(self, config: Config, topics: dict[str, str], switch: Switch, tmp: Path):
        self.switch = switch
        self.target = TofinoTarget(config, topics=topics, stats_path=tmp / "stats.json")
        # Reads the partitions by assignment: a group join can take longer than a test's
        # wait on a loaded broker, and then nothing at all arrives.
        self.consumer = RecordConsumer(
            config.kafka.bootstrap,
            f"test-{uuid.uuid4().hex[:8]}",
            ["link_counters"],
            topics,
            whole_topics=True,
        )
        self.received: list[Received] = []

    def records(self, link: str | None = None) -> list[Record]:
        """The LinkCounters records that arrived so far, of one link if given (the stream
        never pauses, so read for a bounded time). Every one is keyed by its link and
        readable as an interval."""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and (got := self.consumer.poll(0.1)) is not None:
            assert got.key == got.record["link_id"], got
            assert layout_problem(got.record) is None, (layout_problem(got.record), got.record)
            self.received.append(got)
        return [r.record for r in self.received if link is None or r.key == link]

    def samples(self) -> list[Record]:
        """The RTT samples of the records so far, each with its link_id."""
        return [s for r in self.records() for s in samples_of(r)]

    def events(self) -> list[Record]:
        """The long-flow events of the records so far, each with its link_id."""
        return [e for r in self.records() for e in events_of(r)]

    def wait(self, what: Callable[[], list[T]], n: int, timeout_s: float = 90) -> list[T]:
        """`what()` once it has at least n items."""
        assert wait_until(lambda: len(what()) >= n, timeout_s), (
            f"{len(what())} of {n} (from {len(self.received)} records read); "
            f"stats {self.target.stats()}"
        )
        return what()

    def wait_records(self, n: int, link: str | None = None) -> list[Record]:
        return self.wait(lambda: self.records(link), n)

    def wait_closed(self, after_ns: int) -> None:
        """Until both links have sent a complete record ending after `after_ns`: whatever the
        exporter took in before then has gone out."""

        def closed() -> list[str]:
            return [
                link
                for link in (LINK0, LINK1)
                if any(r["complete"] and r["ts_ns"] > after_ns for r in self.records(link))
            ]

        self.wait(closed, 2)


class Runner(Protocol):
    def __call__(self, switch: Switch, changed: Config | None = None) -> Run: ...


@pytest.fixture
def runner(
    config: Config, topics: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Runner]:
    """Starts the target on a switch the test prepared (with the test's config, or one the
    test changed); stops it at the end."""
    runs: list[Run] = []

    def start(switch: Switch, changed: Config | None = None) -> Run:
        for name, module in fake_modules(switch).items():
            monkeypatch.setitem(sys.modules, name, module)
        r = Run(changed or config, topics, switch, tmp_path)
        runs.append(r)
        r.target.start()
        return r

    yield start
    for r in runs:
        r.target.stop(30)
        r.consumer.close()


@pytest.fixture
def run(runner: Runner) -> Run:
    return runner(Switch(counters([W - 100, W - 10, 40, 1040], sum_lo=W - 5)))


def with_dataplane(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, dataplane=dataclasses.replace(config.dataplane, **changes))


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


def pipeline(run: Run, name: str) -> int:
    return run.target.stats().pipeline.get(name, 0)


def test_tables_programmed_from_config(run: Run) -> None:
    assert run.switch.connected[:2] == [("127.0.0.1:50052", 0, 0), ("bind", "p4bs")]
    ports = run.switch.tables["Ingress.port_to_link"]
    got = {k[0][1]: d.to_dict() for k, d in ports.entries.values() for k in [k.ident()]}
    assert {p: (d["link"], d["tap"], d["direction"]) for p, d in got.items()} == {
        4: (0, 0, 2),  # (link index, TAP_BEFORE, DIR_BOTH)
        5: (0, 1, 2),
        8: (1, 0, 0),  # link 1 on an optical tap: DIR_OUT
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


def test_entry_scope_all_pipes_set_on_empty_tables(runner: Runner) -> None:
    """A scope an earlier session left (one pipe, with an entry) is reset to all pipes on
    every table the exporter adds entries to: after the table is cleared (pipe_mgr refuses
    to change a non-empty table's scope) and before the config's entries go in."""
    switch = Switch(counters([0]))
    ports = switch.tables["Ingress.port_to_link"]
    ports.scope = MODE_SINGLE
    stale = Key([KeyTuple("ig_intr_md.ingress_port", 99)])
    ports.entries[stale.ident()] = (stale, ports.make_data([DataTuple("link", 7)]))
    run = runner(switch)
    assert ports.scope == MODE_ALL
    assert sorted(k[0][1] for k in ports.entries) == [4, 5, 8, 9, 10, 11]
    for name in ENTRY_TABLES:
        calls = [c[0] for c in run.switch.tables[f"Ingress.{name}"].calls]
        assert calls.count("scope") == 1, f"{name}: {calls}"
        assert calls.index("del") < calls.index("scope"), f"{name}: {calls}"
        if "add" in calls:
            assert calls.index("scope") < calls.index("add"), f"{name}: {calls}"
    assert not [p for p in run.target.stats().problems if "entry scope" in p]


def lpf_weight(gap_ns: float, tau_ns: float) -> float:
    """The weight the Tofino LPF (SAMPLE mode) gives a sample arriving gap_ns after the last."""
    return 1 - math.exp(-gap_ns / tau_ns)


def test_queue_delay_filter_programmed_and_retuned(runner: Runner) -> None:
    """Every link's Egress.link_qdelay_lpf index is set at start (SAMPLE, unscaled, one time
    constant for rise and fall, as floats) so that a sample gets SPEC §6's weight 1/8 at the
    line-rate sample gap; an interval with many samples re-tunes that link's filter to its
    measured gap. The fake refuses a float given as an int, as the real client does."""
    scripts = counters([0])
    scripts["Egress.link_qdelay_samples"] = [{}, {0: {"f1": [3000, 2000]}}]
    run = runner(Switch(scripts))
    lpf = run.switch.tables["Egress.link_qdelay_lpf"]
    with pytest.raises(TypeError):
        DataTuple("$LPF_SPEC_GAIN_TIME_CONSTANT_NS", float_val=5)
    with pytest.raises(ValueError):
        lpf.make_data([DataTuple("$LPF_SPEC_GAIN_TIME_CONSTANT_NS", 5)])

    first_add = next(keys for call, keys in lpf.calls if call == "add")
    assert sorted(index for ((_, index, _),) in first_add) == [0, 1]
    line_rate_gap = 1500 * 8 * 1e9 / 100e6  # 100 Mbit/s links, full-size packets
    tau = lpf.spec(1)["$LPF_SPEC_GAIN_TIME_CONSTANT_NS"]  # link 1 never has samples
    assert lpf.spec(1) == {
        "$LPF_SPEC_TYPE": "SAMPLE",
        "$LPF_SPEC_GAIN_TIME_CONSTANT_NS": tau,
        "$LPF_SPEC_DECAY_TIME_CONSTANT_NS": tau,
        "$LPF_SPEC_OUT_SCALE_DOWN_FACTOR": 0,
    }
    assert isinstance(tau, float)
    assert lpf_weight(line_rate_gap, tau) == pytest.approx(1 / 8)

    got = run.wait_records(2)
    (busy,) = [r for r in got if r["link_id"] == LINK0 and r["seq"] == 0]
    assert busy["queue_delay_samples"] == 5000
    gap = busy["interval_ns"] / 5000
    assert wait_until(
        lambda: (
            lpf_weight(gap, lpf.spec(0)["$LPF_SPEC_GAIN_TIME_CONSTANT_NS"]) == pytest.approx(1 / 8)
        ),
        10,
    ), lpf.spec(0)
    spec = lpf.spec(0)
    assert spec["$LPF_SPEC_TYPE"] == "SAMPLE" and spec["$LPF_SPEC_OUT_SCALE_DOWN_FACTOR"] == 0
    assert spec["$LPF_SPEC_DECAY_TIME_CONSTANT_NS"] == spec["$LPF_SPEC_GAIN_TIME_CONSTANT_NS"]
    assert lpf.spec(1)["$LPF_SPEC_GAIN_TIME_CONSTANT_NS"] == tau  # no samples: kept


def test_rtt_digest_becomes_rtt_sample_of_its_interval(run: Run) -> None:
    """The sample travels in the one record of its link's interval, beside the interval's
    counters."""
    before = time.time_ns()
    run.switch.digest(RTT_ID, rtt(link=1, rtt_ns=20_000_064))
    run.wait(run.samples, 1)  # once the export tick closes its interval
    after = time.time_ns()
    (interval,) = [r for r in run.records(LINK1) if r["rtt_ns"]]
    assert interval["complete"] and interval["part"] == 0
    # Whole export intervals: one, or more when a busy machine made the loop miss a tick.
    assert interval["interval_ns"] % run.target.config.dataplane.export_interval_ns == 0
    assert [r for r in run.records(LINK1) if r["ts_ns"] == interval["ts_ns"]] == [interval]
    (record,) = samples_of(interval)
    assert interval["ts_ns"] - interval["interval_ns"] <= record["ts_ns"] < interval["ts_ns"]
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
    assert not [s for r in run.records(LINK0) for s in samples_of(r)]


def test_busy_interval_split_into_parts(runner: Runner, config: Config) -> None:
    """An interval with more RTT samples than `max_rtt_samples_per_record` goes out in
    several records, in order: full parts of samples only, then the complete one with the
    rest and the interval's counters; `seq` counts every record."""
    run = runner(Switch(counters([0, 1000])), with_dataplane(config, max_rtt_samples_per_record=2))
    sent = [rtt(rtt_ns=1_000_000 + i, ts=5_000_000_000 + i * 1000) for i in range(5)]
    run.switch.digest(RTT_ID, *sent)
    got = run.wait(run.samples, 5)
    assert [s["rtt_ns"] for s in got] == [r["rtt"] for r in sent]
    link0 = run.records(LINK0)
    assert [r["seq"] for r in link0] == list(range(len(link0)))
    intervals: list[list[Record]] = [[]]  # each interval's records, up to its complete one
    for record in link0:
        intervals[-1].append(record)
        if record["complete"]:
            intervals.append([])
    # Five samples in one interval (or, if a tick fell between them, in two).
    assert max(len(records) for records in intervals) >= 2, intervals
    for records in intervals[:-1]:
        assert [r["part"] for r in records] == list(range(len(records)))
        for part in records[:-1]:
            assert len(part["rtt_ns"]) == 2
            assert all(part[name] == 0 for name in COUNT_FIELDS)
    assert intervals[0][-1]["packets"] == 1000  # the counters: on the complete record


def test_stop_sends_the_open_interval(runner: Runner, config: Config) -> None:
    """What the last interval gathered before the stop goes out at the stop, as a complete
    record with zero counts (its registers are not read)."""
    interval = 10**15  # ns, 11.6 days: no export tick within the test
    run = runner(Switch(counters([0, 1000])), with_dataplane(config, export_interval_ns=interval))
    run.switch.digest(RTT_ID, rtt(rtt_ns=9_000_000))
    run.switch.digest(FLOW_ID, flow(1))  # handled once listed, after the RTT digest
    assert wait_until(lambda: len(run.switch.tables["Ingress.long_flows"].entries) == 1, 10)
    assert run.records() == []
    final = run.target.stop(30)
    assert final.produced == {"link_counters": 1} and final.rtt_samples_produced == 1
    (record,) = run.wait_records(1)
    assert record["link_id"] == LINK0 and record["complete"] and record["seq"] == 0
    assert record["interval_ns"] == interval and record["ts_ns"] % interval == 0
    assert all(record[name] == 0 for name in COUNT_FIELDS)
    assert [s["rtt_ns"] for s in samples_of(record)] == [9_000_000]
    assert [(e["kind"], e["src_port"]) for e in events_of(record)] == [("start", 40001)]


def test_long_flow_start_repeat_and_idle_end(run: Run) -> None:
    table = run.switch.tables["Ingress.long_flows"]
    run.switch.digest(FLOW_ID, flow(1))
    start = run.wait(run.events, 1)[0]
    assert start["link_id"] == LINK0
    assert start["kind"] == "start" and start["reason"] == "threshold"
    assert start["packets"] == 2000 and start["src_port"] == 40001
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
    events = run.wait(run.events, 2)
    assert len(events) == 2
    end = events[1]
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
    run.wait_closed(time.time_ns())
    assert len(run.events()) == 2


def test_counters_deltas_with_wrap(run: Run) -> None:
    got = run.wait_records(6)
    link0 = [r for r in got if r["link_id"] == LINK0]
    link1 = [r for r in got if r["link_id"] == LINK1]
    assert all(r["complete"] and r["part"] == 0 for r in got)  # one record per interval
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


def test_registers_synced_once_then_read_in_bulk(run: Run) -> None:
    """Each register is read as the SDE's examples do: one Sync (the table copied from the
    hardware at once), then one bulk read of the links' cells from that copy; never one
    hardware read per index. Two round trips per register and interval."""
    run.wait_records(4)
    registers = [t for t in run.switch.tables.values() if hasattr(t, "reads")]
    assert len(registers) == 7
    for register in registers:
        syncs = [c for c in register.calls if c == ("operation", "Sync")]
        reads = register.reads  # type: ignore[attr-defined]
        assert reads and all(flags == {"from_hw": False} for flags in reads), register.name
        assert len(syncs) in (len(reads), len(reads) + 1), register.name  # one per read
    assert run.switch.hw_index_reads == 0


def test_insert_errors_sorted_by_code(run: Run) -> None:
    """The long-flow table's refusals, by the server's code: a transient one (table locked:
    UNAVAILABLE) is counted apart and the data plane's repeated start digest inserts the flow;
    a full table (RESOURCE_EXHAUSTED) counts long_flow_table_full; any other code counts
    long_flow_insert_failed with the error in problems. None of them stops the loop."""
    table = run.switch.tables["Ingress.long_flows"]
    table.refuse = [(UNAVAILABLE, "Resource held by another session")]
    run.switch.digest(FLOW_ID, flow(1))
    assert wait_until(lambda: pipeline(run, "long_flow_insert_transient") == 1, 10)
    assert table.entries == {} and pipeline(run, "long_flow_table_full") == 0
    run.switch.digest(FLOW_ID, flow(1))  # the data plane repeats it: now it goes in
    start = run.wait(run.events, 1)[0]
    assert (start["kind"], start["src_port"]) == ("start", 40001) and len(table.entries) == 1

    other = flow(1)
    other["src_port"] = 40002
    table.refuse = [(RESOURCE_EXHAUSTED, "Not enough space")]
    run.switch.digest(FLOW_ID, other)
    assert wait_until(lambda: pipeline(run, "long_flow_table_full") == 1, 10)
    table.refuse = [(INVALID_ARGUMENT, "Invalid arg")]
    run.switch.digest(FLOW_ID, other)
    assert wait_until(lambda: pipeline(run, "long_flow_insert_failed") == 1, 10)
    assert "INVALID_ARGUMENT" in "\n".join(run.target.stats().problems)
    assert pipeline(run, "long_flow_insert_transient") == 1
    assert run.target.stats().state == "running"
    run.wait_closed(time.time_ns())
    assert len(run.events()) == 1  # no start for the flows the table refused


def test_broken_stream_detected_and_reconnected(run: Run) -> None:
    """bf_switchd restarts: the stream's error lands in the client's exception queue while
    digest_get just times out. The exporter counts it, ends the flows the switch forgot,
    reconnects once the switch takes connections again, programs it as at start (tables,
    filter), re-baselines the counters, and goes on exporting what the switch sends."""
    run.switch.digest(FLOW_ID, flow(1))
    run.wait(run.events, 1)
    before = len(run.wait_records(2, LINK0))
    ports = run.switch.tables["Ingress.port_to_link"]

    run.switch.restart(refuse_connects=2)  # two connection attempts fail while it starts
    assert wait_until(lambda: pipeline(run, "reconnects") == 1, 30), run.target.stats()
    stats = run.target.stats()
    assert pipeline(run, "stream_errors") == 1 and stats.state == "running"
    problems = "\n".join(stats.problems)
    assert "notification stream lost" in problems and "UNAVAILABLE" in problems
    assert problems.count("reconnect to 127.0.0.1:50052 failed") == 2
    assert sorted(k[0][1] for k in ports.entries) == [4, 5, 8, 9, 10, 11]  # programmed again
    assert run.switch.tables["Egress.link_qdelay_lpf"].entries  # the filter too
    assert len(run.switch.connected) > 2  # a new ClientInterface

    end = run.wait(run.events, 2)[1]
    assert (end["kind"], end["reason"], end["src_port"]) == ("end", "idle_timeout", 40001)
    run.switch.digest(RTT_ID, rtt(rtt_ns=7_000_000))  # not blind: the new stream is read
    assert [s["rtt_ns"] for s in run.wait(run.samples, 1)] == [7_000_000]
    run.switch.digest(FLOW_ID, flow(1))  # the forgotten flow lists again
    assert run.wait(run.events, 3)[2]["kind"] == "start"
    after = run.wait_records(before + 4, LINK0)
    assert [r["seq"] for r in after] == list(range(len(after)))  # seq goes on
    assert after[-1]["packets"] == 0  # the restarted switch counts from its new baseline


def test_malformed_digests_counted_loop_goes_on(run: Run) -> None:
    short = rtt()
    del short["rtt"]
    run.switch.digest(RTT_ID, short)
    run.switch.digest(RTT_ID, rtt(link=7))
    run.switch.digest(RTT_ID, rtt(rtt_ns=0))
    run.switch.digest(FLOW_ID, flow(9))
    run.switch.digest(999, rtt())
    run.switch.digest(RTT_ID, rtt(rtt_ns=12_345_600))  # a good one after them
    assert [s["rtt_ns"] for s in run.wait(run.samples, 1)] == [12_345_600]
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
    run.wait(run.samples, 1)
    assert wait_until(lambda: run.target.stats().delivered >= 1, 10)
    final = run.target.stop(30)
    assert final.state == "done" and final.target == "tofino"
    assert final.rtt_samples_produced == 1
    assert list(final.produced) == ["link_counters"]
    assert final.produced_total == final.produced["link_counters"]
    assert len(run.wait_records(final.produced_total)) == final.produced_total
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
