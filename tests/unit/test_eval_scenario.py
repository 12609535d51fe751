"""Evaluation scenario files: the sweep's points, the groups at a point, and clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p4bs import paths
from p4bs_eval.cli import SCENARIOS
from p4bs_eval.report import load_results, write_report
from p4bs_eval.runner import ResumeError, describe, folder_policies, pending_runs
from p4bs_eval.scenario import EvalScenario, ScenarioError, load_scenario, parse_scenario

BASE = {"groups": [{"flows": 10, "cca": "cubic", "rtt": "20ms"}], "policies": ["globecom"]}


def test_a_sweep_runs_every_combination_under_every_policy_and_repeat() -> None:
    scenario = parse_scenario(
        {
            **BASE,
            "policies": ["none", "globecom"],
            "repeat": 2,
            "sweep": {"flows": [10, 50], "cca": ["cubic", "bbr"], "rtt": ["20ms", "50ms"]},
        },
        "s",
        "s.toml",
    )
    runs = list(scenario.runs())
    assert len(runs) == 2 * 2 * 2 * 2 * 2
    point = scenario.points()[-1]
    assert point.label == "flows=50,cca=bbr,rtt=50ms"
    (group,) = scenario.groups_at(point)
    assert (group.flows, group.cca, group.rtt_ns) == (50, "bbr", 50_000_000)


def test_a_buffer_sweep_sets_the_initial_buffer_and_leaves_the_groups() -> None:
    scenario = parse_scenario(
        {**BASE, "buffer": "200ms", "sweep": {"buffer": ["2.5ms", "50ms"]}}, "s", "s.toml"
    )
    first, second = scenario.points()
    assert (first.label, second.label) == ("buffer=2.5ms", "buffer=50ms")
    assert (scenario.buffer_ms_at(first), scenario.buffer_ms_at(second)) == (2.5, 50.0)
    assert scenario.groups_at(first) == list(scenario.groups)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"durations": "1s"}, "unknown field"),
        ({"duration": "ten"}, "duration"),
        ({"warmup": "90s"}, "warmup"),
        ({"groups": []}, "no \\[\\[groups\\]\\]"),
        ({"groups": [{"flows": 0}]}, "groups\\[0\\].flows"),
        ({"groups": [{"flows": 5, "cca": "vegas"}]}, "groups\\[0\\].cca"),
        ({"policies": ["stanfrod"]}, "policy 'stanfrod' unknown"),
        ({"sweep": {"duration": ["1s"]}}, "sweep.duration"),
        ({"sweep": {"buffer": ["-1ms"]}}, "sweep.buffer"),
        ({"sweep": {"flows": []}}, "sweep.flows"),
        ({"reports": ["pie"]}, "report 'pie'"),
        ({"short_flows": {"rate": 5}}, "short_flows"),
        ({"link": {"buffer": {"max": "1s"}}}, "link: only sla, weights"),
        ({"link": {"sla": "10ms"}}, "link: a table of tables"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_field(change: dict[str, object], named: str) -> None:
    with pytest.raises(ScenarioError, match=named):
        parse_scenario({**BASE, **change}, "s", "s.toml")


def test_the_shipped_scenarios_parse() -> None:
    names = sorted(path.stem for path in SCENARIOS.glob("*.toml"))
    assert {"globecom-test1", "gomez-jenks", "p4bs-fig11", "p4bs-fig14", "p4bs-fig17"} <= set(names)
    for path in SCENARIOS.glob("*.toml"):
        assert load_scenario(path).points()


def test_an_unreadable_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("duration = \n")
    with pytest.raises(ScenarioError, match=r"broken\.toml"):
        load_scenario(path)


def test_eval_run_refuses_before_any_run_without_router_credentials(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "P4BS_ROUTER_USER"}
    argv = [sys.executable, "-m", "p4bs_cli", "eval", "run", "globecom-test1"]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "P4BS_ROUTER_USER is not set" in done.stderr
    assert not (tmp_path / "run").exists()


def test_eval_run_refuses_before_any_run_what_its_registration_would_refuse(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "P4BS_ROUTER_USER": "u", "P4BS_ROUTER_PASSWORD": "p"}
    registration = paths.home() / "eval" / "registrations" / "dyn-suite-1-r3.json"
    argv = [sys.executable, "-m", "p4bs_cli", "eval", "run", "globecom-test1"]
    done = subprocess.run(
        [*argv, "--registration", str(registration), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # were the check gone, the runs would start
    )
    assert done.returncode == 2
    assert "does not name scenario 'globecom-test1'" in done.stderr
    assert not (tmp_path / "run").exists()


def test_eval_run_refuses_before_any_run_when_the_scenarios_sla_is_invalid(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "bad-sla.toml"
    scenario.write_text(
        'policies = ["p4bs"]\n[link]\nsla = { max_queue_delay = "-5ms", max_loss = 0.01 }\n'
        "[[groups]]\nflows = 5\n"
    )
    env = {**os.environ, "P4BS_ROUTER_USER": "u", "P4BS_ROUTER_PASSWORD": "p"}
    argv = [sys.executable, "-m", "p4bs_cli", "eval", "run", str(scenario)]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "scenario's [link]" in done.stderr and "max_queue_delay" in done.stderr
    assert not (tmp_path / "run").exists()


def _run_folder(out: Path, scenario: EvalScenario, rows: list[dict[str, object]]) -> None:
    out.mkdir()
    (out / "scenario.json").write_text(json.dumps(describe(scenario, scenario.policies)))
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(point: str, policy: str, repeat: int, **figures: object) -> dict[str, object]:
    """A row as the runner writes it: `run_dir` names its raw folder, absent in these tests."""
    where = f"runs/{point.replace(',', '_').replace('=', '-')}/{policy}/r{repeat}"
    return {"point": point, "policy": policy, "repeat": repeat, "run_dir": where, **figures}


def test_a_resume_runs_only_what_the_folder_has_not_finished(tmp_path: Path) -> None:
    scenario = parse_scenario(
        {**BASE, "policies": ["none", "globecom"], "sweep": {"flows": [10, 50]}}, "s", "s.toml"
    )
    out = tmp_path / "run"
    rows = [
        _row("flows=10", "none", 1, f_mean=-1.0),
        _row("flows=10", "globecom", 1, error="TestbedError: boom"),
        _row("flows=50", "none", 1, f_mean=-2.0),
        _row("flows=10", "globecom", 1, error="TestbedError: again"),
    ]
    _run_folder(out, scenario, rows)
    todo = pending_runs(scenario, out, None, resume=True)
    assert [(p.label, policy, r) for p, policy, r in todo] == [
        ("flows=10", "globecom", 1),
        ("flows=50", "globecom", 1),
    ]
    # More repeats on resume: only the new ones and what had not finished.
    more = dataclasses.replace(scenario, repeat=2)
    assert len(pending_runs(more, out, None, resume=True)) == 2 + 4
    assert len(pending_runs(scenario, out, None, resume=False)) == 4
    # A policy added on resume: its runs, beside what had not finished.
    added = pending_runs(scenario, out, ("none", "globecom", "bdp"), resume=True)
    assert [(p.label, policy) for p, policy, _ in added] == [
        ("flows=10", "globecom"),
        ("flows=10", "bdp"),
        ("flows=50", "globecom"),
        ("flows=50", "bdp"),
    ]
    with pytest.raises(ResumeError, match=r"policies \['globecom'\] there"):
        pending_runs(scenario, out, ("none",), resume=True)
    # Without --policies, a resume completes the policies the folder was made for, not
    # every policy the scenario names.
    few = tmp_path / "few"
    few.mkdir()
    (few / "scenario.json").write_text(json.dumps(describe(scenario, ("globecom",))))
    assert folder_policies(few) == ("globecom",) and folder_policies(out) == ("none", "globecom")
    assert folder_policies(tmp_path / "elsewhere") is None


def test_a_resume_refuses_a_folder_of_another_scenario(tmp_path: Path) -> None:
    scenario = parse_scenario({**BASE, "sweep": {"flows": [10, 50]}}, "s", "s.toml")
    out = tmp_path / "run"
    _run_folder(out, scenario, [])
    longer = dataclasses.replace(scenario, duration_s=120.0)
    with pytest.raises(ResumeError, match=r"duration_s: 60\.0 there, 120\.0 now"):
        pending_runs(longer, out, None, resume=True)
    with pytest.raises(ResumeError, match=r"no scenario\.json and results\.jsonl"):
        pending_runs(scenario, tmp_path / "empty", None, resume=True)


def test_a_run_done_again_replaces_its_earlier_row_in_the_report(tmp_path: Path) -> None:
    scenario = parse_scenario({**BASE, "policies": ["none", "globecom"]}, "s", "s.toml")
    out = tmp_path / "run"
    rows = [
        _row("base", "none", 1, f_mean=-1.0),
        _row("base", "globecom", 1, error="TestbedError: boom"),
        _row("base", "globecom", 1, f_mean=-0.5),
    ]
    _run_folder(out, scenario, rows)
    _, loaded = load_results(out)
    assert loaded == [rows[0], rows[2]]
    report = write_report(out).read_text()
    assert "failed" not in report and "| base | globecom | 1 |" in report


def test_eval_run_resume_refuses_fewer_policies_than_the_folder_has(tmp_path: Path) -> None:
    """`--policies p4bs --resume RUN_DIR` on a folder of two policies: refused before any run
    (it once went on, silently, with the folder's policies)."""
    scenario_file = tmp_path / "two.toml"
    scenario_file.write_text(
        'policies = ["none", "globecom"]\n[[groups]]\nflows = 10\ncca = "cubic"\nrtt = "20ms"\n'
    )
    out = tmp_path / "run"
    _run_folder(out, load_scenario(scenario_file), [_row("base", "none", 1, f_mean=-1.0)])
    env = {**os.environ, "P4BS_ROUTER_USER": "u", "P4BS_ROUTER_PASSWORD": "p"}
    argv = [sys.executable, "-m", "p4bs_cli", "eval", "run", str(scenario_file)]
    done = subprocess.run(
        [*argv, "--policies", "globecom", "--resume", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "policies ['none'] there" in done.stderr
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    assert not (out / "stack").exists()


def test_eval_run_refuses_resume_with_out(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "p4bs_cli", "eval", "run", "globecom-test1"]
    argv += ["--resume", str(tmp_path), "--out", str(tmp_path / "x")]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 2 and "give no --out" in done.stderr


def test_the_report_compares_policies_paired_once_there_are_repeats(tmp_path: Path) -> None:
    scenario = parse_scenario({**BASE, "policies": ["bdp", "p4bs"], "repeat": 3}, "s", "s.toml")
    f = {"bdp": (-1.5, -1.1, -1.8), "p4bs": (-1.2, -0.9, -1.5)}  # p4bs 0.3/0.2/0.3 higher
    rows = [
        _row("base", policy, r + 1, f_mean=values[r], rtt_mean_ms=50.0 + r)
        for policy, values in f.items()
        for r in range(3)
    ]
    _run_folder(tmp_path / "run", scenario, rows)
    report = write_report(tmp_path / "run").read_text()
    assert "## Paired comparisons" in report
    assert "base, mean f (p4bs) (higher is better):" in report
    assert "| p4bs | 3 | -1.200 [" in report and "| bdp | +0.267 [+0." in report
    assert report.count("| best |") == 1 and report.count("| worse |") == 1
    # Equal RTTs in every repeat: a zero difference, equivalent both ways (issue 39; no
    # longer "tied", which any wide interval was).
    assert "base, mean RTT, ms (lower is better):" in report
    assert report.count("| equivalent |") == 2
    one = tmp_path / "one"
    _run_folder(one, scenario, [r for r in rows if r["repeat"] == 1])
    alone = write_report(one).read_text()
    assert "Paired" not in alone
    assert (
        "- base: p4bs's mean f -1.200 is at or above the best other policy's, bdp -1.500" in alone
    )
