"""The offline simulator: a policy (the optimizer's own code) against a link simulated from a
measured response surface (surface.py), with the closed loop's timing, in seconds per run.

A simulated run steps through windows of the loop's length; simulated time 0 is the traffic's
start. Each window's metrics come from the runs measured at the two buffers around the one in
force (field by field at the same position in time, so the measured noise and its
autocorrelation come along: log-interpolated, the loss and the delay as powers of the buffer,
f moved with them), from one measured run per buffer drawn by the run's seed; the change
detector is run again on the simulated f, as the metrics job would. After a move of the
buffer, a measured buffer whose surface has step runs of that move (runs of policy `step`:
from the measured buffer nearest the one before the move, into it) gives its windows from one
of them instead, at the same time since the move, and no fill or shrink model applies: with
BBR the flows' state depends on how the buffer got where it is, which a fixed-buffer run,
measured from the traffic's start, cannot show (eval/README.md). When a shrink's step runs
measured it into only one of the two buffers around the new one, the other gets the shrink
model's burst, so that the blend does not halve the measured one.
The policy sees a window `metrics_lag` after it ended; what it decides is applied `apply`
after the decision (and, with `late_apply`, later by a delay drawn per decision from the
measured ones), no sooner than `min_change_interval` after the previous change (the
service's guard), and is in force from the window it is applied in, which the metrics job
labels with the last change applied before the window's end. A raised buffer is
not full at once where the surface shows loss-based flows filling it (`_filling`): the
queue carries over and grows at the flows' pace, without loss, until it reaches the measured
windows' queue. With `shrink_burst` > 0, a buffer lowered below the queue standing in it costs
a burst of loss (`_shrinking`): what stands above the new limit is dropped, and about as much
again while the flows take an RTT to back off, the queue draining to the limit meanwhile. It
is off by default: measured on single large shrinks, it takes ADT's small steady ones for
bursts they do not cause live (eval/README.md).

A run (`SimRun`) keeps per window the buffer in force and f, and the decisions: its whole-run
mean f (after the warm-up, as the live evaluation does), when the policy settled and its mean
f after that, and the share of windows drawn from each source of the surface (its exposure to
the surface's own error, offline_report.py).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from p4bs.config import LinkConfig, MetricsConfig
from p4bs_eval.change_detector import ChangeDetector
from p4bs_eval.surface import BLENDED, StepRun, Surface, WindowRecord, source, window_at
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.loss_delay_fit import MSS_BYTES

# Between two measured buffers these follow the loss and the queueing delay: each blended so
# that its mean goes as a power of the buffer through the two buffers' means (loss ~ B^-1 to
# B^-2, delay ~ B for loss-based flows), where a linear blend overstates both (AM >= GM) and
# so understates f between measured buffers (eval/README.md: how each predicts the measured).
LOSS_FIELDS = ("loss_rate", "loss_rate_ewma", "retransmissions")
DELAY_FIELDS = ("queue_delay_ns", "queue_delay_ewma_ns")
SETTLED = "settled"
# Step runs of one move made this many windows apart are taken as made at the same time (a
# scenario's repeats apply their step 1-3 s apart: the metrics lag varies).
STEP_TIME_SLACK = 10
# A lowered buffer (`--shrink-burst`): the retransmissions beyond the new buffer's own, over
# the first windows under it, per packet of the queue that stood above the new limit; the
# median of the shrinks measured live (eval/README.md).
MEASURED_SHRINK_BURST = 1.27


# The live loop on the third round's testbed (eval/README.md, "The lag"): of 504 decisions
# on dyn-n-step, 58% in force from the first window after their own, 37% from the second,
# 5% from the third: with a 0.5 s lag, no delay, 0.5 s and 1 s added to the apply time.
MEASURED_LAG_NS = 500_000_000
MEASURED_LATE_APPLY = ((0, 0.58), (500_000_000, 0.37), (1_000_000_000, 0.05))


@dataclass(frozen=True)
class LoopTiming:
    """The closed loop's timing, ns (defaults: the testbed loop's, loop/p4bs_loop)."""

    window_ns: int = 500_000_000
    # A window reaches the optimizer this long after it ends, on the windows' grid (with
    # `late_apply`, the live runs' time from the end of the window a decision was made on to
    # the router's set: `decision_lag_s` in results.jsonl; eval/README.md).
    metrics_lag_ns: int = MEASURED_LAG_NS
    apply_ns: int = 50_000_000  # a decision is in force this long after it was made
    # Delays added to `apply_ns`, ns, each with its share, one drawn per decision by the
    # run's seed; empty: none. The live loop's time from a window's end to the router's set
    # varies, so a decision is in force in the first window after its own in some runs and
    # a window or two later in others (eval/README.md, "The lag").
    late_apply: tuple[tuple[int, float], ...] = MEASURED_LATE_APPLY
    # Whether the windows before the first change say the router's buffer. On the third
    # round's testbed none did: every run's first decision had no previous buffer, and
    # loss-delay-fit's step 0 began with a decision for the buffer already in force.
    router_buffer_read: bool = False
    min_change_interval_ns: int = 1_000_000_000
    duration_ns: int = 60_000_000_000
    warmup_ns: int = 10_000_000_000


@dataclass
class SimRun:
    """One simulated run: per window the buffer in force and f; the decisions with the time
    (since the traffic started) each was made."""

    seed: int
    buffers: list[int] = field(default_factory=list)
    f: list[float] = field(default_factory=list)
    decisions: list[tuple[int, Decision]] = field(default_factory=list)
    window_ns: int = 0
    warmup_windows: int = 0
    # Per source (a measured buffer or a move) the share of the windows after the warm-up
    # drawn from its runs.
    exposure: dict[str, float] = field(default_factory=dict)

    @property
    def f_mean(self) -> float:
        """Mean f over the windows after the warm-up: the live evaluation's f_mean."""
        return statistics.fmean(self.f[self.warmup_windows :])

    @property
    def settled_ns(self) -> int | None:
        """When the policy settled for the last time, since the traffic started: its first
        settled decision after its last search step (a search begun again counts from its
        end); None if the run ended searching, or the policy never searches."""
        searched = [i for i, (_, d) in enumerate(self.decisions) if d.phase != SETTLED]
        after = self.decisions[searched[-1] + 1 :] if searched else self.decisions
        return next((t for t, d in after if d.phase == SETTLED), None)

    @property
    def search_ns(self) -> int | None:
        """From the policy's first decision to when it settled."""
        if self.settled_ns is None:
            return None
        return self.settled_ns - self.decisions[0][0]

    @property
    def f_after_settling(self) -> float | None:
        """Mean f over the windows after the settled buffer came into force."""
        if self.settled_ns is None:
            return None
        first = self.settled_ns // self.window_ns + 1
        after = self.f[max(first, self.warmup_windows) :]
        return statistics.fmean(after) if after else None


