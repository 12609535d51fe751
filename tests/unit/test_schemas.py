"""Schemas: committed versions stay readable, the checker catches breaking changes, the codec
round-trips records and turns bad input into RecordError naming what is wrong."""

from __future__ import annotations

import copy
import io
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from p4bs_schemas.codec import (
    FINGERPRINT_HEADER,
    SCHEMA_HEADER,
    Codec,
    RecordError,
    codec,
    schema_fingerprint,
)
from p4bs_schemas.compat import check_backward
from p4bs_schemas.intervals import NO_COUNTS, IntervalAssembler, events_of, samples_of
from p4bs_schemas.ranges import RangeCheck, field_ranges, nullable_fields, range_problem
from p4bs_schemas.registry import STREAMS, Schema, current_schema, released_schemas, schema_names

FLOW = {
    "src_ip": "10.0.1.2",
    "dst_ip": "10.0.2.2",
    "src_port": 40000,
    "dst_port": 5201,
    "protocol": 6,
}
SAMPLE = {"ts_ns": 1_700_000_000_123_456_789, **FLOW, "rtt_ns": 21_500_000}
EVENT = {"ts_ns": 1_700_000_000_101_000_000, "kind": "start", "reason": "threshold", **FLOW}
EVENT["packets"] = 2000
# A link's export interval: counters, a flow event, RTT samples.
INTERVAL = {
    "link_id": "r1:eth1",
    "ts_ns": 1_700_000_000_200_000_000,
    "interval_ns": 100_000_000,
    "seq": 7,
    "packets": 1000,
    "bytes": 1_500_000,
    "after_packets": 960,
    "after_bytes": 1_430_000,
    "data_packets": 990,
    "data_bytes": 1_480_000,
    "retransmissions": 3,
    "queue_delay_samples": 5,
    "queue_delay_sum_ns": 50_000,
    "queue_delay_ewma_ns": 123_456,
    "part": 0,
    "complete": True,
    "flow_events": [EVENT],
    "flows": [FLOW, {**FLOW, "src_port": 40001}],
    "flow_index": [0, 1, 0],
    "offset_ns": [23_456_789, 23_456_790, 99_999_999],
    "rtt_ns": [21_500_000, 7, 22_000_000],
}


def test_every_stream_has_a_schema_with_documented_fields() -> None:
    assert sorted(STREAMS.values()) == schema_names()
    for name in schema_names():
        schema = current_schema(name)
        assert schema["doc"]
        for field in schema["fields"]:
            assert field.get("doc"), f"{name}.{field['name']} has no doc (and unit)"


@pytest.mark.parametrize("name", schema_names())
def test_current_schema_is_released_and_every_release_stays_readable(name: str) -> None:
    released = released_schemas(name)
    assert released, f"{name} has no released version in schemas/p4bs_schemas/avro/released/"
    newest = released[-1][1]
    assert schema_fingerprint(newest) == schema_fingerprint(current_schema(name)), (
        f"{name}.avsc changed: release it as {name}.v{released[-1][0] + 1}.avsc"
    )
    for i, (version, writer) in enumerate(released):
        for later_version, reader in released[i + 1 :]:
            problems = check_backward(reader, writer)
            assert not problems, f"{name} v{later_version} cannot read v{version}: {problems}"


Change = Callable[[Schema], None]


def _evolve(name: str, change: Change) -> tuple[Schema, Schema]:
    old = current_schema(name)
    new = copy.deepcopy(old)
    change(new)
    return new, old


