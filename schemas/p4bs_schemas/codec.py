"""Encoding and decoding of p4bs records: schemaless Avro binary plus two Kafka headers.

The value is plain Avro binary (no container, no registry prefix) so that Flink's `avro`
format reads and writes the same bytes. The writer's schema travels beside it in headers
(`p4bs-schema`, `p4bs-fingerprint` = CRC-64-AVRO of its canonical form); a reader resolves
old versions by fingerprint. A record without headers (Flink writes none) is read with the
current schema of its stream.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form
from fastavro.validation import ValidationError, validate

from p4bs_schemas.intervals import layout_problem
from p4bs_schemas.ranges import RangeCheck, field_groups, field_ranges, nullable_fields
from p4bs_schemas.registry import Schema, current_schema, released_schemas

SCHEMA_HEADER = "p4bs-schema"
FINGERPRINT_HEADER = "p4bs-fingerprint"

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None]


class RecordError(ValueError):
    """A record that does not fit its schema: what is wrong, never a crash."""


def schema_fingerprint(schema: Schema) -> str:
    return str(fingerprint(to_parsing_canonical_form(parse_schema(schema)), "CRC-64-AVRO"))


# fastavro writes any Python int as a varint: out-of-range values would be read back wrong.
_INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _allowed_values(schema: Schema) -> dict[str, frozenset[str]]:
    return {f["name"]: frozenset(f["allowed"]) for f in schema["fields"] if "allowed" in f}


@dataclass(frozen=True)
class _Items:
    """The bound of every item of an array: a number's range, or a record's field ranges."""

    bound: Bound


# A field's bound: (low, high) of an int/long, a record's fields by name, or an array's items.
Bound = tuple[int, int] | dict[str, "Bound"] | _Items


def _bound(avro_type: Any) -> Bound | None:
    types = avro_type if isinstance(avro_type, list) else [avro_type]
    ranges = [_INT_RANGES[t] for t in types if isinstance(t, str) and t in _INT_RANGES]
    if ranges:
        return ranges[-1]
    if isinstance(avro_type, dict) and avro_type["type"] == "record":
        return _field_bounds(avro_type["fields"])
    if isinstance(avro_type, dict) and avro_type["type"] == "array":
        items = _bound(avro_type["items"])
        return None if items is None else _Items(items)
    return None


def _field_bounds(fields: list[dict[str, Any]]) -> dict[str, Bound]:
    bounds = {f["name"]: _bound(f["type"]) for f in fields}
    return {name: bound for name, bound in bounds.items() if bound is not None}


def _within(numbers: Sequence[Any], bound: tuple[int, int]) -> bool:
    """True if every item is a number within the bound; False also when unsure (no items,
    items that do not compare), which leaves it to the item by item check."""
    try:
        return bool(numbers) and bound[0] <= min(numbers) and max(numbers) <= bound[1]
    except TypeError:
        return False


# Invariants between fields that a schema cannot state, per schema: a record breaking them
# fits the schema, but its readers would misread it.
_LAYOUT_CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "LinkCounters": layout_problem,
    "LinkMetrics": lambda r: (
        None
        if r["window_end_ns"] > r["window_start_ns"]
        else f"window_end_ns {r['window_end_ns']} is not after window_start_ns "
        f"{r['window_start_ns']}"
    ),
}


class Codec:
    """Encoder/decoder for one record schema, knowing all its released versions."""

    def __init__(self, name: str) -> None:
        self.name = name
        raw = current_schema(name)
        self.schema = parse_schema(raw)
        self.fingerprint = schema_fingerprint(raw)
        self._allowed = _allowed_values(raw)
        self._bounds = _field_bounds(raw["fields"])
        # The top-level int and long fields sharing a bound, checked at once as a record is
        # written (one per decision and state saved); records and arrays field by field.
        nullable = nullable_fields(raw)
        self._flat_bounds = field_groups(
            {f: b for f, b in self._bounds.items() if isinstance(b, tuple)}, nullable
        )
        self._nested_bounds: dict[str, Bound] = {
            f: b for f, b in self._bounds.items() if not isinstance(b, tuple)
        }
        self._ranges = RangeCheck(name, field_ranges(name, raw), nullable)
        self._layout_problem = _LAYOUT_CHECKS.get(name)
        self._writers = {schema_fingerprint(s): parse_schema(s) for _, s in released_schemas(name)}
        self._writers[self.fingerprint] = self.schema
        self.headers: list[tuple[str, str | bytes | None]] = [
            (SCHEMA_HEADER, f"{raw['namespace']}.{raw['name']}".encode()),
            (FINGERPRINT_HEADER, self.fingerprint.encode()),
        ]

    def _check_allowed(self, record: dict[str, Any]) -> None:
        for field, allowed in self._allowed.items():
            if record.get(field) not in allowed:
                raise RecordError(
                    f"{self.name}.{field}: {record.get(field)!r} is not one of "
                    f"{', '.join(sorted(allowed))}"
                )

    def _check_ranges(self, record: dict[str, Any]) -> None:
        problem = self._ranges.problem(record)
        if problem is not None:
            raise RecordError(problem)

    def encode(self, record: dict[str, Any]) -> bytes:
        self._check_allowed(record)
        if self._ints_within(record):
            self._check_bound(self._nested_bounds, record, self.name)
        else:  # one is not (or not surely): the field by field check names it
            self._check_bound(self._bounds, record, self.name)
        self._check_ranges(record)
        out = io.BytesIO()
        try:
            schemaless_writer(out, self.schema, record)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise RecordError(self._explain(record, exc)) from exc
        self._check_layout(record)
        return out.getvalue()

    def _ints_within(self, record: dict[str, Any]) -> bool:
        """Every top-level int and long field within its bound, decided at C speed; False
        also when unsure (a field absent, a value not a number)."""
        try:
            for values_of, may_be_null, bound in self._flat_bounds:
                values: Sequence[Any] = values_of(record)
                if may_be_null:
                    values = [v for v in values if v is not None]
                if values and not _within(values, bound):
                    return False
        except KeyError:
            return False
        return True

    def _check_bound(self, bound: Bound, value: Any, where: str) -> None:
        """Values of the wrong type are left to the writer, which names them."""
        if isinstance(bound, _Items):
            items = value if isinstance(value, list) else []
            if isinstance(bound.bound, tuple) and _within(items, bound.bound):
                return  # the usual case, at C speed: an interval record has three such arrays
            for i, item in enumerate(items):
                self._check_bound(bound.bound, item, f"{where}[{i}]")
        elif isinstance(bound, dict):
            for name, field_bound in bound.items():
                if isinstance(value, dict):
                    self._check_bound(field_bound, value.get(name), f"{where}.{name}")
        elif isinstance(value, int) and not bound[0] <= value <= bound[1]:
            raise RecordError(f"{where}: {value} is outside [{bound[0]}, {bound[1]}]")

    def _check_layout(self, record: dict[str, Any]) -> None:
        if self._layout_problem is None:
            return
        problem = self._layout_problem(record)
        if problem is not None:
            raise RecordError(f"{self.name}: {problem}")

    def _explain(self, record: dict[str, Any], exc: Exception) -> str:
        """The writer's own errors are terse; the validator names the field."""
        try:
            validate(record, self.schema, raise_errors=True)
        except ValidationError as err:
            return f"{self.name}: " + "; ".join(str(e) for e in err.errors)
        return f"{self.name}: {type(exc).__name__}: {exc}"

    def decode(self, data: bytes | None, headers: Headers | None = None) -> dict[str, Any]:
        if data is None:
            raise RecordError(f"{self.name}: empty value (tombstone)")
        writer = self.schema
        header_map = dict(headers or {})
        if FINGERPRINT_HEADER in header_map:
            fp = header_map[FINGERPRINT_HEADER]
            fp_text = fp.decode(errors="replace") if isinstance(fp, bytes) else str(fp)
            if fp_text not in self._writers:
                raise RecordError(f"{self.name}: unknown writer schema fingerprint {fp_text}")
            writer = self._writers[fp_text]
        buf = io.BytesIO(data)
        try:
            record = schemaless_reader(buf, writer, self.schema)
        except Exception as exc:  # fastavro raises many kinds on garbage input
            raise RecordError(
                f"{self.name}: undecodable ({len(data)} bytes): {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(record, dict):
            raise RecordError(f"{self.name}: decoded to {type(record).__name__}, not a record")
        if buf.tell() != len(data):
            raise RecordError(
                f"{self.name}: {len(data) - buf.tell()} trailing bytes after the record"
            )
        self._check_allowed(record)
        self._check_ranges(record)
        self._check_layout(record)
        return record


@cache
def codec(name: str) -> Codec:
    """The shared codec instance of a schema."""
    return Codec(name)
