"""Issue 39's dynamic scenarios: groups that stop, [[phases]] with short-flow rates, the
oracle's fixed-buffer policies, repeats interleaved (and resumed so), the per-phase figures
and FCT summary of a run's row, its code identity, and the traffic schedules the generator
builds (no live traffic)."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from p4bs_eval.phases import fct_summary, phase_figures, short_flows_record
from p4bs_eval.report import pooled_fcts
from p4bs_eval.runner import (
    POLICY_CODE,
    RunSetup,
    code_identity,
    describe,
    pending_runs,
    run_setup,
)
from p4bs_eval.scenario import (
    ScenarioError,
    check_policies,
    fixed_buffer_ms,
    fixed_policy,
    parse_scenario,
)
from p4bs_infra.testbed import Aqm, SenderGroup
from p4bs_infra.traffic import long_flow_schedule
from p4bs_infra.trafficgen import SIZE_CDFS, short_flow_schedule, size_from_cdf

DYNAMIC: dict[str, Any] = {
    "duration": "120s",
    "warmup": "5s",
    "settle": "5s",
    "policies": ["loss-delay-fit", "bdp"],
    "oracle_buffers": ["5ms", "12.5ms", "200ms"],
    "groups": [
        {"name": "base", "flows": 10},
        {"name": "more", "flows": 90, "start": "40s", "stop": "80s"},
    ],
    "short_flows": {"rate_per_s": 2.0},
    "phases": [
        {"name": "n10", "start": "0s"},
        {"name": "n100", "start": "40s", "short_flows_rate_per_s": 0},
        {"name": "n10-again", "start": "80s", "short_flows_rate_per_s": 5},
    ],
}


def _parse(data: dict[str, Any]) -> Any:
    return parse_scenario(data, "dyn", "dyn.toml")


def test_stops_phases_and_oracle_buffers_are_read() -> None:
    scenario = _parse(DYNAMIC)
    base, more = scenario.groups
    assert (base.stop_ns, more.start_ns, more.stop_ns) == (None, 40 * 10**9, 80 * 10**9)
    spans = [(s.name, s.start_s, s.end_s) for s in scenario.phase_spans()]
    assert spans == [("n10", 0.0, 40.0), ("n100", 40.0, 80.0), ("n10-again", 80.0, 120.0)]
    assert scenario.short_flow_rate_changes() == ((40.0, 0.0), (80.0, 5.0))
    assert scenario.settle_s == 5.0
    # The oracle's fixed buffers are policies of their own, after the scenario's.
    assert scenario.policies == (
        "loss-delay-fit", "bdp", "fixed:5ms", "fixed:12.5ms", "fixed:200ms",
    )  # fmt: skip
    # A sweep keeps a group's stop.
    swept = _parse({**DYNAMIC, "sweep": {"cca": ["cubic", "bbr"]}})
    assert [g.stop_ns for g in swept.groups_at(swept.points()[1])] == [None, 80 * 10**9]


def test_a_scenario_without_phases_has_one_from_the_warmup_to_the_end() -> None:
    data = {k: v for k, v in DYNAMIC.items() if k not in ("phases", "settle")}
    spans = _parse(data).phase_spans()
    assert [(s.name, s.start_s, s.end_s) for s in spans] == [("all", 5.0, 120.0)]


def _phase(name: str, start: str) -> dict[str, str]:
    return {"name": name, "start": start}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"phases": [_phase("a", "50s"), _phase("b", "40s")]}, "phases[1].start"),
        ({"phases": [_phase("a", "0s"), _phase("b", "0s")]}, "phases[1].start"),
        ({"phases": [_phase("a", "120s")]}, "phases[0].start"),
        ({"phases": [_phase("a", "0s"), _phase("a", "9s")]}, "phases[1].name"),
        ({"phases": [{"start": "0s"}]}, "phases[0].name"),
        ({"phases": [{"name": "a"}]}, "phases[0].start"),
        ({"phases": [{"name": "a", "start": "0s", "rate": 3}]}, "phases[0]: unknown field"),
        ({"phases": [{"name": "a", "start": "0s", "short_flows_rate_per_s": -1}]},
         "phases[0].short_flows_rate_per_s"),
        ({"phases": "n10"}, "phases: a list"),
        ({"groups": [{"name": "g", "flows": 5, "start": "40s", "stop": "30s"}]}, "groups[0].stop"),
        ({"groups": [{"name": "g", "flows": 5, "start": "40s", "stop": "40s"}]}, "groups[0].stop"),
        ({"groups": [{"name": "g", "flows": 5, "stop": "121s"}]}, "groups[0].stop"),
        ({"groups": [{"name": "g", "flows": 5, "start": "120s"}]}, "groups[0].start"),
        ({"groups": [{"name": "g", "flows": 5}, {"name": "g", "flows": 5}]}, "groups: names"),
        ({"settle": "40s"}, "settle"),
        ({"oracle_buffers": ["5ms", "5ms"]}, "oracle_buffers: fixed:5ms listed twice"),
        ({"oracle_buffers": ["0ms"]}, "oracle_buffers[0]"),
        ({"oracle_buffers": "5ms"}, "oracle_buffers: a list"),
        ({"short_flows": {"rate_per_s": 1, "sizes": "caida"}}, "short_flows.sizes"),
        ({"short_flows": {"rate_per_s": -2}}, "short_flows.rate_per_s"),
    ],
)  # fmt: skip
def test_bad_phases_stops_and_oracles_are_refused_naming_file_and_field(
    change: dict[str, Any], named: str
) -> None:
    with pytest.raises(ScenarioError, match=r"^dyn\.toml: ") as refused:
        _parse({**DYNAMIC, **change})
    assert named in str(refused.value)


def test_a_phase_rate_needs_short_flows() -> None:
    data = {k: v for k, v in DYNAMIC.items() if k != "short_flows"}
    with pytest.raises(ScenarioError, match=r"phases\[1\].short_flows_rate_per_s: needs"):
        _parse(data)


def test_repeats_interleave_and_a_resume_keeps_that_order(tmp_path: Path) -> None:
    scenario = _parse({**DYNAMIC, "repeat": 3, "sweep": {"flows": [10, 20]}})
    runs = [(p.label, policy, r) for p, policy, r in scenario.runs()]
    per_repeat = 2 * 5
    assert len(runs) == 3 * per_repeat
    # Repeat r of every point and policy, oracle's included, before repeat r + 1.
    assert [r for _, _, r in runs] == [1] * per_repeat + [2] * per_repeat + [3] * per_repeat
    assert runs[:per_repeat] == [
        (point, policy, 1) for point in ("flows=10", "flows=20") for policy in scenario.policies
    ]
    # A folder stopped part-way through repeat 2 resumes in the same interleaved order.
    out = tmp_path / "run"
    out.mkdir()
    (out / "scenario.json").write_text(json.dumps(describe(scenario, scenario.policies)))
    done = runs[: per_repeat + 3]
    rows = [{"point": p, "policy": policy, "repeat": r} for p, policy, r in done]
    (out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    todo = [(p.label, policy, r) for p, policy, r in pending_runs(scenario, out, None, resume=True)]
    assert todo == runs[per_repeat + 3 :]


def test_a_resume_refuses_a_folder_whose_phases_changed(tmp_path: Path) -> None:
    scenario = _parse(DYNAMIC)
    out = tmp_path / "run"
    out.mkdir()
    (out / "scenario.json").write_text(json.dumps(describe(scenario, scenario.policies)))
    (out / "results.jsonl").write_text("")
    phases = [*DYNAMIC["phases"][:2], {"name": "n10-again", "start": "90s"}]
    moved = _parse({**DYNAMIC, "phases": phases})
    with pytest.raises(ValueError, match="phases"):
        pending_runs(moved, out, None, resume=True)


def test_the_oracle_policies_run_without_an_optimizer_at_their_buffer() -> None:
    scenario = _parse(DYNAMIC)
    point = scenario.points()[0]
    assert run_setup(scenario, point, "fixed:12.5ms") == RunSetup(False, 12.5)
    assert run_setup(scenario, point, "none") == RunSetup(False, 200.0)
    assert run_setup(scenario, point, "loss-delay-fit") == RunSetup(True, 200.0)
    assert fixed_policy(12.5) == "fixed:12.5ms" and fixed_buffer_ms("fixed:12.5ms") == 12.5
    assert fixed_buffer_ms("fixed:0ms") is None and fixed_buffer_ms("fixed:xms") is None
    check_policies(("fixed:7.5ms", "none", "p4bs", "red", "codel"), "--policies")
    with pytest.raises(ScenarioError, match=r"'fixed:7\.5'"):
        check_policies(("fixed:7.5",), "--policies")


def test_the_aqm_baselines_run_without_an_optimizer_on_the_initial_buffer() -> None:
    scenario = _parse({**DYNAMIC, "policies": ["red", "codel", "bdp"], "buffer": "100ms"})
    point = scenario.points()[0]
    assert run_setup(scenario, point, "red") == RunSetup(False, 100.0, Aqm(kind="red"))
    assert run_setup(scenario, point, "codel") == RunSetup(False, 100.0, Aqm(kind="codel"))
    assert run_setup(scenario, point, "bdp") == RunSetup(True, 100.0)


def _window(start_s: float, f: float, srtt_ms: float, utilisation: float) -> dict[str, Any]:
    start = T0 + round(start_s * 1e9)
    return {
        "window_start_ns": start,
        "window_end_ns": start + 500_000_000,
        "f": f,
        "srtt_ns": round(srtt_ms * 1e6),
        "utilisation": utilisation,
    }


T0 = 1_700_000_000 * 10**9


def test_phase_figures_count_each_window_in_its_phase_after_the_settling() -> None:
    spans = _parse(DYNAMIC).phase_spans()
    windows = [
        _window(2.0, -9.0, 99.0, 0.1),  # n10's first 5 s: settling, left out
        _window(10.0, -1.0, 30.0, 0.9),
        _window(39.5, -3.0, 50.0, 0.7),  # starts in n10, ends in n100
        _window(41.0, -50.0, 300.0, 0.2),  # n100 settling
        _window(45.0, -2.0, 40.0, 1.0),
        _window(120.0, -7.0, 10.0, 0.5),  # after the run
    ]
    n10, n100, again = phase_figures(spans, 5.0, windows, T0)
    assert (n10["name"], n10["start_s"], n10["end_s"], n10["windows"]) == ("n10", 0.0, 40.0, 2)
    assert (n10["f_mean"], n10["rtt_mean_ms"], n10["utilisation"]) == (-2.0, 40.0, 0.8)
    assert (n100["windows"], n100["f_mean"], n100["rtt_mean_ms"]) == (1, -2.0, 40.0)
    assert again == {
        "name": "n10-again", "start_s": 80.0, "end_s": 120.0, "f_mean": None,
        "windows": 0, "rtt_mean_ms": None, "utilisation": None,
    }  # fmt: skip


def test_the_fct_summary_is_per_phase_and_size_class() -> None:
    spans = _parse(DYNAMIC).phase_spans()

    def flow(start_s: float, size: int, fct_ms: float | None) -> dict[str, Any]:
        ok = fct_ms is not None
        fct = None if fct_ms is None else round(fct_ms * 1e6)
        return {"start_ns": T0 + round(start_s * 1e9), "size_bytes": size, "fct_ns": fct, "ok": ok}

    flows = [flow(1.0, 20_000, 10.0 * k) for k in range(1, 11)]  # n10, small: 10..100 ms
    flows += [flow(39.9, 5_000_000, 900.0), flow(39.0, 5_000_000, None)]  # n10, large
    flows += [flow(85.0, 500_000, 250.0)]  # n10-again, medium
    summary = fct_summary(spans, flows, T0)
    assert list(summary) == ["n10", "n100", "n10-again"]
    small = summary["n10"]["<100kB"]
    assert (small["flows"], small["failed"], small["fct_mean_ms"]) == (10, 0, 55.0)
    assert (small["fct_p10_ms"], small["fct_p50_ms"], small["fct_p99_ms"]) == (10.0, 50.0, 100.0)
    large = summary["n10"][">=1MB"]
    assert (large["flows"], large["failed"], large["fct_p50_ms"]) == (2, 1, 900.0)
    assert summary["n100"] == {}
    assert summary["n10-again"]["100kB-1MB"]["fct_p90_ms"] == 250.0
    assert json.loads(json.dumps(summary)) == summary  # goes into the row as is


def test_the_pooled_fct_table_is_rebuilt_from_the_rows_alone(tmp_path: Path) -> None:
    """Each short flow goes into the row (`short_flows`), so Fig. 14's pooled FCT table comes
    from results.jsonl with the run folders gone: the warm-up's and failed flows left out."""

    def row(repeat: int, fcts_ms: list[float | None]) -> dict[str, Any]:
        flows = [  # one flow in the warm-up (1 s), then one a second from 10 s
            {"start_ns": T0 + round(s * 1e9), "size_bytes": 20_000, "fct_ns": None, "ok": False}
            for s in [1.0] + [10.0 + k for k in range(len(fcts_ms))]
        ]
        for flow, fct in zip(flows, [5.0, *fcts_ms], strict=True):
            if fct is not None:
                flow |= {"fct_ns": round(fct * 1e6), "ok": True}
        record = short_flows_record(list(reversed(flows)), T0)  # kept in start order
        assert record["start_s"][:2] == [1.0, 10.0] and record["fct_ms"][0] == 5.0
        return {
            "point": "base", "policy": "bdp", "repeat": repeat, "run_dir": f"gone/r{repeat}",
            "short_flows_completed": 3, "short_flows": json.loads(json.dumps(record)),
        }  # fmt: skip

    rows = [row(1, [100.0, 300.0, None]), row(2, [200.0, 400.0, 500.0])]
    scenario = {"points": ["base"], "warmup_s": 10.0}
    lines = pooled_fcts(tmp_path, scenario, rows)
    # 5 completed after the warm-up: 100..500 ms; nearest-rank p50 300, p90 and p99 500.
    assert lines[-1] == "| base | bdp | 2 | 5 | 300 | 500 | 500 |"


