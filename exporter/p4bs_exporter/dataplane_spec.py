"""The software data plane's spec: the JSON `p4bs-model` and the exporter read (p4/SPEC.md).

It is derived from the deployment config: the links with their output prefixes, the capture
points (ports) of each link's taps, and the `[dataplane]` settings in the model's units
(tables as log2 of their slots, times in ns).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from p4bs.config import Config, DataplaneConfig, LinkConfig

BEFORE, AFTER = "before", "after"


def settings(d: DataplaneConfig) -> dict[str, Any]:
    """The `[dataplane]` section as the model's JSON sections."""

    def log2(slots: int) -> int:
        return slots.bit_length() - 1

    return {
        "rtt": {
            "slots_log2": log2(d.rtt_slots),
            "max_age_ns": d.rtt_max_age_ns,
            "min_interval_ns": d.rtt_min_interval_ns,
        },
        "long_flows": {
            "mode": d.long_flows,
            "cms_rows": d.cms_rows,
            "cms_width_log2": log2(d.cms_width),
            "cms_reset_ns": d.cms_reset_ns,
            "threshold": d.long_flow_threshold,
            "ttl_ns": d.long_flow_ttl_ns,
            "capacity": d.long_flow_capacity,
            "window_ns": d.window_ns,
            "window_packets": d.window_packets,
        },
        "loss": {"slots_log2": log2(d.loss_slots)},
        "qdelay": {"slots_log2": log2(d.qdelay_slots), "max_age_ns": d.qdelay_max_age_ns},
        "export": {"interval_ns": d.export_interval_ns},
    }


def _link(link: LinkConfig) -> dict[str, Any]:
    return {"id": link.id, "output_prefixes": list(link.output_prefixes)}


def live_spec(config: Config, links: Iterable[LinkConfig]) -> dict[str, Any]:
    """Links captured live: each tap port is named after its interface (or switch port) and
    carries one direction or both."""
    chosen = list(links)
    ports = [
        {"port": str(port), "link": link.id, "tap": side, "direction": direction}
        for link in chosen
        for side, port, direction in link.ports()
    ]
    return {"links": [_link(x) for x in chosen], "ports": ports, **settings(config.dataplane)}


def capture_spec(
    link_id: str, output_prefixes: Iterable[str], settings_of: DataplaneConfig
) -> dict[str, Any]:
    """One link from capture files: ports `before` and `after`, each carrying both directions."""
    ports = [
        {"port": tap, "link": link_id, "tap": tap, "direction": "both"} for tap in (BEFORE, AFTER)
    ]
    link = {"id": link_id, "output_prefixes": list(output_prefixes)}
    return {"links": [link], "ports": ports, **settings(settings_of)}
