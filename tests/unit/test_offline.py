"""The offline simulator on a surface with a known optimum: windows whose loss falls and
whose queueing delay grows with the buffer, f computed from them as the metrics job does, so
the best fixed buffer is known; the loop's timing (lag, apply, guard) applied exactly; the
same seeds giving the same runs; a surface read from a buffer sweep's run folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from p4bs import paths
from p4bs.config import LinkConfig, load_config
from p4bs_cli.main import main
from p4bs_eval.cli import late_apply_shares
from p4bs_eval.offline_report import PolicySummary, evaluate, surface_variance
from p4bs_eval.simulator import MEASURED_LATE_APPLY, MEASURED_SHRINK_BURST, LoopTiming, simulate
from p4bs_eval.surface import StepRun, Surface, SurfaceError
from p4bs_eval.surface_file import load_surfaces, save_surfaces, surfaces, with_steps
from p4bs_optimizer.policies import POLICIES
from p4bs_optimizer.policies.base import Decision, Policy, Window

RATE_BPS = 100_000_000
WINDOW_NS = 500_000_000
BUFFERS = (25_000, 50_000, 100_000, 200_000, 400_000, 800_000)
CONFIG = load_config(paths.example_config())
# The surface's largest buffer is the link's buffer.max and the initial buffer: a simulated
# buffer above the measured ones would get the largest one's windows.
LINK = dataclasses.replace(
    CONFIG.links[0], max_queue_delay_ns=50_000_000, max_loss=0.01, max_buffer_bytes=BUFFERS[-1]
)
# A fixed lag, no late applies: every decision in force at a known window.
TIMING = LoopTiming(
    duration_ns=40_000_000_000,
    warmup_ns=5_000_000_000,
    metrics_lag_ns=3_000_000_000,
    late_apply=(),
)


def windows(
    link: LinkConfig, buffer: int, n: int, rng: random.Random, loss: float | None = None
) -> list[dict[str, Any]]:
    """n windows at `buffer`: loss `loss` (10% * exp(-buffer / 40 kB) by default), a full
    queue, noisy f."""
    delay_ns = round(buffer * 8e9 / RATE_BPS)
    loss = 0.1 * math.exp(-buffer / 40_000) if loss is None else loss
    packets = RATE_BPS // 8 // 1500 // 2
    f = -(
        link.weight_loss * loss / link.max_loss
        + link.weight_delay * delay_ns / link.max_queue_delay_ns
    )
    window = {
        "rtt_samples": 2000, "rtt_flows": 50, "rtt_hmean_ns": 20_000_000 + delay_ns,
        "srtt_ns": 20_000_000 + delay_ns, "rtt_min_ns": 20_000_000, "long_flows": 50,
        "data_packets": packets, "retransmissions": round(loss * packets),
        "loss_rate": loss, "loss_rate_ewma": loss, "queue_delay_samples": 2000,
        "queue_delay_ns": delay_ns, "queue_delay_ewma_ns": delay_ns,
        "throughput_bps": RATE_BPS, "utilisation": 0.99,
    }  # fmt: skip
    return [{**window, "f": f + rng.gauss(0, 0.03)} for _ in range(n)]


def known_surface(runs: int = 2, n: int = 100) -> Surface:
    rng = random.Random(5)
    return Surface({b: [windows(LINK, b, n, rng) for _ in range(runs)] for b in BUFFERS})


def test_the_oracle_is_the_best_measured_buffer_and_between_them_is_interpolated() -> None:
    surface = known_surface()
    best, f = surface.oracle()
    assert best == 200_000 and f == pytest.approx(-0.194, abs=0.01)  # 0.5*0.067 + 0.5*0.32
    low, high, weight = surface.neighbours(round(100_000 * math.sqrt(2)))
    assert (low, high) == (100_000, 200_000) and weight == pytest.approx(0.5, abs=1e-5)
    assert surface.neighbours(10_000) == (25_000, 25_000, 0.0)
    assert surface.neighbours(2_000_000) == (800_000, 800_000, 0.0)
    with pytest.raises(SurfaceError):
        Surface({25_000: []})


def test_between_measured_buffers_loss_and_delay_follow_powers_of_the_buffer() -> None:
    """Loss ~ 1/B and delay ~ B, measured at 100 and 400 kB only: at 200 kB the simulated
    link loses half of 100 kB's loss with twice its delay, and f follows from them, -0.66
    (a linear blend of the two buffers' windows gives 0.625 and 2.5 times, f -0.825)."""
    rng = random.Random(2)
    surface = Surface(
        {b: [windows(LINK, b, 80, rng, loss=0.02 * 100_000 / b)] for b in (100_000, 400_000)}
    )
    policy = POLICIES["static"](LINK, {"buffer": 200_000})
    run = simulate(policy, surface, LINK, CONFIG.metrics, 200_000, TIMING, seed=1)
    expected = -sum(LINK.f_terms(0.01, 16_000_000))
    assert expected == pytest.approx(-0.66)
    assert run.f_mean == pytest.approx(expected, abs=0.01)


def test_the_surface_s_own_error_follows_each_policy_s_share_of_its_buffers() -> None:
    """A static run at a measured buffer draws every window after the warm-up from its runs;
    one at 100 kB * sqrt(2) half from 100 kB's, half from 200 kB's. Each buffer's mean f is
    known to the standard error of its runs' means, and a policy's f, or the difference of
    two, carries it in proportion to their shares: none for two on the same buffers."""
    surface = known_surface(runs=3)

    def static(buffer: int) -> PolicySummary:
        return evaluate(
            "static", {"buffer": buffer}, surface, LINK, CONFIG.metrics, buffer, TIMING, range(2)
        )

    at_200, between = static(200_000), static(round(100_000 * math.sqrt(2)))
    assert at_200.exposure == pytest.approx({"200000": 1.0})
    assert between.exposure == pytest.approx({"100000": 0.5, "200000": 0.5}, abs=1e-4)
    se = at_200.surface_se
    means = [statistics.fmean(w["f"] for w in run[10:]) for run in surface.runs[200_000]]
    assert se["200000"] == pytest.approx(statistics.stdev(means) / math.sqrt(3))
    assert surface_variance(at_200.exposure, {}, se) == pytest.approx(se["200000"] ** 2)
    assert surface_variance(between.exposure, at_200.exposure, se) == pytest.approx(
        0.25 * se["100000"] ** 2 + 0.25 * se["200000"] ** 2, rel=1e-3
    )
    assert surface_variance(at_200.exposure, at_200.exposure, se) == 0


def test_a_decision_is_in_force_after_the_lag_and_the_apply_time() -> None:
    """Window 0 ends at 0.5 s and reaches the policy at 3.5 s (lag 3 s); the static buffer
    it decides is applied at 3.55 s, inside the window from 3.5 s (k = 7), which the metrics
    job labels with it and which has it: the first seven had the initial buffer."""
    policy = POLICIES["static"](LINK, {"buffer": 200_000})
    run = simulate(policy, known_surface(), LINK, CONFIG.metrics, 800_000, TIMING, seed=1)
    assert run.buffers[:7] == [800_000] * 7 and set(run.buffers[7:]) == {200_000}
    assert [(t, d.buffer_bytes) for t, d in run.decisions] == [(3_500_000_000, 200_000)]
    assert len(run.f) == 80 and run.warmup_windows == 10


def test_a_decision_applied_late_is_in_force_as_many_windows_later() -> None:
    """With `late_apply`, each decision's apply time gets a delay drawn from the shares: all
    0.5 s here, so the static buffer is in force from window 8 instead of 7; the same seed
    draws the same delays, and --late-apply's text is read as s:share pairs."""
    late = dataclasses.replace(TIMING, late_apply=((500_000_000, 1.0),))
    policy = POLICIES["static"](LINK, {"buffer": 200_000})
    run = simulate(policy, known_surface(), LINK, CONFIG.metrics, 800_000, late, seed=1)
    assert run.buffers[:8] == [800_000] * 8 and set(run.buffers[8:]) == {200_000}
    assert late_apply_shares("0:0.58,0.5:0.37,1:0.05") == MEASURED_LATE_APPLY
    for bad in ("0.5", "x:1", "0:0", "-1:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            late_apply_shares(bad)


def test_before_the_first_change_the_policy_knows_the_routers_buffer_only_if_read() -> None:
    """As on the third round's testbed, the windows before the first change say no buffer,
    so loss-delay-fit's step 0 begins with a decision for the search max (800 kB here, in
    force already) and measures it 3.5 s later than when the service read the router's."""
    first = {}
    for read in (False, True):
        timing = dataclasses.replace(TIMING, router_buffer_read=read)
        policy = POLICIES["loss-delay-fit"](LINK, {})
        run = simulate(policy, known_surface(), LINK, CONFIG.metrics, 800_000, timing, seed=1)
        first[read] = run.decisions[:2]
    (asked, unknown), (known, _) = first[False], first[True]
    assert asked[1].reason == "step 0 at the search max, 800000 B: the buffer in force is unknown"
    assert unknown[1].reason.startswith("step 0: at 800000 B")
    assert known[1].reason.startswith("step 0: at 800000 B")
    assert (unknown[0], known[0]) == (10_000_000_000, 6_500_000_000)


def test_a_run_shorter_than_the_simulation_goes_on_from_its_steady_part() -> None:
    """A simulated run longer than the measured ones (40 s here, 30 windows measured, the
    first 10 of them warm-up) goes on past their end with the windows after the warm-up,
    never the start-up again."""
    rng = random.Random(1)
    measured = [windows(LINK, b, 30, rng) for b in BUFFERS]
    for windows_at_b in measured:
        for k, window in enumerate(windows_at_b):
            window["f"] = -float(k)  # each window's f says where it was taken from
    surface = Surface({b: [w] for b, w in zip(BUFFERS, measured, strict=True)})
    policy = POLICIES["static"](LINK, {"buffer": 200_000})
    run = simulate(policy, surface, LINK, CONFIG.metrics, 200_000, TIMING, seed=1)
    assert run.f[:30] == [-float(k) for k in range(30)]
    assert run.f[30:] == [-float(10 + (k - 10) % 20) for k in range(30, 80)]


def test_regret_is_zero_at_the_oracle_and_what_a_worse_buffer_costs() -> None:
    surface = known_surface()
    seeds = range(4)

    def static(buffer: int) -> list[float]:
        s = evaluate(
            "static", {"buffer": buffer}, surface, LINK, CONFIG.metrics, buffer, TIMING, seeds
        )
        return s.regrets

    assert all(abs(r) < 0.02 for r in static(200_000))
    big = static(800_000)
    assert all(r == pytest.approx(0.64 - 0.194, abs=0.02) for r in big)  # 0.5 * 64 / 50
    # The same seeds, the same runs.
    assert static(800_000) == big


def test_a_search_settles_near_the_surface_optimum_and_p4bs_runs_deterministically() -> None:
    """loss-delay-fit finds the known optimum (200 kB) of the surface within its measured
    neighbours; P4BS, with its Ax fits, goes through its phases the same way twice."""
    surface = known_surface(n=160)
    timing = dataclasses.replace(TIMING, duration_ns=80_000_000_000)
    run = simulate(
        POLICIES["loss-delay-fit"](LINK, {}), surface, LINK, CONFIG.metrics, BUFFERS[-1], timing, 1
    )
    assert run.settled_ns is not None and run.f_after_settling is not None
    settled = next(d for _, d in run.decisions if d.phase == "settled").buffer_bytes
    assert 100_000 <= settled <= 400_000, run.decisions
    assert run.f_after_settling >= surface.oracle()[1] - 0.1
    runs = [
        simulate(POLICIES["p4bs"](LINK, {}), surface, LINK, CONFIG.metrics, BUFFERS[-1], timing, s)
        for s in (1, 1)
    ]
    assert [r.decisions for r in runs[:1]] == [r.decisions for r in runs[1:]]  # deterministic
    phases = [d.phase for _, d in runs[0].decisions]
    assert phases[0] == "bound_search" and "settled" in phases, phases


# A scenario.json's traffic (runner.traffic_of): 50 Cubic flows for 10 s.
TRAFFIC: dict[str, Any] = {
    "duration_s": 10, "warmup_s": 1, "short_flows": None, "voip": None, "phases": [],
    "groups": [{"name": "g", "flows": 50, "cca": "cubic", "start_ns": 0, "rtt_ns": None,
                "stop_ns": None}],
}  # fmt: skip


def sweep_folder(
    run_dir: Path,
    buffers_ms: tuple[int, ...],
    windows_per_run: int,
    step_to_ms: int = 0,
    traffic: dict[str, Any] | None = TRAFFIC,
) -> Path:
    """A run folder as `p4bs eval run` writes it for a buffer sweep at 50 flows (of
    `traffic`; None: from before scenario.json recorded it); with `step_to_ms`, of policy
    step: the buffer moved there in the traffic's sixth window."""
    rng = random.Random(1)
    policy = "step" if step_to_ms else "none"
    scenario = {
        "name": "s", "title": "s", "reports": [], "policies": [policy], "repeat": 1,
        "duration_s": 10, "warmup_s": 1, "buffer_ms": 200,
        "points": [f"flows=50,buffer={ms}ms" for ms in buffers_ms],
        "sweep_keys": ["flows", "buffer"],
        "link_settings": {"sla": {"max_queue_delay": "50ms", "max_loss": 0.01}},
    }  # fmt: skip
    if traffic is not None:
        scenario["traffic"] = traffic
    rows = []
    for ms in buffers_ms:
        run = run_dir / "runs" / f"b{ms}"
        run.mkdir(parents=True)
        buffer = RATE_BPS // 8 * ms // 1000
        first = 1_700_000_000_000_000_000
        with (run / "link_metrics.jsonl").open("w") as out:
            for k, w in enumerate(windows(LINK, buffer, windows_per_run, rng)):
                start = first + k * WINDOW_NS
                out.write(
                    json.dumps({**w, "window_start_ns": start, "window_end_ns": start + WINDOW_NS})
                    + "\n"
                )
        # The metrics job's windows begin a second before the traffic and end one after it.
        (run / "traffic").mkdir()
        timeline = {
            "traffic_start_ns": first + 2 * WINDOW_NS,
            "end_ns": first + (windows_per_run - 2) * WINDOW_NS,
        }
        (run / "traffic" / "timeline.json").write_text(json.dumps(timeline))
        if step_to_ms:
            applied = {
                "ts_ns": first + 7 * WINDOW_NS + 1, "outcome": "applied",
                "buffer_bytes": RATE_BPS // 8 * step_to_ms // 1000,
            }  # fmt: skip
            (run / "decisions.jsonl").write_text(json.dumps(applied) + "\n")
        rows.append(
            {"point": f"flows=50,buffer={ms}ms", "values": {"flows": 50, "buffer": ms * 10**6},
             "policy": policy, "repeat": 1, "run_dir": f"runs/b{ms}", "rate_bps": RATE_BPS}
        )  # fmt: skip
    (run_dir / "scenario.json").write_text(json.dumps(scenario))
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_surfaces_are_read_from_a_buffer_sweeps_run_folder(tmp_path: Path) -> None:
    (cell, surface), *_ = surfaces(sweep_folder(tmp_path / "s", (2, 16), 20)).items()
    assert cell == "flows=50" and surface.buffers == [25_000, 200_000]
    # Only the traffic's windows, from its start (the simulator leaves out the warm-up).
    assert [len(r) for r in surface.runs[25_000]] == [16]
    (tmp_path / "s" / "runs" / "b2" / "traffic" / "timeline.json").unlink()
    with pytest.raises(SurfaceError, match="an unfinished run"):
        surfaces(tmp_path / "s")
    with pytest.raises(SurfaceError, match="not a run folder"):
        surfaces(tmp_path / "nothing")


def test_step_runs_join_the_surface_of_their_cell_with_the_window_they_moved_in(
    tmp_path: Path,
) -> None:
    found, _, _, traffic = load_surfaces(sweep_folder(tmp_path / "s", (2, 16), 20))
    assert traffic == TRAFFIC
    stepped = with_steps(found, sweep_folder(tmp_path / "up", (2,), 20, step_to_ms=16), traffic)
    # Applied in the metrics job's eighth window, the sixth of the traffic (which starts with
    # the third): its window 5 is the first the metrics job labels with the new buffer.
    ((key, (run,)),) = stepped["flows=50"].steps.items()
    assert key == (25_000, 200_000) and run.moved_at == 5 and len(run.windows) == 16
    packed = tmp_path / "sweep.json.gz"
    save_surfaces(packed, stepped, {}, {}, traffic)
    loaded, _, origin, packed_traffic = load_surfaces(packed)
    assert origin == {}  # a sweep's: matched to live runs by cell
    assert packed_traffic == TRAFFIC
    assert loaded["flows=50"].steps[key][0].moved_at == 5
    with pytest.raises(SurfaceError, match="did not measure"):
        with_steps(found, sweep_folder(tmp_path / "odd", (2,), 20, step_to_ms=5), traffic)
    with pytest.raises(SurfaceError, match="no run of policy step"):
        with_steps(found, tmp_path / "s", traffic)
    # Step runs of other traffic (flows that leave) measure other moves: refused, by name.
    other = {**TRAFFIC, "groups": [{**TRAFFIC["groups"][0], "stop_ns": 5 * 10**9}]}
    leaving = sweep_folder(tmp_path / "leave", (2,), 20, step_to_ms=16, traffic=other)
    with pytest.raises(SurfaceError, match=r"not the surface's \(differs in groups\)"):
        with_steps(found, leaving, traffic)
    # Folders from before scenario.json recorded the traffic have nothing to compare.
    older = sweep_folder(tmp_path / "old", (2,), 20, step_to_ms=16, traffic=None)
    assert with_steps(found, older, traffic)["flows=50"].steps


def test_a_dynamic_scenarios_oracle_buffers_are_its_surface(tmp_path: Path) -> None:
    """Without a buffer sweep, the runs of the oracle's fixed buffers (fixed:*) make the
    surface, and its origin (the scenario's name and timing) comes along into the file."""
    folder = sweep_folder(tmp_path / "dyn", (2, 16), 20)
    scenario = json.loads((folder / "scenario.json").read_text())
    scenario |= {"name": "dyn", "points": ["base"], "sweep_keys": [], "duration_s": 9}
    (folder / "scenario.json").write_text(json.dumps(scenario))
    rows = [json.loads(line) for line in (folder / "results.jsonl").open()]
    for row in rows:
        ms = row["values"]["buffer"] // 10**6
        row |= {"point": "base", "values": {}, "policy": f"fixed:{ms}ms"}
    rows[1]["fixed_buffer_bytes"] = 199_000  # what the router was given, where recorded
    rows.append({**rows[0], "policy": "loss-delay-fit", "run_dir": "runs/none"})  # not read
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found, _, origin, _ = load_surfaces(folder)
    assert list(found) == ["base"] and found["base"].buffers == [25_000, 199_000]
    assert origin == {"name": "dyn", "duration_s": 9, "warmup_s": 1, "buffer_ms": 200}
    packed = tmp_path / "dyn.json.gz"
    save_surfaces(packed, found, {}, origin, None)
    assert load_surfaces(packed).origin == origin
    for row in rows:
        row["policy"] = "bdp"
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SurfaceError, match="nor fixed:"):
        surfaces(folder)


def test_after_a_measured_move_the_windows_come_from_its_step_run() -> None:
    """A move from 800 kB to 200 kB in force from window 7 (as above): with a step run of
    that move, whose buffer moved in its window 4, window k is the step run's 4 + (k - 7);
    from a buffer whose move into 200 kB was not measured, the fixed-buffer windows."""
    surface = known_surface()
    rng = random.Random(2)
    step = windows(LINK, 200_000, 80, rng)
    for k, window in enumerate(step):
        window["f"] = -100.0 - k  # each window's f says where it was taken from
    measured = Surface(surface.runs, {(800_000, 200_000): [StepRun(4, step)]})
    policy = POLICIES["static"](LINK, {"buffer": 200_000})
    run = simulate(policy, measured, LINK, CONFIG.metrics, 800_000, TIMING, seed=1)
    assert run.f[7:] == [-100.0 - (4 + k - 7) for k in range(7, 80)]
    assert max(run.f[:7]) > -5  # before the move: the fixed 800 kB windows
    # Every window after the warm-up (10) came from the step run: its error is the move's.
    assert run.exposure == pytest.approx({"800000>200000": 1.0})
    policy = POLICIES["static"](LINK, {"buffer": 200_000})
    other = simulate(policy, measured, LINK, CONFIG.metrics, 400_000, TIMING, seed=1)
    assert max(other.f[7:]) > -5


class Scripted(Policy):
    """Decides the buffers of `plan` (window index -> bytes) on those windows."""

    name = "scripted"

    def __init__(self, plan: dict[int, int]) -> None:
        super().__init__(LINK, {})
        self.plan = plan

    def decide(self, window: Window) -> list[Decision]:
        k = window.window_start_ns // WINDOW_NS
        return [Decision(self.plan[k], "static", "plan")] if k in self.plan else []


def test_a_move_made_again_takes_another_step_run_made_about_then() -> None:
    """Two step runs of a move made in their window 4 and one made in its window 150: the
    move in force from window 7 and the same move from window 47 draw on the two early ones,
    one each (never the late one, made further from either), at the time since the move."""
    surface = known_surface()
    rng = random.Random(2)
    marked = []
    for base in (-100.0, -300.0, -500.0):
        step = windows(LINK, 200_000, 160, rng)
        for k, window in enumerate(step):
            window["f"] = base - k
        marked.append(step)
    runs = [StepRun(4, marked[0]), StepRun(4, marked[1]), StepRun(150, marked[2])]
    measured = Surface(surface.runs, {(800_000, 200_000): runs})
    # Decided on windows 0, 20 and 40, each in force 7 windows later (the lag of 3 s).
    plan = {0: 200_000, 20: 800_000, 40: 200_000}
    run = simulate(Scripted(plan), measured, LINK, CONFIG.metrics, 800_000, TIMING, seed=1)
    first, again = run.f[7:27], run.f[47:60]
    bases = {round(first[0] + 4), round(again[0] + 4)}
    assert bases == {-100, -300}
    assert first == [first[0] - k for k in range(20)] and again == [again[0] - k for k in range(13)]
    assert max(run.f[27:47]) > -5  # 200 kB -> 800 kB was not measured: fixed windows
    # The move's own error: between its runs' means from the move on.
    means = [statistics.fmean(w["f"] for w in r.windows[r.moved_at :]) for r in runs]
    se = measured.mean_f_se(skip=10)
    assert se["800000>200000"] == pytest.approx(statistics.stdev(means) / math.sqrt(3))


def test_eval_offline_reports_each_policy_against_the_oracle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("P4BS_ROUTER_USER", "u")
    monkeypatch.setenv("P4BS_ROUTER_PASSWORD", "p")
    run_dir = sweep_folder(tmp_path / "s", (2, 4, 8, 16, 32, 64), 60)
    argv = ["eval", "offline", str(run_dir), "--policies", "stanford,bloated", "--seeds", "3"]
    assert main([*argv, "--duration", "20", "--warmup", "5"]) == 0
    report = (run_dir / "offline.md").read_text()
    assert "d-hat 50 ms" in report  # the sweep's own SLA, not the config's
    assert "Oracle (best fixed buffer in hindsight): 200 kB (16.0 ms)" in report
    # Stanford's C RTT / sqrt(N) moves to a small buffer where this surface loses much (whole-
    # run f -1.31 here); 800 kB, the largest buffer measured, stands for the 200 ms one (f
    # -0.64): bloated is best of the two.
    assert "| stanford | 3 |" in report and "| bloated | 3 | -0.640" in report
    assert "| bloated | 3 | -0.640 [-0.640, -0.640] | 0.452 " in report
    assert report.count("| best |") == 1 and report.count("| worse |") == 1
    cell = json.loads((run_dir / "offline.json").read_text())["cells"]["flows=50"]
    assert cell["oracle"]["buffer_bytes"] == 200_000
    assert set(cell["policies"]["bloated"]["f_mean"]) == {"1", "2", "3"}
    assert main([*argv, "--policies", "nope"]) == 2
    assert "policy 'nope' unknown" in capsys.readouterr().err
    # The surfaces as one file to commit: the same report from it.
    packed = tmp_path / "sweep.json.gz"
    assert main(["eval", "surfaces", str(run_dir), "--out", str(packed)]) == 0
    argv[2] = str(packed)
    assert main([*argv, "--duration", "20", "--warmup", "5"]) == 0
    again = (tmp_path / "sweep-offline.md").read_text()
    # All but the heading (the source's name) and the last line (the time it took).
    assert again.splitlines()[1:-1] == report.splitlines()[1:-1]
    packed.write_bytes(b"not gzip")
    assert main(argv) == 2 and "not a run folder or a surfaces file" in capsys.readouterr().err


def test_a_raised_buffer_fills_at_the_pace_the_largest_buffers_sawtooth_shows() -> None:
    """At the largest buffer the queue saws between 70% and 90% of it (a loss every fifth
    window, rising 5% of the buffer a window): 4 loss-based flows, K = rise/s x (RTT_min +
    median queue), as the model's N·MSS/C. Raised there from 25 kB, the queue carries over
    and grows as dq/dt = K / (RTT_min + q), without loss, until it reaches the measured
    windows' queue; f follows that queue. Full queues (the other surfaces here) are left as
    measured."""
    rng = random.Random(7)
    top = BUFFERS[-1]
    drain_ns = top * 8e9 / RATE_BPS
    runs = {b: [windows(LINK, b, 60, rng)] for b in BUFFERS[:-1]}
    saw = []
    for i, window in enumerate(windows(LINK, top, 60, rng)):
        queue_ns = round((0.7 + 0.05 * (i % 5)) * drain_ns)
        lost = i % 5 == 0
        saw.append(
            {
                **window,
                "queue_delay_ns": queue_ns,
                "retransmissions": 9 if lost else 0,
                **dict.fromkeys(("long_flows", "rtt_flows"), 4),
            }
        )
    surface = Surface({**runs, top: [saw]})
    rise_s = 0.05 * drain_ns / 1e9 / (WINDOW_NS / 1e9)
    k_s = rise_s * (0.020 + 0.8 * drain_ns / 1e9)
    assert k_s == pytest.approx(4 * 1448 * 8 / RATE_BPS, rel=0.02)  # the model's N·MSS/C
    assert surface.fill_constant_s(WINDOW_NS, 10) == pytest.approx(k_s)
    assert known_surface().fill_constant_s(WINDOW_NS, 10) is None  # queues pinned full
    # The same rise with 50 flows is 8% of what their windows would add: not their sawtooth.
    crowded = [{**w, "long_flows": 50, "rtt_flows": 50} for w in saw]
    assert Surface({**runs, top: [crowded]}).fill_constant_s(WINDOW_NS, 10) is None

    policy = POLICIES["bloated"](LINK, {"delay_ns": "64ms"})
    run = simulate(policy, surface, LINK, CONFIG.metrics, BUFFERS[0], TIMING, seed=1)
    raised = run.buffers.index(top)
    queue_s = BUFFERS[0] * 8 / RATE_BPS  # the 25 kB queue, full, carried over
    filled = raised
    while True:
        end_s = math.sqrt((0.020 + queue_s) ** 2 + 2 * k_s * WINDOW_NS / 1e9) - 0.020
        target_s = saw[filled % len(saw)]["queue_delay_ns"] / 1e9
        if end_s >= target_s:
            break
        mean_ns = (queue_s + end_s) / 2 * 1e9
        assert run.f[filled] == pytest.approx(
            -LINK.weight_delay * mean_ns / LINK.max_queue_delay_ns
        )
        queue_s, filled = end_s, filled + 1
    assert filled - raised >= 3  # seconds of filling, not one window
    assert filled < len(saw)  # still in the measured run's windows, not its repetition
    assert run.f[filled] == pytest.approx(saw[filled % len(saw)]["f"])


def test_a_buffer_lowered_below_its_standing_queue_costs_a_burst_of_loss() -> None:
    """Lowered from 800 kB (its queue full, 64 ms) to 100 kB at 3.5 s: the 700 kB above the new
    limit drain at line rate (56 ms of the window, at their mean of 36 ms) while 1.27 times
    them is lost, in the first window under 100 kB; the next window is 100 kB's as measured.
    Lowered below a buffer the queue does not reach, nothing is lost; nor without the burst
    model (the default)."""
    surface = known_surface()

    def lowered(surface: Surface) -> list[float]:
        policy = POLICIES["static"](LINK, {"buffer": 100_000})
        run = simulate(
            policy, surface, LINK, CONFIG.metrics, 800_000, TIMING, 1, MEASURED_SHRINK_BURST
        )
        assert run.buffers.index(100_000) == 7  # in force from 3.5 s
        return run.f

    f = lowered(surface)
    measured = surface.runs[100_000][0][0]
    lost = 1.27 * 700_000 / 1448
    loss = measured["loss_rate"] + lost / measured["data_packets"]
    delay_ns = (36e6 * 56e6 + 8e6 * (500e6 - 56e6)) / 500e6
    assert f[7] == pytest.approx(
        -(LINK.weight_loss * loss / 0.01 + LINK.weight_delay * delay_ns / 50e6), rel=1e-3
    )
    assert f[7] < f[8] - 5  # loss of 15% in one window
    assert f[8] in {run[8]["f"] for run in surface.runs[100_000]}

    shallow = [[{**w, "queue_delay_ns": 4_000_000} for w in r] for r in surface.runs[800_000]]
    f = lowered(Surface({**surface.runs, 800_000: shallow}))
    assert f[7] in {run[7]["f"] for run in surface.runs[100_000]}
    policy = POLICIES["static"](LINK, {"buffer": 100_000})
    run = simulate(policy, surface, LINK, CONFIG.metrics, 800_000, TIMING, seed=1)
    assert run.f[8] in {r[8]["f"] for r in surface.runs[100_000]}