def test_the_long_flow_schedule_stops_each_group_at_its_stop() -> None:
    def group(name: str, flows: int, start_s: float) -> SenderGroup:
        return SenderGroup(name, "10.201.1.10", flows, "cubic", round(start_s * 1e9), None)

    groups = [group("late", 30, 40.0), group("base", 150, 0.0), group("gone", 5, 10.0)]
    batches = long_flow_schedule(groups, 120.0, {"late": 80.0, "gone": 500.0})
    got = [(b.name, b.port, b.flows, b.start_s, b.stop_s) for b in batches]
    assert got == [
        ("base-0", 5202, 100, 0.0, 120.0),  # a bulk client feeds at most 100 flows
        ("base-1", 5203, 50, 0.0, 120.0),
        ("gone-0", 5204, 5, 10.0, 120.0),  # a stop after the end is the end
        ("late-0", 5201, 30, 40.0, 80.0),
    ]


def _old_client_schedule(seed: int, rate: float, duration: float) -> list[tuple[float, int]]:
    """The fct-client's draws before rate changes existed (the reference)."""
    rng = random.Random(seed)
    flows, at = [], 0.0
    while at < duration:
        flows.append((at, round(15_000 * (2_500_000 / 15_000) ** rng.random())))
        at += rng.expovariate(rate)
    return flows