def _power_weight(low_mean: float, high_mean: float, weight: float) -> float:
    """The blend's weight that puts its mean where a power of the buffer through the two
    means puts it, low^(1 - w) * high^w at the log-scale weight w (w itself where either
    is 0, or they are equal)."""
    if low_mean <= 0 or high_mean <= 0 or low_mean == high_mean:
        return weight
    power = low_mean ** (1 - weight) * high_mean**weight
    return float((power - low_mean) / (high_mean - low_mean))


def _blend(
    low: WindowRecord,
    high: WindowRecord,
    weight: float,
    means: tuple[tuple[float, float], tuple[float, float]],
    link: LinkConfig,
) -> dict[str, Any]:
    """Two buffers' windows blended at the log-scale `weight`, the loss and delay fields
    (LOSS_FIELDS, DELAY_FIELDS) as powers of the buffer through the buffers' `means`, f
    moved with them as its formula says (its own noise kept)."""
    (low_loss, low_delay), (high_loss, high_delay) = means
    loss_weight = _power_weight(low_loss, high_loss, weight)
    delay_weight = _power_weight(low_delay, high_delay, weight)

    def mixed(name: str, w: float) -> Any:
        """The field at weight `w` (the one that has it where the other does not)."""
        a, b = low[name], high[name]
        if a is None or b is None:
            return a if b is None else b
        return (1 - w) * a + w * b

    out: dict[str, Any] = {}
    for name in BLENDED:
        w = loss_weight if name in LOSS_FIELDS else delay_weight if name in DELAY_FIELDS else weight
        value = mixed(name, w)
        ints = isinstance(low[name], int) and isinstance(high[name], int)
        out[name] = round(value) if ints else value
    if weight > 0:
        linear = [float(mixed(name, weight) or 0) for name in ("loss_rate", "queue_delay_ns")]
        out["f"] += sum(link.f_terms(*linear)) - sum(
            link.f_terms(out["loss_rate"] or 0.0, out["queue_delay_ns"] or 0)
        )
    return out


def _drawn(rng: random.Random, shares: Sequence[tuple[int, float]]) -> int:
    """One of the values, by their shares (0 when there are none)."""
    if not shares:
        return 0
    values, weights = zip(*shares, strict=True)
    return int(rng.choices(values, weights)[0])


