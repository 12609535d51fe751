"""Units at the edges: the system keeps time in ns, sizes in bytes and rates in bit/s.

Config files and command lines may write "20ms", "100Mbit", "256KiB"; everything inside
p4bs works on the int64 values the parsers return. The formatters turn those values back
into text for a person to read ("4 min 10 s", "256 KiB", "100 Mbit/s").
"""

from __future__ import annotations

import math
import re

_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")

_TIME_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "min": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}
_SIZE_BYTES = {
    "B": 1,
    "KB": 1_000,
    "MB": 1_000_000,
    "GB": 1_000_000_000,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
}
_RATE_BPS = {
    "bit": 1,
    "bps": 1,
    "Kbit": 1_000,
    "kbit": 1_000,
    "Mbit": 1_000_000,
    "Gbit": 1_000_000_000,
    "Tbit": 1_000_000_000_000,
}


class UnitError(ValueError):
    """A value that is not a number with one of the accepted units."""


def _parse(value: object, table: dict[str, int], what: str, bare_unit: str) -> int:
    if isinstance(value, bool):
        raise UnitError(f"expected {what}, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        raise UnitError(
            f"expected {what} with a unit (e.g. '{value}{bare_unit}'), got a bare float"
        )
    if not isinstance(value, str):
        raise UnitError(f"expected {what}, got {type(value).__name__}")
    m = _NUMBER_UNIT.match(value)
    if not m:
        raise UnitError(f"expected {what} such as '10{bare_unit}', got {value!r}")
    number, unit = m.group(1), m.group(2) or bare_unit
    if unit not in table:
        accepted = ", ".join(table)
        raise UnitError(f"unknown unit {unit!r} in {value!r}; accepted: {accepted}")
    return round(float(number) * table[unit])


def parse_duration_ns(value: object) -> int:
    """'20ms' -> 20_000_000. A bare integer is taken as nanoseconds."""
    return _parse(value, _TIME_NS, "a duration", "ns")


def parse_size_bytes(value: object) -> int:
    """'256KiB' -> 262_144. A bare integer is taken as bytes."""
    return _parse(value, _SIZE_BYTES, "a size", "B")


def parse_rate_bps(value: object) -> int:
    """'100Mbit' -> 100_000_000. A bare integer is taken as bit/s."""
    return _parse(value, _RATE_BPS, "a rate", "bit")


def bytes_for_duration(duration_ns: int, rate_bps: int) -> int:
    """Bytes a link of `rate_bps` sends in `duration_ns`: how routers express buffers as time."""
    return duration_ns * rate_bps // (8 * 1_000_000_000)


def duration_for_bytes(size_bytes: int, rate_bps: int) -> int:
    """Nanoseconds a link of `rate_bps` needs to drain `size_bytes`."""
    return size_bytes * 8 * 1_000_000_000 // rate_bps


def format_duration_ns(ns: int) -> str:
    """850 ns, 12.3 µs, 80 ms, 3.2 s, 4 min 10 s, 2 h 5 min, 3 d 4 h."""
    if ns < 0:
        return "-" + format_duration_ns(-ns)
    if ns < 1_000:
        return f"{ns} ns"
    if ns < _TIME_NS["ms"]:
        return f"{ns / 1e3:.3g} µs"
    if ns < _TIME_NS["s"]:
        return f"{ns / 1e6:.3g} ms"
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:.3g} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def format_size_bytes(size: int) -> str:
    """262144 -> '256 KiB'; below 1 KiB in bytes."""
    if abs(size) < 1024:
        return f"{size} B"
    exponent = min(int(math.log(abs(size), 1024)), 4)
    unit = ("B", "KiB", "MiB", "GiB", "TiB")[exponent]
    return f"{size / 1024**exponent:.4g} {unit}"


def format_rate_bps(bps: int) -> str:
    """100_000_000 -> '100 Mbit/s'; below 1 kbit/s in bit/s."""
    for unit, scale in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if abs(bps) >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps} bit/s"
