"""Offline policy evaluation: a policy (the optimizer's own code) against a link simulated
from a measured response surface, with the closed loop's timing, in seconds per run.

A surface is one cell's (CCA, N, RTT) LinkMetrics windows measured at fixed buffers: runs of
a buffer sweep (policy `none`), each the sequence of its windows from the start of its
traffic to its end: simulated time 0 is the traffic's start. A simulated run steps through
windows of the loop's length. Each window's metrics come from the runs measured at the two
buffers around the one in force (field by field at the same position in time, so the
measured noise and its autocorrelation come along: log-interpolated, the loss and the delay
as powers of the buffer, f moved with them), from one measured run per buffer drawn by the
run's seed; the change detector is run again on the simulated f, as the metrics job would.
After a move of the buffer, a measured buffer whose surface has step runs of that move (runs
of policy `step`: from the measured buffer nearest the one before the move, into it) gives
its windows from one of them instead, at the same time since the move, and no fill or
shrink model applies: with BBR the flows' state depends on how the buffer got where it is,
which a fixed-buffer run, measured from the traffic's start, cannot show (eval/README.md).
The policy sees a window `metrics_lag` after it ended; what it decides is applied `apply`
after the decision, no sooner than `min_change_interval` after the previous change (the
service's guard), and is in force from the window it is applied in, which the metrics job
labels with the last change applied before the window's end. A raised buffer is
not full at once where the surface shows loss-based flows filling it (`_filling`): the
queue carries over and grows at the flows' pace, without loss, until it reaches the measured
windows' queue. With `shrink_burst` > 0, a buffer lowered below the queue standing in it costs
a burst of loss (`_shrinking`): what stands above the new limit is dropped, and about as much
again while the flows take an RTT to back off, the queue draining to the limit meanwhile. It
is off by default: measured on single large shrinks, it takes ADT's small steady ones for
bursts they do not cause live (eval/README.md).

What it reports per run: the whole-run mean f (after the warm-up, as the live evaluation
does), the mean f after the policy settled and when, and the regret to the oracle, the best
fixed buffer measured in hindsight. Seeds are paired repeats, but they all draw on the few
runs measured per buffer (and move): the intervals of a policy's f and of a paired
difference add the surface's own error (each buffer's or move's standard error between its
runs, in proportion to the share of windows a policy drew from it: `surface_variance`),
which no number of seeds shrinks.
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import math
import random
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p4bs.config import LinkConfig, MetricsConfig
from p4bs_eval.report import load_results
from p4bs_eval.stats import KnownVariance, compare_in_cell, mean_ci
from p4bs_optimizer.policies import POLICIES
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.loss_delay_fit import MSS_BYTES

WindowRecord = Mapping[str, Any]
# Fields a simulated window takes from the measured ones, blended between two buffers.
BLENDED = (
    "rtt_samples", "rtt_flows", "rtt_hmean_ns", "srtt_ns", "rtt_min_ns", "long_flows",
    "data_packets", "retransmissions", "loss_rate", "loss_rate_ewma", "queue_delay_samples",
    "queue_delay_ns", "queue_delay_ewma_ns", "throughput_bps", "utilisation", "f",
)  # fmt: skip
# Between two measured buffers these follow the loss and the queueing delay: each blended so
# that its mean goes as a power of the buffer through the two buffers' means (loss ~ B^-1 to
# B^-2, delay ~ B for loss-based flows), where a linear blend overstates both (AM >= GM) and
# so understates f between measured buffers. Left out in turn, each inner measured buffer of
# the Fig. 11 surfaces was predicted from its neighbours within a median 4.1% of its f this
# way, 11.1% linearly (whose errors all fell below it in the Cubic and Reno cells: -0.42 at
# Cubic 100's 1250 kB, -0.01 as powers); neither follows BBR's cliff.
LOSS_FIELDS = ("loss_rate", "loss_rate_ewma", "retransmissions")
DELAY_FIELDS = ("queue_delay_ns", "queue_delay_ewma_ns")
SETTLED = "settled"
# A step run's buffers are the measured ones they are this close to (log scale: 2%; the
# router's buffer is whole bytes of a µs or a size).
STEP_SNAP = 0.02
# Step runs of one move made this many windows apart are taken as made at the same time (a
# scenario's repeats apply their step 1-3 s apart: the metrics lag varies).
STEP_TIME_SLACK = 10
# A queue above this fraction of its buffer is pinned at the limit (its rises are not the
# flows' growth); one below the second does not fill it (BBR's own queue).
FILL_PINNED = 0.95
FILL_FILLED = 0.5
# A fill slower than this fraction of the model's K = N·MSS/C is not N flows' windows growing
# a segment per round trip: BBR with 100 flows holds 93% of 200 ms with rises of 1% of the
# model's (carried throughput put that queue below FILL_PINNED; the loss-based cells measure
# 0.5-1.4 of the model).
FILL_MODEL_FRACTION = 0.25
# A lowered buffer: the retransmissions beyond the new buffer's own, over the first windows
# under it, per packet of the queue that stood above the new limit. Measured live
# (2026-11-28, p4bs-fig11's Cubic and Reno cells, loss-delay-fit and P4BS, one run each): the
# median over the 12 shrinks with more than 50 packets above the limit is 1.27 (0.80-2.03),
# in the first window under the new buffer and the next (`--shrink-burst`).
MEASURED_SHRINK_BURST = 1.27


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
        return _window_at(self.windows, self.moved_at + since, self.moved_at)


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


def _results(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run folder's scenario and rows, or SurfaceError."""
    try:
        return load_results(run_dir)
    except OSError as exc:
        raise SurfaceError(
            f"{run_dir}: not a run folder ({exc.strerror}: {exc.filename})"
        ) from None


