"""The metrics job's readers of raw Kafka values (streaming-jobs/functions, from the jar `make
build` makes), run by a small harness (tests/java/RecordCheck.java): a links-topic record is
taken only whole and within its ranges, and a bad one is refused with its reason, never an
exception the job would stop on; an interval record's flow events and addresses cannot carry
separators into the job, and its counts and RTTs are not negative."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_writer
from jarharness import run_harness

from p4bs_schemas.registry import STREAMS, current_schema

HARNESS = Path(__file__).parents[1] / "java" / "RecordCheck.java"
LINK = "r1:eth1"
TS_NS = 1_700_000_000_100_000_000


def _avro(stream: str, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(STREAMS[stream])), record)
    return out.getvalue()


def _spec(**changes: Any) -> dict[str, Any]:
    return {
        "link_id": LINK,
        "ts_ns": TS_NS,
        "removed": False,
        "capacity_bps": 10_000_000,
        "max_queue_delay_ns": 5_000_000,
        "max_loss": 0.01,
        "weight_loss": 0.5,
        "weight_delay": 0.5,
        "config": "{}",
        **changes,
    }


def _interval(src_ip: str = "10.0.1.2", kind: str = "start", **changes: Any) -> dict[str, Any]:
    flow = {"src_ip": src_ip, "dst_ip": "10.0.2.2", "src_port": 40000, "dst_port": 5201}
    flow |= {"protocol": 6}
    counts = ("packets", "bytes", "after_packets", "after_bytes", "data_packets", "data_bytes")
    counts += ("retransmissions", "queue_delay_samples", "queue_delay_sum_ns")
    return {
        "link_id": LINK,
        "ts_ns": TS_NS,
        "interval_ns": 100_000_000,
        "seq": 0,
        **dict.fromkeys(counts, 1),
        "queue_delay_ewma_ns": 0,
        "part": 0,
        "complete": True,
        "flow_events": [
            {"ts_ns": TS_NS - 1000, "kind": kind, "reason": "threshold", "packets": 1} | flow
        ],
        "flows": [flow],
        "flow_index": [0, 0],
        "offset_ns": [0, 1],
        "rtt_ns": [1000, 2000],
        **changes,
    }


def _hex(value: bytes | None) -> str:
    return "-" if value is None else value.hex()


def _check(lines: list[str], tmp_path: Path) -> list[str]:
    return run_harness(HARNESS, "io.p4bs.flink.RecordCheck", [], lines, tmp_path).splitlines()


def test_a_link_spec_is_taken_whole_and_in_range_or_refused_with_its_reason(
    tmp_path: Path,
) -> None:
    good = _avro("links", _spec())
    cases: list[tuple[str | None, bytes | None, str]] = [
        (LINK, good, f"ok {TS_NS} false 10000000 0.5 0.5 0.01 5000000"),
        (LINK, _avro("links", _spec(removed=True, max_loss=1.0)), "ok"),  # p-hat 1 is a bound
        (LINK, b"not avro", "malformed"),
        (LINK, good[:-3], "malformed value ends inside a number"),  # cut short
        (LINK, good[:45], "malformed value ends inside a double"),
        (LINK, good + b"\0", "malformed 1 bytes after the last field"),
        (LINK, None, "malformed no value"),  # a tombstone
        (None, good, "malformed no link id"),
        (LINK, _avro("links", _spec(capacity_bps=0)), "malformed capacity_bps 0 is not above 0"),
        (LINK, _avro("links", _spec(max_loss=0.0)), "malformed max_loss 0.0 is not in (0, 1]"),
        (LINK, _avro("links", _spec(max_loss=math.nan)), "malformed max_loss NaN"),
        (LINK, _avro("links", _spec(max_loss=1.5)), "malformed max_loss 1.5"),
        (LINK, _avro("links", _spec(max_queue_delay_ns=-1)), "malformed max_queue_delay_ns -1"),
        (LINK, _avro("links", _spec(weight_loss=math.inf)), "malformed weight_loss Infinity"),
        (LINK, _avro("links", _spec(weight_delay=-0.5)), "malformed weight_delay -0.5"),
        (LINK, _avro("links", _spec(ts_ns=0)), "malformed ts_ns 0 is not above 0"),
        ("r2:eth2", good, "malformed link_id 'r1:eth1' is not the record's key 'r2:eth2'"),
        ("r7, x:eth7", _avro("links", _spec(link_id="r7, x:eth7")), "malformed link id 'r7, x"),
        ("eth1", _avro("links", _spec(link_id="eth1")), "malformed link id 'eth1'"),
    ]
    lines = [f"spec {_hex(None if k is None else k.encode())} {_hex(v)}" for k, v, _ in cases]
    got = _check(lines, tmp_path)
    assert len(got) == len(cases)
    wrong = [
        (k, want, out)
        for (k, _, want), out in zip(cases, got, strict=True)
        if not out.startswith(want)
    ]
    assert not wrong


def test_a_link_specs_policy_is_read_from_its_config_or_refused_with_its_reason(
    tmp_path: Path,
) -> None:
    """The optimizer feed thins a link's windows by its policy, which a links-topic record
    carries only in its config (the [[links]] entry as JSON): a config the job cannot read a
    policy name from leaves the link unthinned (every window), counted with the reason."""
    cases = [
        (json.dumps({"router": "r1", "policy": "globecom", "policy_options": {}}), "ok globecom"),
        ('{"policy": "loss-delay-fit"}', "ok loss-delay-fit"),
        ("{}", "malformed config names no policy"),
        ('{"policy": 7}', "malformed config names no policy"),
        ('["globecom"]', "malformed config names no policy"),
        ("", "malformed config names no policy"),
        ("policy = 'globecom'", "malformed config is not JSON"),
        ('{"policy": "globecom"', "malformed config is not JSON"),
        ('{"policy": "a,b"}', "malformed policy 'a,b' is not a policy name"),
        (json.dumps({"policy": "p" * 65}), "malformed policy 'ppp"),
    ]
    key = _hex(LINK.encode())
    got = _check(
        [f"policy {key} {_hex(_avro('links', _spec(config=c)))}" for c, _ in cases], tmp_path
    )
    assert len(got) == len(cases)
    # A policy read is the whole name; a reason starts as given.
    wrong = [
        (config, want, out)
        for (config, want), out in zip(cases, got, strict=True)
        if (out != want if want.startswith("ok") else not out.startswith(want))
    ]
    assert not wrong


def test_an_interval_record_with_separators_or_negative_numbers_is_refused(
    tmp_path: Path,
) -> None:
    """The flow events once crossed into LinkMetrics as text split on ',' and ' ': an address
    holding them made the job fail. Now an address must be an IP address's text and a kind
    start or end; negative counts and RTTs are refused too (they would make negative rates)."""
    cases = [
        (_interval(), "ok 1700000000100000000 2 1"),
        (_interval(kind="end"), "ok 1700000000100000000 2 1"),
        (_interval(src_ip="10.0.1.2, 6"), "malformed an address that is not an IP address"),
        (_interval(src_ip="x" * 46), "malformed an address of 46 bytes"),
        (_interval(kind="start now"), "malformed a flow event of kind 'start now'"),
        (_interval(data_packets=-1), "malformed data_packets = -1 is negative"),
        (_interval(rtt_ns=[1000, -5]), "malformed a negative RTT sample"),
    ]
    got = _check([f"interval {_hex(_avro('link_counters', r))}" for r, _ in cases], tmp_path)
    assert len(got) == len(cases)
    wrong = [
        (want, out) for (_, want), out in zip(cases, got, strict=True) if not out.startswith(want)
    ]
    assert not wrong


def test_an_interval_far_ahead_of_the_clock_gets_no_event_time(tmp_path: Path) -> None:
    """One record dated ahead would move its partition's event time past the windows of every
    other link there: beyond a minute after the job's clock it is refused, not timed."""
    end_ms = (TS_NS - 1) // 1_000_000
    record = _hex(_avro("link_counters", _interval()))
    cases = [
        (end_ms, f"ok {end_ms}"),  # the clock at the interval's end
        (end_ms - 60_000, f"ok {end_ms}"),  # a minute ahead: clocks that differ
        (end_ms - 60_001, "malformed its interval ends 60001 ms after this host's clock"),
        (end_ms - 30 * 86_400_000, "malformed its interval ends 2592000000 ms after"),
    ]
    got = _check([f"time {record} {now_ms}" for now_ms, _ in cases], tmp_path)
    assert len(got) == len(cases)
    wrong = [
        (want, out) for (_, want), out in zip(cases, got, strict=True) if not out.startswith(want)
    ]
    assert not wrong
