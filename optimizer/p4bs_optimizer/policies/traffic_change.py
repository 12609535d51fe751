"""A change detector that sees the traffic, not the policy's own moves (issue 39, item 5).

The metrics job's z-score of f (streaming-jobs/README.md) compares f with its last 50 windows:
a searching policy's own trials spread those windows, so that a real shift of the traffic
hides in their spread, and a buffer move shifts f as much as a change of the traffic does.
This detector watches what a sizing policy needs, each signal against a baseline of its own:

- `flows`: N, the window's long flows. Not the flows with RTT samples, which loss-delay-fit
  sizes its first guess for: short flows count there, and a burst of them (20 -> 35 on
  `dyn-burst`, whose best buffer is the same in every phase) alarmed; the long-flow count
  sees joins up to ~4 s later (optimizer/README.md has the measurements). Flows do not come
  or go because the buffer moved, so its baseline restarts only after a detected change.
- `rtt_min`: the base RTT, the windows' `rtt_min_ns` (the minimum RTT sample over the metrics
  job's `rtt_min_horizon`, 10 s; LinkMetrics has no other base RTT). A window without one (no
  RTT sample in the horizon) gives this signal no value: it neither extends nor breaks a run
  of moved windows. One sample too low holds it down for the whole horizon (on the committed
  Fig. 11 surfaces, 11-12 ms now and then on a 20 ms path): its baseline is the highest of
  its windows, and a fall counts once it lasted longer than `rtt_drop_ns` (a rise of a
  minimum is real at once).
- `loss`: the loss regime, the windows' retransmissions over their data packets. Only a
  rise counts: the same flows losing less (BBR after its first 30 s in a large buffer) is no
  reason to search again, and flows leaving, the usual cause of less loss, show in N.
- `delay`: the delay regime, the windows' mean queueing delay (no value without a sample).
- `cca`: the CCA mix, as loss-insensitivity: the windows' loss over what N loss-based flows
  would lose keeping that buffer full (`expected_loss`, Mathis et al.'s model, the one
  loss-delay-fit classifies flows with). Loss-based flows sit near 1-2 times it, flows that
  do not back off on loss (BBR) far above (11-26 on the Fig. 11 surfaces). It moves only
  while the loss regime moves too: for few flows in a large buffer the model's loss is tiny
  and their loss, in bursts seconds apart, many times it either way.

The last four depend on the buffer: their baselines restart after each buffer change, from
`holdoff_ns` after the first window under the new buffer (the queue refills in ~7-10 s after
a raise, and `rtt_min_ns` is a minimum over 10 s), so a buffer move is never a change.

A baseline is a signal over its first `baseline_ns` of windows after the holdoff (pooled:
sums over the windows, e.g. retransmissions over data packets). N and RTT_min are then judged
a window at a time; loss, delay and the CCA mix over the windows so far, each weighed by
exp(-age / `smoothing_ns`) (with a large buffer loss-based flows lose in bursts seconds apart,
Cubic's sawtooth: a window alone is no regime). A window
moves a signal when its value is at least `ratio` times the baseline or at most 1/`ratio` of
it, and differs from it by at least the signal's `floor` (so that a rate near 0 does not turn
noise into a large ratio). `persistence` windows in a row that move a signal (windows without
a value skipped) signal a change, its reason naming every signal moving then, by how much
and for how many windows; then every baseline restarts after the holdoff, as after a buffer
change. optimizer/README.md says why each default, and what `p4bs eval detection` measured
with them on the dynamic suite's exploratory runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from p4bs.config import LinkConfig
from p4bs_optimizer.policies.base import Window
from p4bs_optimizer.policies.baselines import OptionReader

# (rtt_min_ns, flows, buffer_bytes) -> the loss rate of that many loss-based flows
ExpectedLoss = Callable[[int, int, float], float]
SIGNALS = ("flows", "rtt_min", "loss", "delay", "cca")
BUFFER_DRIVEN = ("rtt_min", "loss", "delay", "cca")  # restarted by a buffer change
SMOOTHED = ("loss", "delay", "cca")  # windows weighed by exp(-age / `smoothing_ns`)
RISES_ONLY = ("loss", "cca")  # a fall alone is no change (optimizer/README.md)


@dataclass(frozen=True)
class TrafficChangeOptions:
    """The detector's thresholds (a policy's `traffic_*` options)."""

    # After a buffer change (or a detected change) before a baseline starts: a raised buffer
    # fills in ~7-10 s (eval/README.md), and RTT_min is a minimum over the last 10 s.
    holdoff_ns: int = 10_000_000_000
    # A baseline's windows, and the smoothed signals' time constant (as steady a mean as one
    # over the last 10 s, in two numbers): on the Fig. 11 surfaces' fixed-buffer runs a
    # baseline and a span of 5 s gave 8.4 false alarms an hour, 10 s 2.2 (optimizer/README.md).
    baseline_ns: int = 10_000_000_000
    smoothing_ns: int = 5_000_000_000
    # Windows in a row that must move a signal: 2 s at 0.5 s windows, a step's `measure_ns`
    # (a shift shorter than one step's measurement is not worth a new search).
    persistence: int = 4
    # N: the smallest change that moves loss-delay-fit's model optimum (C RTT + B ~ N^(2/3))
    # by more than its `close_enough` (1.15): 1.15^(3/2) = 1.23; and at least 3 flows.
    flows_ratio: float = 1.25
    flows_floor: float = 3.0
    # RTT_min: the BDP (and the buffer that follows it) moves with it; 1.25 as N gave 7
    # false alarms in 1.4 h of the Fig. 11 surfaces (a low sample held for 10 s), 1.5 none.
    # At least 2 ms, above the per-flow jitter of a few ms the testbed adds.
    rtt_ratio: float = 1.5
    rtt_floor_ns: int = 2_000_000
    # A fall of RTT_min counts once it lasted longer than the metrics job's
    # `rtt_min_horizon` (10 s): a single sample too low lasts exactly that.
    rtt_drop_ns: int = 10_000_000_000
    # Loss and delay regimes: double or half, and a move of at least a fifth of the SLA's
    # bound (p-hat, d-hat): less moves f by under 0.1 at weight 0.5 (loss-delay-fit's
    # `good_enough`); a tenth alarmed on Cubic 25's 0.1-0.3% loss in 200 ms.
    loss_ratio: float = 2.0
    loss_floor: float = 0.2  # of p-hat
    delay_ratio: float = 2.0
    delay_floor: float = 0.2  # of d-hat
    # CCA mix: loss over loss-based flows' at least tripled (or a third), with the loss
    # regime moving too: loss-based flows read 1.2-2.1, BBR 11-26 on the Fig. 11 surfaces.
    cca_ratio: float = 3.0

    @classmethod
    def parse(cls, r: OptionReader) -> TrafficChangeOptions:
        """The `traffic_*` options of a policy's reader (PolicyOptionError names a bad one)."""
        d = cls()

        def ratio(name: str, default: float) -> float:
            return r.number(f"traffic_{name}", default, low=1, low_open=True)

        return cls(
            holdoff_ns=r.duration_ns("traffic_holdoff_ns", d.holdoff_ns, allow_zero=True),
            baseline_ns=r.duration_ns("traffic_baseline_ns", d.baseline_ns),
            smoothing_ns=r.duration_ns("traffic_smoothing_ns", d.smoothing_ns, allow_zero=True),
            persistence=r.integer("traffic_persistence", d.persistence, low=1, high=1000),
            flows_ratio=ratio("flows_ratio", d.flows_ratio),
            flows_floor=r.number("traffic_flows_floor", d.flows_floor, low=0),
            rtt_ratio=ratio("rtt_ratio", d.rtt_ratio),
            rtt_floor_ns=r.duration_ns("traffic_rtt_floor_ns", d.rtt_floor_ns, allow_zero=True),
            rtt_drop_ns=r.duration_ns("traffic_rtt_drop_ns", d.rtt_drop_ns, allow_zero=True),
            loss_ratio=ratio("loss_ratio", d.loss_ratio),
            loss_floor=r.number("traffic_loss_floor", d.loss_floor, low=0),
            delay_ratio=ratio("delay_ratio", d.delay_ratio),
            delay_floor=r.number("traffic_delay_floor", d.delay_floor, low=0),
            cca_ratio=ratio("cca_ratio", d.cca_ratio),
        )


