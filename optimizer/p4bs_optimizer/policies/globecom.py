"""GLOBECOM 2021 dynamic buffer sizing (Kfoury, Crichigno, Bou-Harb & Srivastava, "Dynamic
router's buffer sizing using passive measurements and P4 programmable switches", §III-C):
the Stanford rule on the measured SRTT and long-flow count, recomputed only when the SRTT has
moved by more than a fraction gamma from the one it was last computed with, or N has changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from p4bs.config import LinkConfig
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.baselines import (
    OptionReader,
    clamp_note,
    flow_count,
    stanford_bytes,
    window_rtt_ns,
)

# The paper leaves gamma as "a configurable fraction of R_SRTT" and publishes no value. 10%
# lets the buffer follow an SRTT change of a tenth or more (a path change, flows joining with
# other RTTs) while the smoothed SRTT's ordinary wobble stays below it.
DEFAULT_GAMMA = 0.1


class GlobecomPolicy(Policy):
    """Buffer B = C·SRTT/√N (C the link capacity, SRTT the window's `srtt_ns`, N its
    `long_flows`, N < 1 taken as 1), recomputed when

        |SRTT - R_SRTT| > gamma·R_SRTT   or   N ≠ R_N

    where R_SRTT and R_N are the SRTT and N the buffer was last computed with (the paper's
    recorded SRTT; N ≠ R_N is its "or N changes"). The first window with an SRTT gives the
    first decision; a recomputation that lands on the buffer already decided (e.g. both at
    the link's maximum) updates the references but sends no decision. Option `gamma`, in
    (0, 1], default 0.1 (the paper gives no value). `snapshot` keeps R_SRTT and R_N.
    """

    name = "globecom"

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        reader = OptionReader(self.name, options)
        self.gamma = reader.number("gamma", DEFAULT_GAMMA, low=0, high=1, low_open=True)
        reader.finish()
        self.reference_srtt_ns: int | None = None  # R_SRTT
        self.reference_flows: int | None = None  # R_N
        self._decided: int | None = None

    def decide(self, window: Window) -> list[Decision]:
        if self.passes_over(window):
            return []
        srtt = window_rtt_ns(window)
        if srtt is None:
            return []
        flows = flow_count(window)
        reference, reference_flows = self.reference_srtt_ns, self.reference_flows
        if reference is None or reference_flows is None:
            why = "first SRTT"
        else:
            srtt_moved = abs(srtt - reference) > self.gamma * reference
            if not srtt_moved and flows == reference_flows:
                return []
            changes = []
            if srtt_moved:
                changes.append(
                    f"|SRTT - R_SRTT| = |{srtt / 1e6:.2f} - {reference / 1e6:.2f}| ms "
                    f"> gamma·R_SRTT (gamma = {self.gamma:g})"
                )
            if flows != reference_flows:
                changes.append(f"N {reference_flows} → {flows}")
            why = " and ".join(changes)
        self.reference_srtt_ns, self.reference_flows = srtt, flows
        capacity = self.link.capacity_bps
        target = stanford_bytes(capacity, srtt, flows)
        buffer = self.clamp(target)
        if buffer == self._decided:
            return []
        self._decided = buffer
        reason = (
            f"{why}: C·SRTT/√N = {capacity / 1e6:g} Mbit/s * {srtt / 1e6:.2f} ms / √{flows} "
            f"= {target:.0f} B" + clamp_note(self.link, target, buffer)
        )
        return [Decision(buffer_bytes=buffer, phase="recompute", reason=reason)]

    def snapshot(self) -> dict[str, Any]:
        return {
            "reference_srtt_ns": self.reference_srtt_ns,
            "reference_flows": self.reference_flows,
            "decided": self._decided,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self.reference_srtt_ns = state.get("reference_srtt_ns")
        self.reference_flows = state.get("reference_flows")
        self._decided = state.get("decided")

    def loaded_problem(self) -> str | None:
        if self._decided is None:
            return None
        return self.buffer_problem("the buffer decided", self._decided)
