"""RTT-unfairness flow separation (Gomez, Kfoury, Crichigno & Srivastava, "Reducing the impact
of RTT unfairness using P4-programmable data planes", §III-C and §IV): the flows' RTTs are
split into K router queues by Jenks natural breaks, with the goodness of variance fit (GVF)
as the quality index, and each queue's buffer is set by the Stanford rule on its own flows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean, harmonic_mean
from typing import Any

import jenkspy

from p4bs.config import LinkConfig
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.baselines import OptionReader, clamp_note, stanford_bytes


@dataclass(frozen=True)
class Classes:
    """Flows split into classes of similar RTT, lowest RTTs first."""

    breaks_ns: tuple[float, ...]  # class bounds: the lowest RTT, the inner breaks, the highest
    groups: tuple[tuple[str, ...], ...]  # each class's flow keys, sorted
    gvf: float  # goodness of variance fit, 1 - within-class / total squared deviation


def goodness_of_variance_fit(groups: Sequence[Sequence[float]]) -> float:
    """GVF = 1 - Σ_j SD_j / SD_all (Gomez et al., Algorithm 1): 1 when every class holds
    equal values; 1 also when all values are equal (nothing to explain)."""
    values = [value for group in groups for value in group]
    mean = fmean(values)
    total = sum((value - mean) ** 2 for value in values)
    if total == 0:
        return 1.0
    within = sum(sum((v - fmean(group)) ** 2 for v in group) for group in groups if group)
    return 1 - within / total


def classify(
    flow_rtts: Mapping[str, float],
    classes: int,
    min_gap_ns: float = 0.0,
    min_gap_ratio: float = 0.0,
) -> Classes:
    """Jenks natural breaks of the flows' RTTs into `classes` classes, fewer when there are
    fewer distinct RTTs. Adjacent classes closer than `min_gap_ns` or `min_gap_ratio` of the
    lower one's highest RTT (the upper class's lowest RTT minus that) are one class: with
    fewer RTT groups than classes, Jenks otherwise splits a group by its measurement noise,
    differently in every interval. A flow whose RTT equals an inner break belongs to the
    lower class."""
    values = sorted(flow_rtts.values())
    count = min(classes, len(set(values)))
    if count == 1:
        breaks = [float(values[0]), float(values[-1])]
    else:
        breaks = [float(b) for b in jenkspy.jenks_breaks(values, n_classes=count)]
    kept = [breaks[0]]
    for bound in breaks[1:-1]:  # a class's highest RTT; the next class starts above it
        above = values[bisect_right(values, bound)]
        if above - bound >= max(min_gap_ns, min_gap_ratio * bound):
            kept.append(bound)
    breaks = [*kept, breaks[-1]]
    count = len(breaks) - 1
    inner = breaks[1:-1]
    members: list[list[str]] = [[] for _ in range(count)]
    for key in sorted(flow_rtts):
        members[bisect_left(inner, flow_rtts[key])].append(key)
    gvf = goodness_of_variance_fit([[flow_rtts[key] for key in group] for group in members])
    return Classes(tuple(breaks), tuple(tuple(group) for group in members), gvf)


@dataclass
class _Flow:
    first_seen_ns: int
    last_seen_ns: int
    recent_ns: list[int] = field(default_factory=list)  # the last intervals' lowest RTTs


class JenksPolicy(Policy):
    """Separates the link's flows into `queues` router queues by RTT and sizes each queue.

    `observe_flows(ts_ns, flow_rtts)` takes each flow's lowest RTT sample over the last
    interval (flow key "src:sport>dst:dport/proto" -> ns). A flow's RTT is the second lowest
    of its last `rtt_history` intervals' values (the lowest when it has one): queueing and
    ACKs held back by a loss only add to a sample, so the low end is the path's RTT, by which
    the flows are unfair to each other; but a tap's timestamp can come late on a loaded
    machine, and one interval of a 20 ms path read 15.6 ms in CI, a 6% smaller buffer and
    back a second later, so the single lowest value is passed over.
    Means moved with the queue: an interval of cumulative-ACK samples after a loss read 210 ms
    on a 100 ms path, and BBR flows in 32 kB queues read up to 515 ms on 2-70 ms paths, each
    time moving flows between classes. A flow is classified once it has reported RTTs for
    `min_flow_age_ns` (iperf3's and other short connections come and go without regrouping
    the link) and is forgotten when not seen for `flow_ttl_ns`. `decide(window)` classifies
    the known flows with Jenks natural breaks into K classes (fewer when there are fewer
    distinct RTTs), queue 0 holding the lowest RTTs, and returns one Decision per queue
    0..K-1, `flows` being the flows classified into it and its buffer the Stanford rule on
    them:

        B_q = C_q·RTT_q/√N_q

    with N_q the queue's flows, RTT_q the harmonic mean of their RTTs (as the link's SRTT is a
    harmonic mean across flows) and C_q = C/K', the link capacity shared equally among the K'
    queues that hold flows. Equal shares follow the paper: §IV-A "divides the available
    bandwidth equally as a function of the number of flows", with one flow per queue there,
    so it does not tell per-queue from per-flow shares; §IV-B puts 100 flows with RTTs spread
    over 1-100 ms in four queues and reports the queues' aggregate throughputs converging to
    fairness (Fig. 6), which only an equal split per queue gives. A queue without flows gets
    the link's minimum buffer. Buffers are clamped to the link's bounds.

    It decides again only when the groups change (a flow joins, leaves or moves class) or a
    queue's buffer would move by more than `tolerance` (relative, default 5%) from the one
    last decided; otherwise []. Options: `queues` (K, default 4: the router in the paper's
    evaluation has up to four queues, §IV-B), `tolerance`, `flow_ttl_ns` (default 2 s, the
    data plane's long-flow idle timeout), `min_flow_age_ns` (default 1 s), `rtt_history`
    (default 5 intervals), `min_gap_ns` and `min_gap_ratio` (default 1 ms and 10%: classes
    closer than that are one, see `classify`; three RTT groups in four queues were split
    by noise, 2.11 / 2.18 ms, and regrouped every second). The GVF of the classification in
    force is the attribute `gvf` and is in each decision's reason.
    """

    name = "jenks"

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        reader = OptionReader(self.name, options)
        self.queues = reader.integer("queues", 4, low=1, high=64)
        self.tolerance = reader.tolerance()
        self.flow_ttl_ns = reader.duration_ns("flow_ttl_ns", 2_000_000_000)
        self.min_flow_age_ns = reader.duration_ns("min_flow_age_ns", 1_000_000_000)
        self.rtt_history = reader.integer("rtt_history", 5, low=1, high=1000)
        self.min_gap_ns = reader.duration_ns("min_gap_ns", 1_000_000)
        self.min_gap_ratio = reader.number("min_gap_ratio", 0.1, low=0, high=10)
        reader.finish()
        self._flows: dict[str, _Flow] = {}
        self.classes: Classes | None = None  # the classification last decided
        self._buffers: list[int] = []  # each queue's buffer, as last decided

    @property
    def gvf(self) -> float | None:
        """The GVF of the classification in force; None before the first."""
        return self.classes.gvf if self.classes is not None else None

    def observe_flows(self, ts_ns: int, flow_rtts: Mapping[str, int]) -> None:
        """Records each flow's mean RTT (ns) over the interval ending at `ts_ns`."""
        for key, rtt_ns in flow_rtts.items():
            if rtt_ns <= 0:  # a harmonic mean has no place for a zero or negative RTT
                continue
            flow = self._flows.get(key)
            if flow is None:
                flow = self._flows[key] = _Flow(first_seen_ns=ts_ns, last_seen_ns=ts_ns)
            flow.last_seen_ns = max(flow.last_seen_ns, ts_ns)
            flow.recent_ns.append(rtt_ns)
            del flow.recent_ns[: -self.rtt_history]

    def decide(self, window: Window) -> list[Decision]:
        if self.passes_over(window):
            return []
        oldest = window.window_end_ns - self.flow_ttl_ns
        self._flows = {k: f for k, f in self._flows.items() if f.last_seen_ns >= oldest}
        rtts = {
            key: sorted(flow.recent_ns)[min(1, len(flow.recent_ns) - 1)]
            for key, flow in self._flows.items()
            if flow.last_seen_ns - flow.first_seen_ns >= self.min_flow_age_ns
        }
        if not rtts:
            return []
        classes = classify(rtts, self.queues, self.min_gap_ns, self.min_gap_ratio)
        decisions = self._decisions(classes, rtts)
        buffers = [d.buffer_bytes for d in decisions]
        if not self._regrouped(classes, buffers):
            return []
        self.classes, self._buffers = classes, buffers
        return decisions

    def _regrouped(self, classes: Classes, buffers: Sequence[int]) -> bool:
        if self.classes is None or classes.groups != self.classes.groups:
            return True
        return any(
            abs(new - old) > self.tolerance * old
            for new, old in zip(buffers, self._buffers, strict=True)
        )

    def _decisions(self, classes: Classes, rtts: Mapping[str, int]) -> list[Decision]:
        occupied = sum(1 for group in classes.groups if group)
        breaks = ", ".join(f"{bound / 1e6:.2f}" for bound in classes.breaks_ns)
        summary = (
            f"{len(classes.groups)} classes of {len(rtts)} flows, breaks [{breaks}] ms, "
            f"GVF {classes.gvf:.4f}"
        )
        decisions = []
        for queue in range(self.queues):
            group = classes.groups[queue] if queue < len(classes.groups) else ()
            if not group:
                reason = f"queue {queue}: no flows; {summary}"
                decisions.append(
                    Decision(self.clamp(0), phase="separate", reason=reason, queue=queue)
                )
                continue
            rtt = harmonic_mean([rtts[key] for key in group])
            target = stanford_bytes(self.link.capacity_bps, rtt, len(group)) / occupied
            buffer = self.clamp(target)
            reason = (
                f"queue {queue}: C_q·RTT_q/√N_q = {self.link.capacity_bps / occupied / 1e6:g} "
                f"Mbit/s * {rtt / 1e6:.2f} ms / √{len(group)} = {target:.0f} B"
                f"{clamp_note(self.link, target, buffer)}; {summary}"
            )
            decisions.append(
                Decision(buffer, phase="separate", reason=reason, queue=queue, flows=group)
            )
        return decisions

    def snapshot(self) -> dict[str, Any]:
        classes = self.classes
        return {
            "flows": {
                key: [flow.first_seen_ns, flow.last_seen_ns, flow.recent_ns]
                for key, flow in self._flows.items()
            },
            "buffers": self._buffers,
            "classes": None
            if classes is None
            else {
                "breaks_ns": list(classes.breaks_ns),
                "groups": [list(group) for group in classes.groups],
                "gvf": classes.gvf,
            },
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self._flows = {
            key: _Flow(first, last, list(recent))
            for key, (first, last, recent) in state.get("flows", {}).items()
        }
        self._buffers = list(state.get("buffers", []))
        classes = state.get("classes")
        self.classes = (
            None
            if classes is None
            else Classes(
                breaks_ns=tuple(classes["breaks_ns"]),
                groups=tuple(tuple(group) for group in classes["groups"]),
                gvf=classes["gvf"],
            )
        )

    def loaded_problem(self) -> str | None:
        if len(self._buffers) > self.queues:
            return f"{len(self._buffers)} queues' buffers for a link of {self.queues} queues"
        problems = (
            self.buffer_problem(f"queue {q}'s buffer", b) for q, b in enumerate(self._buffers)
        )
        return next((p for p in problems if p is not None), None)