def _traffic_windows(run: Path) -> list[WindowRecord]:
    """A run's windows of its traffic (traffic/timeline.json) from link_metrics.jsonl."""
    try:
        windows = [json.loads(line) for line in (run / "link_metrics.jsonl").open()]
        # The traffic's own start and end: the metrics job's windows begin seconds earlier
        # (the testbed's idle RTT probe) and go on while the queue drains.
        timeline = json.loads((run / "traffic" / "timeline.json").read_text())
    except OSError as exc:
        raise SurfaceError(f"{run}: an unfinished run ({exc.strerror}: {exc.filename})") from None
    start, end = timeline["traffic_start_ns"], timeline["end_ns"]
    return [
        w
        for w in windows
        if start <= w["window_start_ns"] and w["window_end_ns"] <= end and w["f"] is not None
    ]


def _cell_and_buffer(row: Mapping[str, Any], scenario: Mapping[str, Any]) -> tuple[str, int]:
    """A row's cell (its point's values but the buffer) and its initial buffer, bytes."""
    values = dict(row["values"])
    buffer_ns = values.pop("buffer", scenario["buffer_ms"] * 1e6)
    cell = ",".join(f"{k}={v}" for k, v in values.items()) or "base"
    return cell, round(row.get("rate_bps", 100_000_000) / 8 * buffer_ns / 1e9)


def surfaces(run_dir: Path) -> dict[str, Surface]:
    """The surfaces of a buffer sweep's run folder (policy `none`, `buffer` swept), one per
    cell (the point's other values), from each run's link_metrics.jsonl: the windows of its
    traffic, warm-up included, as a simulated run has them."""
    scenario, rows = _results(run_dir)
    if "buffer" not in scenario["sweep_keys"]:
        raise SurfaceError(f"{run_dir}: not a buffer sweep (sweep keys {scenario['sweep_keys']})")
    cells: dict[str, dict[int, list[list[WindowRecord]]]] = {}
    for row in rows:
        if row["policy"] != "none" or "error" in row:
            continue
        cell, buffer = _cell_and_buffer(row, scenario)
        kept = _traffic_windows(run_dir / row["run_dir"])
        if kept:
            cells.setdefault(cell, {}).setdefault(buffer, []).append(kept)
    if not cells:
        raise SurfaceError(f"{run_dir}: no run of policy none with windows")
    return {cell: Surface(runs) for cell, runs in cells.items()}


