"""`p4bs eval detection`: how well a change detector sees the traffic's changes in a run
folder's runs (issue 39, item 5), measured, not assumed.

Each run's windows (link_metrics.jsonl, those of its traffic: traffic/timeline.json) are
replayed through loss-delay-fit's traffic detector (optimizer's `traffic_change.py`, with the
thresholds given), each window under the buffer the run had in force then: the last applied
decision (decisions.jsonl, queue 0) before the window's end, else the run's initial buffer
(a `fixed:*` run has no decision). The metrics job's own flag (`change`, its z-score of f)
is read from the same windows: an alarm where a flagged window follows one not flagged.

The ground truth is the scenario's phases (the row's `phases`): every phase start after the
first is a change of the traffic. A change is detected by the first alarm from its start until
`within` later (default: the phase's end); the delay is from the phase start to the end of the
window alarmed on; none: a miss. Every other alarm after the warm-up is a false alarm; the
steady time it counts against is the run after its warm-up less each change's time until it
was detected (or until its bound, when missed).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from p4bs.config import LinkConfig
from p4bs_eval.figures import read_jsonl, run_file
from p4bs_eval.scenario import fixed_buffer_ms
from p4bs_optimizer.policies.base import Window
from p4bs_optimizer.policies.loss_delay_fit import mathis_loss
from p4bs_optimizer.policies.traffic_change import TrafficChangeDetector, TrafficChangeOptions

TRAFFIC = "traffic"  # loss-delay-fit's detector
JOB_ZSCORE = "job-zscore"  # the metrics job's `change` flag
DETECTORS = (TRAFFIC, JOB_ZSCORE)
FALSE_ALARM = "false alarm"  # Tally.signals' key for the false alarms'


class DetectionError(ValueError):
    """A folder or run the command cannot read; the message names it."""


@dataclass
class Tally:
    """One detector's results over runs of one policy: delays per change (by the phase it
    starts), misses, false alarms and the steady time they count against."""

    delays_s: dict[str, list[float]] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)
    false_alarms: int = 0
    steady_s: float = 0.0
    runs: int = 0
    # The signals of the alarms that detected each change (by its phase), and of the false
    # alarms (FALSE_ALARM): what the detector saw move.
    signals: dict[str, Counter[str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        changes = {}
        for name, delays in self.delays_s.items():  # the phases in time order
            changes[name] = {
                "detected": len(delays),
                "misses": self.misses.get(name, 0),
                "delay_median_s": round(statistics.median(delays), 2) if delays else None,
                "delay_max_s": round(max(delays), 2) if delays else None,
                "signals": dict(sorted(self.signals.get(name, Counter()).items())),
            }
        hours = self.steady_s / 3600
        return {
            "runs": self.runs,
            "changes": changes,
            "false_alarms": self.false_alarms,
            "false_alarm_signals": dict(sorted(self.signals.get(FALSE_ALARM, Counter()).items())),
            "steady_h": round(hours, 3),
            "false_alarms_per_h": round(self.false_alarms / hours, 2) if hours > 0 else None,
        }


def buffers_in_force(
    windows: Sequence[Mapping[str, Any]], decisions: Sequence[Mapping[str, Any]], initial: int
) -> list[int]:
    """Each window's buffer: the last applied decision (queue 0) before its end, as the
    metrics job labels windows; the initial buffer before any."""
    applied = sorted(
        (d["ts_ns"], d["buffer_bytes"])
        for d in decisions
        if d.get("outcome") == "applied" and d.get("queue", 0) == 0
    )
    out, buffer, i = [], initial, 0
    for w in windows:
        while i < len(applied) and applied[i][0] < w["window_end_ns"]:
            buffer = applied[i][1]
            i += 1
        out.append(buffer)
    return out


def traffic_alarms(
    windows: Sequence[Mapping[str, Any]],
    buffers: list[int],
    link: LinkConfig,
    options: TrafficChangeOptions,
) -> list[tuple[int, list[str]]]:
    """End times (ns) of the windows the traffic detector signalled a change on, each with
    the signals its reason names; as in the policy, a window holding a value no window can
    (`Window.problem`) is passed over."""
    detector = TrafficChangeDetector(link, options, lambda r, n, b: mathis_loss(link, r, n, b))
    out = []
    for w, buffer in zip(windows, buffers, strict=True):
        window = Window.from_record(w, buffer)
        reason = None if window.problem() is not None else detector.observe(window)
        if reason is not None:
            out.append((w["window_end_ns"], signals_of(reason)))
    return out


# How the traffic detector's reason names each signal (TrafficChangeDetector._describe).
SIGNAL_WORDS = {
    "N ": "flows",
    "RTT_min ": "rtt_min",
    "loss ": "loss",
    "queueing delay ": "delay",
    "CCA mix": "cca",
}


def signals_of(reason: str) -> list[str]:
    """The signals a traffic detector's reason names ('; '-separated, one each)."""
    return [
        next((s for words, s in SIGNAL_WORDS.items() if part.startswith(words)), "other")
        for part in reason.split("; ")
    ]


def job_alarms(windows: Sequence[Mapping[str, Any]]) -> list[tuple[int, list[str]]]:
    """End times (ns) of the windows where the metrics job's change flag went up."""
    out, before = [], False
    for w in windows:
        if w["change"] and not before:
            out.append((w["window_end_ns"], ["zscore"]))
        before = bool(w["change"])
    return out


