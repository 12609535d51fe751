"""P4BS (TNSM 2023, §V-B): search, in a closed loop, the buffer that maximises
f = -(w1 * p / p_hat + w2 * d / d_hat), settle on it, and search again when the traffic changes.

The policy is a state machine over the link's windows, in event time (`window_end_ns`). It
starts once a window shows the link busy (`min_utilisation`).

- "bound_search" (Algorithm 1): start at the BDP, C * RTT with RTT the window's SRTT (its
  RTT_min while there is no SRTT), capped at `search_max`. Loss there of at least
  `high_loss` makes the bounds [BDP, search_max / 2] at once (the authors' controller);
  otherwise, while the loss measured is above `loss_epsilon`, double; a doubling past
  search_max makes search_max the upper bound without measuring it, else the first buffer
  with loss <= `loss_epsilon` is. The lower bound is then C * RTT_min / sqrt(N), from the
  last measured window (N at least 1).
- "optimise" (Algorithm 2): Bayesian optimisation (`bayes.BufferSearch`, GP with an RBF
  kernel and Expected Improvement) over [lower, upper], by default on the authors' linear
  grid of 1.5 ms of line rate with the GP's noise fitted, starting at the lower bound and
  told only its own trials (`warm_start` adds the bound search's measurements). Each trial
  applies the suggested buffer and measures it. Before each trial the search stops when
  the largest EI on the grid is at most `ei_stop` (units of f), once `min_trials` trials
  were made, or when `max_trials` (the paper's n-bar) trials were made.
- "settled": the best observed buffer (highest mean f, the paper's x*) stays in force
  until the change detector flags f; then the bound search starts again, keeping nothing:
  the flag says f itself changed (N, RTTs or the congestion control mix did), so the old
  observations describe another function and would mislead the GP; the BDP also has to be
  measured again.

Every decided buffer is a step, measured as `stepped.SteppedPolicy` says, the wait before
a trial's measurement longer for a deeper buffer (as the authors' controller waits). A
step's f is the mean of its windows' f with its standard error; a bound-search step's loss
is their retransmissions over their data packets.

`snapshot` holds everything as JSON data: the phase, the step being measured (with what it
measured so far), the bounds, the bound search's and the trials' observations and the
incumbent. `restore` rebuilds the search from the observations, and the search is a pure
function of them and the seed, so a restarted optimizer decides exactly what the original
would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from p4bs.config import LinkConfig
from p4bs.units import bytes_for_duration, duration_for_bytes
from p4bs_optimizer.policies.base import Decision, Window, bdp_bytes
from p4bs_optimizer.policies.baselines import OptionReader
from p4bs_optimizer.policies.bayes import Observation, Plan, SearchSpec, plan
from p4bs_optimizer.policies.stepped import SETTLED, Step, SteppedPolicy

BOUND_SEARCH = "bound_search"
OPTIMISE = "optimise"


# The authors' controller waits 1 s after a change to a buffer of at most 10 ms of line rate
# (its MINIMUM_BUFFER), and 2.5 s more per 190 ms of buffer above that (utils.py
# `scaled_delay`): a deeper queue takes longer to fill to its new level.
SETTLE_FREE_BUFFER_NS = 10_000_000
AUTHORS_SETTLE_PER_BUFFER = 2.5 / 0.19


@dataclass(frozen=True)
class P4bsOptions:
    """The policy's options (the link's `policy_options`), in the system's units. The
    defaults are the paper's, and where the paper gives no value the authors' published
    controller's (github.com/ekfoury/p4bs-bo: global_defs.py, utils.py, main.py);
    optimizer/README.md lists each with what remains different."""

    # epsilon_p of Algorithm 1, a fraction (the controller's THRESH_LOSS_EXPONENTIAL_INCREASE).
    loss_epsilon: float = 0.0025
    # Loss at the BDP this high skips the doubling: the bounds are [BDP, search_max / 2], as
    # the controller's `exponential_increase` does at 3%. 1 turns the rule off.
    high_loss: float = 0.03
    # Upper end of the search, ns of line rate; None: the link's buffer.max (the controller's
    # MAXIMUM_BUFFER is 200 ms). Separate from d_hat, which normalises f.
    search_max_ns: int | None = None
    settle_ns: int = 1_000_000_000  # wait after a buffer is in force before measuring
    # Extra wait before a trial's measurement, per ns of buffer above 10 ms of line rate.
    settle_per_buffer: float = AUTHORS_SETTLE_PER_BUFFER
    measure_ns: int = 500_000_000  # windows measured per step (the controller's ~0.5 s)
    # Stop when the largest EI is at most this, units of f. The controller stops at 1e-3 of
    # its f, loss / 5% and delay / 200 ms; f here divides by the SLA's p_hat and d_hat (1%
    # and 50 ms in the evaluation scenarios), about 4 times larger numbers.
    ei_stop: float = 0.004
    max_trials: int = 4  # n-bar: the controller's `iteration < 4`
    # Trials before the EI rule may stop the search. The controller's GP has its amplitude
    # fixed at 1, far above its f's variation, so its EI stays above 1e-3 until the grid is
    # covered and it makes its 4 trials; a GP whose amplitude is fitted to one or two points
    # can claim no improvement anywhere (it stopped a search on the testbed without a trial).
    min_trials: int = 3
    # The controller's GP sees only its BO trials; true also tells it the bound search's
    # measurements inside the bounds.
    warm_start: bool = False
    # Candidates every grid_step_ns of line rate from the lower bound (the controller's
    # GRID_UNIT_SIZE, 1.5 ms) with the controller's GP, its noise fitted (bayes.py); 0: a
    # continuous search on log(buffer), each trial's SEM its fixed noise.
    grid_step_ns: int = 1_500_000
    # The grid GP's noise variance, units of f squared; 0: fitted (the paper's Eq. 11). The
    # controller fixes it at 1.25e-4 of its f, about 2e-3 of this f (4 times larger).
    noise_variance: float = 0.0
    # No search starts before a window shows the link this busy: an idle link's f says
    # nothing about its buffer. 0 turns the gate off. The controller has 98%; utilisation
    # here counts IP bytes against a capacity quoted with Ethernet framing, so a saturated
    # link reads 0.975-0.99.
    min_utilisation: float = 0.95
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
            high_loss=r.number("high_loss", d.high_loss, low=0, high=1, low_open=True),
            search_max_ns=r.duration_ns("search_max_ns", 0) or None,
            settle_ns=r.duration_ns("settle_ns", d.settle_ns, allow_zero=True),
            settle_per_buffer=r.number("settle_per_buffer", d.settle_per_buffer, low=0),
            measure_ns=r.duration_ns("measure_ns", d.measure_ns),
            ei_stop=r.number("ei_stop", d.ei_stop, low=0),
            max_trials=r.integer("max_trials", d.max_trials, low=1, high=1000),
            min_trials=r.integer("min_trials", d.min_trials, low=0, high=1000),
            warm_start=r.flag("warm_start", d.warm_start),
            grid_step_ns=r.duration_ns("grid_step_ns", d.grid_step_ns, allow_zero=True),
            noise_variance=r.number("noise_variance", d.noise_variance, low=0),
            min_utilisation=r.number("min_utilisation", d.min_utilisation, low=0),
            reissue_after_ns=r.duration_ns("reissue_after_ns", d.reissue_after_ns, allow_zero=True),
            seed=r.integer("seed", d.seed, low=0, high=2**32 - 1),
            change_holdoff_ns=r.duration_ns(
                "change_holdoff_ns", d.change_holdoff_ns, allow_zero=True
            ),
        )
        r.finish()
        return parsed

    def settle_for(self, buffer_ns: int, trial: bool) -> int:
        """The wait before measuring a buffer of `buffer_ns` of line rate: `settle_ns`, and
        for a BO trial `settle_per_buffer` more per ns above 10 ms."""
        extra = max(0, buffer_ns - SETTLE_FREE_BUFFER_NS) * self.settle_per_buffer if trial else 0
        return self.settle_ns + round(extra)


class P4bsPolicy(SteppedPolicy):
    """P4BS: Algorithm 1's bounds, then GP + EI trials, then the best buffer until f changes."""

    name: ClassVar[str] = "p4bs"
    config: P4bsOptions

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self.config = P4bsOptions.parse(options)
        # How a search's next step is computed: here, or (the service sets it) in a pool of
        # processes, so that several links' fits run at once on several cores.
        self.planner: Callable[[SearchSpec], Plan] = plan
        self._start_over()

    def _start_over(self) -> None:
        self.phase = BOUND_SEARCH
        self.step = None
        self.cap_bytes = 0  # C * d_hat within the link's bounds
        self.rtt_ns = 0  # the RTT the search's BDP came from
        self.bound_points: list[Observation] = []
        self.low_bytes = 0
        self.high_bytes = 0
        self.trials: list[Observation] = []
        self.incumbent: Observation | None = None

    def _settle_ns(self, step: Step) -> int:
        buffer_ns = duration_for_bytes(step.buffer_bytes, self.link.capacity_bps)
        return self.config.settle_for(buffer_ns, trial=self.phase == OPTIMISE)

    def _step_done(self, step: Step, window: Window) -> list[Decision]:
        if self.phase == BOUND_SEARCH:
            return self._bound_step_done(step, window)
        return self._trial_done(step, window)

    def _restart(self, window: Window, prefix: str) -> list[Decision]:
        self._start_over()
        return self._begin(window, prefix + "new search, nothing kept; ")

    # -- bound search (Algorithm 1) -------------------------------------------------------

    def _begin(self, window: Window, prefix: str) -> list[Decision]:
        """Algorithm 1's first step, the BDP."""
        rtt_ns = window.srtt_ns if window.srtt_ns is not None else window.rtt_min_ns
        if rtt_ns is None:
            return []  # no RTT yet: nothing to size a BDP from
        rtt_name = "SRTT" if window.srtt_ns is not None else "RTT_min"
        capacity = self.link.capacity_bps
        self.rtt_ns = rtt_ns
        self.cap_bytes = self._search_max()
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

    def _search_max(self) -> int:
        """The upper end of any search, bytes: `search_max_ns` of line rate, or the link's
        buffer.max."""
        if self.config.search_max_ns is None:
            return self.link.max_buffer_bytes
        return self.clamp(bytes_for_duration(self.config.search_max_ns, self.link.capacity_bps))

    def _bound_step_done(self, step: Step, window: Window) -> list[Decision]:
        obs = step.observation()
        self.bound_points.append(obs)
        loss = step.retransmissions / step.data_packets if step.data_packets else 0.0
        epsilon = self.config.loss_epsilon
        seen = f"loss {loss:.3%} at {step.buffer_bytes} B (f {obs.mean:.4f} +- {obs.sem:.4f})"
        if loss >= self.config.high_loss and len(self.bound_points) == 1:
            # The authors' controller: so lossy at the BDP that the Stanford bound and the
            # doublings below the cap are not worth measuring.
            upper = max(self.cap_bytes // 2, step.buffer_bytes)
            why = (
                f"{seen} >= high_loss {self.config.high_loss:.3%}: bounds [BDP, "
                f"{self._cap_name()} / 2] = [{step.buffer_bytes}, {upper}] B"
            )
            return self._bounds_found(step, window, upper, why, lower=step.buffer_bytes)
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
        return "search_max" if self.config.search_max_ns is not None else "the link's buffer.max"

    def _grid_step_bytes(self) -> int | None:
        if self.config.grid_step_ns == 0:
            return None
        return max(1, bytes_for_duration(self.config.grid_step_ns, self.link.capacity_bps))

    def _bounds_found(
        self, step: Step, window: Window, upper: int, why: str, lower: int | None = None
    ) -> list[Decision]:
        """Algorithm 2 over [lower, upper]; without `lower`, the Stanford bound
        C * RTT_min / sqrt(N) from the step's last window."""
        self.high_bytes = upper
        if lower is None:
            rtt_min_ns = step.rtt_min_ns if step.rtt_min_ns is not None else self.rtt_ns
            flows = max(step.long_flows, 1)
            lower = self.clamp(bdp_bytes(self.link.capacity_bps, rtt_min_ns) / math.sqrt(flows))
            why += (
                f"; lower bound C * RTT_min / sqrt(N) = {min(lower, upper)} B "
                f"(RTT_min {_ms(rtt_min_ns)}, N {flows})"
            )
        self.low_bytes = min(lower, upper)
        last_f = self.bound_points[-1].mean
        if self.high_bytes - self.low_bytes < (self._grid_step_bytes() or 1):
            buffer = self.low_bytes
            measured = [o for o in self.bound_points if o.buffer_bytes == buffer]
            why += "; nothing to search between them"
            return self._settle(window, buffer, measured[-1] if measured else None, last_f, why)
        self.phase = OPTIMISE
        return self._next_trial(window, last_f, why)

    # -- Bayesian optimisation (Algorithm 2) ----------------------------------------------

    def _trial_done(self, step: Step, window: Window) -> list[Decision]:
        obs = step.observation()
        self.trials.append(obs)
        seen = f"trial {step.trial}: f at {obs.buffer_bytes} B = {obs.mean:.4f} +- {obs.sem:.4f}"
        return self._next_trial(window, obs.mean, seen)

    def _next_trial(self, window: Window, last_f: float, prefix: str) -> list[Decision]:
        """The next trial's decision, or the settled one when Algorithm 2 stops."""
        spec = self.search_spec()
        done = len(self.trials)
        if done >= self.config.max_trials:
            reason = f"{prefix}; {done} trials made (max_trials)"
            best = max(spec.observations, key=lambda o: o.mean)
            return self._settle(window, best.buffer_bytes, best, last_f, reason)
        max_ei, suggestion = self.planner(spec)
        if not spec.observations:
            ei_text = "no observation inside the bounds yet"
        elif done < self.config.min_trials:
            ei_text = f"max EI {max_ei:.3g}, {done} of at least {self.config.min_trials} trials"
        else:
            ei_text = f"max EI {max_ei:.3g}"
            if max_ei <= self.config.ei_stop:
                reason = f"{prefix}; {ei_text} <= ei_stop {self.config.ei_stop:g}"
                best = max(spec.observations, key=lambda o: o.mean)
                return self._settle(window, best.buffer_bytes, best, last_f, reason)
        buffer = self.clamp(suggestion)
        trial = done + 1
        reason = (
            f"{prefix}; search [{self.low_bytes}, {self.high_bytes}] B, {ei_text}: "
            f"trial {trial} at {buffer} B"
        )
        return [self._new_step(window, buffer, OPTIMISE, trial, reason, f=last_f)]

    def search_spec(self) -> SearchSpec:
        """The search over the bounds as it stands: the bound search's points inside them
        (with `warm_start`), then the trials, in order. (`bayes.plan` computes the next
        step from it; the dashboard shows the GP it fits.)"""
        warm = [
            o
            for o in self.bound_points
            if self.config.warm_start and self.low_bytes <= o.buffer_bytes <= self.high_bytes
        ]
        return SearchSpec(
            self.low_bytes,
            self.high_bytes,
            self.config.seed,
            (*warm, *self.trials),
            self._grid_step_bytes(),
            self.config.noise_variance or None,
        )

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
        self.phase = SETTLED
        measured = f"f {incumbent.mean:.4f} +- {incumbent.sem:.4f}" if incumbent else "not measured"
        reason = f"{why}: settling on {buffer} B ({measured})"
        return [self._new_step(window, buffer, SETTLED, None, reason, f=last_f)]

    # -- persistence ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            **self._step_state(),
            "cap_bytes": self.cap_bytes,
            "rtt_ns": self.rtt_ns,
            "bound_points": [list(o) for o in self.bound_points],
            "low_bytes": self.low_bytes,
            "high_bytes": self.high_bytes,
            "trials": [list(o) for o in self.trials],
            "incumbent": list(self.incumbent) if self.incumbent is not None else None,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self._start_over()
        self._restore_step(state)
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