def _field(schema: Schema, name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def _items(schema: Schema, name: str) -> Any:
    return _field(schema, name)["type"]["items"]


def _event_field(schema: Schema, name: str) -> dict[str, Any]:
    return next(f for f in _items(schema, "flow_events")["fields"] if f["name"] == name)


# Changes of LinkCounters' flat fields, of its arrays of numbers and of records (the flows'
# and the flow events', which hold values from a fixed set).
COUNTERS = "LinkCounters"
BREAKING: dict[str, tuple[str, Change]] = {
    "new field without default": (
        COUNTERS,
        lambda s: s["fields"].append({"name": "x", "type": "long"}),
    ),
    "long narrowed to int": (COUNTERS, lambda s: _field(s, "ts_ns").update(type="int")),
    "string to long": (COUNTERS, lambda s: _field(s, "link_id").update(type="long")),
    "allowed value removed": (
        COUNTERS,
        lambda s: _event_field(s, "kind").update(allowed=["start"]),
    ),
    "long to boolean": (COUNTERS, lambda s: _field(s, "packets").update(type="boolean")),
    "array items narrowed long to int": (
        COUNTERS,
        lambda s: _field(s, "rtt_ns")["type"].update(items="int"),
    ),
    "array of numbers to array of strings": (
        COUNTERS,
        lambda s: _field(s, "flow_index")["type"].update(items="string"),
    ),
    "array item record: new field without default": (
        COUNTERS,
        lambda s: _items(s, "flows")["fields"].append({"name": "x", "type": "long"}),
    ),
}
COMPATIBLE: dict[str, tuple[str, Change]] = {
    "new field with default": (
        COUNTERS,
        lambda s: s["fields"].append({"name": "x", "type": ["null", "long"], "default": None}),
    ),
    "field removed": (COUNTERS, lambda s: s["fields"].pop()),
    "int widened to long": (COUNTERS, lambda s: _field(s, "part").update(type="long")),
    "allowed value added": (
        COUNTERS,
        lambda s: _event_field(s, "kind").update(allowed=["start", "end", "x"]),
    ),
    "field made nullable": (
        COUNTERS,
        lambda s: _field(s, "packets").update(type=["null", "long"]),
    ),
    "array items widened int to long": (
        COUNTERS,
        lambda s: _field(s, "flow_index")["type"].update(items="long"),
    ),
    "array item record: field removed": (
        COUNTERS,
        lambda s: _items(s, "flows")["fields"].pop(),
    ),
}


@pytest.mark.parametrize("change", list(BREAKING), ids=list(BREAKING))
def test_checker_rejects_breaking_changes(change: str) -> None:
    assert check_backward(*_evolve(*BREAKING[change]))


@pytest.mark.parametrize("change", list(COMPATIBLE), ids=list(COMPATIBLE))
def test_checker_accepts_compatible_changes(change: str) -> None:
    assert check_backward(*_evolve(*COMPATIBLE[change])) == []


def test_codec_round_trip_and_headers() -> None:
    counters = codec(COUNTERS)
    data = counters.encode(INTERVAL)
    assert counters.decode(data, counters.headers) == INTERVAL
    assert counters.decode(data) == INTERVAL  # no headers: Flink-written, current schema
    assert dict(counters.headers)[FINGERPRINT_HEADER] == counters.fingerprint.encode()


def test_codec_reads_an_older_writer_by_fingerprint() -> None:
    """A newer reader with a new defaulted field reads current data, found by its
    fingerprint."""
    now = current_schema(COUNTERS)
    later = copy.deepcopy(now)
    later["fields"].append({"name": "x", "type": ["null", "long"], "default": None, "doc": "x"})
    reader = Codec(COUNTERS)
    reader.schema = parse_schema(later)
    data = codec(COUNTERS).encode(INTERVAL)
    assert reader.decode(data, codec(COUNTERS).headers) == {**INTERVAL, "x": None}


def _released_codec(name: str, version: int) -> tuple[Any, list[tuple[str, bytes]]]:
    """A released version's parsed schema and the headers its writers sent."""
    schema = dict(released_schemas(name))[version]
    full_name = f"{schema['namespace']}.{schema['name']}".encode()
    return parse_schema(schema), [
        (SCHEMA_HEADER, full_name),
        (FINGERPRINT_HEADER, schema_fingerprint(schema).encode()),
    ]


COUNTERS_V1 = {
    "link_id": "r1:eth1",
    "ts_ns": 1_700_000_000_100_000_000,
    "interval_ns": 100_000_000,
    "seq": 7,
    "packets": 1000,
    "bytes": 1_500_000,
    "data_packets": 990,
    "data_bytes": 1_480_000,
    "retransmissions": 3,
    "queue_delay_samples": 5,
    "queue_delay_sum_ns": 50_000,
    "queue_delay_ewma_ns": 123_456,
}


def _read_from(name: str, version: int, record: dict[str, Any]) -> dict[str, Any]:
    """`record` written by a writer of `version` (with its headers), read with the current
    schema."""
    schema, headers = _released_codec(name, version)
    out = io.BytesIO()
    schemaless_writer(out, schema, record)
    decoded: dict[str, Any] = codec(name).decode(out.getvalue(), headers)
    return decoded


def test_link_counters_v2_counts_the_after_tap_and_reads_v1_records_as_zero_there() -> None:
    """v2 adds what left the router (after_packets, after_bytes); a v1 exporter's record,
    known by its fingerprint, reads with both 0, and a v2 record keeps them."""
    (v1_version, v1), (v2_version, v2) = released_schemas(COUNTERS)[:2]
    assert (v1_version, v2_version) == (1, 2)
    assert check_backward(v2, v1) == []
    added = {f["name"] for f in v2["fields"]} - {f["name"] for f in v1["fields"]}
    assert added == {"after_packets", "after_bytes"}
    assert _read_from(COUNTERS, 1, COUNTERS_V1) == {
        **COUNTERS_V1, "after_packets": 0, "after_bytes": 0, **V3_DEFAULTS,
    }  # fmt: skip


V3_DEFAULTS = {"part": 0, "complete": True, "flow_events": [], "flows": [], "flow_index": []}
V3_DEFAULTS |= {"offset_ns": [], "rtt_ns": []}


def test_link_counters_v3_carries_the_intervals_events_and_samples_and_reads_v2_without() -> None:
    """v3 brings the interval's flow events and RTT samples into its counters' record; a v2
    record, known by its fingerprint, reads as a whole interval (one part, complete) with
    none."""
    (v2_version, v2), (v3_version, v3) = released_schemas(COUNTERS)[1:3]
    assert (v2_version, v3_version) == (2, 3)
    assert check_backward(v3, v2) == []
    added = {f["name"] for f in v3["fields"]} - {f["name"] for f in v2["fields"]}
    assert added == set(V3_DEFAULTS)
    v2_record = {**COUNTERS_V1, "after_packets": 960, "after_bytes": 1_430_000}
    assert _read_from(COUNTERS, 2, v2_record) == {**v2_record, **V3_DEFAULTS}


def test_link_metrics_v2_adds_the_offered_load_and_reads_v1_records_without_it() -> None:
    (v1_version, v1), (v2_version, v2) = released_schemas("LinkMetrics")[:2]
    assert (v1_version, v2_version) == (1, 2)
    assert check_backward(v2, v1) == []
    fields = {f["name"]: f for f in v2["fields"]}
    assert fields.keys() - {f["name"] for f in v1["fields"]} == {
        "offered_bps", "offered_utilisation",
    }  # fmt: skip
    assert all(fields[n]["default"] is None for n in ("offered_bps", "offered_utilisation"))
    assert "after-router tap" in fields["throughput_bps"]["doc"]
    assert "before-router tap" in fields["offered_bps"]["doc"]
    window = {
        "link_id": "r1:eth1", "window_start_ns": 0, "window_end_ns": 100_000_000,
        "rtt_samples": 0, "rtt_flows": 0, "rtt_hmean_ns": None, "srtt_ns": None,
        "rtt_min_ns": None, "long_flows": 0, "data_packets": 0, "retransmissions": 0,
        "loss_rate": 0.0, "loss_rate_ewma": 0.0, "queue_delay_samples": 0,
        "queue_delay_ns": None, "queue_delay_ewma_ns": None, "throughput_bps": 99_000_000,
        "utilisation": 0.99, "f": 0.0, "zscore": 0.0, "change": False, "buffer_bytes": None,
    }  # fmt: skip
    without_buffer = {k: v for k, v in window.items() if k != "buffer_bytes"}
    assert _read_from("LinkMetrics", 1, window) == {
        **without_buffer, "offered_bps": None, "offered_utilisation": None,
    }  # fmt: skip
    metrics = codec("LinkMetrics")
    now = {**without_buffer, "offered_bps": 104_000_000, "offered_utilisation": 1.04}
    assert metrics.decode(metrics.encode(now)) == now  # Flink's way: no headers


def test_link_metrics_v3_leaves_the_buffer_to_the_decisions_and_reads_v2_without_it() -> None:
    (v2_version, v2), (v3_version, v3) = released_schemas("LinkMetrics")[1:3]
    assert (v2_version, v3_version) == (2, 3)
    assert check_backward(v3, v2) == []
    assert {f["name"] for f in v2["fields"]} - {f["name"] for f in v3["fields"]} == {"buffer_bytes"}
    assert "BufferDecision" in v3["doc"]


def test_optimizer_link_state_v2_keeps_the_buffer_changes_and_reads_v1_as_none() -> None:
    (v1_version, v1), (v2_version, v2) = released_schemas("OptimizerLinkState")[:2]
    assert (v1_version, v2_version) == (1, 2)
    assert check_backward(v2, v1) == []
    v1_state = {
        "link_id": "r1:eth1", "ts_ns": 5, "owner": "opt-0", "epoch": 1, "policy": "static",
        "policy_state": "{}", "last_window_end_ns": 4, "intended": [], "in_force": [],
        "last_change_ns": 0, "fallback": False, "unapplied": [],
    }  # fmt: skip
    assert _read_from("OptimizerLinkState", 1, v1_state) == {**v1_state, "buffer_changes": []}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(interval_ns="fast"), "interval_ns"),
        (lambda r: r.pop("link_id"), "link_id"),
        (lambda r: r.update(rtt_ns=[1, "fast", 2]), "rtt_ns"),
        (
            lambda r: r.update(flows=[FLOW, {**FLOW, "src_port": 2**40}]),
            r"flows\[1\]\.src_port: 1099511627776 is outside",
        ),
        (lambda r: r.update(flow_index=[0, 2**31, 0]), r"flow_index\[1\]: 2147483648 is outside"),
        (lambda r: r.update(offset_ns=[0, 1, 2**63]), r"offset_ns\[2\]: 9223372036854775808 is"),
    ],
)
def test_encoding_a_bad_record_names_the_field(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    record = dict(INTERVAL)
    mutate(record)
    with pytest.raises(RecordError, match=message):
        codec(COUNTERS).encode(record)


def test_allowed_values_are_enforced_both_ways() -> None:
    """A flow event's kind and reason come from fixed sets: the codec writes no other
    value, and a consumer reading one gets a RecordError (a dead letter) naming it."""
    record = {**INTERVAL, "flow_events": [{**EVENT, "kind": "begin"}]}
    message = r"flow_events\[0\]\.kind: 'begin' is not one of end, start"
    with pytest.raises(RecordError, match=message):
        codec(COUNTERS).encode(record)
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(COUNTERS)), record)
    with pytest.raises(RecordError, match=message):
        codec(COUNTERS).decode(out.getvalue())