def with_steps(found: Mapping[str, Surface], run_dir: Path) -> dict[str, Surface]:
    """The surfaces with the step runs of a run folder (policy `step`) added to their cells:
    each run's move from its initial buffer to the buffer it applied, at the first window
    the metrics job labels with it (the window its change fell in). Both buffers must be
    measured ones of the cell's surface."""
    scenario, rows = _results(run_dir)
    # Per cell, its step runs so far and this folder's.
    steps = {cell: {k: list(v) for k, v in s.steps.items()} for cell, s in found.items()}
    added = 0
    for row in rows:
        if row["policy"] != "step" or "error" in row:
            continue
        cell, moved_from = _cell_and_buffer(row, scenario)
        run = run_dir / row["run_dir"]
        if cell not in found:
            raise SurfaceError(f"{run}: cell {cell} has no fixed-buffer surface")
        kept = _traffic_windows(run)
        try:
            applied = [
                d
                for d in map(json.loads, (run / "decisions.jsonl").open())
                if d["outcome"] == "applied"
            ]
        except OSError as exc:
            raise SurfaceError(f"{run}: no decisions ({exc.strerror})") from None
        if not applied:
            raise SurfaceError(f"{run}: the step was never applied")
        moved_to = applied[0]["buffer_bytes"]
        surface = found[cell]
        key = (surface.nearest(moved_from), surface.nearest(moved_to))
        if any(
            abs(math.log(measured / b)) > STEP_SNAP
            for measured, b in zip(key, (moved_from, moved_to), strict=True)
        ):
            raise SurfaceError(
                f"{run}: a move {moved_from} -> {moved_to} B between buffers the surface of "
                f"{cell} did not measure ({', '.join(map(str, surface.buffers))} B)"
            )
        moved_at = next(
            (i for i, w in enumerate(kept) if w["window_end_ns"] > applied[0]["ts_ns"]), None
        )
        if moved_at is None:
            raise SurfaceError(f"{run}: the step came after the traffic")
        steps[cell].setdefault(key, []).append(StepRun(moved_at, kept))
        added += 1
    if not added:
        raise SurfaceError(f"{run_dir}: no run of policy step")
    return {cell: Surface(s.runs, steps[cell]) for cell, s in found.items()}


