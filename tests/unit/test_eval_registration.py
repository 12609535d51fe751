"""Pre-registration (eval/p4bs_eval/registration.py, issue 39): `p4bs eval register` records
the commit, the policy code's tree and the scenario files in a git repository made here (not
the project's), refuses uncommitted policy code, and `p4bs eval claims --registration` refuses
the rows made at another policy tree."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from p4bs_cli.main import main
from p4bs_eval.claims import build
from p4bs_eval.registration import (
    Registration,
    RegistrationError,
    load_plan,
    load_registration,
    refusals_before_running,
    register,
    screen_rows,
)

SCENARIO = """title = "N 10 -> 100 -> 10"
duration = "60s"
warmup = "10s"
buffer = "200ms"
policies = ["loss-delay-fit", "bdp"]
repeat = 10

[[groups]]
flows = 10
cca = "cubic"
rtt = "20ms"
"""
PLAN = """policies = ["loss-delay-fit", "bdp"]
repeats = 10
margin = 0.02
alpha = 0.05
"""


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with policy code, a scenario and a plan, all committed."""
    root = tmp_path / "repo"
    policies = root / "optimizer" / "p4bs_optimizer" / "policies"
    policies.mkdir(parents=True)
    (policies / "fit.py").write_text("CLOSE_ENOUGH = 0.01\n")
    (root / "eval" / "scenarios").mkdir(parents=True)
    (root / "eval" / "scenarios" / "dyn.toml").write_text(SCENARIO)
    (root / "eval" / "suite.toml").write_text(PLAN)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "suite")
    return root


def _register(repo: Path) -> Path:
    return register(
        [repo / "eval" / "scenarios" / "dyn.toml"],
        repo / "eval" / "suite.toml",
        repo,
        repo / "eval" / "registrations",
    )


# --- issue 39: pre-registration ------------------------------------------------------------


def test_register_records_the_commit_the_policy_tree_and_the_files(repo: Path) -> None:
    out = _register(repo)
    assert out == repo / "eval" / "registrations" / "suite.json"
    data = json.loads(out.read_text())
    assert data["code_commit"] == _git(repo, "rev-parse", "HEAD")
    assert data["policy_tree"] == _git(repo, "rev-parse", "HEAD:optimizer/p4bs_optimizer/policies")
    (scenario,) = data["scenarios"]
    assert (scenario["name"], scenario["path"]) == ("dyn", "eval/scenarios/dyn.toml")
    scenario_bytes = (repo / "eval" / "scenarios" / "dyn.toml").read_bytes()
    assert scenario["sha256"] == hashlib.sha256(scenario_bytes).hexdigest()
    assert scenario["described"]["duration_s"] == 60.0
    assert data["plan"] == {
        "name": "suite",
        "policies": ["loss-delay-fit", "bdp"],
        "metric": "f_mean",
        "repeats": 10,
        "margin": 0.02,
        "alpha": 0.05,
        "holm_family": "suite",
        "tuned_on": [],
    }
    with pytest.raises(RegistrationError, match="never rewritten"):
        _register(repo)


def test_register_refuses_a_dirty_policy_tree(repo: Path) -> None:
    policy = repo / "optimizer" / "p4bs_optimizer" / "policies" / "fit.py"
    policy.write_text("CLOSE_ENOUGH = 0.02\n")
    with pytest.raises(RegistrationError, match=r"uncommitted changes.*policies/fit\.py"):
        _register(repo)
    policy.write_text("CLOSE_ENOUGH = 0.01\n")  # as committed again
    (policy.parent / "new.py").write_text("")  # an untracked policy file counts too
    with pytest.raises(RegistrationError, match=r"policies/new\.py"):
        _register(repo)
    assert not (repo / "eval" / "registrations").exists()


def test_register_refuses_an_unknown_policy(repo: Path) -> None:
    (repo / "eval" / "suite.toml").write_text(PLAN.replace('"bdp"', '"bdpp"'))
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "typo")
    with pytest.raises(RegistrationError, match="policy 'bdpp' unknown"):
        _register(repo)