@pytest.mark.parametrize(
    ("data", "headers", "message"),
    [
        (b"\x01\x02", None, "undecodable"),
        (None, None, "tombstone"),
        (b"", None, "undecodable"),
        (codec(COUNTERS).encode(INTERVAL) + b"\x00", None, "1 trailing bytes"),
        (codec(COUNTERS).encode(INTERVAL), [(FINGERPRINT_HEADER, b"00ff")], "unknown writer"),
    ],
)
def test_decoding_garbage_is_a_record_error(
    data: bytes | None, headers: list[tuple[str, bytes]] | None, message: str
) -> None:
    with pytest.raises(RecordError, match=message):
        codec(COUNTERS).decode(data, headers)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rtt_ns": [1, 2]}, r"differ in length \(flow_index 3, offset_ns 3, rtt_ns 2\)"),
        ({"flow_index": [0, 2, 0]}, r"flow_index\[1\] = 2 is not a position in flows \(2 flows\)"),
        ({"flow_index": [0, 1, -1]}, r"flow_index\[2\] = -1 is not a position"),
        (
            {"offset_ns": [0, 100_000_000, 1]},
            r"offset_ns\[1\] = 100000000 is outside \[0, interval_ns = 100000000\)",
        ),
        ({"offset_ns": [-1, 0, 1]}, r"offset_ns\[0\] = -1 is outside"),
        (
            {"flow_events": [{**EVENT, "ts_ns": INTERVAL["ts_ns"]}]},
            r"flow_events\[0\]\.ts_ns = 1700000000200000000 is outside",
        ),
        ({"complete": False}, "flow events on a part that is not its interval's last"),
        (
            {"complete": False, "flow_events": []},
            r"counts \(packets, bytes, .*\) on a part that is not its interval's last",
        ),
    ],
)
def test_a_record_whose_parts_do_not_fit_together_is_refused_both_ways(
    change: dict[str, Any], message: str
) -> None:
    """Such a record fits the schema, but it cannot be read as an interval: the codec refuses
    to write it, and a consumer reading it gets a RecordError (a dead letter) naming why."""
    record = {**INTERVAL, **change}
    counters = codec(COUNTERS)
    with pytest.raises(RecordError, match=message):
        counters.encode(record)
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(COUNTERS)), record)
    with pytest.raises(RecordError, match=f"LinkCounters: .*{message}"):
        counters.decode(out.getvalue(), counters.headers)


