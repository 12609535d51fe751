import pytest

from p4bs.units import (
    UnitError,
    bytes_for_duration,
    duration_for_bytes,
    format_duration_ns,
    format_rate_bps,
    format_size_bytes,
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


S = 1_000_000_000


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0 ns"),
        (999, "999 ns"),
        (1_000, "1 µs"),
        (12_300, "12.3 µs"),
        (80_000_000, "80 ms"),
        (3_200_000_000, "3.2 s"),
        (59 * S, "59 s"),
        (60 * S, "1 min 0 s"),
        (250 * S, "4 min 10 s"),
        (7_500 * S, "2 h 5 min"),
        (3 * 86_400 * S + 4 * 3_600 * S, "3 d 4 h"),
        (-80_000_000, "-80 ms"),
    ],
)
def test_durations_print_in_the_largest_unit_that_reads_well(ns: int, text: str) -> None:
    assert format_duration_ns(ns) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (250_000, "244.1 KiB"),
        (262_144, "256 KiB"),
        (3 * 1024**3, "3 GiB"),
        (2 * 1024**5, "2048 TiB"),  # TiB is the largest unit
        (-2048, "-2 KiB"),
    ],
)
def test_sizes_print_in_binary_units(size: int, text: str) -> None:
    assert format_size_bytes(size) == text


@pytest.mark.parametrize(
    ("bps", "text"),
    [
        (999, "999 bit/s"),
        (1_000, "1 kbit/s"),
        (100_000_000, "100 Mbit/s"),
        (2_500_000_000, "2.5 Gbit/s"),
    ],
)
def test_rates_print_in_decimal_units(bps: int, text: str) -> None:
    assert format_rate_bps(bps) == text


def test_whole_durations_and_sizes_read_back_as_they_were_written() -> None:
    for ns in (850, 80_000_000, 3 * S):
        assert parse_duration_ns(format_duration_ns(ns)) == ns
    for size in (1000, 262_144, 3 * 1024**3):
        assert parse_size_bytes(format_size_bytes(size)) == size
