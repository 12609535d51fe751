"""Schemas: committed versions stay readable, the checker catches breaking changes, the codec
round-trips records and turns bad input into RecordError naming what is wrong."""

from __future__ import annotations

import copy
import io
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
from p4bs_schemas.registry import STREAMS, Schema, current_schema, released_schemas, schema_names
from p4bs_schemas.rtt_batch import RttBatcher, samples_of

FLOW = {
    "src_ip": "10.0.1.2",
    "dst_ip": "10.0.2.2",
    "src_port": 40000,
    "dst_port": 5201,
    "protocol": 6,
}
SAMPLE = {"ts_ns": 1_700_000_000_123_456_789, **FLOW, "rtt_ns": 21_500_000}
RTT = {
    "link_id": "r1:eth1",
    "ts_ns": 1_700_000_000_130_000_000,
    "interval_ns": 10_000_000,
    "flows": [FLOW, {**FLOW, "src_port": 40001}],
    "flow_index": [0, 1, 0],
    "offset_ns": [3_456_789, 3_456_790, 9_999_999],
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


# Changes of FlowEvent (flat), and of RttSampleBatch's arrays of numbers and of records.
BREAKING: dict[str, tuple[str, Change]] = {
    "new field without default": (
        "FlowEvent",
        lambda s: s["fields"].append({"name": "x", "type": "long"}),
    ),
    "long narrowed to int": ("FlowEvent", lambda s: _field(s, "ts_ns").update(type="int")),
    "string to long": ("FlowEvent", lambda s: _field(s, "src_ip").update(type="long")),
    "allowed value removed": (
        "FlowEvent",
        lambda s: _field(s, "kind").update(allowed=["start"]),
    ),
    "long to boolean": ("FlowEvent", lambda s: _field(s, "packets").update(type="boolean")),
    "array items narrowed long to int": (
        "RttSampleBatch",
        lambda s: _field(s, "rtt_ns")["type"].update(items="int"),
    ),
    "array of numbers to array of strings": (
        "RttSampleBatch",
        lambda s: _field(s, "flow_index")["type"].update(items="string"),
    ),
    "array item record: new field without default": (
        "RttSampleBatch",
        lambda s: _items(s, "flows")["fields"].append({"name": "x", "type": "long"}),
    ),
}
COMPATIBLE: dict[str, tuple[str, Change]] = {
    "new field with default": (
        "FlowEvent",
        lambda s: s["fields"].append({"name": "x", "type": ["null", "long"], "default": None}),
    ),
    "field removed": ("FlowEvent", lambda s: s["fields"].pop()),
    "int widened to long": ("FlowEvent", lambda s: _field(s, "src_port").update(type="long")),
    "allowed value added": (
        "FlowEvent",
        lambda s: _field(s, "kind").update(allowed=["start", "end", "x"]),
    ),
    "field made nullable": (
        "FlowEvent",
        lambda s: _field(s, "packets").update(type=["null", "long"]),
    ),
    "array items widened int to long": (
        "RttSampleBatch",
        lambda s: _field(s, "flow_index")["type"].update(items="long"),
    ),
    "array item record: field removed": (
        "RttSampleBatch",
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
    rtt = codec("RttSampleBatch")
    data = rtt.encode(RTT)
    assert rtt.decode(data, rtt.headers) == RTT
    assert rtt.decode(data) == RTT  # no headers: Flink-written, current schema
    assert dict(rtt.headers)[FINGERPRINT_HEADER] == rtt.fingerprint.encode()


def test_codec_reads_an_older_writer_by_fingerprint() -> None:
    """A v2 reader with a new defaulted field reads v1 data, found by its fingerprint."""
    v1 = current_schema("RttSampleBatch")
    v2 = copy.deepcopy(v1)
    v2["fields"].append({"name": "seq", "type": ["null", "long"], "default": None, "doc": "x"})
    reader = Codec("RttSampleBatch")
    reader.schema = parse_schema(v2)
    data = codec("RttSampleBatch").encode(RTT)
    assert reader.decode(data, codec("RttSampleBatch").headers) == {**RTT, "seq": None}


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


def _read_from_v1(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """`record` written by a v1 writer (with its headers), read with the current schema."""
    schema, headers = _released_codec(name, 1)
    out = io.BytesIO()
    schemaless_writer(out, schema, record)
    decoded: dict[str, Any] = codec(name).decode(out.getvalue(), headers)
    return decoded


def test_link_counters_v2_counts_the_after_tap_and_reads_v1_records_as_zero_there() -> None:
    """v2 adds what left the router (after_packets, after_bytes); a v1 exporter's record,
    known by its fingerprint, reads with both 0, and a v2 record keeps them."""
    (v1_version, v1), (v2_version, v2) = released_schemas("LinkCounters")[-2:]
    assert (v1_version, v2_version) == (1, 2)
    assert check_backward(v2, v1) == []
    added = {f["name"] for f in v2["fields"]} - {f["name"] for f in v1["fields"]}
    assert added == {"after_packets", "after_bytes"}
    assert _read_from_v1("LinkCounters", COUNTERS_V1) == {
        **COUNTERS_V1, "after_packets": 0, "after_bytes": 0,
    }  # fmt: skip
    counters = codec("LinkCounters")
    now = {**COUNTERS_V1, "after_packets": 960, "after_bytes": 1_430_000}
    assert counters.decode(counters.encode(now), counters.headers) == now


def test_link_metrics_v2_adds_the_offered_load_and_reads_v1_records_without_it() -> None:
    (v1_version, v1), (v2_version, v2) = released_schemas("LinkMetrics")[-2:]
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
    assert _read_from_v1("LinkMetrics", window) == {
        **window, "offered_bps": None, "offered_utilisation": None,
    }  # fmt: skip
    metrics = codec("LinkMetrics")
    now = {**window, "offered_bps": 104_000_000, "offered_utilisation": 1.04}
    assert metrics.decode(metrics.encode(now)) == now  # Flink's way: no headers


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
    record = dict(RTT)
    mutate(record)
    with pytest.raises(RecordError, match=message):
        codec("RttSampleBatch").encode(record)


def test_allowed_values_are_enforced_both_ways() -> None:
    event = {
        "link_id": "r1:eth1",
        "ts_ns": 1,
        "kind": "begin",
        "reason": "threshold",
        "src_ip": "a",
        "dst_ip": "b",
        "src_port": 1,
        "dst_port": 2,
        "protocol": 6,
        "packets": 9,
    }
    with pytest.raises(RecordError, match=r"FlowEvent\.kind: 'begin' is not one of end, start"):
        codec("FlowEvent").encode(event)
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema("FlowEvent")), event)
    with pytest.raises(RecordError, match="not one of"):
        codec("FlowEvent").decode(out.getvalue())


@pytest.mark.parametrize(
    ("data", "headers", "message"),
    [
        (b"\x01\x02", None, "undecodable"),
        (None, None, "tombstone"),
        (b"", None, "undecodable"),
        (codec("RttSampleBatch").encode(RTT) + b"\x00", None, "1 trailing bytes"),
        (codec("RttSampleBatch").encode(RTT), [(FINGERPRINT_HEADER, b"00ff")], "unknown writer"),
    ],
)
def test_decoding_garbage_is_a_record_error(
    data: bytes | None, headers: list[tuple[str, bytes]] | None, message: str
) -> None:
    with pytest.raises(RecordError, match=message):
        codec("RttSampleBatch").decode(data, headers)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"rtt_ns": [1, 2]}, r"differ in length \(flow_index 3, offset_ns 3, rtt_ns 2\)"),
        ({"flow_index": [], "offset_ns": [], "rtt_ns": []}, "no samples"),
        ({"flow_index": [0, 2, 0]}, r"flow_index\[1\] = 2 is not a position in flows \(2 flows\)"),
        ({"flow_index": [0, 1, -1]}, r"flow_index\[2\] = -1 is not a position"),
        (
            {"offset_ns": [0, 10_000_000, 1]},
            r"offset_ns\[1\] = 10000000 is outside \[0, interval_ns = 10000000\)",
        ),
        ({"offset_ns": [-1, 0, 1]}, r"offset_ns\[0\] = -1 is outside"),
    ],
)
def test_a_batch_whose_columns_do_not_fit_together_is_refused_both_ways(
    columns: dict[str, list[int]], message: str
) -> None:
    """Such a batch fits the schema, but its samples cannot be read: the codec refuses to
    write it, and a consumer reading it gets a RecordError (a dead letter) naming why."""
    batch = {**RTT, **columns}
    rtt = codec("RttSampleBatch")
    with pytest.raises(RecordError, match=message):
        rtt.encode(batch)
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema("RttSampleBatch")), batch)
    with pytest.raises(RecordError, match=f"RttSampleBatch: .*{message}"):
        rtt.decode(out.getvalue(), rtt.headers)


