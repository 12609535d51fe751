"""Reports and P4BS Fig. 10 from a run folder alone: a folder written here as `p4bs eval run`
writes one (scenario.json, results.jsonl) for a sweep over fixed buffers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from p4bs_eval.acquisition import CurveError, measured_curve, run_acquisitions
from p4bs_eval.figures import decision_lag_s, settling
from p4bs_eval.report import write_report

RATE_BPS = 100_000_000
# f measured at buffers of 2, 4, 8 and 16 ms of line rate (25, 50, 100, 200 kB).
F_AT_MS = {2: -2.0, 4: -1.0, 8: -0.5, 16: -0.8}


def _buffer_sweep(run_dir: Path, f_at_ms: dict[int, float]) -> Path:
    run_dir.mkdir()
    points = [f"buffer={ms}ms" for ms in f_at_ms]
    scenario = {
        "name": "sweep", "title": "fixed buffers", "reports": ["buffer", "heatmap"],
        "policies": ["none"], "duration_s": 40, "warmup_s": 15, "buffer_ms": 200,
        "points": points, "sweep_keys": ["buffer"],
    }  # fmt: skip
    rows = [
        {
            "point": point,
            "values": {"buffer": ms * 1_000_000},
            "policy": "none",
            "repeat": 1,
            "run_dir": f"runs/{ms}",
            "rate_bps": RATE_BPS,
            "f_mean": f,
            "f_std": 0.3,
            "window_ns": 500_000_000,
            "loss_mean": 0.01 / ms,
            "rtt_mean_ms": 20 + ms,
            "utilisation": 0.99,
            "wall_s": 70.0,
        }
        for point, (ms, f) in zip(points, f_at_ms.items(), strict=True)
    ]
    (run_dir / "scenario.json").write_text(json.dumps(scenario))
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_the_measured_curve_interpolates_f_in_log_buffer_with_a_trials_noise(
    tmp_path: Path,
) -> None:
    curve = measured_curve(_buffer_sweep(tmp_path / "run", F_AT_MS))
    assert (curve.low_bytes, curve.high_bytes) == (25_000, 200_000)
    assert curve.f(100_000) == -0.5 and curve.f(25_000) == -2.0
    assert curve.f(round(math.sqrt(50_000 * 100_000))) == pytest.approx(-0.75, abs=1e-4)
    # A trial measures 0.5 s of 500 ms windows, and at least 2 of them.
    assert curve.sem == pytest.approx(0.3 / math.sqrt(2))


def test_fig10_on_the_measured_curve_reports_regret_against_its_optimum(tmp_path: Path) -> None:
    run = _buffer_sweep(tmp_path / "run", F_AT_MS)
    report = run_acquisitions(tmp_path / "fig10", seeds=2, iterations=4, measured=run)
    saved = json.loads((tmp_path / "fig10" / "acquisition.json").read_text())
    assert str(run) in saved["curves"] and str(run) in report.read_text()
    assert len(saved["runs"]) == 2 * 3
    for trace in saved["runs"]:
        assert trace["f_opt"] == -0.5
        assert all(step["regret"] >= 0 for step in trace["trace"])
        assert all(25_000 <= step["buffer_bytes"] <= 200_000 for step in trace["trace"])


def test_a_folder_without_a_buffer_sweep_gives_no_curve(tmp_path: Path) -> None:
    run = _buffer_sweep(tmp_path / "run", {2: -1.0, 4: -0.5})
    with pytest.raises(CurveError, match="2 buffer"):
        measured_curve(run)
    argv = [sys.executable, "-m", "p4bs_cli", "eval", "acquisition", "--curve", str(run)]
    done = subprocess.run([*argv, "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2 and "p4bs-fig17" in done.stderr


def test_the_buffer_report_plots_loss_rtt_and_f_against_the_buffer(tmp_path: Path) -> None:
    run = _buffer_sweep(tmp_path / "run", F_AT_MS)
    report = write_report(run).read_text()
    assert "| buffer=8ms | none | 1 |" in report
    assert (run / "buffer.png").stat().st_size > 10_000
    assert (run / "heatmap.png").stat().st_size > 5_000


def test_runs_without_their_raw_folder_are_left_out_of_the_per_run_plots(
    tmp_path: Path,
) -> None:
    """Rows resumed on another machine have no raw folder: the report is still written from
    the rows, and says which plots leave them out."""
    run = _buffer_sweep(tmp_path / "run", F_AT_MS)
    scenario = json.loads((run / "scenario.json").read_text())
    scenario["reports"] = ["buffer", "timeseries", "cdf"]
    (run / "scenario.json").write_text(json.dumps(scenario))
    report = write_report(run).read_text()
    assert "| buffer=8ms | none | 1 |" in report
    assert "4 run(s) have no raw folder here" in report
    assert not list(run.glob("timeseries-*.png")) and not (run / "cdf.png").exists()


def test_the_search_time_and_f_after_settling_come_from_the_applied_decisions() -> None:
    s = 10**9
    decisions = [
        {"ts_ns": 3 * s, "phase": "bound_search", "outcome": "applied"},
        {"ts_ns": 9 * s, "phase": "settled", "outcome": "skipped"},  # not in force
        {"ts_ns": 21 * s, "phase": "settled", "outcome": "applied"},
    ]
    windows = [{"window_start_ns": t * s, "f": -2.0 if t < 21 else -0.5} for t in range(30)]
    assert settling(decisions, windows, start_ns=1 * s) == {
        "settled_after_s": 20.0,
        "search_s": 18.0,
        "f_after_settling": -0.5,
    }
    assert set(settling(decisions[:1], windows, start_ns=0).values()) == {None}


def test_the_decision_lag_is_the_median_from_the_decided_window_to_the_applied_change() -> None:
    s = 10**9
    applied = [
        {"ts_ns": 3 * s, "window_end_ns": 2 * s},
        {"ts_ns": 9 * s, "window_end_ns": 5 * s},
        {"ts_ns": 21 * s, "window_end_ns": 19 * s},
        {"ts_ns": 22 * s, "window_end_ns": None},  # a decision made on no window
    ]
    assert decision_lag_s(applied) == 2.0
    assert decision_lag_s([]) is None
