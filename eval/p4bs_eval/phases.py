"""A run's figures per phase of its traffic: the `phases` of its row in results.jsonl, from
p4bs's link metrics, the short flows' FCT summary per phase and size class (`fct`), and
each short flow itself (`short_flows`: its start, size and FCT), small enough to commit with
the row: every FCT table and pooled CDF is rebuilt from results.jsonl alone.

Times are seconds from the traffic's start (`traffic/timeline.json`). A window counts in the
phase its start lies in, after the phase's first `settle_s` seconds; a short flow in the
phase it started in (its whole FCT, even where it ends in the next one).
"""

from __future__ import annotations

import statistics
from typing import Any

from p4bs_eval.scenario import PhaseSpan
from p4bs_infra.traffic import percentile

# Short flows by size, bytes: (class, up to this size); the last takes the rest. Web search's
# CDF puts 60% of its flows in the first, 10% in the second, 30% in the last; the log-uniform
# 15 kB-2.5 MB sizes 37%, 45% and 18%.
SIZE_CLASSES = (("<100kB", 100_000), ("100kB-1MB", 1_000_000), (">=1MB", None))
FCT_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def phase_figures(
    spans: list[PhaseSpan],
    settle_s: float,
    windows: list[dict[str, Any]],
    traffic_start_ns: int,
) -> list[dict[str, Any]]:
    """Per phase, in time order: mean f, the windows counted, mean SRTT (ms) and utilisation
    of the link's windows that began in [start + settle, end)."""
    out = []
    for span in spans:
        low = traffic_start_ns + round((span.start_s + settle_s) * 1e9)
        high = traffic_start_ns + round(span.end_s * 1e9)
        inside = [w for w in windows if low <= w["window_start_ns"] < high]
        f = [w["f"] for w in inside if w.get("f") is not None]
        srtt = [w["srtt_ns"] / 1e6 for w in inside if w.get("srtt_ns")]
        utilisation = [w["utilisation"] for w in inside if w.get("utilisation") is not None]
        out.append(
            {
                "name": span.name,
                "start_s": span.start_s,
                "end_s": span.end_s,
                "f_mean": _mean(f),
                "windows": len(inside),
                "rtt_mean_ms": _mean(srtt),
                "utilisation": _mean(utilisation),
            }
        )
    return out


def size_class(size_bytes: int) -> str:
    for name, up_to in SIZE_CLASSES:
        if up_to is None or size_bytes < up_to:
            return name
    raise AssertionError("the last class takes every size")


def fct_summary(
    spans: list[PhaseSpan], flows: list[dict[str, Any]], traffic_start_ns: int
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per phase and size class (only those with flows): the flows started, those that did
    not complete (`failed`: refused, timed out or short of their size), and the completed
    ones' FCT quantiles (ms, nearest rank) and mean. Flows of the warm-up before the first
    phase are in none."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for span in spans:
        low = traffic_start_ns + round(span.start_s * 1e9)
        high = traffic_start_ns + round(span.end_s * 1e9)
        classes: dict[str, list[dict[str, Any]]] = {}
        for flow in flows:
            if low <= flow["start_ns"] < high:
                classes.setdefault(size_class(flow["size_bytes"]), []).append(flow)
        summary = {}
        for name, _ in SIZE_CLASSES:
            started = classes.get(name, [])
            if not started:
                continue
            done = [f["fct_ns"] / 1e6 for f in started if f.get("ok")]
            summary[name] = {
                "flows": len(started),
                "failed": len(started) - len(done),
                "fct_mean_ms": _mean(done),
                **{f"fct_p{round(q * 100)}_ms": percentile(done, q) for q in FCT_QUANTILES},
            }
        out[span.name] = summary
    return out


def short_flows_record(flows: list[dict[str, Any]], traffic_start_ns: int) -> dict[str, list[Any]]:
    """Every short flow of a run, as columns: its start (s from the traffic's start, to the
    ms), size (bytes) and FCT (ms, to 0.01; null where it did not complete). ~100 flows a run
    at 2/s: a few kB per row."""
    flows = sorted(flows, key=lambda f: f["start_ns"])
    return {
        "start_s": [round((f["start_ns"] - traffic_start_ns) / 1e9, 3) for f in flows],
        "size_bytes": [f["size_bytes"] for f in flows],
        "fct_ms": [round(f["fct_ns"] / 1e6, 2) if f.get("ok") else None for f in flows],
    }