def test_the_command_refuses_an_uncommitted_scenario(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("P4BS_HOME", str(repo))
    (repo / "eval" / "scenarios" / "dyn.toml").write_text(SCENARIO.replace("60s", "90s"))
    args = ["eval", "register", str(repo / "eval" / "scenarios" / "dyn.toml")]
    args += ["--plan", str(repo / "eval" / "suite.toml"), "--out-dir", str(repo / "out")]
    assert main(args) == 2
    assert "eval/scenarios/dyn.toml" in capsys.readouterr().err
    assert not (repo / "out").exists()
    (repo / "eval" / "scenarios" / "dyn.toml").write_text(SCENARIO)  # as committed
    assert main(args[:-2]) == 0  # the default folder: the checkout's (P4BS_HOME)
    assert (repo / "eval" / "registrations" / "suite.json").exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("policies = []", "non-empty"),
        ('policies = ["bdp"]\nrepeats = 3', "at least 10"),
        ('policies = ["bdp"]\nmargin = 2.0', "margin"),
        ('policies = ["bdp"]\nmetric = "rtt"', "metric"),
        ('policies = ["bdp"]\nfamily = "x"', "unknown keys"),
        ('policies = ["bdp"]\ntuned_on = "dyn"', "tuned_on must be a list"),
    ],
)
def test_a_plan_names_its_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    with pytest.raises(RegistrationError, match=problem):
        load_plan(path)


def _rows(registration: Registration) -> list[dict[str, Any]]:
    """Ten repeats of both policies, made at the registration's commit and policy tree."""
    f = {"loss-delay-fit": -1.0, "bdp": -1.3}
    return [
        {
            "point": "base",
            "policy": policy,
            "repeat": r,
            "seed": r,
            "f_mean": value + 0.01 * (r % 3),
            "code_commit": registration.code_commit,
            "policy_tree": registration.policy_tree,
            "policy_code_dirty": False,
        }
        for r in range(1, 11)
        for policy, value in f.items()
    ]


def test_claims_refuse_rows_of_another_policy_tree(repo: Path, tmp_path: Path) -> None:
    registration = load_registration(_register(repo))
    described = registration.scenarios["dyn"]["described"]
    results = tmp_path / "results"
    folder = results / "dyn"
    folder.mkdir(parents=True)
    (folder / "scenario.json").write_text(json.dumps(described))
    rows = _rows(registration)
    for row in rows[:4]:  # repeats 1 and 2 at other policy code
        row["policy_tree"] = "0" * 40
    rows[4]["policy_code_dirty"] = True  # repeat 3's loss-delay-fit with uncommitted code
    del rows[6]["policy_tree"]  # repeat 4's from before the code fields
    rows[8]["code_commit"] = "f" * 40  # repeat 5's at a commit this repository lacks
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = build(results, repo, [registration])
    assert data["registrations"][0]["policy_tree"] == registration.policy_tree
    reasons = [(f["policy"], f["repeat"], f["reason"]) for f in data["flagged"]]
    assert len(reasons) == 7
    assert reasons[0] == (
        "loss-delay-fit",
        1,
        f"policy_tree {'0' * 40}, registered {registration.policy_tree}",
    )
    assert "uncommitted" in reasons[4][2] and "no policy_tree" in reasons[5][2]
    assert reasons[6][1:] == (5, f"code_commit {'f' * 40} unknown to this repository")
    (ours,) = [c for c in data["claims"] if c["claim"] == "ours-best-or-equivalent"]
    assert ours["n"] == 5 and ours["registered"] is True  # repeats 6-10 only
    assert ours["planned_repeats"] == 10  # fewer than the plan's: said so
    # The same rows without the registration: all used, unregistered.
    (plain,) = [
        c for c in build(results, tmp_path)["claims"] if c["claim"] == "ours-best-or-equivalent"
    ]
    assert plain["n"] == 10 and plain["registered"] is False


def test_a_folder_of_another_scenario_file_is_refused_whole(repo: Path) -> None:
    registration = load_registration(_register(repo))
    described = dict(registration.scenarios["dyn"]["described"])
    rows = _rows(registration)
    used, flagged = screen_rows("x", described | {"repeat": 20}, rows, registration, repo)
    assert (len(used), flagged) == (20, [])  # more repeats: the same scenario
    used, flagged = screen_rows("x", described | {"duration_s": 90.0}, rows, registration, repo)
    assert (
        used == []
        and "differs from the registered eval/scenarios/dyn.toml in duration_s"
        in flagged[0]["reason"]
    )
    other = described | {"name": "other"}
    assert screen_rows("x", other, rows, registration, repo) == (rows, [])  # unregistered: all used


def test_before_the_runs_start_what_the_registration_would_refuse_is_told(repo: Path) -> None:
    registration = load_registration(_register(repo))
    described = dict(registration.scenarios["dyn"]["described"])
    head = {
        "code_commit": _git(repo, "rev-parse", "HEAD"),
        "policy_tree": registration.policy_tree,
        "policy_code_dirty": False,
    }
    assert refusals_before_running(registration, described | {"repeat": 20}, head, repo) == []
    assert refusals_before_running(
        registration, described | {"policies": ["bdp", "fixed:4ms", "red"]}, head, repo
    ) == ["policy 'red' is not in the plan"]
    assert refusals_before_running(
        registration, described, head | {"policy_code_dirty": True}, repo
    ) == ["made with uncommitted changes to the policy code"]
    assert refusals_before_running(registration, described, head | {"policy_tree": "0" * 40}, repo)
    (changed,) = refusals_before_running(registration, described | {"warmup_s": 5.0}, head, repo)
    assert "differs from the registered eval/scenarios/dyn.toml in warmup_s" in changed
    (other,) = refusals_before_running(registration, described | {"name": "x"}, head, repo)
    assert other == "it does not name scenario 'x' (it names dyn)"


