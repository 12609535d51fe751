"""loss-delay-fit: measure the loss and the queueing delay at a few buffers, fit how each
varies with the buffer, and go to the buffer where the fitted f is highest.

f = -(w1 * p / p_hat + w2 * d / d_hat) is the sum of a term that falls with the buffer (loss)
and one that rises with it (delay). P4BS's GP sees only their sum, and needs trials spread
over the range to learn its shape; here each step measures both terms, and each is close to
a power of the buffer over a factor of a few (loss falls with the flows' window, about
B^-1 to B^-2 for loss-based congestion control; delay grows with how full the queue stays,
about B^1). Two measured buffers already place the optimum of the fitted sum.

- "search" begins where it is: the buffer in force (the router's, before any decision) is
  measured as step 0, without a change, from the first busy window on. Two things measured
  there end the search at once, on that buffer: a mean queue below `unfilled_fraction` of
  the buffer (the flows keep a standing queue of their own, as BBR does with few flows: a
  smaller buffer cannot lower it and may cause loss; that buffer stays watched, for few
  loss-based flows fill a large one slowly, 3 Reno flows 200 ms at 100 Mbit/s in ~10 s:
  once the queue fills `unfilled_fraction` of it over `measure_ns`, a search begins as this
  one, those windows its step 0), or loss that is both the larger of
  f's terms and `loss_insensitive_ratio` times what loss-based flows would lose there (the
  flows do not back off on loss; a smaller buffer only loses more): if the buffer in force
  is below the search max, the top is probed first, as below. Step 0 costs no traffic at
  another buffer, and mostly falls in the flows' start-up.
- Otherwise the first step is where a model of a full queue of N loss-based flows puts the
  optimum: each flow's window is (C * RTT_min + B) / N, loss follows Mathis et al.'s
  p = 1.5 / window^2 (in packets), delay is B / C (`first_guess_bytes`); N is the larger of
  the window's long flows and its flows with RTT samples. From one point, the next goes
  where f would peak if loss fell as 1/B and delay rose as B from what was measured there
  (at most `first_stride` away) — unless the first step lost more than
  `loss_insensitive_ratio` times what the same model predicts there: then the flows do not
  back off on loss (BBR keeps its own standing queue and loses heavily in any buffer below
  it), and the second step probes the search max; if f is higher there, the search settles
  on it. From two or more, loss and delay are each fitted as a
  power of the buffer (least squares in log-log, exponents clamped to [-4, 0] and [0, 2]),
  and the fitted f is maximised between the measured neighbours of the best measured buffer
  (f taken as unimodal), or past it within reach when it is the smallest or the largest:
  `max_stride`, widened by that factor for each step in a row that went to the edge of its
  reach. A maximiser at a measured neighbour means the fit disagrees with the measured f,
  and one whose fitted f is less than `min_gain` above the fitted f at the best measured
  buffer is not worth a step: either settles the search on the best measured buffer; one
  within `close_enough` of a measured buffer settles it on that buffer (measured, where
  the maximiser is a prediction); one between two measured buffers whose f differ by less
  than `flat_fraction` settles it on the maximiser unmeasured (f being unimodal, it is at
  least the lower of the two there); else the maximiser is the next step. After `max_steps`
  steps it settles on the best measured buffer. Any step (step 0 too) whose f is at least
  -`good_enough` settles the search on its buffer: loss and delay are both a small part of
  their bounds there, and another step would cost more than it could gain.
- "settled": the buffer stays until the traffic changes; the search then starts again from
  the first guess for the traffic now (N and RTT_min of the window that showed the change),
  the settled buffer being the old traffic's (without an RTT in that window, from the
  settled buffer, in force, measured without a change). The change is
  the policy's own detector's (`traffic_change.py`: N, RTT_min, the loss and delay regimes
  and the CCA mix, each against a baseline that restarts after every buffer change, so the
  search's own moves are never a change), or with `zscore_change` the metrics job's z-score
  of f, as P4BS (before issue 39, the only one: it missed the traffic changes it met).

A step that raises the buffer, and the first step of a search after a change, is measured
only once its queue has reached its level (`_at_level`): after a raise, loss-based flows take
seconds to fill the larger buffer without losing a packet (10 Cubic flows ~10 s for 2.5 MB on
dyn-n-step), and a step measured meanwhile finds the low delay of a queue on its way up, a
buffer better than it is. Before issue 39's fourth round, half of dyn-n-step's runs settled
on 2.5 MB that way.

Steps are measured as `stepped.SteppedPolicy` says. `snapshot` holds the phase, the step,
the measured points and the detector's baselines as JSON data.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from p4bs.config import LinkConfig
from p4bs.units import bytes_for_duration, duration_for_bytes
from p4bs_optimizer.policies.base import Decision, Window
from p4bs_optimizer.policies.baselines import OptionReader
from p4bs_optimizer.policies.stepped import MIN_WINDOWS, SETTLED, Step, SteppedPolicy
from p4bs_optimizer.policies.traffic_change import TrafficChangeDetector, TrafficChangeOptions

SEARCH = "search"
MSS_BYTES = 1448  # a TCP segment's payload on a 1500-byte MTU with timestamps
MATHIS_CONSTANT = 1.5  # p = 1.5 / W^2: Mathis et al.'s 1.22 / sqrt(p) throughput, squared
CANDIDATES = 256  # log-spaced buffers on which the fitted f is maximised
LOSS_EXPONENTS = (-4.0, 0.0)
DELAY_EXPONENTS = (0.0, 2.0)
# A queue is steady when its mean over this span moves little from the span before.
LEVEL_SPAN_NS = 1_000_000_000
# A window with no retransmission (no queueing-delay sample) still has some loss (delay):
# half a retransmission in the step's packets, 1 us. Logs need a floor.
DELAY_FLOOR_NS = 1_000.0


class Point(NamedTuple):
    """One measured step: mean loss rate, mean queueing delay (ns) and mean f."""

    buffer_bytes: int
    loss: float
    delay_ns: float
    f: float


@dataclass(frozen=True)
class LossDelayFitOptions:
    """The policy's options (the link's `policy_options`), in the system's units."""

    settle_ns: int = 1_000_000_000  # wait after a buffer is in force before measuring
    # Windows measured per step. Two windows (1 s) were too noisy to rank steps 15-50%
    # apart: offline, Cubic 25 -0.633 with 1 s, -0.607 with 2 s, -0.604 with 3 s (whose
    # longer search costs Cubic 100).
    measure_ns: int = 2_000_000_000
    max_steps: int = 6
    # Settle when the fitted optimum is this near a measured buffer; how far past the
    # measured range a step may go. Tuned offline on the measured Fig. 11 surfaces
    # (eval/results/surface-fig11/offline.md): wider strides overshoot on a noisy fit of
    # two close points.
    close_enough: float = 1.15
    max_stride: float = 1.5
    # Settle on the best measured buffer when the fitted optimum promises less than this
    # over the fitted f there (relative): a step costs 5-7 s of traffic. Off by default:
    # offline, 0.05 took the 21 s searches of Cubic 10 and Reno 10 at the paper's per-flow
    # BDP to 14 s, but left Cubic 10 below the Stanford rule (-0.004 [-0.007, -0.001]), tied
    # without it; 0.02-0.1 moved no Fig. 11 cell's f by 0.001.
    min_gain: float = 0.0
    # Settle on a fitted optimum between two measured buffers whose f differ by less than
    # this (relative), without measuring it: f being unimodal, it is at least the lower of
    # the two there, and a step costs 5-7 s of traffic. Offline, 0.05 took the search at the
    # paper's per-flow BDP with Cubic 10 from 21 to 14 s (f -0.2473 -> -0.2466) and moved no
    # other cell's f by more than 0.001.
    flat_fraction: float = 0.05
    # A step measuring f at or above -good_enough settles the search on its buffer: loss and
    # delay are both a small part of their bounds there, and another step costs more than it
    # could gain (offline at the paper's per-flow BDP, 3 Cubic or Reno flows: f -0.05 at the
    # smallest buffer, and steps above it cost 0.001-0.002 of whole-run f). 0: off.
    good_enough: float = 0.1
    # The second step's reach: the 1/B-and-B prior from one point may be far off (BBR keeps
    # a standing queue, and loses heavily below it, whatever the first guess says).
    first_stride: float = 4.0
    # Measured loss over the Mathis prediction above which the flows are taken as
    # loss-insensitive. At the first guess the ratio was 1.2-2.1 for Cubic and Reno on the
    # Fig. 11 surfaces (live 1.2-1.5), but 4.0-5.6 for 10 Cubic flows with per-flow RTTs of
    # 20-35 ms on dyn-n-step (live, eval/results/dyn-n-step-r3), where 4 took half the runs
    # for BBR; BBR's was 11-26 (Fig. 11 surfaces, live 24-26), 9 at 25 flows in 5 ms.
    # Set between 5.6 and 9 after dyn-n-step's third round, which is tuned on since.
    loss_insensitive_ratio: float = 8.0
    # Step 0: a mean queue below this fraction of the buffer in force (at the busy link the
    # search needs) means the flows do not fill it. On the Fig. 11 surfaces at 200 ms: BBR
    # with 25 flows 0.30-0.34, every other cell 0.62-0.98 (Reno 25 the lowest).
    unfilled_fraction: float = 0.5
    # A raised buffer's queue (or the settled buffer's, after a change) is at its level once
    # a window lost packets, its mean over the last second is within `level_tolerance` of the
    # second before, or `fill_max_ns` after the buffer came into force: 10 Cubic flows took
    # 10 s to fill 2.5 MB on dyn-n-step (eval/results/dyn-n-step-r3, r5), rising 5-13 ms a
    # second (4-20% of a second's mean), and BBR's own queue moves by under 5% a second but
    # for its 200 ms dips every 10 s (surface-fig11, BBR 25 at 200 ms).
    level_tolerance: float = 0.05
    fill_max_ns: int = 15_000_000_000
    search_max_ns: int | None = None  # ns of line rate; None: the link's buffer.max
    min_utilisation: float = 0.95  # no search before a window shows the link this busy (P4BS's)
    reissue_after_ns: int = 30_000_000_000  # as P4BS's
    # With `zscore_change`: act on the metrics job's change flag (P4BS's detector), this long
    # after the settled buffer came into force. Without it (the default) the policy's own
    # traffic detector, whose `traffic_*` options are `traffic`, holds off by itself.
    zscore_change: bool = False
    change_holdoff_ns: int = 5_000_000_000  # as P4BS's
    traffic: TrafficChangeOptions = field(default_factory=TrafficChangeOptions)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> LossDelayFitOptions:
        """The options of a `policy_options` table; raises PolicyOptionError naming the first
        unknown option or bad value."""
        r, d = OptionReader(LossDelayFitPolicy.name, options), cls()
        parsed = cls(
            settle_ns=r.duration_ns("settle_ns", d.settle_ns, allow_zero=True),
            measure_ns=r.duration_ns("measure_ns", d.measure_ns),
            max_steps=r.integer("max_steps", d.max_steps, low=1, high=100),
            close_enough=r.number("close_enough", d.close_enough, low=1, low_open=True),
            max_stride=r.number("max_stride", d.max_stride, low=1, low_open=True),
            min_gain=r.number("min_gain", d.min_gain, low=0, high=1),
            flat_fraction=r.number("flat_fraction", d.flat_fraction, low=0, high=1),
            good_enough=r.number("good_enough", d.good_enough, low=0),
            first_stride=r.number("first_stride", d.first_stride, low=1, low_open=True),
            loss_insensitive_ratio=r.number(
                "loss_insensitive_ratio", d.loss_insensitive_ratio, low=1, low_open=True
            ),
            unfilled_fraction=r.number(
                "unfilled_fraction", d.unfilled_fraction, low=0, low_open=True, high=1
            ),
            level_tolerance=r.number("level_tolerance", d.level_tolerance, low=0, high=1),
            fill_max_ns=r.duration_ns("fill_max_ns", d.fill_max_ns, allow_zero=True),
            search_max_ns=r.duration_ns("search_max_ns", 0) or None,
            min_utilisation=r.number("min_utilisation", d.min_utilisation, low=0),
            reissue_after_ns=r.duration_ns("reissue_after_ns", d.reissue_after_ns, allow_zero=True),
            zscore_change=r.flag("zscore_change", d.zscore_change),
            change_holdoff_ns=r.duration_ns(
                "change_holdoff_ns", d.change_holdoff_ns, allow_zero=True
            ),
            traffic=TrafficChangeOptions.parse(r),
        )
        r.finish()
        return parsed


