"""Schemas: committed versions stay readable, the checker catches breaking changes, the codec
round-trips records and turns bad input into RecordError naming what is wrong."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from p4bs_schemas.codec import FINGERPRINT_HEADER, Codec, RecordError, codec, schema_fingerprint
from p4bs_schemas.compat import check_backward
from p4bs_schemas.registry import STREAMS, Schema, current_schema, released_schemas, schema_names
from p4bs_schemas.rtt_batch import RttBatcher, samples_of

SAMPLE = {
    "ts_ns": 1_700_000_000_123_456_789,
    "src_ip": "10.0.1.2",
    "dst_ip": "10.0.2.2",
    "src_port": 40000,
    "dst_port": 5201,
    "protocol": 6,
    "rtt_ns": 21_500_000,
}
RTT = {
    "link_id": "r1:eth1",
    "ts_ns": 1_700_000_000_130_000_000,
    "interval_ns": 10_000_000,
    "samples": [SAMPLE, {**SAMPLE, "ts_ns": SAMPLE["ts_ns"] + 1, "rtt_ns": 7}],
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


def _evolve(change: Callable[[Schema], None]) -> tuple[Schema, Schema]:
    old = current_schema("FlowEvent")
    new = copy.deepcopy(old)
    change(new)
    return new, old


def _field(schema: Schema, name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


BREAKING = {
    "new field without default": lambda s: s["fields"].append({"name": "x", "type": "long"}),
    "long narrowed to int": lambda s: _field(s, "ts_ns").update(type="int"),
    "string to long": lambda s: _field(s, "src_ip").update(type="long"),
    "allowed value removed": lambda s: _field(s, "kind").update(allowed=["start"]),
    "long to boolean": lambda s: _field(s, "packets").update(type="boolean"),
}
COMPATIBLE = {
    "new field with default": lambda s: s["fields"].append(
        {"name": "x", "type": ["null", "long"], "default": None}
    ),
    "field removed": lambda s: s["fields"].pop(),
    "int widened to long": lambda s: _field(s, "src_port").update(type="long"),
    "allowed value added": lambda s: _field(s, "kind").update(allowed=["start", "end", "x"]),
    "field made nullable": lambda s: _field(s, "packets").update(type=["null", "long"]),
}


@pytest.mark.parametrize("change", list(BREAKING), ids=list(BREAKING))
def test_checker_rejects_breaking_changes(change: str) -> None:
    assert check_backward(*_evolve(BREAKING[change]))


@pytest.mark.parametrize("change", list(COMPATIBLE), ids=list(COMPATIBLE))
def test_checker_accepts_compatible_changes(change: str) -> None:
    assert check_backward(*_evolve(COMPATIBLE[change])) == []


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


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(interval_ns="fast"), "interval_ns"),
        (lambda r: r.pop("link_id"), "link_id"),
        (lambda r: r.update(samples=[{**SAMPLE, "rtt_ns": "fast"}]), "rtt_ns"),
        (
            lambda r: r.update(samples=[SAMPLE, {**SAMPLE, "src_port": 2**40}]),
            r"samples\[1\]\.src_port",
        ),
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


def test_rtt_batches_hold_one_interval_of_one_link_and_split_when_full() -> None:
    batcher = RttBatcher(interval_ns=10, max_samples=3)
    done = []
    for link, ts in [("a", 0), ("b", 5), ("a", 9), ("a", 9), ("a", 9), ("a", 10), ("a", 35)]:
        done += batcher.add(link, {**SAMPLE, "ts_ns": ts})
    # "a" at 9 filled the first batch; 10 starts the next interval, 35 the one after.
    assert [(b["link_id"], b["ts_ns"], [s["ts_ns"] for s in b["samples"]]) for b in done] == [
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
