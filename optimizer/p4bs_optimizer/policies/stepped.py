"""What the searching policies (P4BS, loss-delay-fit) share: each buffer they decide is a
step, measured on the windows once it is in force, and a settled buffer is kept until the
metrics job's change detector flags f.

A step's windows count only once the windows say its buffer is in force
(`Window.buffer_bytes`: the service's last applied change before the window's end), from a wait
after the first such window (`_settle_ns`: the queue needs time to reach its new level) and,
for a step whose queue may still be on its way there (`Step.to_level`: a raise, or traffic
that just changed), from the window a subclass's `_at_level` says it got there, until
`measure_ns` of windows were counted (and at least 2). A decision that is not in force
`reissue_after_ns` (and at least a step's time) after it was made is made again. No search
starts before a window shows the link busy (`min_utilisation`): an idle link's f says
nothing about its buffer. A change once the settled buffer has been in force for
`change_holdoff_ns` makes the policy search again (`_restart`); the holdoff exists because
settling moves f, and the metrics job's detector would otherwise flag the policy's own move.
Which change: every window is shown to `_observed_change`, by default the metrics job's
`change` flag (P4BS, as the paper); loss-delay-fit's own traffic detector
(`traffic_change.py`) sees every window too, to keep its baselines, and holds off itself.
"""

from __future__ import annotations

import math
import statistics
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.bayes import Observation

SETTLED = "settled"
MIN_WINDOWS = 2  # a standard error needs two windows


class StepTiming(Protocol):
    """The options every stepped policy has, in ns (and a fraction)."""

    @property
    def settle_ns(self) -> int: ...
    @property
    def measure_ns(self) -> int: ...
    @property
    def reissue_after_ns(self) -> int: ...
    @property
    def change_holdoff_ns(self) -> int: ...
    @property
    def min_utilisation(self) -> float: ...


@dataclass
class Step:
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
    rtt_flows: int = 0  # of the last measured window
    loss_sum: float = 0.0  # of the windows' loss rates
    delay_sum_ns: float = 0.0  # of the windows' mean queueing delays (0 with no sample)
    # The queue may still be moving to its level once the buffer is in force (a raise:
    # loss-based flows take seconds to fill it; or traffic that just changed): the windows
    # count from the one `_at_level` accepts.
    to_level: bool = False

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
        self.rtt_flows = window.rtt_flows
        self.loss_sum += window.loss_rate
        self.delay_sum_ns += window.queue_delay_ns or 0

    def observation(self) -> Observation:
        """Mean f of the measured windows and its standard error."""
        mean = statistics.fmean(self.f_values)
        sem = statistics.stdev(self.f_values) / math.sqrt(len(self.f_values))
        return Observation(self.buffer_bytes, mean, sem)

    def mean_loss(self) -> float:
        """The windows' mean loss rate: f's loss term is its average."""
        return self.loss_sum / len(self.f_values)

    def mean_delay_ns(self) -> float:
        """The windows' mean queueing delay, ns: f's delay term is its average."""
        return self.delay_sum_ns / len(self.f_values)


class SteppedPolicy(Policy):
    """A policy that measures every buffer it decides, one step at a time; subclasses say
    where a search begins (`_begin`), what a measured step leads to (`_step_done`) and what
    a detected change does (`_restart`)."""

    config: StepTiming
    phase: str
    step: Step | None  # None: waiting for a busy link with an RTT to start from

    def decide(self, window: Window) -> list[Decision]:
        if self.passes_over(window):
            return []
        change = self._observed_change(window)  # every window: a detector keeps its baseline
        step = self.step
        if step is None:
            if window.utilisation < self.config.min_utilisation:
                return []
            return self._begin(window, "")
        if window.buffer_bytes != step.buffer_bytes:
            return self._not_in_force(step, window)
        if step.in_force_ns is None:
            step.in_force_ns = window.window_end_ns  # the change happened inside this window
            return []
        if self.phase == SETTLED:
            return self._watch_for_change(step, window, change)
        if not step.f_values:
            at_level = self._at_level(step, window)  # sees each window until one is measured
            if window.window_start_ns < step.in_force_ns + self._settle_ns(step) or not at_level:
                return []
        step.measure(window)
        if step.measured_ns < self.config.measure_ns or len(step.f_values) < MIN_WINDOWS:
            return []
        return self._step_done(step, window)

    @abstractmethod
    def _begin(self, window: Window, prefix: str) -> list[Decision]:
        """The first step of a search ([] while the window gives nothing to start from)."""

    @abstractmethod
    def _step_done(self, step: Step, window: Window) -> list[Decision]:
        """What follows a step measured in full."""

    @abstractmethod
    def _restart(self, window: Window, prefix: str) -> list[Decision]:
        """A new search after the detector flagged f while settled."""

    def _settle_ns(self, step: Step) -> int:
        return self.config.settle_ns

    def _at_level(self, step: Step, window: Window) -> bool:
        """Whether the step's queue has reached its level by this window (shown every window
        in force until the step's first measured one); by default at once."""
        return True

    def _observed_change(self, window: Window) -> str | None:
        """What changed by this window, for a reason; None: nothing. Here the metrics job's
        z-score of f (P4BS's detector)."""
        if not window.change:
            return None
        return f"z-score {window.zscore:.1f}, f {window.f:.4f}"

    def _change_holdoff_ns(self) -> int:
        """How long a settled buffer is in force before a change counts."""
        return self.config.change_holdoff_ns

    def _watch_for_change(self, step: Step, window: Window, change: str | None) -> list[Decision]:
        assert step.in_force_ns is not None
        if change is None or (
            window.window_start_ns < step.in_force_ns + self._change_holdoff_ns()
        ):
            return []
        prefix = f"change detected ({change}) while settled on {step.buffer_bytes} B: "
        return self._restart(window, prefix)

    def _new_step(
        self,
        window: Window,
        buffer: int,
        phase: str,
        trial: int | None,
        reason: str,
        f: float | None = None,
    ) -> Decision:
        self.step = Step(buffer, phase, trial, f, decided_ns=window.window_end_ns)
        return self.step.decision(reason)

    def _not_in_force(self, step: Step, window: Window) -> list[Decision]:
        """A window under another buffer: it does not count. A buffer that was in force and
        is no longer is measured afresh once it is back; one not in force for a whole
        step's time is decided again."""
        now = window.window_end_ns
        if step.in_force_ns is not None:
            self.step = Step(
                step.buffer_bytes,
                step.phase,
                step.trial,
                step.f,
                decided_ns=now,
                to_level=step.to_level,
            )
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

    def _step_state(self) -> dict[str, Any]:
        return {"phase": self.phase, "step": asdict(self.step) if self.step else None}

    def _restore_step(self, state: Mapping[str, Any]) -> None:
        self.phase = state["phase"]
        self.step = Step(**state["step"]) if state["step"] is not None else None

    def loaded_problem(self) -> str | None:
        if self.step is None:
            return None
        return self.buffer_problem("the step's buffer", self.step.buffer_bytes)
