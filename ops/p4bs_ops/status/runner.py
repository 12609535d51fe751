"""Running the checks: the result of one (`PartStatus`), what they wait for and call healthy
(`StatusOptions`), the registry of checks (`part_check`) and the one guard every check runs
in (`run_check`), the checks side by side (`run_status`), and the exit code.

A check is a function of the config and the options that returns its part's `PartStatus`,
or raises `CheckFailed` when it cannot go on (its message is the part's summary). It is
registered with `@part_check(name)` and run only through `run_check`, which turns whatever
it raises into an unhealthy result and times it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from p4bs.config import Config
from p4bs.topic_range import Deadline as Deadline  # re-exported: influxdb.py imports it here

SECOND_NS = 1_000_000_000
MS_NS = 1_000_000

# The metrics job's consumer group, as `p4bs jobs run|submit --group` names it by default
# (streaming-jobs/p4bs_jobs/cli.py); tests/unit/test_status_render.py checks that it still is.
METRICS_GROUP = "p4bs-metrics"
# A Flink job made by the Table API is named after its sinks ("insert-into_<catalog>.
# <database>.metrics_out,..."): the metrics job is the one writing the table metrics_out
# (streaming-jobs/p4bs_jobs/metrics.py).
METRICS_JOB_MATCH = "metrics_out"

PARTS = ("kafka", "flink", "exporters", "optimizer", "routers", "influxdb")

# A thread that outlives its check's timeout by this much is left behind, reported as hung.
GRACE_NS = 2 * SECOND_NS


@dataclass(frozen=True)
class PartStatus:
    """One part of the deployment as its check found it."""

    name: str
    healthy: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    took_ns: int = 0


@dataclass(frozen=True)
class StatusOptions:
    """What the checks wait for and what they call healthy."""

    timeout_ns: int = 5 * SECOND_NS  # per check
    max_data_age_ns: int = 5 * SECOND_NS  # a link's newest link_counters record
    # The metrics job's last completed checkpoint; None: 10 checkpoint intervals, >= 30 s.
    max_checkpoint_age_ns: int | None = None
    max_lag: int | None = None  # records per group and topic; None: lag is only reported
    influx_interval_ns: int = SECOND_NS  # between the two readings of InfluxDB's counters
    metrics_group: str = METRICS_GROUP
    flink_job: str = METRICS_JOB_MATCH  # a part of the metrics job's name

    def checkpoint_age_limit_ns(self, config: Config) -> int:
        if self.max_checkpoint_age_ns is not None:
            return self.max_checkpoint_age_ns
        return max(10 * config.flink.checkpoint_interval_ns, 30 * SECOND_NS)


class CheckFailed(Exception):
    """A check that cannot go on: its message is the part's summary."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


Check = Callable[[Config, StatusOptions], PartStatus]

# Each part's check, filled by `part_check` as the check modules are imported (the package
# imports them all).
CHECKS: dict[str, Check] = {}


def part_check(name: str) -> Callable[[Check], Check]:
    """Registers the decorated function as the check of part `name` (one of `PARTS`)."""
    if name not in PARTS:
        raise ValueError(f"no part {name!r}; parts are {', '.join(PARTS)}")

    def register(check: Check) -> Check:
        CHECKS[name] = check
        return check

    return register


def run_check(name: str, config: Config, options: StatusOptions) -> PartStatus:
    """Part `name`'s check, its failures returned as an unhealthy part (CheckFailed with its
    message and details, any other error named by its type), timed."""
    began = time.monotonic_ns()
    try:
        result = CHECKS[name](config, options)
    except CheckFailed as exc:
        result = PartStatus(name, False, str(exc), exc.details)
    except Exception as exc:  # a client library's surprise: still a result
        result = PartStatus(name, False, f"check failed: {describe_error(exc)}")
    return dataclasses.replace(result, took_ns=time.monotonic_ns() - began)


def run_status(
    config: Config, options: StatusOptions, parts: Iterable[str] = PARTS
) -> list[PartStatus]:
    """Runs the checks of `parts` side by side; returns their results in `PARTS` order. A
    check that raises is unhealthy with its error; one still running well after its timeout
    is unhealthy as hung (its thread is left behind: it is a daemon)."""
    wanted = [p for p in PARTS if p in set(parts)]
    results: dict[str, PartStatus] = {}

    def run_into_results(name: str) -> None:
        results[name] = run_check(name, config, options)

    threads = {}
    for name in wanted:
        thread = threading.Thread(
            target=run_into_results, args=(name,), name=f"p4bs-status-{name}", daemon=True
        )
        thread.start()
        threads[name] = thread
    limit = Deadline(options.timeout_ns + options.influx_interval_ns + GRACE_NS)
    for thread in threads.values():
        thread.join(limit.left_s(0.0))
    out = []
    for name in wanted:
        result = results.get(name)
        if result is None:
            result = PartStatus(
                name,
                False,
                f"no answer: the check was still waiting after {options.timeout_ns / 1e9:g} s",
            )
        out.append(result)
    return out


def describe_error(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def exit_code(results: Iterable[PartStatus]) -> int:
    """0 when every part is healthy, 1 otherwise."""
    return 0 if all(r.healthy for r in results) else 1
