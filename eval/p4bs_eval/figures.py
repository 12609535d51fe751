"""A run's figures, the line `results.jsonl` gets: from the ground truth (the router's FIFOs,
the senders' TCP state, the ping probe, short flows, the VoIP stream) and from what p4bs
measured (its link metrics), over the run's measured part (after the warm-up)."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from p4bs_infra.traffic import jain_index


def run_file(path: Path) -> Path:
    """`path`, or its gzipped copy where a kept run folder (keep.py) has only that."""
    packed = path.with_name(path.name + ".gz")
    return packed if not path.exists() and packed.exists() else path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (gzipped or not, `run_file`); none if it is absent."""
    path = run_file(path)
    if not path.exists():
        return []
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def flow_throughputs(traffic_dir: Path, steady_from_ns: int) -> dict[tuple[str, int], float]:
    """Each long flow's goodput (bit/s) over the measured part, from the senders' bytes_acked
    (a flow that moved under 1 MB there is not a long flow)."""
    first: dict[tuple[str, int], tuple[int, int]] = {}
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for r in read_jsonl(traffic_dir / "ss.jsonl"):
        if r["ts_ns"] < steady_from_ns or "bytes_acked" not in r:
            continue
        flow = (r["src"], r["sport"])
        first.setdefault(flow, (r["ts_ns"], r["bytes_acked"]))
        last[flow] = (r["ts_ns"], r["bytes_acked"])
    rates = {}
    for flow, (t0, b0) in first.items():
        t1, b1 = last[flow]
        if t1 > t0 and b1 - b0 >= 1_000_000:
            rates[flow] = (b1 - b0) * 8e9 / (t1 - t0)
    return rates


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def settling(
    decisions: list[dict[str, Any]], windows: list[dict[str, Any]], start_ns: int
) -> dict[str, float | None]:
    """When a searching policy (P4BS) first settled, counted from the traffic's start and
    from its first applied decision (the search time), and the mean f of the measured
    windows that began after it settled. All None when it never settled."""
    applied = [d for d in decisions if d["outcome"] == "applied"]
    settled = next((d["ts_ns"] for d in applied if d["phase"] == "settled"), None)
    if settled is None:
        return {"settled_after_s": None, "search_s": None, "f_after_settling": None}
    return {
        "settled_after_s": (settled - start_ns) / 1e9,
        "search_s": (settled - applied[0]["ts_ns"]) / 1e9,
        "f_after_settling": _mean([w["f"] for w in windows if w["window_start_ns"] >= settled]),
    }


def decision_lag_s(applied: list[dict[str, Any]]) -> float | None:
    """The median time from the end of the window a decision was made on to its being in
    force on the router: the metrics job's lag, the policy's decision and the driver's set
    (what the offline simulator's `metrics_lag_ns` and `apply_ns` stand for together)."""
    lags = [(d["ts_ns"] - d["window_end_ns"]) / 1e9 for d in applied if d.get("window_end_ns")]
    return statistics.median(lags) if lags else None


def run_figures(
    summary: dict[str, Any],
    traffic_dir: Path,
    windows: list[dict[str, Any]],
    decisions: list[dict[str, Any]],
    groups_by_address: dict[str, str],
    rate_bps: int,
) -> dict[str, Any]:
    steady = summary["timeline"]["steady_from_ns"]
    end = summary["timeline"]["end_ns"]
    router = summary.get("router", {})
    long_flows = summary.get("long_flows", {})
    probe = summary.get("probe", {})
    flows = flow_throughputs(traffic_dir, steady)
    per_group: dict[str, float] = defaultdict(float)
    for (src, _), rate in flows.items():
        per_group[groups_by_address.get(src, src)] += rate
    measured = [w for w in windows if steady <= w["window_end_ns"] <= end]
    applied = [d for d in decisions if d["outcome"] == "applied"]
    row: dict[str, Any] = {
        "utilisation": router.get("throughput_bps", 0.0) / rate_bps,
        "drops": router.get("drops"),
        "queue_delay_ms": router.get("queue_delay_mean_ns", 0.0) / 1e6,
        "rtt_mean_ms": long_flows.get("rtt_mean_ns", 0.0) / 1e6,
        "probe_rtt_ms": probe.get("loaded_rtt_p50_ns", 0.0) / 1e6,
        "idle_rtt_ms": probe.get("idle_rtt_ns", 0.0) / 1e6,
        "long_flows": len(flows),
        "jain_flows": jain_index(list(flows.values())) or 0.0,
        "group_mbps": {g: rate / 1e6 for g, rate in sorted(per_group.items())},
        "jain_groups": jain_index(list(per_group.values())) or 0.0,
        # What p4bs measured over the same part.
        "f_mean": _mean([w["f"] for w in measured]),
        # One window's spread: what one trial's mean of f is noisy by (`acquisition.py`).
        "f_std": statistics.stdev([w["f"] for w in measured]) if len(measured) > 1 else None,
        "loss_mean": _mean([w["loss_rate"] for w in measured]),
        "srtt_mean_ms": _mean([w["srtt_ns"] / 1e6 for w in measured if w["srtt_ns"]]),
        "windows": len(measured),
        "window_ns": (
            measured[0]["window_end_ns"] - measured[0]["window_start_ns"] if measured else None
        ),
        "rate_bps": rate_bps,
        "decisions_applied": len(applied),
        "decision_lag_s": decision_lag_s(applied),
        "buffer_final_bytes": applied[-1]["buffer_bytes"] if applied else None,
        "buffer_limits_bytes": router.get("limit_bytes"),
        **settling(decisions, measured, summary["timeline"]["traffic_start_ns"]),
    }
    short = summary.get("short_flows")
    if short:
        row["fct_p50_ms"] = (short["fct_p50_ns"] or 0) / 1e6
        row["fct_p90_ms"] = (short.get("fct_p90_ns") or 0) / 1e6
        row["fct_p99_ms"] = (short["fct_p99_ns"] or 0) / 1e6
        row["short_flows_completed"] = short["completed"]
    voip = summary.get("voip")
    if voip:
        row["voip_delay_p50_ms"] = (voip["delay_p50_ns"] or 0) / 1e6
        row["voip_jitter_ms"] = voip["jitter_ns"] / 1e6
        row["voip_loss"] = voip["loss"]
    return row