def load_surfaces(source: Path) -> tuple[dict[str, Surface], dict[str, Any]]:
    """A buffer sweep's surfaces and its scenario's link settings (SLA, weights), from its
    run folder or from the file `save_surfaces` wrote."""
    if source.is_dir():
        found = surfaces(source)
        scenario, _ = load_results(source)
        return found, scenario.get("link_settings", {})
    try:
        with gzip.open(source, "rt") as file:
            data = json.load(file)
        steps = data.get("steps", {})
        cells = {
            cell: Surface(
                {int(b): runs for b, runs in by_buffer.items()},
                {
                    _step_key(key): [StepRun(r["moved_at"], r["windows"]) for r in runs]
                    for key, runs in steps.get(cell, {}).items()
                },
            )
            for cell, by_buffer in data["cells"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SurfaceError(f"{source}: not a run folder or a surfaces file ({exc})") from None
    return cells, data["link_settings"]


def source(measured: int | tuple[int, int]) -> str:
    """Where a simulated window came from: a measured buffer's fixed-buffer runs ('BYTES')
    or a move's step runs ('FROM>TO', bytes; their key in a surfaces file)."""
    return str(measured) if isinstance(measured, int) else f"{measured[0]}>{measured[1]}"


def _source_order(name: str) -> list[int]:
    """Sorts sources by buffer, a move after its from-buffer."""
    return [int(part) for part in name.split(">")]


def _step_key(text: str) -> tuple[int, int]:
    """A move's key from its `source` name."""
    moved_from, moved_to = _source_order(text)
    return moved_from, moved_to


def save_surfaces(
    path: Path, found: Mapping[str, Surface], link_settings: Mapping[str, Any]
) -> None:
    """The surfaces as a compact file: per cell, buffer and run, the windows' measured fields
    the simulator reads (six significant digits), and the cells' step runs, gzipped JSON."""

    def compact(value: Any) -> Any:
        return float(f"{value:.6g}") if isinstance(value, float) else value

    def windows(run: Sequence[WindowRecord]) -> list[dict[str, Any]]:
        return [{k: compact(w[k]) for k in BLENDED} for w in run]

    cells = {
        cell: {source(b): list(map(windows, runs)) for b, runs in sorted(s.runs.items())}
        for cell, s in found.items()
    }
    steps = {
        cell: {
            source(key): [{"moved_at": r.moved_at, "windows": windows(r.windows)} for r in runs]
            for key, runs in sorted(s.steps.items())
        }
        for cell, s in found.items()
        if s.steps
    }
    data = {"link_settings": dict(link_settings), "cells": cells}
    if steps:
        data["steps"] = steps
    with gzip.open(path, "wt") as file:
        json.dump(data, file, separators=(",", ":"))


@dataclass(frozen=True)
class LoopTiming:
    """The closed loop's timing, ns (defaults: the testbed loop's, loop/p4bs_loop)."""

    window_ns: int = 500_000_000
    # A window reaches the optimizer this long after it ends. Measured live (2026-11-28,
    # p4bs-fig11's Cubic and Reno cells, 38 decisions of loss-delay-fit and P4BS): from the
    # end of the window a decision was made on to the router's set, median 1.62 s (quartiles
    # 1.27, 2.47 s; `decision_lag_s` in results.jsonl); less the apply time, on the windows'
    # grid.
    metrics_lag_ns: int = 1_500_000_000
    apply_ns: int = 50_000_000  # a decision is in force this long after it was made
    min_change_interval_ns: int = 1_000_000_000
    duration_ns: int = 60_000_000_000
    warmup_ns: int = 10_000_000_000


class ChangeDetector:
    """The metrics job's smoothed z-score of f (LinkMetrics.java, detectChange)."""

    DEVIATION_FLOOR = 1e-9

    def __init__(self, m: MetricsConfig) -> None:
        self.m = m
        self.filtered: deque[float] = deque()

    def __call__(self, f: float) -> tuple[float, bool]:
        if len(self.filtered) < self.m.zscore_lag:
            self.filtered.append(f)
            return 0.0, False
        mean = statistics.fmean(self.filtered)
        deviation = statistics.pstdev(self.filtered, mean)
        z = (f - mean) / max(deviation, self.DEVIATION_FLOOR)
        change = abs(z) > self.m.zscore_threshold
        previous = self.filtered[-1]
        self.filtered.popleft()
        influence = self.m.zscore_influence
        self.filtered.append(influence * f + (1 - influence) * previous if change else f)
        return z, change


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


def _window_at(run: Sequence[WindowRecord], k: int, steady: int) -> WindowRecord:
    """A measured run's k-th window; past its end, the run again from its `steady`-th (a
    measured run is a window or two shorter than a simulated one, or much shorter when the
    simulation runs longer: its start-up is not repeated)."""
    if k < len(run):
        return run[k]
    if steady >= len(run):
        return run[k % len(run)]
    return run[steady + (k - steady) % (len(run) - steady)]


def _made_about_then(runs: Sequence[StepRun], k: int) -> Sequence[StepRun]:
    """Of a move's step runs, those made nearest in time to a move in window `k`: with BBR
    the flows recover from a move faster the longer they have run (live, a move from 250 kB
    to 1.25 MB at ~11 s dipped to f -13 to -14 and came back over ~4 s; at ~25 s to -11)."""
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
            buffer, pending = pending[1], None
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
            else _window_at(surface.runs[b][chosen[b]], k, steady)
            for b in (low, high)
        )
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
            # the service fills in the router's, read when it took the link.
            buffer_bytes=buffer,
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
                applied = max(end + timing.apply_ns, last_change + timing.min_change_interval_ns)
                # The service applies the newest decision: one made sooner but not yet in
                # force is replaced. The metrics job labels a window with the last change
                # applied before its end: the window the change falls in has it.
                pending = (applied // w * w, policy.clamp(decision.buffer_bytes))
                last_change = applied
    return result


@dataclass(frozen=True)
class PolicySummary:
    """A policy's simulated runs on one surface."""

    policy: str
    runs: tuple[SimRun, ...]
    oracle: tuple[int, float]  # the best fixed buffer over the same windows, and its f
    surface_se: Mapping[str, float]  # Surface.mean_f_se over the same windows

    @property
    def oracle_f(self) -> float:
        return self.oracle[1]

    @property
    def f_means(self) -> list[float]:
        return [r.f_mean for r in self.runs]

    @property
    def regrets(self) -> list[float]:
        return [self.oracle_f - r.f_mean for r in self.runs]

    @property
    def exposure(self) -> dict[str, float]:
        """The runs' mean share of windows drawn from each source (`source`)."""
        out: dict[str, float] = {}
        for run in self.runs:
            for b, share in run.exposure.items():
                out[b] = out.get(b, 0.0) + share / len(self.runs)
        return out


def surface_variance(
    ours: Mapping[str, float], theirs: Mapping[str, float], se: Mapping[str, float]
) -> float:
    """The variance the surface's own measurement adds to a difference of two policies'
    mean f (`theirs` empty: to one policy's mean f), which seeds cannot show, as they all
    draw on the same few runs per buffer (and move): each source's mean f is known to its
    standard error `se`, and a policy carries it in its share of windows from that source
    (`PolicySummary.exposure`). Two policies on the same sources carry the same error."""
    return sum((ours.get(b, 0.0) - theirs.get(b, 0.0)) ** 2 * e**2 for b, e in se.items())


def surface_variances(
    exposure: Mapping[str, Mapping[str, float]], se: Mapping[str, float]
) -> KnownVariance:
    """(policy, rival) -> the `surface_variance` of their difference, from each policy's
    exposure: what `compare_in_cell` and the claims add to the seeds' variance."""
    return lambda ours, theirs: surface_variance(exposure[ours], exposure[theirs], se)


def evaluate(
    policy: str,
    options: Mapping[str, Any],
    surface: Surface,
    link: LinkConfig,
    metrics: MetricsConfig,
    initial_buffer: int,
    timing: LoopTiming,
    seeds: Sequence[int],
    shrink_burst: float = 0.0,
) -> PolicySummary:
    """A fresh `policy` with `options` per seed; the same seeds give every policy the same
    measured runs (the offline counterpart of paired repeats)."""
    runs = tuple(
        simulate(
            POLICIES[policy](link, options),
            surface,
            link,
            metrics,
            initial_buffer,
            timing,
            s,
            shrink_burst,
        )
        for s in seeds
    )
    skip = timing.warmup_ns // timing.window_ns
    return PolicySummary(policy, runs, surface.oracle(skip), surface.mean_f_se(skip))


def cell_report(
    cell: str, surface: Surface, summaries: Sequence[PolicySummary], rate_bps: int
) -> list[str]:
    """A cell's table: per policy the whole-run f and the regret with their intervals, when
    it settled, f after settling, and its paired difference to the best other policy."""
    best, best_f = summaries[0].oracle
    lines = [
        f"### {cell}",
        "",
        f"Measured buffers: {', '.join(f'{b / 1000:g}' for b in surface.buffers)} kB. Oracle "
        f"(best fixed buffer in hindsight): {best / 1000:g} kB ({best * 8e3 / rate_bps:.1f} ms)"
        f", mean f {best_f:.3f}."
        + (
            " Step runs (the moves measured, kB: runs): "
            + ", ".join(
                f"{a / 1000:g} -> {b / 1000:g}: {len(runs)}"
                for (a, b), runs in sorted(surface.steps.items())
            )
            + "."
            if surface.steps
            else ""
        ),
        "",
        "| policy | runs | whole-run f [95% CI] | regret [95% CI] | settled after, s (median, "
        "runs) | f after settling | against the best other: difference [95% CI] | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_policy = {s.policy: {r.seed: r.f_mean for r in s.runs} for s in summaries}
    exposure, se = {s.policy: s.exposure for s in summaries}, summaries[0].surface_se
    known_variance = surface_variances(exposure, se)
    compared = {c.policy: c for c in compare_in_cell(by_policy, known_variance=known_variance)}
    for s in summaries:
        settled = [r.settled_ns / 1e9 for r in s.runs if r.settled_ns is not None]
        after = [f for r in s.runs if (f := r.f_after_settling) is not None]
        c = compared.get(s.policy)
        versus = f"{c.against}: {c.difference.shown('+.3f')} | {c.verdict}" if c else "- | -"
        settled_s = f"{statistics.median(settled):.1f} ({len(settled)})" if settled else "-"
        after_f = f"{statistics.fmean(after):.3f}" if after else "-"
        f_mean = mean_ci(s.f_means, known_variance=surface_variance(s.exposure, {}, se))
        lines.append(
            f"| {s.policy} | {len(s.runs)} | {f_mean.shown('.3f')} | "
            f"{mean_ci(s.regrets).shown('.3f')} | {settled_s} | {after_f} | {versus} |"
        )
    return lines


def summary_data(cells: Mapping[str, Sequence[PolicySummary]]) -> dict[str, Any]:
    """Per cell the oracle and the surface's standard error per buffer, and per policy each
    seed's whole-run mean f, search time (s) and f after settling, and its mean share of
    windows per buffer: what `p4bs eval claims` reads (`offline.json`)."""

    def seconds(ns: int | None) -> float | None:
        return None if ns is None else ns / 1e9

    out: dict[str, Any] = {}
    for cell, summaries in cells.items():
        best, best_f = summaries[0].oracle
        out[cell] = {
            "oracle": {"buffer_bytes": best, "f": round(best_f, 6)},
            "surface_se": {b: round(e, 6) for b, e in summaries[0].surface_se.items()},
            "policies": {
                s.policy: {
                    "f_mean": {r.seed: round(r.f_mean, 6) for r in s.runs},
                    "exposure": {
                        b: round(x, 6)
                        for b, x in sorted(s.exposure.items(), key=lambda i: _source_order(i[0]))
                    },
                    "search_s": {r.seed: seconds(r.search_ns) for r in s.runs},
                    "f_after_settling": {
                        r.seed: None if r.f_after_settling is None else round(r.f_after_settling, 6)
                        for r in s.runs
                    },
                }
                for s in summaries
            },
        }
    return out
