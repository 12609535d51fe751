"""The metrics job's change detector in Python, for the simulator, which runs it again on the
simulated f, and for the tests' replay of the metrics job (tests/replay.py).

The job's own is streaming-jobs/functions/io/p4bs/flink/ChangeDetector.java; both must give the
shared test vector's z-scores and changes (tests/fixtures/change-detector-vector.json,
tests/unit/test_change_detector.py)."""

from __future__ import annotations

import statistics
from collections import deque

from p4bs.config import MetricsConfig


class ChangeDetector:
    """The metrics job's smoothed z-score of f (Brakel): f against the mean and the population
    deviation of the last `zscore_lag` filtered values (none before there are that many: the
    warm-up gives z 0), a change when |z| exceeds `zscore_threshold`, and a change enters the
    filtered values damped by `zscore_influence` towards the newest of them."""

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