@dataclass(frozen=True)
class PowerLaw:
    """y = scale * buffer ** exponent."""

    scale: float
    exponent: float

    def __call__(self, buffer: float) -> float:
        return self.scale * math.pow(buffer, self.exponent)

    @classmethod
    def fit(
        cls, xs: Sequence[float], ys: Sequence[float], exponents: tuple[float, float]
    ) -> PowerLaw:
        """Least squares in log-log, the exponent clamped to `exponents` (and the scale
        refitted for it)."""
        us, vs = [math.log(x) for x in xs], [math.log(y) for y in ys]
        u_mean, v_mean = sum(us) / len(us), sum(vs) / len(vs)
        spread = sum((u - u_mean) ** 2 for u in us)
        slope = sum((u - u_mean) * (v - v_mean) for u, v in zip(us, vs, strict=True)) / spread
        slope = min(max(slope, exponents[0]), exponents[1])
        return cls(math.exp(v_mean - slope * u_mean), slope)


def mathis_loss(link: LinkConfig, rtt_ns: int, flows: int, buffer_bytes: float) -> float:
    """The loss rate of N loss-based flows keeping a buffer of `buffer_bytes` full: each
    flow's window is (C * RTT + B) / N, and p = 1.5 / window^2 (window in packets)."""
    window_bytes = (link.capacity_bps / 8 * rtt_ns / 1e9 + buffer_bytes) / flows
    return MATHIS_CONSTANT / (window_bytes / MSS_BYTES) ** 2