def _counts(**counts: int) -> dict[str, int]:
    return {**NO_COUNTS, **counts}


def test_an_interval_is_one_record_with_its_counts_events_and_samples() -> None:
    """Samples and events wait for their interval's counters; each flow is listed once, in
    the order of its first sample; samples and events of the next interval wait for its
    counters; a record decodes to what was put in it."""
    flows = [FLOW, {**FLOW, "src_port": 40001}, {**FLOW, "dst_ip": "10.0.2.3"}]
    start = 1_700_000_000_100_000_000
    added = [
        {"ts_ns": start + 1000 * i, **flows[f], "rtt_ns": 20_000_000 + i}
        for i, f in enumerate([1, 0, 1, 2, 1])
    ]
    assembler = IntervalAssembler(interval_ns=100_000_000)
    assert [r for sample in added for r in assembler.add_sample("r1:eth1", sample)] == []
    assembler.add_event("r1:eth1", {**EVENT, "link_id": "r1:eth1"})
    assert assembler.add_sample("r1:eth1", {**SAMPLE, "ts_ns": start + 100_000_000}) == []
    assembler.add_event("r1:eth1", {**EVENT, "ts_ns": start + 100_000_000, "kind": "end"})
    (record,) = assembler.close("r1:eth1", start + 100_000_000, 100_000_000, _counts(bytes=9))
    assert record == {
        "link_id": "r1:eth1",
        "ts_ns": start + 100_000_000,
        "interval_ns": 100_000_000,
        "seq": 0,
        **_counts(bytes=9),
        "part": 0,
        "complete": True,
        "flow_events": [EVENT],
        "flows": [flows[1], flows[0], flows[2]],
        "flow_index": [0, 1, 0, 2, 0],
        "offset_ns": [0, 1000, 2000, 3000, 4000],
        "rtt_ns": [20_000_000, 20_000_001, 20_000_002, 20_000_003, 20_000_004],
    }
    assert samples_of(record) == [{"link_id": "r1:eth1", **s} for s in added]
    assert events_of(record) == [{"link_id": "r1:eth1", **EVENT}]
    assert codec(COUNTERS).decode(codec(COUNTERS).encode(record)) == record
    (second,) = assembler.close("r1:eth1", start + 200_000_000, 100_000_000, _counts())
    assert (second["seq"], second["rtt_ns"], second["flow_events"][0]["kind"]) == (
        1, [SAMPLE["rtt_ns"]], "end",
    )  # fmt: skip