def score(
    tally: Tally,
    alarms: list[tuple[float, list[str]]],
    phases: Sequence[Mapping[str, Any]],
    warmup_s: float,
    end_s: float,
    within_s: float | None,
) -> None:
    """Adds one run's alarms (s from the traffic's start, with their signals) to the
    tally."""
    tally.runs += 1
    claimed: set[float] = set()
    unsteady_s = 0.0
    for phase in phases[1:]:
        name, start, bound = phase["name"], phase["start_s"], phase["end_s"]
        if within_s is not None:
            bound = min(bound, start + within_s)
        hit = next(((a, signals) for a, signals in alarms if start <= a < bound), None)
        tally.delays_s.setdefault(name, [])
        tally.misses.setdefault(name, 0)
        if hit is None:
            tally.misses[name] += 1
            unsteady_s += bound - start
        else:
            tally.delays_s[name].append(hit[0] - start)
            tally.signals.setdefault(name, Counter()).update(hit[1])
            claimed.add(hit[0])
            unsteady_s += hit[0] - start
    for at, signals in alarms:
        if at >= warmup_s and at not in claimed:
            tally.false_alarms += 1
            tally.signals.setdefault(FALSE_ALARM, Counter()).update(signals)
    tally.steady_s += max(end_s - warmup_s - unsteady_s, 0.0)


def _run_windows(run: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The windows of the run's traffic, its decisions, and its traffic's start (ns)."""
    timeline_path = run / "traffic" / "timeline.json"
    metrics_path = run_file(run / "link_metrics.jsonl")
    for path in (timeline_path, metrics_path):
        if not path.is_file():
            raise DetectionError(f"{run}: no {path.relative_to(run)} (an unfinished run?)")
    times = json.loads(timeline_path.read_text())
    start, end = times["traffic_start_ns"], times["end_ns"]
    windows = [
        w
        for w in read_jsonl(metrics_path)
        if start <= w["window_start_ns"] and w["window_end_ns"] <= end
    ]
    return windows, read_jsonl(run / "decisions.jsonl"), start


def folder_summary(
    folder: Path,
    scenario: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    link: LinkConfig,
    options: TrafficChangeOptions,
    within_s: float | None,
) -> dict[str, Any]:
    """Per detector and policy, the folder's runs (`rows`) scored against their phases."""
    tallies: dict[str, dict[str, Tally]] = {d: {} for d in DETECTORS}
    for row in rows:
        if "error" in row or not row.get("phases"):
            continue
        policy = row["policy"]
        windows, decisions, start_ns = _run_windows(folder / row["run_dir"])
        fixed = fixed_buffer_ms(policy)
        buffer_ms = fixed if fixed is not None else scenario["buffer_ms"]
        initial = row.get("fixed_buffer_bytes") or round(link.capacity_bps / 8 * buffer_ms / 1e3)
        buffers = buffers_in_force(windows, decisions, initial)
        try:
            alarms = {
                TRAFFIC: traffic_alarms(windows, buffers, link, options),
                JOB_ZSCORE: job_alarms(windows),
            }
        except KeyError as exc:
            raise DetectionError(
                f"{folder / row['run_dir']}: a window of link_metrics.jsonl has no {exc}"
            ) from None
        end_s = scenario["duration_s"]
        for detector, at_ns in alarms.items():
            tally = tallies[detector].setdefault(policy, Tally())
            alarms_s = [((t - start_ns) / 1e9, signals) for t, signals in at_ns]
            score(tally, alarms_s, row["phases"], scenario["warmup_s"], end_s, within_s)
    return {
        "folder": folder.name,
        "scenario": scenario["name"],
        "within_s": within_s,
        "traffic_options": asdict(options),
        "detectors": {
            d: {policy: t.summary() for policy, t in by_policy.items()}
            for d, by_policy in tallies.items()
        },
    }


def _cell(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(summary: Mapping[str, Any]) -> list[str]:
    """The summary as two tables: detection per change, false alarms per steady hour."""
    within = summary["within_s"]
    lines = [
        f"## Change detection: {summary['scenario']} ({summary['folder']})",
        "",
        "A change is a phase start; detected by the first alarm "
        + ("before the phase's end" if within is None else f"within {within:g} s (and the phase)")
        + "; delay from the phase start, s. `traffic`: loss-delay-fit's detector (options in "
        "detection.json); `job-zscore`: the metrics job's flag.",
        "",
        "| detector | policy | change | runs | detected | delay median | delay max | misses "
        "| signals |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for detector, by_policy in summary["detectors"].items():
        for policy, s in by_policy.items():
            for name, c in s["changes"].items():
                lines.append(
                    f"| {detector} | {policy} | {name} | {s['runs']} | {c['detected']} | "
                    f"{_cell(c['delay_median_s'])} | {_cell(c['delay_max_s'])} | {c['misses']} "
                    f"| {_counts(c['signals'])} |"
                )
    lines += [
        "",
        "| detector | policy | steady h | false alarms | per hour | signals |",
        "|---|---|---|---|---|---|",
    ]
    for detector, by_policy in summary["detectors"].items():
        for policy, s in by_policy.items():
            lines.append(
                f"| {detector} | {policy} | {s['steady_h']:.3f} | {s['false_alarms']} | "
                f"{_cell(s['false_alarms_per_h'], '.2f')} | {_counts(s['false_alarm_signals'])} |"
            )
    return lines


def _counts(signals: Mapping[str, int]) -> str:
    """'flows 3, delay 1' ('-' for none)."""
    return ", ".join(f"{name} {count}" for name, count in signals.items()) or "-"