@dataclass
class Baseline:
    """One signal's baseline and the windows in a row that moved it. A value is a ratio of
    sums over windows (loss: retransmissions over data packets), so that a baseline or a span
    of windows weighs each window by what it carried."""

    collect_from_ns: int  # windows starting before this do not count (the holdoff)
    first_ns: int | None = None  # start of the first window collected
    total: float = 0.0  # the baseline's sums, until `baseline_ns` were collected
    weight: float = 0.0
    reference: float | None = None  # total / weight, once `baseline_ns` were collected
    # A smoothed signal's sums, each window's weighing exp(-age / smoothing_ns), and the end
    # of the last window in them
    smooth_total: float = 0.0
    smooth_weight: float = 0.0
    smooth_end_ns: int | None = None
    streak: int = 0  # windows in a row that moved the signal
    moved_from_ns: int | None = None  # start of the first of them

    def value(self, end_ns: int, part: tuple[float, float], time_constant_ns: int) -> float:
        """The signal over the windows so far, weighed by exp(-age / `time_constant_ns`) (0:
        this window alone). Two sums, whatever the time constant: a link's state stays small
        (the service saves it every second)."""
        if time_constant_ns == 0:
            return part[0] / part[1]
        decay = 0.0
        if self.smooth_end_ns is not None:
            decay = math.exp(-(end_ns - self.smooth_end_ns) / time_constant_ns)
        self.smooth_total = decay * self.smooth_total + part[0]
        self.smooth_weight = decay * self.smooth_weight + part[1]
        self.smooth_end_ns = end_ns
        return self.smooth_total / self.smooth_weight

    @classmethod
    def loaded(cls, state: Any, what: str) -> Baseline:
        """A baseline from its snapshot; raises ValueError or TypeError naming what is wrong."""
        if not isinstance(state, Mapping) or set(state) != {f.name for f in fields(cls)}:
            raise ValueError(f"{what} is not a baseline: {state!r}")
        baseline = cls(**state)
        _whole(baseline.collect_from_ns, f"{what}.collect_from_ns")
        _whole(baseline.streak, f"{what}.streak", low=0)
        if baseline.first_ns is not None:
            _whole(baseline.first_ns, f"{what}.first_ns")
        _real(baseline.total, f"{what}.total")
        _real(baseline.weight, f"{what}.weight")
        if baseline.moved_from_ns is not None:
            _whole(baseline.moved_from_ns, f"{what}.moved_from_ns")
        if baseline.reference is not None:
            _real(baseline.reference, f"{what}.reference")
        _real(baseline.smooth_total, f"{what}.smooth_total")
        _real(baseline.smooth_weight, f"{what}.smooth_weight")
        if baseline.smooth_end_ns is not None:
            _whole(baseline.smooth_end_ns, f"{what}.smooth_end_ns")
            if baseline.smooth_weight <= 0:
                raise ValueError(f"{what}.smooth_weight is not positive")
        return baseline