def test_a_busy_interval_comes_in_parts_and_a_lost_intervals_samples_are_not_lost() -> None:
    """Parts of `max_samples` go as they fill, with zero counts; the counters' record
    completes the interval; samples of an interval whose counters never came go as a complete
    record of their own, with zero counts, before the next interval's; every record encodes,
    and `seq` counts them."""
    assembler = IntervalAssembler(interval_ns=10, max_samples=2)
    done = []
    for link, ts in [("a", 0), ("b", 5), ("a", 3), ("a", 9), ("a", 12), ("a", 25)]:
        done += assembler.add_sample(link, {**SAMPLE, "ts_ns": ts})
    assert [(r["ts_ns"], r["part"], r["complete"], r["rtt_ns"]) for r in done] == [
        (10, 0, False, [SAMPLE["rtt_ns"]] * 2),
    ]
    done += assembler.close("a", 10, 10, _counts(packets=3))
    done += assembler.close("a", 30, 10, _counts(packets=4))  # 20's counters were lost
    done += assembler.close("b", 10, 10, _counts())
    offsets = [(r["link_id"], r["ts_ns"], r["part"], r["complete"], r["packets"], r["offset_ns"])
               for r in done]  # fmt: skip
    assert offsets == [
        ("a", 10, 0, False, 0, [0, 3]),
        ("a", 10, 1, True, 3, [9]),
        ("a", 20, 0, True, 0, [2]),
        ("a", 30, 0, True, 4, [5]),
        ("b", 10, 0, True, 0, [5]),
    ]
    assert [r["seq"] for r in done] == [0, 1, 2, 3, 0]
    for record in done:
        assert codec(COUNTERS).decode(codec(COUNTERS).encode(record)) == record
    assembler.add_sample("a", {**SAMPLE, "ts_ns": 31})
    (left,) = assembler.close_all()
    assert (left["ts_ns"], left["complete"], left["packets"], left["seq"]) == (40, True, 0, 4)