def _results_folder(results: Path, described: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    folder = results / described["name"]
    folder.mkdir(parents=True)
    (folder / "scenario.json").write_text(json.dumps(described))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_claims_read_several_registrations_each_scenario_by_its_own(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two suites registered at different times: each folder's rows screened by the
    registration naming its scenario, at that plan's margin; one scenario in two, or two
    alphas, cannot be read into one claims.json."""
    first = _register(repo)
    (repo / "eval" / "scenarios" / "dyn2.toml").write_text(SCENARIO.replace("60s", "90s"))
    (repo / "eval" / "suite2.toml").write_text(PLAN.replace("0.02", "0.05"))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "suite 2")
    second = register(
        [repo / "eval" / "scenarios" / "dyn2.toml"],
        repo / "eval" / "suite2.toml",
        repo,
        repo / "eval" / "registrations",
    )
    one, two = load_registration(first), load_registration(second)
    results = tmp_path / "results"
    _results_folder(results, dict(one.scenarios["dyn"]["described"]), _rows(one))
    rows = _rows(two)
    rows[0]["code_commit"] = one.code_commit  # suite 2's repeat 1 made before it was registered
    _results_folder(results, dict(two.scenarios["dyn2"]["described"]), rows)
    monkeypatch.setenv("P4BS_HOME", str(repo))
    out = tmp_path / "claims.json"
    args = ["eval", "claims", "--results", str(results), "--out", str(out)]
    assert main([*args, "--registration", str(first), "--registration", str(second)]) == 0
    data = json.loads(out.read_text())
    assert [r["name"] for r in data["registrations"]] == ["suite", "suite2"]
    assert data["registrations"][1]["file"] == "eval/registrations/suite2.json"
    ours = {  # by folder
        c["source"].split("/")[-2]: c
        for c in data["claims"]
        if c["claim"] == "ours-best-or-equivalent"
    }
    assert (ours["dyn"]["n"], ours["dyn2"]["n"]) == (10, 9)  # suite 2's repeat 1 refused
    assert ours["dyn"]["registered"] and ours["dyn2"]["registered"]
    margins = [ours[name]["margin"] / abs(ours[name]["rival_mean"]) for name in ("dyn", "dyn2")]
    assert margins == pytest.approx([0.02, 0.05])
    (refused,) = data["flagged"]
    assert refused["source"].split("/")[-2] == "dyn2" and refused["repeat"] == 1
    assert refused["reason"].startswith(f"made at {one.code_commit[:12]}, before the registration")
    assert main([*args, "--registration", str(first), "--registration", str(first)]) == 2
    with pytest.raises(RegistrationError, match="'dyn' is registered in both"):
        build(results, tmp_path, [one, one])
    stricter = dataclasses.replace(two, plan=dataclasses.replace(two.plan, alpha=0.01))
    with pytest.raises(RegistrationError, match="alphas differ"):
        build(results, tmp_path, [one, stricter])


def test_a_scenario_the_policy_was_tuned_on_gives_verdicts_apart(
    repo: Path, tmp_path: Path
) -> None:
    """A plan's `tuned_on` names registered scenarios whose earlier runs the policy was
    changed after: their target claims are marked, counted apart and leave the `target`
    Holm family; a name the registration does not hold is refused."""
    (repo / "eval" / "suite.toml").write_text(PLAN + 'tuned_on = ["dyn"]\n')
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "tuned")
    registration = load_registration(_register(repo))
    assert registration.plan.tuned_on == ("dyn",)
    results = tmp_path / "results"
    _results_folder(results, dict(registration.scenarios["dyn"]["described"]), _rows(registration))
    data = build(results, repo, [registration])
    (ours,) = [c for c in data["claims"] if c["claim"] == "ours-best-or-equivalent"]
    assert ours["tuned_on"] is True and ours["family"] == "tuned" and ours["registered"]
    assert "ours-best-or-equivalent (tuned on)" in data["summary"]
    assert "ours-best-or-equivalent" not in data["summary"]
    assert "target" not in data["holm_families"]
    (repo / "eval" / "suite.toml").write_text(PLAN + 'name = "other"\ntuned_on = ["elsewhere"]\n')
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "unknown")
    with pytest.raises(RegistrationError, match=r"tuned_on names scenarios not registered"):
        _register(repo)
