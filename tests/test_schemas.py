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

RTT = {
    "link_id": "r1:eth1",
    "ts_ns": 1_700_000_000_123_456_789,
    "src_ip": "10.0.1.2",
    "dst_ip": "10.0.2.2",
    "src_port": 40000,
    "dst_port": 5201,
    "protocol": 6,
    "rtt_ns": 21_500_000,
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
    rtt = codec("RttSample")
    data = rtt.encode(RTT)
    assert rtt.decode(data, rtt.headers) == RTT
    assert rtt.decode(data) == RTT  # no headers: Flink-written, current schema
    assert dict(rtt.headers)[FINGERPRINT_HEADER] == rtt.fingerprint.encode()


def test_codec_reads_an_older_writer_by_fingerprint() -> None:
    """A v2 reader with a new defaulted field reads v1 data, found by its fingerprint."""
    v1 = current_schema("RttSample")
    v2 = copy.deepcopy(v1)
    v2["fields"].append({"name": "seq", "type": ["null", "long"], "default": None, "doc": "x"})
    reader = Codec("RttSample")
    reader.schema = parse_schema(v2)
    data = codec("RttSample").encode(RTT)
    assert reader.decode(data, codec("RttSample").headers) == {**RTT, "seq": None}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(rtt_ns="fast"), "rtt_ns"),
        (lambda r: r.pop("link_id"), "link_id"),
        (lambda r: r.update(src_port=2**40), "src_port"),
    ],
)
def test_encoding_a_bad_record_names_the_field(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    record = dict(RTT)
    mutate(record)
    with pytest.raises(RecordError, match=message):
        codec("RttSample").encode(record)


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
        (codec("RttSample").encode(RTT) + b"\x00", None, "1 trailing bytes"),
        (codec("RttSample").encode(RTT), [(FINGERPRINT_HEADER, b"00ff")], "unknown writer"),
    ],
)
def test_decoding_garbage_is_a_record_error(
    data: bytes | None, headers: list[tuple[str, bytes]] | None, message: str
) -> None:
    with pytest.raises(RecordError, match=message):
        codec("RttSample").decode(data, headers)
