"""The demo's live line and report figures: utilisation is what the link carried, and the
offered load stands beside it (none from a v1 metrics record)."""

from __future__ import annotations

import time
from typing import Any

from p4bs_loop.demo import LiveView, link_figures


def _window(utilisation: float, offered: float | None) -> dict[str, Any]:
    return {
        "window_end_ns": time.time_ns(),
        "srtt_ns": 40_000_000,
        "long_flows": 10,
        "loss_rate": 0.001,
        "queue_delay_ns": 5_000_000,
        "utilisation": utilisation,
        "offered_utilisation": offered,
        "f": -0.2,
        "rtt_samples": 100,
        "data_packets": 800,
    }


def _view(windows: list[dict[str, Any]]) -> LiveView:
    view = LiveView.__new__(LiveView)  # no Kafka consumer: only what it read
    view.windows, view.decisions = windows, []
    return view


def test_the_live_line_shows_the_carried_utilisation_and_the_offered_load_beside_it() -> None:
    line = _view([_window(0.991, 1.047)]).line(12)
    assert "util  99.1% (offered 104.7%)" in line
    assert "(offered     -)" in _view([_window(0.991, None)]).line(13)


def test_report_figures_keep_the_offered_load_apart() -> None:
    figures = link_figures([_window(0.99, 1.04), _window(0.97, None), _window(0.98, 1.00)])
    assert figures["utilisation, %"] == 98.0
    assert figures["offered load, %"] == 102.0  # the v1 window has none