def test_the_short_flow_schedule_follows_the_phases_rates() -> None:
    # Without changes, the same flows as before: runs made earlier still pair.
    plain = short_flow_schedule(3, 2.0, 60.0, 15_000, 2_500_000)
    assert plain == _old_client_schedule(3, 2.0, 60.0)
    changes = ((40.0, 0.0), (80.0, 20.0), (100.0, 2.0))
    flows = short_flow_schedule(3, 2.0, 120.0, 15_000, 2_500_000, rate_changes=changes)
    assert flows == short_flow_schedule(3, 2.0, 120.0, 15_000, 2_500_000, rate_changes=changes)
    starts = [t for t, _ in flows]
    assert starts == sorted(starts) and starts[-1] < 120.0
    assert not [t for t in starts if 40.0 <= t < 80.0]  # paused
    burst = len([t for t in starts if 80.0 <= t < 100.0])
    calm = len([t for t in starts if t < 40.0])
    assert 300 <= burst <= 500 and 50 <= calm <= 120  # 20/s for 20 s against 2/s for 40 s
    # A run that starts paused has its first flow after the pause.
    late = short_flow_schedule(3, 0.0, 60.0, 15_000, 2_500_000, rate_changes=((30.0, 5.0),))
    assert late and late[0][0] >= 30.0


