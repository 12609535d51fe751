"""`p4bs eval detection` (eval/p4bs_eval/detection.py) on a tiny synthetic run folder: two runs
of a scenario whose second phase doubles N, one at a fixed buffer, one whose policy moves the
buffer before the change; each detector's delays, misses and false alarms are known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from p4bs_cli.main import main

WINDOW_NS = 500_000_000
START_NS = 1_700_000_000 * 10**9
PHASES = [
    {"name": "n30", "start_s": 0.0, "end_s": 30.0},
    {"name": "n60", "start_s": 30.0, "end_s": 60.0},
]
FIXED, MOVED = 1_250_000, 250_000  # 100 ms and 20 ms of 100 Mbit/s


def record(i: int, buffer: int, job_flag: bool) -> dict[str, Any]:
    """Window i of the traffic: 30 flows, 60 with the second phase; under the 20 ms buffer
    five times the loss and a fifth of the queue."""
    start = START_NS + i * WINDOW_NS
    flows = 60 if start >= START_NS + 30 * 10**9 else 30
    loss, delay = (0.006, 60_000_000) if buffer == FIXED else (0.03, 12_000_000)
    return {
        "link_id": "r1:eth1",
        "window_start_ns": start,
        "window_end_ns": start + WINDOW_NS,
        "rtt_samples": 1000,
        "rtt_flows": flows,
        "rtt_hmean_ns": 20_000_000 + delay,
        "srtt_ns": 20_000_000 + delay,
        "rtt_min_ns": 20_000_000,
        "long_flows": flows,
        "data_packets": 4000,
        "retransmissions": round(loss * 4000),
        "loss_rate": loss,
        "loss_rate_ewma": loss,
        "queue_delay_samples": 4000,
        "queue_delay_ns": delay,
        "queue_delay_ewma_ns": delay,
        "throughput_bps": 98_000_000,
        "utilisation": 0.98,
        "offered_bps": 99_000_000,
        "offered_utilisation": 0.99,
        "f": -(0.5 * loss / 0.01 + 0.5 * delay / 50_000_000),
        "zscore": 12.0 if job_flag else 0.0,
        "change": job_flag,
    }


def write_run(run: Path, moved_at_s: float | None, job_flags: set[int]) -> None:
    (run / "traffic").mkdir(parents=True)
    timeline = {
        "traffic_start_ns": START_NS,
        "steady_from_ns": START_NS + 5 * 10**9,
        "end_ns": START_NS + 60 * 10**9,
    }
    (run / "traffic" / "timeline.json").write_text(json.dumps(timeline))
    decisions = []
    if moved_at_s is not None:
        decisions.append(
            {
                "ts_ns": START_NS + round(moved_at_s * 1e9),
                "queue": 0,
                "policy": "loss-delay-fit",
                "phase": "search",
                "buffer_bytes": MOVED,
                "outcome": "applied",
            }
        )
    moved_ns = None if moved_at_s is None else START_NS + round(moved_at_s * 1e9)
    lines = []
    for i in range(-4, 124):  # the metrics job's windows begin before the traffic, end after
        end = START_NS + (i + 1) * WINDOW_NS
        buffer = MOVED if moved_ns is not None and moved_ns < end else FIXED
        lines.append(json.dumps(record(i, buffer, i in job_flags)))
    (run / "link_metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "decisions.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))


def write_folder(folder: Path) -> None:
    scenario = {
        "name": "dyn-tiny",
        "duration_s": 60.0,
        "warmup_s": 5.0,
        "buffer_ms": 100.0,
        "link_settings": {"sla": {"max_queue_delay": "50ms", "max_loss": 0.01}},
        "phases": PHASES,
        "settle_s": 5.0,
    }
    (folder / "scenario.json").write_text(json.dumps(scenario))
    rows = []
    # The fixed buffer: the job flags a window at 10 s (a false alarm) and two at 40 s (the
    # change, 10.5 s late).
    write_run(folder / "runs" / "base" / "fixed" / "r0", None, {20, 80, 81})
    rows.append(
        {"policy": "fixed:100ms", "fixed_buffer_bytes": FIXED, "run_dir": "runs/base/fixed/r0"}
    )
    # The policy cuts the buffer at 20 s: the job flags that move (a false alarm) and misses
    # the change.
    write_run(folder / "runs" / "base" / "ldf" / "r0", 20.0, {41})
    rows.append({"policy": "loss-delay-fit", "run_dir": "runs/base/ldf/r0"})
    with (folder / "results.jsonl").open("w") as out:
        for row in rows:
            out.write(
                json.dumps({"point": "base", "values": {}, "repeat": 0, "phases": PHASES, **row})
                + "\n"
            )


def test_detection_reports_each_detectors_delays_misses_and_false_alarms(tmp_path: Path) -> None:
    """The traffic detector sees N double 2 s after it (its persistence: 4 windows of 0.5 s)
    in both runs, and takes the policy's cut of the buffer for none (it reads the buffer in
    force from decisions.jsonl: without that, the cut's loss and delay would be a false
    alarm). The job's flag: 10.5 s late at the fixed buffer and one false alarm, a miss and
    a false alarm (the buffer move) in the other run. Each detection and false alarm names
    the signals that moved: N for the traffic detector."""
    write_folder(tmp_path)
    assert main(["eval", "detection", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "detection.json").read_text())
    traffic, job = summary["detectors"]["traffic"], summary["detectors"]["job-zscore"]
    for policy in ("fixed:100ms", "loss-delay-fit"):
        assert traffic[policy]["changes"] == {
            "n60": {
                "detected": 1,
                "misses": 0,
                "delay_median_s": 2.0,
                "delay_max_s": 2.0,
                "signals": {"flows": 1},
            }
        }
        assert traffic[policy]["false_alarms"] == 0
        assert traffic[policy]["false_alarm_signals"] == {}
        assert traffic[policy]["steady_h"] == round((60 - 5 - 2) / 3600, 3)
    assert job["fixed:100ms"]["changes"]["n60"] == {
        "detected": 1,
        "misses": 0,
        "delay_median_s": 10.5,
        "delay_max_s": 10.5,
        "signals": {"zscore": 1},
    }
    assert job["fixed:100ms"]["false_alarms"] == 1
    assert job["fixed:100ms"]["false_alarm_signals"] == {"zscore": 1}
    assert job["fixed:100ms"]["false_alarms_per_h"] == round(1 / ((60 - 5 - 10.5) / 3600), 2)
    assert job["loss-delay-fit"]["changes"]["n60"]["misses"] == 1
    assert job["loss-delay-fit"]["false_alarms"] == 1
    assert job["loss-delay-fit"]["steady_h"] == round((60 - 5 - 30) / 3600, 3)
    table = (tmp_path / "detection.md").read_text()
    assert "| traffic | loss-delay-fit | n60 | 1 | 1 | 2.0 | 2.0 | 0 | flows 1 |" in table
    assert "| job-zscore | loss-delay-fit | n60 | 1 | 0 | - | - | 1 | - |" in table
    assert "| job-zscore | loss-delay-fit | 0.007 | 1 | 144.00 | zscore 1 |" in table


def test_detection_refuses_a_bad_option_and_a_folder_that_is_not_one(tmp_path: Path) -> None:
    write_folder(tmp_path)
    assert main(["eval", "detection", str(tmp_path), "--option", "traffic_persistence=0"]) == 2
    assert main(["eval", "detection", str(tmp_path), "--option", "persistence=4"]) == 2
    assert main(["eval", "detection", str(tmp_path / "none")]) == 2
    assert main(["eval", "detection", str(tmp_path), "--within", "0"]) == 2
    # Within 1 s, N's change (2 s to detect) is missed by both detectors.
    assert main(["eval", "detection", str(tmp_path), "--within", "1"]) == 0
    within = json.loads((tmp_path / "detection.json").read_text())["detectors"]["traffic"]
    assert within["fixed:100ms"]["changes"]["n60"]["misses"] == 1
    # A threshold given: persistence 8 windows, the delay 4 s.
    assert main(["eval", "detection", str(tmp_path), "--option", "traffic_persistence=8"]) == 0
    summary = json.loads((tmp_path / "detection.json").read_text())
    assert summary["traffic_options"]["persistence"] == 8
    n60 = summary["detectors"]["traffic"]["fixed:100ms"]["changes"]["n60"]
    assert n60["delay_median_s"] == 4.0
