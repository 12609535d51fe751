"""SLA alerts from link metrics: a bound broken for K consecutive windows raises an alert, K
consecutive windows back within it resolve it. One state per link, updated once per window."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from p4bs.config import LinkConfig


@dataclass
class _Bound:
    outside: int = 0  # consecutive windows out of bounds
    inside: int = 0  # consecutive windows within bounds
    alert_id: str | None = None  # the raised alert, until it resolves


@dataclass
class SlaState:
    bounds: dict[str, _Bound] = field(
        default_factory=lambda: {"queue_delay": _Bound(), "loss": _Bound()}
    )

    def update(self, metrics: dict[str, Any], link: LinkConfig, k: int) -> list[dict[str, Any]]:
        """The alerts (raise or resolve) this window's metrics cause, usually none."""
        measured = {
            # A window without queueing-delay samples had nothing queued to measure.
            "queue_delay": (float(metrics["queue_delay_ns"] or 0), float(link.max_queue_delay_ns)),
            "loss": (metrics["loss_rate"], link.max_loss),
        }
        alerts = []
        for kind, (value, bound) in measured.items():
            b = self.bounds[kind]
            if value > bound:
                b.outside, b.inside = b.outside + 1, 0
            else:
                b.outside, b.inside = 0, b.inside + 1
            if b.alert_id is None and b.outside == k:
                b.alert_id = f"{metrics['link_id']}/{kind}/{metrics['window_end_ns']}"
                state = "raise"
            elif b.alert_id is not None and b.inside == k:
                state = "resolve"
            else:
                continue
            alerts.append(
                {
                    "link_id": metrics["link_id"],
                    "ts_ns": metrics["window_end_ns"],
                    "alert_id": b.alert_id,
                    "state": state,
                    "kind": kind,
                    "value": value,
                    "bound": bound,
                    "windows": k,
                }
            )
            if state == "resolve":
                b.alert_id = None
        return alerts