def test_a_longer_or_a_last_shorter_interval_takes_what_came_before_its_end() -> None:
    """After a jump of the clock the data plane closes one long interval, and at exit a short
    one ending at its last packet: their record holds the samples before their end, offsets
    from their own start."""
    assembler = IntervalAssembler(interval_ns=10)
    for ts in (12, 25, 31, 36):
        assembler.add_sample("a", {**SAMPLE, "ts_ns": ts})
    (long,) = assembler.close("a", 30, 20, _counts())
    (last,) = assembler.close("a", 33, 3, _counts())
    assert (long["offset_ns"], last["offset_ns"]) == ([2, 15], [1])
    (left,) = assembler.close_all()
    assert (left["ts_ns"], left["offset_ns"]) == (40, [6])


def test_the_last_short_interval_numbers_its_part_on_and_leaves_nothing_behind() -> None:
    """At exit the data plane closes [start, last packet + 1): its record takes the samples
    of the grid interval it ends in, numbered after the part that interval sent, and nothing
    of it is left for `close_all`; what it does not take (an idle end stamped with its
    end, which belongs to the next interval) goes after it, numbered on."""
    assembler = IntervalAssembler(interval_ns=10, max_samples=2)
    parts = [r for ts in (31, 32, 33) for r in assembler.add_sample("a", {**SAMPLE, "ts_ns": ts})]
    (last,) = assembler.close("a", 34, 4, _counts(packets=1))
    assert [(r["ts_ns"], r["part"], r["complete"]) for r in [*parts, last]] == [
        (40, 0, False),
        (34, 1, True),
    ]
    assert assembler.close_all() == []
    assembler.add_sample("b", {**SAMPLE, "ts_ns": 31})
    assembler.add_event("b", {**EVENT, "ts_ns": 34, "kind": "end"})
    (last,) = assembler.close("b", 34, 4, _counts())
    (after,) = assembler.close_all()
    assert [(r["ts_ns"], r["part"], len(r["flow_events"])) for r in (last, after)] == [
        (34, 0, 0),
        (40, 1, 1),
    ]


