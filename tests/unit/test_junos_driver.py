"""The Junos driver's numbers and payload without a router: bytes to whole µs of line rate
(rounded, at least 1) and back, and its edit-config validated against Junos's published
class-of-service model (the XML converted to RFC 7951 JSON by the model itself)."""

from __future__ import annotations

import pytest
from lxml import etree

from p4bs.config import JunosLinkConfig, junos_defaults
from p4bs.yang import yang_model
from p4bs_optimizer.drivers.junos import bytes_in_force, cos_config, temporal_us

RATE = 100_000_000


@pytest.mark.parametrize(
    ("size", "rate", "us"),
    [
        (625_000, RATE, 50_000),  # 50 ms of 100 Mbit/s (the published example)
        (300_012, RATE, 24_001),  # 24000.96 µs
        (300_006, RATE, 24_000),  # 24000.48 µs
        (1, 16_000_000, 1),  # 0.5 µs: halves go up
        (3, 16_000_000, 2),  # 1.5 µs
        (1, 100_000_000_000, 1),  # 0.08 µs: never 0, which would be no buffer
        (2_500_000, 10_000_000_000, 2_000),  # 2 ms of 10 Gbit/s
    ],
)
def test_bytes_to_whole_microseconds(size: int, rate: int, us: int) -> None:
    assert temporal_us(size, rate) == us


def test_the_bytes_in_force_are_within_half_a_microsecond_of_line_rate() -> None:
    for size in (1514, 32_768, 99_999, 625_001, 2_500_000, 123_456_789):
        back = bytes_in_force(temporal_us(size, RATE), RATE)
        assert abs(back - size) <= RATE / 8 / 1e6 / 2 + 1, (size, back)
    assert bytes_in_force(50_000, RATE) == 625_000


def test_nonpositive_sizes_and_rates_are_refused() -> None:
    for size, rate in ((0, RATE), (-5, RATE), (1000, 0)):
        with pytest.raises(ValueError, match="positive"):
            temporal_us(size, rate)


@pytest.mark.parametrize(
    "link",
    [
        junos_defaults("eth1"),
        junos_defaults("et-0/0/0.0"),
        JunosLinkConfig("xe-1/2/3", "sched <&>", "map-1", "expedited-forwarding"),
    ],
)
def test_the_edit_config_is_valid_junos_class_of_service(link: JunosLinkConfig) -> None:
    model = yang_model("junos")
    raw = model.from_xml(etree.fromstring(cos_config(link, 24_001).encode()))
    model.validate(raw)
    cos = raw["junos-conf-root:configuration"]["junos-conf-class-of-service:class-of-service"]
    assert cos == {
        "schedulers": [{"name": link.scheduler, "buffer-size": {"temporal": "24001"}}],
        "scheduler-maps": [
            {
                "name": link.scheduler_map,
                "forwarding-class": [{"name": link.forwarding_class, "scheduler": link.scheduler}],
            }
        ],
        "interfaces": {
            "interface": [{"name": link.interface, "scheduler-map": link.scheduler_map}]
        },
    }