def _made_about_then(runs: Sequence[StepRun], k: int) -> Sequence[StepRun]:
    """Of a move's step runs, those made nearest in time to a move in window `k`: with BBR
    the flows recover from a move faster the longer they have run (eval/README.md, "Step
    runs")."""
    nearest = min(abs(r.moved_at - k) for r in runs)
    return [r for r in runs if abs(r.moved_at - k) <= nearest + STEP_TIME_SLACK]


def _shrinking(
    metrics: dict[str, Any],
    link: LinkConfig,
    queue_s: float,
    buffer_bytes: int,
    window_ns: int,
    burst: float,
) -> bool:
    """The first window under a buffer lowered below the queue `queue_s` standing in it:
    the queue drains at line rate down to the new limit while `burst` times the excess is
    lost (it, and more until the flows back off); then the new buffer's measured window.
    Returns whether the queue stood above the new limit."""
    rate = link.capacity_bps / 8
    excess_bytes = queue_s * rate - buffer_bytes
    if excess_bytes <= 0:
        return False
    lost = burst * excess_bytes / MSS_BYTES
    data = max(metrics["data_packets"] or 0, 1)
    metrics["retransmissions"] = round((metrics["retransmissions"] or 0) + lost)
    metrics["loss_rate"] = (metrics["loss_rate"] or 0.0) + lost / data
    drain_ns = min(excess_bytes / rate * 1e9, window_ns)
    draining_ns = (queue_s * 1e9 + buffer_bytes / rate * 1e9) / 2
    measured_ns = metrics["queue_delay_ns"] or 0
    metrics["queue_delay_ns"] = round(
        (draining_ns * drain_ns + measured_ns * (window_ns - drain_ns)) / window_ns
    )
    metrics["f"] = -sum(link.f_terms(metrics["loss_rate"], metrics["queue_delay_ns"]))
    return True


def _with_burst(
    window: WindowRecord, link: LinkConfig, queue_s: float, buffer_bytes: int, window_ns: int
) -> WindowRecord:
    """A measured window with the measured shrink burst (`_shrinking`) from the queue
    `queue_s` to `buffer_bytes`, as a new window."""
    burst = dict(window)
    _shrinking(burst, link, queue_s, buffer_bytes, window_ns, MEASURED_SHRINK_BURST)
    return burst


def _filling(
    metrics: dict[str, Any], link: LinkConfig, k_s: float, queue_s: float | None, window_ns: int
) -> float | None:
    """A raised buffer fills at the flows' pace: from the queue `queue_s` the window's
    queue grows as dq/dt = K / (RTT_min + q) towards the buffer's steady queue, with no
    loss (nothing overflows) and f from the queue reached. Returns the queue at the window's
    end, or None once it has reached the steady one (the measured windows again)."""
    if queue_s is None:
        return None
    target_s = (metrics["queue_delay_ns"] or 0) / 1e9
    rtt_s = (metrics["rtt_min_ns"] or 0) / 1e9
    end_s = math.sqrt((rtt_s + queue_s) ** 2 + 2 * k_s * window_ns / 1e9) - rtt_s
    if end_s >= target_s:
        return None
    mean_ns = (queue_s + end_s) / 2 * 1e9
    metrics["queue_delay_ns"] = round(mean_ns)
    metrics["loss_rate"] = 0.0
    metrics["retransmissions"] = 0
    metrics["f"] = -sum(link.f_terms(0.0, mean_ns))
    return end_s