def first_guess_bytes(link: LinkConfig, rtt_ns: int, flows: int) -> float:
    """The buffer maximising f when N flows share the link with windows of
    (C * RTT + B) / N, lose p = 1.5 / window^2 and keep the queue full (delay B / C).

    With tau = B / C (s), f = -(a / (RTT + tau)^2 + b * tau), where
    a = (w1 / p_hat) * 1.5 * (N * MSS / C)^2 and b = w2 / d_hat, which peaks at
    RTT + tau = (2 a / b)^(1/3)."""
    capacity = link.capacity_bps / 8  # bytes/s
    a = link.weight_loss / link.max_loss * MATHIS_CONSTANT * (flows * MSS_BYTES / capacity) ** 2
    b = link.weight_delay / (link.max_queue_delay_ns / 1e9)
    tau = math.cbrt(2 * a / b) - rtt_ns / 1e9
    return max(tau, 0.0) * capacity


class LossDelayFitPolicy(SteppedPolicy):
    """Fits loss and delay against the buffer from a few measured steps; settles where the
    fitted f is highest."""

    name: ClassVar[str] = "loss-delay-fit"
    config: LossDelayFitOptions

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self.config = LossDelayFitOptions.parse(options)
        self.phase = SEARCH
        self.step = None
        self.points: list[Point] = []
        self.edge_steps = 0  # consecutive fitted steps that went to the edge of their reach
        self.note = ""  # why the search began, for the next decision's reason
        self.probing = False  # step 2 probes the search max (loss-insensitive flows)
        # Settled because step 0's queue did not fill the buffer: watched, as few flows (3
        # Reno flows at 100 Mbit/s) take tens of seconds to fill 200 ms.
        self.unfilled = False
        self._watched: deque[Window] = deque()  # the last `measure_ns` of them, while unfilled
        # A step's windows while its queue moves to its level, the last 2 LEVEL_SPAN_NS of
        # them (not in a snapshot: a restored policy waits for two spans again), and how the
        # level was reached, for the step's reason.
        self._recent: deque[Window] = deque()
        self.level_note = ""
        self.detector = (
            None
            if self.config.zscore_change
            else TrafficChangeDetector(
                link, self.config.traffic, lambda rtt, n, b: mathis_loss(link, rtt, n, b)
            )
        )

    def _search_max(self) -> int:
        if self.config.search_max_ns is None:
            return self.link.max_buffer_bytes
        return self.clamp(bytes_for_duration(self.config.search_max_ns, self.link.capacity_bps))

    def _bounded(self, buffer: float) -> int:
        return min(self.clamp(buffer), self._search_max())

    # -- the search -----------------------------------------------------------------------

    def _begin(self, window: Window, prefix: str) -> list[Decision]:
        rtt_ns = window.rtt_min_ns if window.rtt_min_ns is not None else window.srtt_ns
        if rtt_ns is None:
            return []  # no RTT yet: nothing to size a window from
        if window.buffer_bytes is None:
            top = self._search_max()
            reason = f"{prefix}step 0 at the search max, {top} B: the buffer in force is unknown"
            return [self._new_step(window, top, SEARCH, 0, reason)]
        return self._measure_in_force(window, window.buffer_bytes, 0)

    @staticmethod
    def _flows(window: Window | Step) -> int:
        # The long-flow detector needs seconds to count flows that just started (6 s at
        # N = 100 on the testbed), while every flow sends an RTT sample in a window.
        return max(window.long_flows, window.rtt_flows, 1)

    def _first_guess(self, window: Window, rtt_ns: int, flows: int, prefix: str) -> Decision:
        buffer = self._bounded(first_guess_bytes(self.link, rtt_ns, flows))
        reason = (
            f"{prefix}first step at the optimum of f for {flows} loss-based flows filling the "
            f"queue (RTT_min {rtt_ns / 1e6:.1f} ms): {buffer} B"
        )
        return self._new_step(window, buffer, SEARCH, 1, reason)

    def _restart(self, window: Window, prefix: str) -> list[Decision]:
        self.phase, self.points, self.edge_steps, self.probing = SEARCH, [], 0, False
        self.unfilled, self.level_note = False, ""
        assert self.step is not None
        settled_on = self.step.buffer_bytes
        rtt_ns = window.rtt_min_ns if window.rtt_min_ns is not None else window.srtt_ns
        if rtt_ns is None:
            self.note = prefix + "new search from the settled buffer; "
            decisions = self._measure_in_force(window, settled_on, 1)
        else:
            self.note = ""
            decisions = [self._first_guess(window, rtt_ns, self._flows(window), prefix)]
        if self.step.buffer_bytes >= settled_on:
            self.step.to_level = True  # the queue follows the new traffic
        return decisions

    def _measure_in_force(self, window: Window, buffer: int, trial: int) -> list[Decision]:
        """A search step at the buffer in force (step 0 of the first search, step 1 of one
        after a change: the settled buffer): measured without a change."""
        self.step = Step(
            buffer,
            SEARCH,
            trial,
            None,
            decided_ns=window.window_end_ns,
            in_force_ns=window.window_end_ns,
        )
        return []

    def _step_done(self, step: Step, window: Window) -> list[Decision]:
        floor = 0.5 / step.data_packets if step.data_packets else 1e-6
        point = Point(
            step.buffer_bytes,
            max(step.mean_loss(), floor),
            max(step.mean_delay_ns(), DELAY_FLOOR_NS),
            step.observation().mean,
        )
        seen = (
            f"{self.note}step {step.trial}: at {point.buffer_bytes} B{self.level_note} loss "
            f"{step.mean_loss():.3%}, delay {step.mean_delay_ns() / 1e6:.2f} ms, f {point.f:.4f}"
        )
        self.note = self.level_note = ""
        if self.config.good_enough > 0 and point.f >= -self.config.good_enough:
            reason = f"{seen}; f at least -{self.config.good_enough:g} (good_enough)"
            return self._settle(window, point.buffer_bytes, reason, point.f)
        if step.trial == 0:
            return self._after_step_zero(window, step, point, seen)
        self.points.append(point)
        if len(self.points) == 1:
            return self._second_step(window, step, point, seen)
        if self.probing:
            self.probing = False
            first = self.points[0]
            if point.f > first.f:
                reason = (
                    f"{seen}; f higher at the top than at {first.buffer_bytes} B ({first.f:.4f})"
                )
                return self._settle(window, point.buffer_bytes, reason, point.f)
        top = max(self.points, key=lambda p: p.f)
        best, predicted, at_top, note, at_edge = self._fitted_optimum(top.buffer_bytes)
        if best != top.buffer_bytes and any(p.buffer_bytes == best for p in self.points):
            reason = (
                f"{seen}; {note}: the fitted f rises towards {best} B, measured lower than "
                f"{top.buffer_bytes} B (f {top.f:.4f}): the fit disagrees with the measurements"
            )
            return self._settle(window, top.buffer_bytes, reason, point.f)
        if self.config.min_gain > 0 and predicted - at_top < self.config.min_gain * abs(at_top):
            reason = (
                f"{seen}; {note}: the fitted optimum {best} B (f {predicted:.4f}) promises less "
                f"than {self.config.min_gain:.0%} over the best measured, {top.buffer_bytes} B "
                f"(fitted f {at_top:.4f})"
            )
            return self._settle(window, top.buffer_bytes, reason, point.f)
        nearest = min(self.points, key=lambda p: abs(math.log(p.buffer_bytes / best)))
        if abs(math.log(nearest.buffer_bytes / best)) <= math.log(self.config.close_enough):
            reason = f"{seen}; {note}: fitted optimum {best} B (f {predicted:.4f}), measured nearby"
            return self._settle(window, nearest.buffer_bytes, reason, point.f)
        below = [p for p in self.points if p.buffer_bytes < best]
        above = [p for p in self.points if p.buffer_bytes > best]
        if below and above:
            low = max(below, key=lambda p: p.buffer_bytes)
            high = min(above, key=lambda p: p.buffer_bytes)
            if abs(low.f - high.f) <= self.config.flat_fraction * max(abs(low.f), abs(high.f)):
                reason = (
                    f"{seen}; {note}: fitted optimum {best} B (f {predicted:.4f}), between "
                    f"{low.buffer_bytes} B and {high.buffer_bytes} B, measured alike (f "
                    f"{low.f:.4f} and {high.f:.4f}): f is at least that there"
                )
                return self._settle(window, best, reason, point.f)
        if len(self.points) >= self.config.max_steps:
            reason = f"{seen}; {len(self.points)} steps made (max_steps): best measured"
            return self._settle(window, top.buffer_bytes, reason, point.f)
        self.edge_steps = self.edge_steps + 1 if at_edge else 0
        reason = f"{seen}; {note}: next step at the fitted optimum {best} B (f {predicted:.4f})"
        if at_edge:
            reason += ", the edge of this step's reach"
        assert step.trial is not None  # a search step's
        return [self._new_step(window, best, SEARCH, step.trial + 1, reason, f=point.f)]

    def _after_step_zero(
        self, window: Window, step: Step, point: Point, seen: str
    ) -> list[Decision]:
        """Settles on the buffer in force when the flows do not fill it or do not back off on
        loss there (probing the top first if it is higher); else the first guess."""
        buffer, top = point.buffer_bytes, self._search_max()
        drain_ns = duration_for_bytes(buffer, self.link.capacity_bps)
        if step.mean_delay_ns() < self.config.unfilled_fraction * drain_ns:
            reason = (
                f"{seen}; a mean queue of {step.mean_delay_ns() / drain_ns:.0%} of the buffer: "
                f"the flows do not fill it (watched: a search begins if they come to)"
            )
            self.unfilled = True
            return self._settle(window, buffer, reason, point.f)
        rtt_ns = step.rtt_min_ns if step.rtt_min_ns is not None else window.srtt_ns
        if rtt_ns is None:
            return []  # no RTT in step 0 or now: wait for a window with one
        flows = self._flows(step)
        ratio = self._loss_insensitive(point, rtt_ns, flows)
        if ratio is not None:
            reason = (
                f"{seen}; {ratio:.1f} times the loss of {flows} loss-based flows there, and the "
                f"larger term of f: flows that do not back off on loss"
            )
            if buffer >= top:
                return self._settle(window, buffer, reason, point.f)
            self.points, self.probing = [point], True
            reason += f"; step 1 probes the top, {top} B"
            return [self._new_step(window, top, SEARCH, 1, reason, f=point.f)]
        return [self._first_guess(window, rtt_ns, flows, f"{seen}; ")]

    def _loss_insensitive(self, point: Point, rtt_ns: int, flows: int) -> float | None:
        """The point's loss over what `flows` loss-based flows would lose at its buffer, if
        it is above `loss_insensitive_ratio` and loss the larger term of f (BBR below its
        standing queue: a larger buffer is what would help); else None. Without the second
        condition, few Cubic flows in a large buffer (10 times the model at 0.8 MB on
        dyn-n-step, where the queue costs f far more) had the top probed."""
        loss_term, delay_term = self.link.f_terms(point.loss, point.delay_ns)
        ratio = point.loss / mathis_loss(self.link, rtt_ns, flows, point.buffer_bytes)
        if loss_term > delay_term and ratio > self.config.loss_insensitive_ratio:
            return ratio
        return None

    def _second_step(self, window: Window, step: Step, point: Point, seen: str) -> list[Decision]:
        """With loss ~ 1/B and delay ~ B, f = -(L B1 / B + D B / B1) from the terms L and
        D measured at B1 peaks at B1 sqrt(L / D): the second step goes there, at least
        `close_enough` and at most `first_stride` away. Loss far above what loss-based
        flows would lose at B1, and f's larger term, sends it to the search max instead."""
        top = self._search_max()
        if step.rtt_min_ns is not None and point.buffer_bytes < top:
            flows = self._flows(step)
            ratio = self._loss_insensitive(point, step.rtt_min_ns, flows)
            if ratio is not None:
                self.probing = True
                reason = (
                    f"{seen}; {ratio:.1f} times the loss of {flows} loss-based flows there, and "
                    f"the larger term of f: flows that do not back off on loss; step 2 probes "
                    f"the top, {top} B"
                )
                return [self._new_step(window, top, SEARCH, 2, reason, f=point.f)]
        loss_term, delay_term = self.link.f_terms(point.loss, point.delay_ns)
        reach = self.config.first_stride
        stride = min(max(math.sqrt(loss_term / delay_term), 1 / reach), reach)
        if abs(math.log(stride)) < math.log(self.config.close_enough):
            stride = self.config.close_enough if stride >= 1 else 1 / self.config.close_enough
        buffer = self._bounded(point.buffer_bytes * stride)
        if buffer == point.buffer_bytes:
            buffer = self._bounded(point.buffer_bytes / stride)
        if buffer == point.buffer_bytes:
            return self._settle(window, buffer, f"{seen}; no other buffer to try", point.f)
        reason = (
            f"{seen}; loss term {loss_term:.3f}, delay term {delay_term:.3f}: step 2 at "
            f"{buffer} B, where f would peak with loss ~ 1/B and delay ~ B"
        )
        return [self._new_step(window, buffer, SEARCH, 2, reason, f=point.f)]

    def _fitted_optimum(self, top: int) -> tuple[int, float, float, str, bool]:
        """The buffer with the highest fitted f around the best measured buffer `top` (and
        within the link's bounds), that f, the fitted f at `top`, what the fit found, and
        whether it is at the edge of the reach. The reach is `max_stride`, widened by that
        factor for each step in a row that went to its edge: the fit keeps pointing further,
        so go further."""
        xs = [float(p.buffer_bytes) for p in self.points]
        loss = PowerLaw.fit(xs, [p.loss for p in self.points], LOSS_EXPONENTS)
        delay = PowerLaw.fit(xs, [p.delay_ns for p in self.points], DELAY_EXPONENTS)
        reach = self.config.max_stride ** (1 + self.edge_steps)
        # f is taken as unimodal in the buffer: its peak lies between the measured neighbours
        # of the best measured buffer (or within reach past it, when it is an end).
        ordered = sorted(self.points, key=lambda p: p.buffer_bytes)
        peak = max(range(len(ordered)), key=lambda j: ordered[j].f)
        low = ordered[peak - 1].buffer_bytes if peak > 0 else self._bounded(min(xs) / reach)
        high = (
            ordered[peak + 1].buffer_bytes
            if peak < len(ordered) - 1
            else self._bounded(max(xs) * reach)
        )
        candidates = [low * (high / low) ** (i / (CANDIDATES - 1)) for i in range(CANDIDATES)]

        def fitted_f(buffer: float) -> float:
            return -sum(self.link.f_terms(loss(buffer), delay(buffer)))

        index = max(range(CANDIDATES), key=lambda i: fitted_f(candidates[i]))
        best = candidates[index]
        limits = (self.link.min_buffer_bytes, self._search_max())
        at_edge = index in (0, CANDIDATES - 1) and round(best) not in limits
        note = f"loss ~ B^{loss.exponent:.2f}, delay ~ B^{delay.exponent:.2f}"
        return round(best), fitted_f(best), fitted_f(top), note, at_edge

    def _new_step(
        self,
        window: Window,
        buffer: int,
        phase: str,
        trial: int | None,
        reason: str,
        f: float | None = None,
    ) -> Decision:
        raised = self.step is not None and buffer > self.step.buffer_bytes
        self.level_note = ""  # a step's own, once its queue is at its level
        decision = super()._new_step(window, buffer, phase, trial, reason, f)
        assert self.step is not None
        self.step.to_level = raised and phase == SEARCH
        return decision

    def _at_level(self, step: Step, window: Window) -> bool:
        """For a step with `to_level`: whether its queue has reached its level by this
        window. Past the settle wait, a window that lost packets says so (loss-based flows
        lose when the queue reaches the buffer), as does a mean queue over the last
        LEVEL_SPAN_NS within `level_tolerance` of the span before (a steady queue: BBR's
        own, or Cubic's between losses), or `fill_max_ns` since the buffer came in force."""
        if not step.to_level:
            return True
        assert step.in_force_ns is not None
        end, since = window.window_end_ns, window.window_end_ns - step.in_force_ns
        self._recent.append(window)
        while self._recent[0].window_end_ns <= max(end - 2 * LEVEL_SPAN_NS, step.in_force_ns):
            self._recent.popleft()
        how = ""
        if since >= self.config.fill_max_ns:
            how = "still moving at fill_max_ns"
        elif window.retransmissions and (
            window.window_start_ns >= step.in_force_ns + self._settle_ns(step)
        ):
            how = "a loss"
        elif self._recent[0].window_start_ns <= end - 2 * LEVEL_SPAN_NS and all(
            w.queue_delay_ns is not None for w in self._recent
        ):
            split = end - LEVEL_SPAN_NS
            last = statistics.fmean(
                w.queue_delay_ns or 0 for w in self._recent if w.window_end_ns > split
            )
            before = statistics.fmean(
                w.queue_delay_ns or 0 for w in self._recent if w.window_end_ns <= split
            )
            if abs(last - before) <= self.config.level_tolerance * max(last, before):
                how = f"steady, {before / 1e6:.1f} then {last / 1e6:.1f} ms"
        if not how:
            return False
        self._recent.clear()
        self.level_note = f" (queue at its level {since / 1e9:.1f} s in: {how})"
        return True

    def _settle(self, window: Window, buffer: int, reason: str, last_f: float) -> list[Decision]:
        self.phase = SETTLED
        reason += f": settling on {buffer} B"
        return [self._new_step(window, buffer, SETTLED, None, reason, f=last_f)]

    # -- persistence ----------------------------------------------------------------------

    def _observed_change(self, window: Window) -> str | None:
        if self.detector is None:
            return super()._observed_change(window)
        return self.detector.observe(window)

    def _change_holdoff_ns(self) -> int:
        # The traffic detector's baselines start `traffic_holdoff_ns` after a buffer change.
        return super()._change_holdoff_ns() if self.detector is None else 0

    def _watch_for_change(self, step: Step, window: Window, change: str | None) -> list[Decision]:
        """While settled: besides the change detector, a buffer settled on because the flows
        did not fill it is watched: once the mean queue over `measure_ns` fills
        `unfilled_fraction` of it, a search begins as the first did, those windows being its
        step 0 (measuring it again would keep the full buffer 3 s longer)."""
        if self.unfilled and window.queue_delay_ns is not None:
            end = window.window_end_ns
            self._watched.append(window)
            while self._watched[0].window_end_ns <= end - self.config.measure_ns:
                self._watched.popleft()
            drain_ns = duration_for_bytes(step.buffer_bytes, self.link.capacity_bps)
            mean_ns = statistics.fmean(w.queue_delay_ns or 0 for w in self._watched)
            full = len(self._watched) >= MIN_WINDOWS and mean_ns >= (
                self.config.unfilled_fraction * drain_ns
            )
            if full:
                self.phase, self.points, self.edge_steps, self.probing = SEARCH, [], 0, False
                self.unfilled = False
                self.note = (
                    f"the flows now fill the buffer they did not ({mean_ns / drain_ns:.0%} over "
                    f"{self.config.measure_ns / 1e9:g} s): new search; "
                )
                zero = Step(step.buffer_bytes, SEARCH, 0, None, decided_ns=end, in_force_ns=end)
                for watched in self._watched:
                    zero.measure(watched)
                self._watched.clear()
                self.step = zero
                return self._step_done(zero, window)
        return super()._watch_for_change(step, window, change)

    def snapshot(self) -> dict[str, Any]:
        return {
            **self._step_state(),
            "points": [list(p) for p in self.points],
            "edge_steps": self.edge_steps,
            "note": self.note,
            "level_note": self.level_note,
            "probing": self.probing,
            "unfilled": self.unfilled,
            "traffic_change": None if self.detector is None else self.detector.snapshot(),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self._restore_step(state)
        self.points = [Point(*p) for p in state["points"]]
        self.edge_steps = state["edge_steps"]
        self.note = state["note"]
        self.level_note = state.get("level_note", "")  # absent from earlier snapshots
        self.probing = state.get("probing", False)  # absent from earlier snapshots
        self.unfilled = state.get("unfilled", False)  # absent from earlier snapshots
        saved = state.get("traffic_change")  # absent from earlier snapshots: a new detector
        if self.detector is not None and saved is not None:
            self.detector = copy.copy(self.detector)  # a refused load leaves the policy's own
            self.detector.load(saved)
