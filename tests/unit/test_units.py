import pytest

from p4bs.units import (
    UnitError,
    bytes_for_duration,
    duration_for_bytes,
    parse_duration_ns,
    parse_rate_bps,
    parse_size_bytes,
)


def test_durations_become_nanoseconds() -> None:
    assert parse_duration_ns("20ms") == 20_000_000
    assert parse_duration_ns("1.5s") == 1_500_000_000
    assert parse_duration_ns("250us") == 250_000
    assert parse_duration_ns("30d") == 30 * 86_400 * 10**9
    assert parse_duration_ns(42) == 42


def test_sizes_and_rates() -> None:
    assert parse_size_bytes("256KiB") == 262_144
    assert parse_size_bytes("1.5MB") == 1_500_000
    assert parse_rate_bps("100Mbit") == 100_000_000
    assert parse_rate_bps("10Gbit") == 10_000_000_000


def test_buffer_time_and_size_convert_both_ways() -> None:
    # 200 ms of a 100 Mbit/s link is 2.5 MB.
    assert bytes_for_duration(200_000_000, 100_000_000) == 2_500_000
    assert duration_for_bytes(2_500_000, 100_000_000) == 200_000_000


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("20 parsecs", "unknown unit 'parsecs'"),
        ("fast", "such as"),
        (1.5, "bare float"),
        (True, "boolean"),
    ],
)
def test_bad_units_say_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises(UnitError, match=message):
        parse_duration_ns(value)