def test_websearch_sizes_follow_the_published_cdf() -> None:
    cdf = SIZE_CDFS["websearch"]
    assert size_from_cdf(cdf, 0.53) == 80_000 and size_from_cdf(cdf, 1.0) == 30_000_000
    assert size_from_cdf(cdf, 0.65) == 600_000  # halfway from 200 kB (0.6) to 1 MB (0.7)
    flows = short_flow_schedule(1, 50.0, 400.0, 1, 1, sizes="websearch")
    sizes = sorted(size for _, size in flows)
    assert sizes[len(sizes) // 2] == pytest.approx(80_000, rel=0.1)
    assert sum(sizes) / len(sizes) == pytest.approx(1.71e6, rel=0.1)


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True)
    return done.stdout.decode().strip()


def test_a_row_names_the_code_and_the_policy_tree_it_ran(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    policies = repo / POLICY_CODE
    policies.mkdir(parents=True)
    (policies / "rule.py").write_text("X = 1\n")
    (repo / "README.md").write_text("r\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "c")
    identity = code_identity(repo)
    assert identity == {
        "code_commit": _git(repo, "rev-parse", "HEAD"),
        "policy_tree": _git(repo, "rev-parse", f"HEAD:{POLICY_CODE}"),
        "policy_code_dirty": False,
    }
    (repo / "README.md").write_text("elsewhere\n")
    assert code_identity(repo)["policy_code_dirty"] is False
    (policies / "new.py").write_text("Y = 2\n")
    assert code_identity(repo)["policy_code_dirty"] is True
    outside = code_identity(tmp_path / "nothing")
    assert outside == {"code_commit": None, "policy_tree": None, "policy_code_dirty": None}
