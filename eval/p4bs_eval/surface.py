"""A measured response surface: one cell's (CCA, N, RTT) LinkMetrics windows measured at
fixed buffers, the runs of a buffer sweep (policy `none`), each the sequence of its windows from
the start of its traffic to its end, and the cell's step runs (policy `step`: runs whose buffer
moved once), if any were measured. What the simulator (simulator.py) draws a link's windows
from, and what it reads of them: the oracle, each source's standard error, the buffers around
one, how fast loss-based flows fill a queue (eval/README.md, "Offline evaluation")."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from p4bs_optimizer.policies.loss_delay_fit import MSS_BYTES

WindowRecord = Mapping[str, Any]
# The fields of a measured window a surface keeps (a surfaces file stores them) and a
# simulated window takes from it, blended between two buffers.
BLENDED = (
    "rtt_samples", "rtt_flows", "rtt_hmean_ns", "srtt_ns", "rtt_min_ns", "long_flows",
    "data_packets", "retransmissions", "loss_rate", "loss_rate_ewma", "queue_delay_samples",
    "queue_delay_ns", "queue_delay_ewma_ns", "throughput_bps", "utilisation", "f",
)  # fmt: skip
# A queue above this fraction of its buffer is pinned at the limit (its rises are not the
# flows' growth); one below the second does not fill it (BBR's own queue).
FILL_PINNED = 0.95
FILL_FILLED = 0.5
# A fill slower than this fraction of the model's K = N·MSS/C is not N flows' windows growing
# a segment per round trip: the loss-based cells fill about as fast as the model, BBR's own
# queue far slower (eval/README.md, the fill of a raised buffer).
FILL_MODEL_FRACTION = 0.25


class SurfaceError(ValueError):
    """A run folder that gives no surface; the message says why."""


@dataclass(frozen=True)
class StepRun:
    """A run whose buffer moved once (policy `step`): its windows from the traffic's start,
    and the index of the first window under the new buffer."""

    moved_at: int
    windows: Sequence[WindowRecord]

    def window(self, since: int) -> WindowRecord:
        """The window `since` windows after the move (past the run's end, its windows after
        the move again)."""
        return window_at(self.windows, self.moved_at + since, self.moved_at)


@dataclass(frozen=True)
class Surface:
    """A cell's measured response: buffer (bytes) -> runs -> windows, in time order; and
    its step runs, if any were measured: (from, to) buffer (bytes) -> runs."""

    runs: Mapping[int, Sequence[Sequence[WindowRecord]]]
    steps: Mapping[tuple[int, int], Sequence[StepRun]] = field(default_factory=dict)
    # skip -> buffer -> the mean loss rate and queueing delay (ns) after it (`steady_means`):
    # a simulated run asks for them once, and recomputing them made a run 35% slower.
    _means: dict[int, dict[int, tuple[float, float]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.runs or any(not runs or not all(runs) for runs in self.runs.values()):
            raise SurfaceError("a surface needs at least one run with windows at each buffer")

    @property
    def buffers(self) -> list[int]:
        return sorted(self.runs)

    def mean_f(self, buffer: int, skip: int = 0) -> float:
        """Mean f over the windows measured at a measured buffer, each run's first `skip`
        left out."""
        return statistics.fmean(w["f"] for run in self.runs[buffer] for w in run[skip:])

    def mean_f_se(self, skip: int = 0) -> dict[str, float]:
        """Per source of windows (`source`) the standard error of its mean f between its
        runs: how well the surface knows it (0 from one run). A measured buffer's runs
        without their first `skip` windows; a move's step runs from the move on (those made
        at different times together, which overstates it)."""
        means = {
            source(b): [statistics.fmean(w["f"] for w in run[skip:]) for run in runs]
            for b, runs in self.runs.items()
        } | {
            source(key): [statistics.fmean(w["f"] for w in r.windows[r.moved_at :]) for r in runs]
            for key, runs in self.steps.items()
        }
        return {
            name: statistics.stdev(m) / math.sqrt(len(m)) if len(m) > 1 else 0.0
            for name, m in means.items()
        }

    def oracle(self, skip: int = 0) -> tuple[int, float]:
        """The measured buffer with the highest mean f (each run's first `skip` windows left
        out, as a simulated run leaves out its warm-up), and that mean."""
        best = max(self.buffers, key=lambda b: self.mean_f(b, skip))
        return best, self.mean_f(best, skip)

    def fill_constant_s(self, window_ns: int, skip: int) -> float | None:
        """How fast loss-based flows fill a queue, from the largest buffer's sawtooth: a queue
        q below the limit grows as K / (RTT_min + q) (each flow's window one segment per
        round trip: K = N·MSS/C, s), K from the median rise between windows after `skip`
        at the median queue there. None when the flows do not fill that buffer with a
        sawtooth (BBR's own queue, a queue pinned at the limit, or one that rises far slower
        than N flows' windows would): a raised buffer is then taken as in its steady state
        at once."""
        top = self.buffers[-1]
        windows = [w for run in self.runs[top] for w in run[skip:]]
        throughput_bps = statistics.fmean(w["throughput_bps"] or 1 for w in windows)
        drain_s = top * 8 / throughput_bps
        queue_s = statistics.median((w["queue_delay_ns"] or 0) / 1e9 for w in windows)
        lossy = any(w["retransmissions"] for w in windows)
        if not lossy or queue_s > FILL_PINNED * drain_s or queue_s < FILL_FILLED * drain_s:
            return None
        rises = [
            (b["queue_delay_ns"] - a["queue_delay_ns"]) / window_ns
            for run in self.runs[top]
            for a, b in itertools.pairwise(run[skip:])
            if a["queue_delay_ns"] is not None
            and b["queue_delay_ns"] is not None
            and b["queue_delay_ns"] > a["queue_delay_ns"]
        ]
        if not rises:
            return None
        rtt_s = statistics.median(w["rtt_min_ns"] / 1e9 for w in windows if w["rtt_min_ns"])
        k_s = statistics.median(rises) * (rtt_s + queue_s)
        flows = statistics.median(max(w["long_flows"], w["rtt_flows"], 1) for w in windows)
        model_s = flows * MSS_BYTES * 8 / throughput_bps
        return k_s if k_s >= FILL_MODEL_FRACTION * model_s else None

    def steady_means(self, skip: int) -> dict[int, tuple[float, float]]:
        """Per measured buffer the mean loss rate and queueing delay (ns) of its windows,
        each run's first `skip` left out."""
        if skip not in self._means:
            self._means[skip] = {
                b: (
                    statistics.fmean(w["loss_rate"] or 0.0 for run in runs for w in run[skip:]),
                    statistics.fmean(w["queue_delay_ns"] or 0 for run in runs for w in run[skip:]),
                )
                for b, runs in self.runs.items()
            }
        return self._means[skip]

    def nearest(self, buffer: int) -> int:
        """The measured buffer nearest to `buffer` on a log scale."""
        return min(self.buffers, key=lambda b: abs(math.log(buffer / b)))

    def steps_into(self, measured: int, moved_from: int) -> tuple[int, int] | None:
        """The step runs' (from, to) key for a move from `moved_from` into the measured
        buffer `measured`: from the measured buffer nearest to `moved_from`; None when that
        move was not measured (or is no move)."""
        key = (self.nearest(moved_from), measured)
        return key if key[0] != measured and key in self.steps else None

    def neighbours(self, buffer: int) -> tuple[int, int, float]:
        """The measured buffers around `buffer` and the weight of the upper one (log scale);
        outside the measured range, the nearest end alone."""
        b = self.buffers
        if buffer <= b[0]:
            return b[0], b[0], 0.0
        if buffer >= b[-1]:
            return b[-1], b[-1], 0.0
        i = bisect.bisect_right(b, buffer)
        low, high = b[i - 1], b[i]
        return low, high, math.log(buffer / low) / math.log(high / low)


def source(measured: int | tuple[int, int]) -> str:
    """Where a simulated window came from: a measured buffer's fixed-buffer runs ('BYTES')
    or a move's step runs ('FROM>TO', bytes; their key in a surfaces file)."""
    return str(measured) if isinstance(measured, int) else f"{measured[0]}>{measured[1]}"


def source_order(name: str) -> list[int]:
    """Sorts sources by buffer, a move after its from-buffer."""
    return [int(part) for part in name.split(">")]


def step_key(text: str) -> tuple[int, int]:
    """A move's key from its `source` name."""
    moved_from, moved_to = source_order(text)
    return moved_from, moved_to


def window_at(run: Sequence[WindowRecord], k: int, steady: int) -> WindowRecord:
    """A measured run's k-th window; past its end, the run again from its `steady`-th (a
    measured run is a window or two shorter than a simulated one, or much shorter when the
    simulation runs longer: its start-up is not repeated)."""
    if k < len(run):
        return run[k]
    if steady >= len(run):
        return run[k % len(run)]
    return run[steady + (k - steady) % (len(run) - steady)]
