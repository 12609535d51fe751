"""The values a field may hold because of what it measures, which Avro types cannot state: no
number is NaN or infinite, counts, sizes, durations and times are not negative, a fraction
lies in [0, 1], a port in [0, 65535], a link's capacity and SLA bounds are above 0.

A record breaking them fits its schema but would mislead its readers (a NaN window made a
policy raise and the dashboard answer 500; a negative buffer is no buffer): the codec
refuses to write it, and a consumer reading one gets a RecordError naming the field and the
value, so that it dead-letters the record instead of acting on it.

Fields are named by path: `name`, `array[].name` for a field of every item of an array of
records, `array[]` for every item of an array of numbers. Fields of type float or double that
no range names must still be finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, TypeVar

K = TypeVar("K")  # what field_groups groups by


@dataclass(frozen=True)
class Range:
    """[low, high]; with `above`, (low, high]."""

    low: float
    high: float = math.inf
    above: bool = False

    def holds(self, value: float) -> bool:
        if self.above:
            return self.low < value <= self.high
        return self.low <= value <= self.high

    def __str__(self) -> str:
        high = "inf)" if math.isinf(self.high) else f"{self.high:g}]"
        return f"{'(' if self.above else '['}{self.low:g}, {high}"


NOT_NEGATIVE = Range(0)
POSITIVE = Range(0, above=True)
FRACTION = Range(0, 1)
ANY = Range(-math.inf)  # finite, of either sign
PORT = Range(0, 65_535)
PROTOCOL = Range(0, 255)


def _all(range_: Range, *paths: str) -> dict[str, Range]:
    return dict.fromkeys(paths, range_)


_FLOW = {"src_port": PORT, "dst_port": PORT, "protocol": PROTOCOL}
_QUEUE_BUFFER = ("queue", "buffer_bytes")

RANGES: dict[str, dict[str, Range]] = {
    "LinkMetrics": {
        **_all(NOT_NEGATIVE, "window_start_ns", "window_end_ns", "rtt_samples", "rtt_flows"),
        **_all(NOT_NEGATIVE, "rtt_hmean_ns", "srtt_ns", "rtt_min_ns", "long_flows"),
        **_all(NOT_NEGATIVE, "data_packets", "retransmissions", "queue_delay_samples"),
        **_all(NOT_NEGATIVE, "queue_delay_ns", "queue_delay_ewma_ns", "throughput_bps"),
        **_all(NOT_NEGATIVE, "utilisation", "offered_bps", "offered_utilisation"),
        **_all(FRACTION, "loss_rate", "loss_rate_ewma"),
        # f is <= 0 as the metrics job computes it, but a simulated link's noise may cross 0
        # (tests/simlink.py); no reader divides by it.
        **_all(ANY, "f", "zscore"),
    },
    "LinkCounters": {
        **_all(NOT_NEGATIVE, "ts_ns", "seq", "part", "rtt_ns[]", "flow_events[].packets"),
        **_all(NOT_NEGATIVE, "packets", "bytes", "after_packets", "after_bytes"),
        **_all(NOT_NEGATIVE, "data_packets", "data_bytes", "retransmissions"),
        **_all(NOT_NEGATIVE, "queue_delay_samples", "queue_delay_sum_ns", "queue_delay_ewma_ns"),
        "interval_ns": POSITIVE,
        **{f"flows[].{name}": range_ for name, range_ in _FLOW.items()},
        **{f"flow_events[].{name}": range_ for name, range_ in _FLOW.items()},
    },
    "LinkSpec": {
        "ts_ns": NOT_NEGATIVE,
        **_all(POSITIVE, "capacity_bps", "max_queue_delay_ns"),
        "max_loss": Range(0, 1, above=True),
        **_all(NOT_NEGATIVE, "weight_loss", "weight_delay"),
    },
    "OptimizerLinkState": {
        **_all(NOT_NEGATIVE, "ts_ns", "epoch", "last_window_end_ns", "last_change_ns"),
        **_all(NOT_NEGATIVE, *(f"intended[].{name}" for name in _QUEUE_BUFFER)),
        **_all(NOT_NEGATIVE, *(f"in_force[].{name}" for name in _QUEUE_BUFFER)),
        **_all(NOT_NEGATIVE, "buffer_changes[].ts_ns", "buffer_changes[].buffer_bytes"),
        **_all(NOT_NEGATIVE, *(f"unapplied[].{name}" for name in _QUEUE_BUFFER)),
        **_all(NOT_NEGATIVE, "unapplied[].trial", "unapplied[].window_end_ns"),
    },
    "BufferDecision": {
        **_all(NOT_NEGATIVE, "ts_ns", "queue", "buffer_bytes", "previous_buffer_bytes"),
        **_all(NOT_NEGATIVE, "trial", "window_end_ns", "epoch"),
    },
    "SlaAlert": _all(NOT_NEGATIVE, "ts_ns", "value", "bound", "windows"),
    "DeadLetter": _all(NOT_NEGATIVE, "source_partition", "source_offset", "ts_ns"),
}


def _float_paths(fields: list[dict[str, Any]], prefix: str = "") -> Iterator[str]:
    """The paths of the fields of type float or double (nullable too)."""
    for field in fields:
        path = prefix + field["name"]
        types = field["type"] if isinstance(field["type"], list) else [field["type"]]
        for avro_type in types:
            if avro_type in ("float", "double"):
                yield path
            elif isinstance(avro_type, dict) and avro_type["type"] == "array":
                items = avro_type["items"]
                if items in ("float", "double"):
                    yield path + "[]"
                elif isinstance(items, dict) and items["type"] == "record":
                    yield from _float_paths(items["fields"], path + "[].")


def field_ranges(name: str, schema: dict[str, Any]) -> dict[str, Range]:
    """The ranges of schema `name`'s fields: its own, and `ANY` (finite) for every float or
    double field it gives none."""
    ranges = dict(RANGES.get(name, {}))
    for path in _float_paths(schema["fields"]):
        ranges.setdefault(path, ANY)
    return ranges


def _values(value: Any, steps: list[str], where: str) -> Iterator[tuple[str, Any]]:
    """(where, value) of each value at the path's steps; an absent field or a null has
    none (the schema checks presence)."""
    if not steps:
        yield where, value
        return
    step, rest = steps[0], steps[1:]
    if step == "[]":
        for i, item in enumerate(value if isinstance(value, list) else []):
            yield from _values(item, rest, f"{where}[{i}]")
    elif isinstance(value, dict) and value.get(step) is not None:
        yield from _values(value[step], rest, f"{where}.{step}")


def _steps(path: str) -> list[str]:
    """`a[].b` as the steps a, [], b."""
    steps = []
    for part in path.split("."):
        steps += [part[:-2], "[]"] if part.endswith("[]") else [part]
    return steps


def range_problem(name: str, ranges: dict[str, Range], record: dict[str, Any]) -> str | None:
    """What value of the record lies outside its field's range (or is NaN or infinite),
    naming the field and the value; None if none does. Values of the wrong type are the
    schema's business."""
    for path, range_ in ranges.items():
        steps = _steps(path)
        if steps[-1] == "[]":  # an array of numbers: at C speed in the usual case
            items = next((v for _, v in _values(record, steps[:-1], name)), None)
            if isinstance(items, list) and _all_within(items, range_):
                continue
        for where, value in _values(record, steps, name):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value):
                return f"{where}: {value} is not a finite number"
            if not range_.holds(value):
                return f"{where}: {value} is outside {range_}"
    return None


