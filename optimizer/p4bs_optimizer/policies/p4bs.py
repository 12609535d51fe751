"""P4BS (TNSM 2023, §V-B): search, in a closed loop, the buffer that maximises
f = -(w1 * p / p_hat + w2 * d / d_hat), settle on it, and search again when the traffic changes.

The policy is a state machine over the link's windows, in event time (`window_end_ns`):

- "bound_search" (Algorithm 1): start at the BDP, C * RTT with RTT the window's SRTT (its
  RTT_min while there is no SRTT), capped at C * d_hat; while the loss measured there is
  above `loss_epsilon`, double; a doubling past C * d_hat makes C * d_hat the upper bound
  without measuring it, else the first buffer with loss <= `loss_epsilon` is. The lower
  bound is C * RTT_min / sqrt(N), from the last measured window (N at least 1).
- "optimise" (Algorithm 2): Bayesian optimisation (`bayes.BufferSearch`, GP with an RBF
  kernel and Expected Improvement) over [lower, upper], warm-started with the bound search's
  measurements inside the bounds. Each trial applies the suggested buffer and measures it.
  Before each trial the search stops when the largest EI on a grid of the bounds is at most
  `ei_epsilon` times the noise, the median standard error of the observations' means (an
  improvement that small is a fraction of what one trial can resolve; with noise-free
  measurements only an EI of 0 stops it), once `min_trials` trials were made, or when
  `max_trials` (the paper's n-bar) trials were made.
- "settled": the best observed buffer (highest mean f, the paper's x*) stays in force.
  A window flagged `change` (the metrics job's z-score detector) once the buffer has been in
  force for `change_holdoff_ns` restarts the bound search, keeping nothing: the flag says f
  itself changed (N, RTTs or the congestion control mix did), so the old observations
  describe another function and would mislead the GP; the BDP also has to be measured
  again. The holdoff exists because settling moves f, and the detector would otherwise flag
  the policy's own move.

Every decided buffer is then measured the same way: windows count only once the windows say
the buffer is in force (`Window.buffer_bytes`, joined by the metrics job from the applied
decisions), from `settle_ns` after the first such window, until `measure_ns` of windows were
counted (and at least 2). A step's f is the mean of those windows' f with its standard error;
a bound-search step's loss is their retransmissions over their data packets. A decision that
is not in force `reissue_after_ns` (and at least a step's time) after it was made is made
again.

`snapshot` holds everything as JSON data: the phase, the step being measured (with what it
measured so far), the bounds, the bound search's and the trials' observations and the
incumbent. `restore` rebuilds the Ax search from the observations, and the search is a pure
function of them and the seed, so a restarted optimizer decides exactly what the original
would have.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from p4bs.config import LinkConfig
from p4bs.units import bytes_for_duration
from p4bs_optimizer.policies.base import Decision, Policy, Window, bdp_bytes
from p4bs_optimizer.policies.baselines import OptionReader
from p4bs_optimizer.policies.bayes import BufferSearch, Observation

BOUND_SEARCH = "bound_search"
OPTIMISE = "optimise"
SETTLED = "settled"
MIN_WINDOWS = 2  # a standard error needs two windows


@dataclass(frozen=True)
class P4bsOptions:
    """The policy's options (the link's `policy_options`), in the system's units."""

    # epsilon_p of Algorithm 1, a fraction. The paper gives no value; 0.25% is the threshold of
    # the authors' published controller (github.com/ekfoury/p4bs-bo, global_defs.py).
    loss_epsilon: float = 0.0025
    settle_ns: int = 2_000_000_000  # wait after a buffer is in force before measuring
    measure_ns: int = 3_000_000_000  # windows measured per step
    ei_epsilon: float = 0.1  # stop when max EI <= ei_epsilon * median SEM of the observations
    max_trials: int = 8  # n-bar: BO trials at most (Fig. 10: EI stopped at the 8th)
    # Trials before the EI rule may stop the search: a GP fitted to one or two points (the
    # bound search's) can claim no improvement anywhere, and stopped a search on the testbed
    # at the cap without a single trial.
    min_trials: int = 3
    # A decision the windows do not show this long after it was made is made again (the
    # service held it, or lost it). Windows arrive late when the metrics job lags (on the
    # closed-loop testbed here, 5 to 40 s behind), and the decision only shows in windows
    # that end after it was applied.
    reissue_after_ns: int = 30_000_000_000
    seed: int = 0  # of the acquisition optimiser's random starts
    # The metrics job's z-score looks back 50 windows of 100 ms: after 5 s its window holds
    # only windows under the settled buffer, so a flag is no longer about the policy's move.
    change_holdoff_ns: int = 5_000_000_000

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> P4bsOptions:
        """The options of a `policy_options` table; raises PolicyOptionError naming the first
        unknown option or bad value. Durations are ns or strings such as "2s"."""
        r, d = OptionReader(P4bsPolicy.name, options), cls()
        parsed = cls(
            loss_epsilon=r.number(
                "loss_epsilon", d.loss_epsilon, low=0, high=1, low_open=True, high_open=True
            ),
            settle_ns=r.duration_ns("settle_ns", d.settle_ns, allow_zero=True),
            measure_ns=r.duration_ns("measure_ns", d.measure_ns),
            ei_epsilon=r.number("ei_epsilon", d.ei_epsilon, low=0),
            max_trials=r.integer("max_trials", d.max_trials, low=1, high=1000),
            min_trials=r.integer("min_trials", d.min_trials, low=0, high=1000),
            reissue_after_ns=r.duration_ns("reissue_after_ns", d.reissue_after_ns, allow_zero=True),
            seed=r.integer("seed", d.seed, low=0, high=2**32 - 1),
            change_holdoff_ns=r.duration_ns(
                "change_holdoff_ns", d.change_holdoff_ns, allow_zero=True
            ),
        )
        r.finish()
        return parsed