def _whole(value: Any, what: str, low: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} {value!r} is not a whole number")
    if low is not None and value < low:
        raise ValueError(f"{what} {value} is below {low}")


def _real(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{what} {value!r} is not a finite number")
    if value < 0:
        raise ValueError(f"{what} {value} is negative")


class TrafficChangeDetector:
    """One link's detector: `observe` each window in order (its `buffer_bytes` the buffer in
    force), which returns why the traffic changed, or None."""

    def __init__(
        self,
        link: LinkConfig,
        options: TrafficChangeOptions,
        expected_loss: ExpectedLoss | None = None,
    ) -> None:
        self.link = link
        self.options = options
        self.expected_loss = expected_loss  # None: no `cca` signal
        self._reset()

    def _reset(self) -> None:
        self.buffer_bytes: int | None = None  # in force in the last window observed
        self.started = False  # a window was observed
        self.baselines = {name: Baseline(collect_from_ns=0) for name in SIGNALS}

    def observe(self, window: Window) -> str | None:
        """Takes one window; returns the signals it completed a change of, as a reason."""
        o = self.options
        if not self.started:
            self._restart(SIGNALS, window)
        elif window.buffer_bytes != self.buffer_bytes:
            self._restart(BUFFER_DRIVEN, window)
        self.started, self.buffer_bytes = True, window.buffer_bytes
        moving: dict[str, float] = {}  # the signals this window moved, and by what
        for name, part in self._parts(window).items():
            baseline = self.baselines[name]
            if part is None or window.window_start_ns < baseline.collect_from_ns:
                continue
            time_constant = o.smoothing_ns if name in SMOOTHED else 0
            if baseline.reference is None:
                if baseline.first_ns is None:
                    baseline.first_ns = window.window_start_ns
                if name == "rtt_min":  # its highest: a minimum errs only low
                    baseline.total, baseline.weight = max(baseline.total, part[0]), 1.0
                else:
                    baseline.total += part[0]
                    baseline.weight += part[1]
                baseline.value(window.window_end_ns, part, time_constant)  # it starts meanwhile
                if window.window_end_ns - baseline.first_ns >= o.baseline_ns:
                    baseline.reference = baseline.total / baseline.weight
                continue
            value = baseline.value(window.window_end_ns, part, time_constant)
            # The CCA mix moves only with the loss regime: the Mathis prediction of few flows
            # in a large buffer is tiny, and their loss, in bursts seconds apart, many times it.
            gated = name == "cca" and self.baselines["loss"].streak == 0
            if not gated and self._moves(name, value, baseline.reference):
                if baseline.streak == 0:
                    baseline.moved_from_ns = window.window_start_ns
                baseline.streak += 1
                moving[name] = value
            else:
                baseline.streak, baseline.moved_from_ns = 0, None
        if not any(self._persisted(name, value, window) for name, value in moving.items()):
            return None
        # The reason names every signal moving now, with its windows in a row: a join of
        # BBR flows shows in the loss regime first, and the CCA mix a window or two later.
        reason = "; ".join(self._describe(name, value) for name, value in moving.items())
        self._restart(SIGNALS, window)
        return reason

    def _persisted(self, name: str, value: float, window: Window) -> bool:
        """Whether the signal moved long enough: `persistence` windows; a fall of RTT_min
        also longer than `rtt_drop_ns`, for one sample too low (the job's RTT samples hold a
        few such) holds the minimum down for its whole horizon, a real fall for good."""
        baseline = self.baselines[name]
        if baseline.streak < self.options.persistence:
            return False
        if name != "rtt_min" or baseline.reference is None or value > baseline.reference:
            return True
        assert baseline.moved_from_ns is not None
        return window.window_end_ns - baseline.moved_from_ns > self.options.rtt_drop_ns

    def _restart(self, names: tuple[str, ...], window: Window) -> None:
        # The holdoff runs from the end of the first window under the new buffer (the change
        # happened inside it).
        start = window.window_end_ns + self.options.holdoff_ns
        for name in names:
            self.baselines[name] = Baseline(collect_from_ns=start)

    def _parts(self, window: Window) -> dict[str, tuple[float, float] | None]:
        """Each signal's (value sum, weight) in the window; None: no value."""
        flows = window.long_flows
        packets, lost = window.data_packets, float(window.retransmissions)
        cca = None
        if (
            self.expected_loss is not None
            and packets > 0
            and window.rtt_min_ns is not None
            and window.buffer_bytes is not None
        ):
            expected = self.expected_loss(window.rtt_min_ns, max(flows, 1), window.buffer_bytes)
            cca = (lost, packets * expected) if expected > 0 else None
        delay = window.queue_delay_ns
        return {
            "flows": (float(flows), 1.0),
            "rtt_min": None if window.rtt_min_ns is None else (float(window.rtt_min_ns), 1.0),
            "loss": (lost, float(packets)) if packets > 0 else None,
            "delay": None if delay is None else (float(delay), 1.0),
            "cca": cca,
        }

    def _band(self, name: str) -> tuple[float, float]:
        """The signal's ratio and floor (in its own units)."""
        o, link = self.options, self.link
        return {
            "flows": (o.flows_ratio, o.flows_floor),
            "rtt_min": (o.rtt_ratio, float(o.rtt_floor_ns)),
            "loss": (o.loss_ratio, o.loss_floor * link.max_loss),
            "delay": (o.delay_ratio, o.delay_floor * link.max_queue_delay_ns),
            "cca": (o.cca_ratio, 0.0),
        }[name]

    def _moves(self, name: str, value: float, reference: float) -> bool:
        ratio, floor = self._band(name)
        if abs(value - reference) < floor:
            return False
        if name in RISES_ONLY:
            return value >= reference * ratio
        return value >= reference * ratio or value * ratio <= reference

    def _describe(self, name: str, value: float) -> str:
        """Which signal moved, from what to what, by what factor, over how many windows."""
        reference, streak = self.baselines[name].reference, self.baselines[name].streak
        assert reference is not None
        moved = {
            "flows": f"N {reference:g} -> {value:g}",
            "rtt_min": f"RTT_min {reference / 1e6:.1f} -> {value / 1e6:.1f} ms",
            "loss": f"loss {reference:.3%} -> {value:.3%}",
            "delay": f"queueing delay {reference / 1e6:.1f} -> {value / 1e6:.1f} ms",
            "cca": f"CCA mix: loss over loss-based flows' {reference:.1f} -> {value:.1f}",
        }[name]
        factor = f"x{value / reference:.2f}" if reference > 0 else "from 0"
        return f"{moved} ({factor}, {streak} windows)"

    # -- persistence ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "buffer_bytes": self.buffer_bytes,
            "started": self.started,
            "baselines": {name: asdict(b) for name, b in self.baselines.items()},
        }

    def load(self, state: Any) -> None:
        """Takes what `snapshot` returned; raises ValueError, TypeError or KeyError naming
        what does not fit (and leaves the detector as it was)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"a detector's state is a JSON object, not {type(state).__name__}")
        buffer, started, saved = state["buffer_bytes"], state["started"], state["baselines"]
        if buffer is not None:
            _whole(buffer, "traffic_change.buffer_bytes", low=0)
        if not isinstance(started, bool):
            raise TypeError(f"traffic_change.started {started!r} is not true or false")
        if not isinstance(saved, Mapping) or set(saved) != set(SIGNALS):
            raise ValueError(f"traffic_change.baselines must have {', '.join(SIGNALS)}")
        baselines = {n: Baseline.loaded(saved[n], f"traffic_change.{n}") for n in SIGNALS}
        self.buffer_bytes, self.started, self.baselines = buffer, started, baselines

    def restore(self, state: Any) -> str | None:
        """Resumes from a snapshot; never raises: what does not fit leaves the detector as new
        and is returned as the reason (None: resumed)."""
        try:
            self.load(state)
        except (LookupError, TypeError, ValueError) as exc:
            self._reset()
            return f"{type(exc).__name__}: {exc}"
        return None