# A LinkMetrics window as the metrics job writes it.
WINDOW = {
    "link_id": "r1:eth1",
    "window_start_ns": 1_700_000_000_000_000_000,
    "window_end_ns": 1_700_000_000_500_000_000,
    "rtt_samples": 400, "rtt_flows": 50, "rtt_hmean_ns": 30_000_000, "srtt_ns": 30_000_000,
    "rtt_min_ns": 20_000_000, "long_flows": 50, "data_packets": 4000, "retransmissions": 4,
    "loss_rate": 0.001, "loss_rate_ewma": 0.001, "queue_delay_samples": 400,
    "queue_delay_ns": 10_000_000, "queue_delay_ewma_ns": 10_000_000,
    "throughput_bps": 95_000_000, "utilisation": 0.95, "offered_bps": 99_000_000,
    "offered_utilisation": 0.99, "f": -0.3, "zscore": 0.5, "change": False,
}  # fmt: skip
STATE = {
    "link_id": "r1:eth1", "ts_ns": 1, "owner": "o", "epoch": 1, "policy": "p4bs",
    "policy_state": "{}", "last_window_end_ns": 0, "intended": [], "in_force": [],
    "last_change_ns": 0, "buffer_changes": [], "fallback": False,
    "unapplied": [{"queue": 0, "buffer_bytes": 100_000, "phase": "optimise", "reason": "r",
                   "trial": 1, "f": -0.2, "flows": [], "window_end_ns": 5}],
}  # fmt: skip
SPEC = {
    "link_id": "r1:eth1", "ts_ns": 1, "removed": False, "capacity_bps": 100_000_000,
    "max_queue_delay_ns": 10_000_000, "max_loss": 0.01, "weight_loss": 1.0,
    "weight_delay": 1.0, "config": "{}",
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "record", "change", "message"),
    [
        ("LinkMetrics", WINDOW, {"f": math.nan}, r"LinkMetrics\.f: nan is not a finite number"),
        ("LinkMetrics", WINDOW, {"zscore": -math.inf}, r"LinkMetrics\.zscore: -inf is not a"),
        (
            "LinkMetrics",
            WINDOW,
            {"loss_rate": 1.5},
            r"LinkMetrics\.loss_rate: 1\.5 is outside \[0, 1\]",
        ),
        ("LinkMetrics", WINDOW, {"utilisation": math.inf}, r"utilisation: inf is not a finite"),
        ("LinkMetrics", WINDOW, {"srtt_ns": -1}, r"LinkMetrics\.srtt_ns: -1 is outside \[0, inf\)"),
        ("LinkMetrics", WINDOW, {"long_flows": -3}, r"long_flows: -3 is outside"),
        ("LinkMetrics", WINDOW, {"window_end_ns": WINDOW["window_start_ns"]}, r"is not after"),
        (
            "OptimizerLinkState",
            STATE,
            {"unapplied": [{**STATE["unapplied"][0], "f": math.nan}]},
            r"OptimizerLinkState\.unapplied\[0\]\.f: nan is not a finite number",
        ),
        (
            "OptimizerLinkState",
            STATE,
            {"intended": [{"queue": 0, "buffer_bytes": -1}]},
            r"intended\[0\]\.buffer_bytes: -1 is outside",
        ),
        ("LinkSpec", SPEC, {"max_loss": 0.0}, r"LinkSpec\.max_loss: 0\.0 is outside \(0, 1\]"),
        ("LinkSpec", SPEC, {"capacity_bps": 0}, r"LinkSpec\.capacity_bps: 0 is outside \(0, inf\)"),
        ("LinkSpec", SPEC, {"weight_loss": math.nan}, r"weight_loss: nan is not a finite"),
        ("BufferDecision", None, {"buffer_bytes": -5}, r"BufferDecision\.buffer_bytes: -5 is"),
        ("LinkCounters", INTERVAL, {"rtt_ns": [1, -2, 3]}, r"LinkCounters\.rtt_ns\[1\]: -2 is"),
        ("LinkCounters", INTERVAL, {"retransmissions": -1}, r"retransmissions: -1 is outside"),
    ],
)
def test_a_value_its_field_cannot_hold_is_refused_both_ways_naming_field_and_value(
    name: str, record: dict[str, Any] | None, change: dict[str, Any], message: str
) -> None:
    """NaN, infinite, negative or out-of-range values fit the Avro types but not what the
    field measures: the codec does not write them, and a consumer reading one written by
    another writer gets a RecordError (its dead letter's reason) naming field and value."""
    bad = {**(record if record is not None else DECISION), **change}
    with pytest.raises(RecordError, match=message):
        codec(name).encode(bad)
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(name)), bad)
    with pytest.raises(RecordError, match=message):
        codec(name).decode(out.getvalue())