class RangeCheck:
    """The ranges of one record kind, checked as `problem(record)`. Every consumer checks
    every record it reads (the optimizer ~10 windows a second per link) and every writer
    every record it writes, so the usual case, every value within its range, is decided at
    C speed: the top-level fields sharing a range are taken at once (those that may be null
    apart, their nulls left out), and their minimum, maximum and sum (NaN or infinite if a
    value is) compared; so are an array's numbers, or one field of each of an array's
    records. Anything else, a missing field, a value out of range or not a number, a
    deeper path, is left to the field-by-field check, which names what is wrong.
    `nullable`: the top-level fields whose type allows null."""

    def __init__(
        self, name: str, ranges: dict[str, Range], nullable: frozenset[str] = frozenset()
    ) -> None:
        self.name = name
        self.ranges = ranges
        top: dict[str, Range] = {}
        self._in_arrays: list[tuple[str, str | None, float, float, bool]] = []
        self._deeper: dict[str, Range] = {}
        for path, range_ in ranges.items():
            steps = _steps(path)
            if len(steps) == 1:
                top[path] = range_
            elif len(steps) in (2, 3) and steps[1] == "[]" and "[]" not in steps[2:]:
                item_field = steps[2] if len(steps) == 3 else None
                self._in_arrays.append((steps[0], item_field, *_bounds(range_)))
            else:
                self._deeper[path] = range_
        self._flat = [
            (values_of, may_be_null, *_bounds(range_))
            for values_of, may_be_null, range_ in field_groups(top, nullable)
        ]

    def problem(self, record: dict[str, Any]) -> str | None:
        """What value of the record lies outside its field's range (or is NaN or
        infinite), naming the field and the value; None if none does. Values of the wrong
        type are the schema's business."""
        try:
            for values_of, may_be_null, low, high, above in self._flat:
                values: Sequence[Any] = values_of(record)
                if may_be_null:
                    values = [v for v in values if v is not None]
                if values and not _all_in(values, low, high, above):
                    return range_problem(self.name, self.ranges, record)
            for array, item_field, low, high, above in self._in_arrays:
                items = record.get(array)
                if not items:
                    continue
                if item_field is not None:
                    items = [item[item_field] for item in items]
                values = [v for v in items if v is not None]
                if values and not _all_in(values, low, high, above):
                    return range_problem(self.name, self.ranges, record)
        except (KeyError, TypeError, ValueError):  # absent, not a record, or not a number
            return range_problem(self.name, self.ranges, record)
        if self._deeper:
            return range_problem(self.name, self._deeper, record)
        return None