def test_rtt_batches_hold_one_interval_of_one_link_and_split_when_full() -> None:
    batcher = RttBatcher(interval_ns=10, max_samples=3)
    done = []
    for link, ts in [("a", 0), ("b", 5), ("a", 9), ("a", 9), ("a", 9), ("a", 10), ("a", 35)]:
        done += batcher.add(link, {**SAMPLE, "ts_ns": ts})
    # "a" at 9 filled the first batch; 10 starts the next interval, 35 the one after.
    assert [(b["link_id"], b["ts_ns"], [s["ts_ns"] for s in samples_of(b)]) for b in done] == [
        ("a", 10, [0, 9, 9]),
        ("a", 10, [9]),
        ("a", 20, [10]),
    ]
    assert [(b["link_id"], b["ts_ns"]) for b in batcher.close(10)] == [("b", 10)]
    assert batcher.close(39) == []
    (last,) = batcher.close()
    assert last["ts_ns"] == 40 and last["interval_ns"] == 10
    assert samples_of(last) == [{"link_id": "a", **SAMPLE, "ts_ns": 35}]
    assert batcher.close() == []
    for batch in done:
        assert codec("RttSampleBatch").decode(codec("RttSampleBatch").encode(batch)) == batch


def test_a_batch_lists_each_flow_once_in_the_order_of_its_first_sample() -> None:
    flows = [FLOW, {**FLOW, "src_port": 40001}, {**FLOW, "dst_ip": "10.0.2.3"}]
    start = 1_700_000_000_120_000_000
    added = [
        {"ts_ns": start + 1000 * i, **flows[f], "rtt_ns": 20_000_000 + i}
        for i, f in enumerate([1, 0, 1, 2, 1])
    ]
    batcher = RttBatcher(interval_ns=10_000_000)
    assert [b for sample in added for b in batcher.add("r1:eth1", sample)] == []
    (batch,) = batcher.close()
    assert batch == {
        "link_id": "r1:eth1",
        "ts_ns": start + 10_000_000,
        "interval_ns": 10_000_000,
        "flows": [flows[1], flows[0], flows[2]],
        "flow_index": [0, 1, 0, 2, 0],
        "offset_ns": [0, 1000, 2000, 3000, 4000],
        "rtt_ns": [20_000_000, 20_000_001, 20_000_002, 20_000_003, 20_000_004],
    }
    assert samples_of(batch) == [{"link_id": "r1:eth1", **s} for s in added]
    assert codec("RttSampleBatch").decode(codec("RttSampleBatch").encode(batch)) == batch
