"""The change detector's shared test vector (tests/fixtures/change-detector-vector.json): the
metrics job's Java detector (from the functions jar `make build` makes), the offline simulator's
Python one (which the test replay of the metrics job uses too) and a computation with exact
fractions written here from the definition each give every step's z and change."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from jarharness import run_harness

from p4bs.config import MetricsConfig
from p4bs_eval.change_detector import ChangeDetector

VECTOR = Path(__file__).parents[1] / "fixtures" / "change-detector-vector.json"
HARNESS = Path(__file__).parents[1] / "java" / "ChangeDetectorVector.java"
# Tolerance of z: the copies round their mean and deviation at different steps.
Z_REL = 1e-12


def vector() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTOR.read_text())
    return data


def by_definition(settings: dict[str, Any], fs: Sequence[float]) -> list[tuple[float, bool]]:
    """Each f's z against the mean and population deviation of the last `zscore_lag` filtered
    values (exact fractions; the deviation at least 1e-9), z 0 while there are fewer; a change
    when |z| is above the threshold, and then f enters the filtered values as
    influence * f + (1 - influence) * the newest of them."""
    lag, threshold = settings["zscore_lag"], settings["zscore_threshold"]
    influence = settings["zscore_influence"]
    filtered: list[float] = []
    out = []
    for f in fs:
        if len(filtered) < lag:
            filtered.append(f)
            out.append((0.0, False))
            continue
        last = [Fraction(v) for v in filtered[-lag:]]
        mean = sum(last) / lag
        deviation = math.sqrt(sum((v - mean) ** 2 for v in last) / lag)
        z = float(Fraction(f) - mean) / max(deviation, 1e-9)
        change = abs(z) > threshold
        filtered.append(influence * f + (1 - influence) * filtered[-1] if change else f)
        out.append((z, change))
    return out


def assert_reproduces(got: Sequence[tuple[float, bool]], steps: Sequence[dict[str, Any]]) -> None:
    assert len(got) == len(steps)
    wrong = [
        (i, step["why"], (z, change), (step["z"], step["change"]))
        for i, ((z, change), step) in enumerate(zip(got, steps, strict=True))
        if change != step["change"] or not math.isclose(z, step["z"], rel_tol=Z_REL)
    ]
    assert not wrong, wrong


def test_the_vector_is_the_definition_and_exercises_each_case() -> None:
    data = vector()
    steps, settings = data["steps"], data["settings"]
    assert_reproduces(by_definition(settings, [s["f"] for s in steps]), steps)
    lag, threshold = settings["zscore_lag"], settings["zscore_threshold"]
    zs = [s["z"] for s in steps]
    changes = [s["change"] for s in steps]
    assert zs[:lag] == [0.0] * lag and not any(changes[:lag])  # the warm-up
    assert any(z != 0 and not c for z, c in zip(zs, changes, strict=True))  # no change
    assert any(abs(z) == threshold and not c for z, c in zip(zs, changes, strict=True))
    # Two changes in a row: the second against a history the first entered damped.
    assert any(a and b for a, b in itertools.pairwise(changes))
    assert any(z > threshold for z in zs) and any(z < -threshold for z in zs)
    # A flat stretch (lag equal filtered values, deviation 0): the same f gives z 0, a move of
    # it a change whose z is finite (the deviation floor).
    fs = [s["f"] for s in steps]
    flat = [i for i in range(lag, len(fs)) if len(set(fs[i - lag : i])) == 1]
    assert any(fs[i] == fs[i - 1] and zs[i] == 0.0 for i in flat)
    assert any(changes[i] and math.isfinite(zs[i]) for i in flat)


def test_the_offline_detector_reproduces_the_vector() -> None:
    data = vector()
    detect = ChangeDetector(dataclasses.replace(MetricsConfig(), **data["settings"]))
    assert_reproduces([detect(s["f"]) for s in data["steps"]], data["steps"])


def test_the_metrics_jobs_java_detector_reproduces_the_vector(tmp_path: Path) -> None:
    """The detector in the functions jar the metrics job loads, run by a small harness
    (tests/java) compiled against it."""
    data = vector()
    settings = data["settings"]
    args = [str(settings[k]) for k in ("zscore_lag", "zscore_threshold", "zscore_influence")]
    fs = [repr(s["f"]) for s in data["steps"]]
    out = run_harness(HARNESS, "ChangeDetectorVector", args, fs, tmp_path)
    got = [(float(z), change == "1") for z, change in map(str.split, out.splitlines())]
    assert_reproduces(got, data["steps"])