DECISION = {
    "link_id": "r1:eth1", "ts_ns": 1, "queue": 0, "policy": "p4bs", "phase": "optimise",
    "buffer_bytes": 100_000, "previous_buffer_bytes": None, "reason": "r", "trial": None,
    "outcome": "applied", "f": None, "window_end_ns": None, "owner": None, "epoch": None,
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "record"),
    [("LinkMetrics", WINDOW), ("OptimizerLinkState", STATE), ("LinkSpec", SPEC),
     ("BufferDecision", DECISION), ("LinkCounters", INTERVAL)],
)  # fmt: skip
def test_values_within_their_ranges_round_trip(name: str, record: dict[str, Any]) -> None:
    assert codec(name).decode(codec(name).encode(record)) == record


ODD_VALUES = [0, 1, 7, 0.5, 1.0, 1.5, -1, -0.25, math.nan, math.inf, -math.inf, None, True, "x"]


@pytest.mark.parametrize(
    ("name", "record"),
    [("LinkMetrics", WINDOW), ("LinkSpec", SPEC), ("LinkCounters", INTERVAL),
     ("OptimizerLinkState", STATE), ("BufferDecision", DECISION)],
)  # fmt: skip
def test_the_fast_range_check_finds_what_the_field_by_field_one_finds(
    name: str, record: dict[str, Any]
) -> None:
    """RangeCheck decides the usual record per range at once and leaves the rest to
    range_problem: on records with up to three fields, or fields of an array's first item,
    set to odd values (NaN, infinities, negatives, fractions above 1, nulls, a bool, a
    string) or removed, it returns exactly what range_problem returns."""
    schema = current_schema(name)
    ranges = field_ranges(name, schema)
    check = RangeCheck(name, ranges, nullable_fields(schema))
    rng = random.Random(41)
    places = [(field, None) for field in record] + [
        (field, key)
        for field, value in record.items()
        if isinstance(value, list) and value and isinstance(value[0], dict)
        for key in value[0]
    ]
    problems = 0
    for _ in range(3000):
        changed = copy.deepcopy(record)
        for field, key in rng.sample(places, rng.randint(1, 3)):
            items = changed.get(field)
            if key is not None and not (isinstance(items, list) and items):
                continue  # the array itself was changed first
            where = changed if key is None else items[0]
            name_there = field if key is None else key
            if rng.random() < 0.1:
                where.pop(name_there, None)
            else:
                where[name_there] = rng.choice(ODD_VALUES)
        expected = range_problem(name, ranges, changed)
        assert check.problem(changed) == expected, changed
        problems += expected is not None
    assert check.problem(record) is None
    assert 500 < problems < 3000  # both kinds were tried


ODD_INTS = [0, 7, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1, None, "x", 1.5]


@pytest.mark.parametrize(
    ("name", "record"),
    [("LinkMetrics", WINDOW), ("LinkCounters", INTERVAL), ("OptimizerLinkState", STATE),
     ("BufferDecision", DECISION)],
)  # fmt: skip
def test_the_fast_int_bound_check_refuses_what_the_field_by_field_one_refuses(
    name: str, record: dict[str, Any]
) -> None:
    """The codec checks the top-level int and long fields at once before writing: with up to
    three fields set to values beyond int or long, nulls or not numbers, its decision is the
    field-by-field check's (which names the value)."""
    encoder = codec(name)
    rng = random.Random(42)
    refused = 0
    for _ in range(2000):
        changed = dict(record)
        for field in rng.sample(list(record), rng.randint(1, 3)):
            changed[field] = rng.choice(ODD_INTS)
        try:
            encoder._check_bound(encoder._bounds, changed, name)
            expected = None
        except RecordError as exc:
            expected = str(exc)
        fast_ok = encoder._ints_within(changed)
        if fast_ok:
            try:
                encoder._check_bound(encoder._nested_bounds, changed, name)
                got = None
            except RecordError as exc:
                got = str(exc)
            assert got == expected, changed
        refused += expected is not None
    assert 100 < refused < 2000  # both kinds were tried