def _bounds(range_: Range) -> tuple[float, float, bool]:
    return range_.low, range_.high, range_.above


def _all_in(values: Sequence[Any], low: float, high: float, above: bool) -> bool:
    """Every value a number within the range (raises TypeError for one that is not a number).
    The sum is NaN or infinite if a value is; an unbounded side needs no look."""
    return (
        math.isfinite(sum(values))
        and (low == -math.inf or (low < min(values) if above else low <= min(values)))
        and (high == math.inf or max(values) <= high)
    )


def nullable_fields(schema: dict[str, Any]) -> frozenset[str]:
    """The names of the schema's top-level fields whose type allows null."""
    return frozenset(
        field["name"]
        for field in schema["fields"]
        if isinstance(field["type"], list) and "null" in field["type"]
    )


def field_groups(
    keyed: Mapping[str, K], nullable: frozenset[str]
) -> list[tuple[Callable[[dict[str, Any]], tuple[Any, ...]], bool, K]]:
    """The top-level fields of `keyed` grouped by their key (a range, a bound) and by
    whether they may be null: per group, the getter of its values (`field_values`), whether
    a value may be null, and the key. What checks a record's fields at once groups them so."""
    groups: dict[tuple[K, bool], list[str]] = {}
    for field, key in keyed.items():
        groups.setdefault((key, field in nullable), []).append(field)
    return [
        (field_values(fields), may_be_null, key) for (key, may_be_null), fields in groups.items()
    ]


def field_values(paths: list[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A record's values of the top-level fields `paths` as a tuple, taken at once
    (itemgetter gives one value bare); KeyError for one absent."""
    if len(paths) == 1:
        (path,) = paths
        return lambda record: (record[path],)
    return itemgetter(*paths)


def _all_within(numbers: list[Any], range_: Range) -> bool:
    """True if every item is a number within the range; False also when unsure."""
    if not numbers:
        return True
    try:
        return _all_in(numbers, *_bounds(range_))
    except TypeError:  # items that are not numbers, or do not compare
        return False