def simulate(
    policy: Policy,
    surface: Surface,
    link: LinkConfig,
    metrics: MetricsConfig,
    initial_buffer: int,
    timing: LoopTiming,
    seed: int,
    shrink_burst: float = 0.0,
) -> SimRun:
    """One run of `policy` on the link `surface` describes, from `initial_buffer`; a lowered
    buffer costs `shrink_burst` times the queue that stood above it in loss (0: nothing)."""
    rng = random.Random(seed)
    chosen = {b: rng.randrange(len(runs)) for b, runs in surface.runs.items()}
    chosen_steps = {key: rng.randrange(len(runs)) for key, runs in surface.steps.items()}
    detect = ChangeDetector(metrics)
    w = timing.window_ns
    steady = timing.warmup_ns // w
    result = SimRun(seed, window_ns=w, warmup_windows=steady)
    in_flight: deque[tuple[int, Window]] = deque()  # (delivered at, window)
    pending: tuple[int, int] | None = None  # (in force from, buffer)
    buffer, last_change = initial_buffer, -timing.min_change_interval_ns
    changed = False  # a decision has come into force
    fill_k = surface.fill_constant_s(w, steady)
    means = surface.steady_means(steady)
    share = 1 / (timing.duration_ns // w - steady)  # of one window in the run's f
    queue_s: float | None = None  # while a raised buffer fills: the queue, s of line rate
    previous, last_queue_s = buffer, 0.0
    # Since the last move (in window `moved_at`): the step run each measured buffer around
    # the one in force gives its windows from (the others: their fixed-buffer runs). The
    # n-th move of a kind in a run takes the n-th measured run of it after the seed's, so
    # that a move made again is not measured with the very same windows.
    stepping: dict[int, tuple[str, StepRun]] = {}
    moves_made: dict[tuple[int, int], int] = {}
    moved_at = 0
    for k in range(timing.duration_ns // w):
        start, end = k * w, (k + 1) * w
        if pending is not None and pending[0] <= start:
            buffer, pending, changed = pending[1], None, True
        low, high, weight = surface.neighbours(buffer)
        if buffer != previous:
            stepping, moved_at = {}, k
            for measured in {low, high}:
                key = surface.steps_into(measured, previous)
                if key is not None:
                    n = moves_made[key] = moves_made.get(key, -1) + 1
                    runs = _made_about_then(surface.steps[key], k)
                    stepping[measured] = (
                        source(key),
                        runs[(chosen_steps[key] + n) % len(runs)],
                    )

        low_window, high_window = (
            stepping[b][1].window(k - moved_at)
            if b in stepping
            else window_at(surface.runs[b][chosen[b]], k, steady)
            for b in (low, high)
        )
        if buffer < previous and len(stepping) == 1 and low != high:
            # A shrink whose step runs measured it into one of the two buffers around the
            # new one only: the other's fixed-buffer window has no burst, and the blend
            # would halve the measured one. It gets the shrink model's burst (a queue's
            # excess over the limit is about the same for both: dyn-n-step's shrink from
            # 2.5 MB to ~88 kB lost about what the step runs into 50 kB did).
            if low in stepping:
                high_window = _with_burst(high_window, link, last_queue_s, high, w)
            else:
                low_window = _with_burst(low_window, link, last_queue_s, low, w)
        metrics_now = _blend(low_window, high_window, weight, (means[low], means[high]), link)
        # A step run measured how the queue followed its move: no fill or shrink model.
        stepped = bool(stepping)
        if stepped:
            queue_s = None
        elif (
            shrink_burst > 0
            and buffer < previous
            and _shrinking(metrics_now, link, last_queue_s, buffer, w, shrink_burst)
        ):
            queue_s = None  # a fill under way ends at the new limit
        if fill_k is not None and not stepped:
            if buffer > previous and queue_s is None:
                queue_s = last_queue_s  # the queue the last window ended with carries over
            queue_s = _filling(metrics_now, link, fill_k, queue_s, w)
        last_queue_s = (
            queue_s if queue_s is not None else ((metrics_now["queue_delay_ns"] or 0) / 1e9)
        )
        previous = buffer
        zscore, change = detect(metrics_now["f"])
        window = Window(
            link_id=link.id,
            window_start_ns=start,
            window_end_ns=end,
            zscore=zscore,
            change=change,
            # The metrics job knows a buffer from the applied decisions; before the first,
            # the service fills in the router's, read when it took the link, if it could.
            buffer_bytes=buffer if changed or timing.router_buffer_read else None,
            **metrics_now,
        )
        result.buffers.append(buffer)
        result.f.append(metrics_now["f"])
        if k >= steady:
            for measured, part in ((low, 1 - weight), (high, weight)):
                if part > 0:
                    drawn = stepping[measured][0] if measured in stepping else source(measured)
                    result.exposure[drawn] = result.exposure.get(drawn, 0.0) + part * share
        in_flight.append((end + timing.metrics_lag_ns, window))
        while in_flight and in_flight[0][0] <= end:
            _, seen = in_flight.popleft()
            for decision in policy.decide(seen):
                if decision.queue != 0:
                    continue
                result.decisions.append((end, decision))
                late = _drawn(rng, timing.late_apply)
                applied = max(
                    end + timing.apply_ns + late, last_change + timing.min_change_interval_ns
                )
                # The service applies the newest decision: one made sooner but not yet in
                # force is replaced. The metrics job labels a window with the last change
                # applied before its end: the window the change falls in has it.
                pending = (applied // w * w, policy.clamp(decision.buffer_bytes))
                last_change = applied
    return result
