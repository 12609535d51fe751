"""Reading the config's fields: `Reader` walks the parsed TOML and collects every problem as
`field.path: what is wrong`; the converters check one value each and turn it into the system's
units, raising ValueError (or UnitError) with the reason."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

from p4bs.config.model import SecretRef
from p4bs.units import UnitError, bytes_for_duration, parse_duration_ns, parse_size_bytes

T = TypeVar("T")


class DependsOnBadField(Exception):
    """A value that cannot be checked because a field it depends on was already reported."""


class Reader:
    """Walks the parsed TOML, remembering the path of each value for error messages."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._path: list[str] = []

    @contextmanager
    def at(self, name: str) -> Iterator[None]:
        self._path.append(name)
        try:
            yield
        finally:
            self._path.pop()

    def where(self, name: str | None = None) -> str:
        parts = [*self._path, name] if name else self._path
        return ".".join(parts).replace(".[", "[")

    def problem(self, name: str | None, message: str) -> None:
        self.problems.append(f"{self.where(name)}: {message}")

    def table(self, data: Any, name: str) -> dict[str, Any]:
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.problem(name, f"must be a table, got {type(value).__name__}")
            return {}
        return value

    def tables(self, data: dict[str, Any], name: str) -> list[dict[str, Any]]:
        value = data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.problem(name, f"must be an array of tables ([[{name}]])")
            return []
        return value

    def unknown(self, data: dict[str, Any], known: set[str]) -> None:
        for key in sorted(set(data) - known):
            self.problem(key, f"unknown field (known: {', '.join(sorted(known))})")

    @overload
    def get(
        self,
        data: dict[str, Any],
        name: str,
        convert: Callable[[Any], T],
        default: T,
        *,
        required: bool = False,
    ) -> T: ...

    @overload
    def get(
        self,
        data: dict[str, Any],
        name: str,
        convert: Callable[[Any], T],
        default: None = None,
        *,
        required: bool = False,
    ) -> T | None: ...

    def get(
        self,
        data: dict[str, Any],
        name: str,
        convert: Callable[[Any], T],
        default: T | None = None,
        *,
        required: bool = False,
    ) -> T | None:
        """`data[name]` converted, or `default` when the key is absent. A present value is
        never replaced: one `convert` refuses (a 0 where the field must be positive) is a
        problem naming the field, and `default` then only stands in so the other checks run
        (the config is refused). An absent required field is a problem too, `default` its
        stand-in."""
        if name not in data:
            if required:
                self.problem(name, "is required")
            return default
        try:
            return convert(data[name])
        except DependsOnBadField:
            return default
        except (UnitError, ValueError, TypeError) as exc:
            self.problem(name, str(exc))
            return default


def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return str(value)

    return convert


def int_in(low: int, high: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be an integer in [{low}, {high}], got {value!r}")
        return value

    return convert


def fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"must be a fraction strictly between 0 and 1, got {value!r}")
    return float(value)


def weight(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"must be a non-negative number, got {value!r}")
    return float(value)


def positive(parse: Callable[[Any], int], what: str) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        result = parse(value)
        if result <= 0:
            raise ValueError(f"{what} must be positive, got {value!r}")
        return result

    return convert


def non_negative(parse: Callable[[Any], int], what: str) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        result = parse(value)
        if result < 0:
            raise ValueError(f"{what} must not be negative, got {value!r}")
        return result

    return convert


def positive_durations(
    r: Reader, data: dict[str, Any], keys: Iterable[str], defaults: object
) -> dict[str, int]:
    """Each of `keys` as a positive duration, named as the config's field `<key>_ns` (whose
    value in `defaults` stands where the key is absent)."""
    return {
        f"{key}_ns": r.get(
            data, key, positive(parse_duration_ns, key), int(getattr(defaults, f"{key}_ns"))
        )
        for key in keys
    }


def endpoint(value: Any) -> str:
    host_port = text(value)
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be host:port with a port in 1..65535, got {value!r}")
    return host_port


def optional_endpoint(value: Any) -> str:
    """host:port, or "" for none (a service's metrics_address: "" turns its endpoint off)."""
    return "" if value == "" else endpoint(value)


def url(value: Any) -> str:
    address = text(value)
    if not address.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return address.rstrip("/")


def secret(value: Any) -> SecretRef:
    if isinstance(value, str):
        raise ValueError(
            'credentials are never written in the config; use { env = "VAR" } or { file = "/path" }'
        )
    if not isinstance(value, dict) or len(value) != 1 or not set(value) <= {"env", "file"}:
        raise ValueError(f'must be {{ env = "VAR" }} or {{ file = "/path" }}, got {value!r}')
    ((kind, ref),) = value.items()
    return SecretRef(**{kind: text(ref)})


def buffer_value(capacity_bps: int | None) -> Callable[[Any], int]:
    """A buffer is a size ('256KiB') or a time of line rate ('200ms'), as routers take it."""

    def convert(value: Any) -> int:
        if isinstance(value, str) and value.strip().rstrip("0123456789. ").lower() == "":
            raise ValueError(f"a bare number string {value!r} is ambiguous; add a unit")
        try:
            size = parse_size_bytes(value)
        except UnitError:
            if capacity_bps is None:
                raise DependsOnBadField from None
            size = bytes_for_duration(parse_duration_ns(value), capacity_bps)
        if size <= 0:
            raise ValueError(f"must be positive, got {value!r}")
        return size

    return convert