@dataclass
class _Step:
    """One decided buffer and what was measured under it so far."""

    buffer_bytes: int
    phase: str
    trial: int | None
    f: float | None  # the decision's f: mean f of the step before
    decided_ns: int  # when decided, or last asked again
    in_force_ns: int | None = None  # end of the first window with the buffer in force
    f_values: list[float] = field(default_factory=list)
    retransmissions: int = 0
    data_packets: int = 0
    measured_ns: int = 0
    rtt_min_ns: int | None = None  # of the last measured window that had one
    long_flows: int = 0  # of the last measured window

    def decision(self, reason: str) -> Decision:
        return Decision(
            buffer_bytes=self.buffer_bytes,
            phase=self.phase,
            reason=reason,
            trial=self.trial,
            f=self.f,
        )

    def measure(self, window: Window) -> None:
        self.f_values.append(window.f)
        self.retransmissions += window.retransmissions
        self.data_packets += window.data_packets
        self.measured_ns += window.window_end_ns - window.window_start_ns
        if window.rtt_min_ns is not None:
            self.rtt_min_ns = window.rtt_min_ns
        self.long_flows = window.long_flows

    def observation(self) -> Observation:
        """Mean f of the measured windows and its standard error."""
        mean = statistics.fmean(self.f_values)
        sem = statistics.stdev(self.f_values) / math.sqrt(len(self.f_values))
        return Observation(self.buffer_bytes, mean, sem)


class P4bsPolicy(Policy):
    """P4BS: Algorithm 1's bounds, then GP + EI trials, then the best buffer until f changes."""

    name: ClassVar[str] = "p4bs"

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self.config = P4bsOptions.parse(options)
        self._start_over()

    def _start_over(self) -> None:
        self.phase = BOUND_SEARCH
        self.step: _Step | None = None  # None: waiting for an RTT to start from
        self.cap_bytes = 0  # C * d_hat within the link's bounds
        self.rtt_ns = 0  # the RTT the search's BDP came from
        self.bound_points: list[Observation] = []
        self.low_bytes = 0
        self.high_bytes = 0
        self.trials: list[Observation] = []
        self.incumbent: Observation | None = None
        self._search: BufferSearch | None = None

    def decide(self, window: Window) -> list[Decision]:
        step = self.step
        if step is None:
            return self._start_bound_search(window, "")
        if window.buffer_bytes != step.buffer_bytes:
            return self._not_in_force(step, window)
        if step.in_force_ns is None:
            step.in_force_ns = window.window_end_ns  # the change happened inside this window
            return []
        if self.phase == SETTLED:
            return self._watch_for_change(step, window)
        if window.window_start_ns < step.in_force_ns + self.config.settle_ns:
            return []
        step.measure(window)
        if step.measured_ns < self.config.measure_ns or len(step.f_values) < MIN_WINDOWS:
            return []
        if self.phase == BOUND_SEARCH:
            return self._bound_step_done(step, window)
        return self._trial_done(step, window)

    # -- bound search (Algorithm 1) -------------------------------------------------------

    def _start_bound_search(self, window: Window, prefix: str) -> list[Decision]:
        rtt_ns = window.srtt_ns if window.srtt_ns is not None else window.rtt_min_ns
        if rtt_ns is None:
            return []  # no RTT yet: nothing to size a BDP from
        rtt_name = "SRTT" if window.srtt_ns is not None else "RTT_min"
        capacity = self.link.capacity_bps
        self.rtt_ns = rtt_ns
        self.cap_bytes = self.clamp(bytes_for_duration(self.link.max_queue_delay_ns, capacity))
        bdp = bdp_bytes(capacity, rtt_ns)
        buffer = self.clamp(min(bdp, self.cap_bytes))
        reason = (
            f"{prefix}bound search: BDP = C * {rtt_name} = {capacity / 1e6:g} Mbit/s * "
            f"{_ms(rtt_ns)} = {round(bdp)} B"
        )
        if bdp > self.cap_bytes:
            reason += f", above the cap {self._cap_name()} = {self.cap_bytes} B"
        reason += f"; measuring loss at {buffer} B"
        return [self._new_step(window, buffer, BOUND_SEARCH, None, reason)]

    def _bound_step_done(self, step: _Step, window: Window) -> list[Decision]:
        obs = step.observation()
        self.bound_points.append(obs)
        loss = step.retransmissions / step.data_packets if step.data_packets else 0.0
        epsilon = self.config.loss_epsilon
        seen = f"loss {loss:.3%} at {step.buffer_bytes} B (f {obs.mean:.4f} +- {obs.sem:.4f})"
        if loss <= epsilon:
            why = f"{seen} <= epsilon_p {epsilon:.3%}: upper bound {step.buffer_bytes} B"
            return self._bounds_found(step, window, step.buffer_bytes, why)
        doubled = 2 * step.buffer_bytes
        if doubled > self.cap_bytes:
            why = (
                f"{seen} > epsilon_p {epsilon:.3%}, and {doubled} B would pass the cap "
                f"{self._cap_name()} = {self.cap_bytes} B: upper bound {self.cap_bytes} B"
            )
            return self._bounds_found(step, window, self.cap_bytes, why)
        reason = f"{seen} > epsilon_p {epsilon:.3%}: doubling to {doubled} B"
        return [self._new_step(window, doubled, BOUND_SEARCH, None, reason, f=obs.mean)]

    def _cap_name(self) -> str:
        at_d_hat = bytes_for_duration(self.link.max_queue_delay_ns, self.link.capacity_bps)
        return "C * d_hat" if self.cap_bytes == at_d_hat else "the link's buffer limit"

    def _bounds_found(self, step: _Step, window: Window, upper: int, why: str) -> list[Decision]:
        rtt_min_ns = step.rtt_min_ns if step.rtt_min_ns is not None else self.rtt_ns
        flows = max(step.long_flows, 1)
        self.high_bytes = upper
        self.low_bytes = min(
            self.clamp(bdp_bytes(self.link.capacity_bps, rtt_min_ns) / math.sqrt(flows)), upper
        )
        why += (
            f"; lower bound C * RTT_min / sqrt(N) = {self.low_bytes} B "
            f"(RTT_min {_ms(rtt_min_ns)}, N {flows})"
        )
        last_f = self.bound_points[-1].mean
        if self.low_bytes >= self.high_bytes:
            measured = [o for o in self.bound_points if o.buffer_bytes == upper]
            why += "; nothing to search between them"
            return self._settle(window, upper, measured[-1] if measured else None, last_f, why)
        self.phase = OPTIMISE
        return self._next_trial(window, last_f, why)

    # -- Bayesian optimisation (Algorithm 2) ----------------------------------------------

    def _trial_done(self, step: _Step, window: Window) -> list[Decision]:
        obs = step.observation()
        search = self._ensure_search()  # before the new trial joins `trials`: it is told next
        self.trials.append(obs)
        search.tell(*obs)
        seen = f"trial {step.trial}: f at {obs.buffer_bytes} B = {obs.mean:.4f} +- {obs.sem:.4f}"
        return self._next_trial(window, obs.mean, seen)

    def _next_trial(self, window: Window, last_f: float, prefix: str) -> list[Decision]:
        """The next trial's decision, or the settled one when Algorithm 2 stops."""
        search = self._ensure_search()
        done = len(self.trials)
        if done >= self.config.max_trials:
            reason = f"{prefix}; {done} trials made (max_trials)"
            best = search.best()
            return self._settle(window, best.buffer_bytes, best, last_f, reason)
        max_ei = search.max_expected_improvement()
        if done < self.config.min_trials:
            ei_text = f"max EI {max_ei:.3g}, {done} of at least {self.config.min_trials} trials"
        elif search.observations:
            noise = statistics.median(o.sem for o in search.observations)
            threshold = self.config.ei_epsilon * noise
            ei_text = f"max EI {max_ei:.3g} ({_ratio(max_ei, noise)} median SEM)"
            if max_ei <= threshold:
                reason = f"{prefix}; {ei_text} <= ei_epsilon {self.config.ei_epsilon:g}"
                best = search.best()
                return self._settle(window, best.buffer_bytes, best, last_f, reason)
        else:
            ei_text = "no observation inside the bounds yet"
        buffer = self.clamp(search.suggest())
        trial = done + 1
        reason = (
            f"{prefix}; search [{self.low_bytes}, {self.high_bytes}] B, {ei_text}: "
            f"trial {trial} at {buffer} B"
        )
        return [self._new_step(window, buffer, OPTIMISE, trial, reason, f=last_f)]

    def _ensure_search(self) -> BufferSearch:
        """The Ax search over the bounds, built from the observations when missing (after
        the bounds were found, or after `restore`)."""
        if self._search is None:
            warm = [
                o for o in self.bound_points if self.low_bytes <= o.buffer_bytes <= self.high_bytes
            ]
            self._search = BufferSearch(
                self.low_bytes,
                self.high_bytes,
                seed=self.config.seed,
                observations=[*warm, *self.trials],
            )
        return self._search

    # -- settled --------------------------------------------------------------------------

    def _settle(
        self,
        window: Window,
        buffer: int,
        incumbent: Observation | None,
        last_f: float,
        why: str,
    ) -> list[Decision]:
        """Settles on `buffer`, measured as `incumbent` (None: never measured)."""
        self.incumbent = incumbent
        self._search = None  # no more trials; the observations stay in the snapshot
        self.phase = SETTLED
        measured = f"f {incumbent.mean:.4f} +- {incumbent.sem:.4f}" if incumbent else "not measured"
        reason = f"{why}: settling on {buffer} B ({measured})"
        return [self._new_step(window, buffer, SETTLED, None, reason, f=last_f)]

    def _watch_for_change(self, step: _Step, window: Window) -> list[Decision]:
        assert step.in_force_ns is not None
        if not window.change or (
            window.window_start_ns < step.in_force_ns + self.config.change_holdoff_ns
        ):
            return []
        reason = (
            f"change detected (z-score {window.zscore:.1f}, f {window.f:.4f}) while settled "
            f"on {step.buffer_bytes} B: new search, nothing kept; "
        )
        self._start_over()
        return self._start_bound_search(window, reason)

    # -- every step -----------------------------------------------------------------------

    def _new_step(
        self,
        window: Window,
        buffer: int,
        phase: str,
        trial: int | None,
        reason: str,
        f: float | None = None,
    ) -> Decision:
        self.step = _Step(buffer, phase, trial, f, decided_ns=window.window_end_ns)
        return self.step.decision(reason)

    def _not_in_force(self, step: _Step, window: Window) -> list[Decision]:
        """A window under another buffer: it does not count. A buffer that was in force and
        is no longer is measured afresh once it is back; one not in force for a whole
        step's time is decided again."""
        now = window.window_end_ns
        if step.in_force_ns is not None:
            self.step = _Step(step.buffer_bytes, step.phase, step.trial, step.f, decided_ns=now)
            return []
        waited = now - step.decided_ns
        if waited < max(
            self.config.settle_ns + self.config.measure_ns, self.config.reissue_after_ns
        ):
            return []
        step.decided_ns = now
        return [
            step.decision(
                f"{step.buffer_bytes} B not in force {waited / 1e9:.1f} s after it was decided "
                f"(the windows say {window.buffer_bytes} B): deciding it again"
            )
        ]

    # -- persistence ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "step": asdict(self.step) if self.step is not None else None,
            "cap_bytes": self.cap_bytes,
            "rtt_ns": self.rtt_ns,
            "bound_points": [list(o) for o in self.bound_points],
            "low_bytes": self.low_bytes,
            "high_bytes": self.high_bytes,
            "trials": [list(o) for o in self.trials],
            "incumbent": list(self.incumbent) if self.incumbent is not None else None,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self._start_over()
        self.phase = state["phase"]
        self.step = _Step(**state["step"]) if state["step"] is not None else None
        self.cap_bytes = state["cap_bytes"]
        self.rtt_ns = state["rtt_ns"]
        self.bound_points = [Observation(*o) for o in state["bound_points"]]
        self.low_bytes = state["low_bytes"]
        self.high_bytes = state["high_bytes"]
        self.trials = [Observation(*o) for o in state["trials"]]
        incumbent = state["incumbent"]
        self.incumbent = Observation(*incumbent) if incumbent is not None else None


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def _ratio(value: float, scale: float) -> str:
    return f"{value / scale:.2f}" if scale > 0 else "inf"
