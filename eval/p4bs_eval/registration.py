"""Pre-registration (issue 39): `p4bs eval register SCENARIO... --plan PLAN.toml` fixes,
before the first run of a suite, what its verdicts will be made of, in
eval/registrations/<name>.json:

- the commit (HEAD) and the policy code's git tree (`git rev-parse
  HEAD:optimizer/p4bs_optimizer/policies`); refused while that folder, a scenario file or
  the plan has uncommitted changes (a registration names committed code);
- each scenario file's path, sha256 and the scenario.json `p4bs eval run` writes of it;
- the plan (PLAN.toml): the policies compared, the metric, the repeats (at least
  MIN_REPEATS), the equivalence margin (a fraction of |the rival's mean|), alpha and the
  Holm family.

`p4bs eval claims --registration FILE` then uses, of a registered scenario's run folder, only
the rows made at the registered commit or after it (`code_commit`), at the registered policy
tree with no uncommitted policy code, of the plan's
policies (and the fixed:* oracle policies), in a folder whose scenario.json is the
registered one (`screen_rows`); the others are refused and listed as flagged with the reason.
A change to any policy is a new policy tree: every policy runs again, under a new
registration.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from p4bs_eval.scenario import FIXED_PREFIX, ScenarioError, check_policies, load_scenario
from p4bs_eval.stats import ALPHA, MARGIN_FRACTION

POLICY_DIR = "optimizer/p4bs_optimizer/policies"
MIN_REPEATS = 10
METRICS = ("f_mean",)  # what the dynamic claims compare
# "suite": every target verdict of one claims.json in one family (claims.py).
HOLM_FAMILIES = ("suite",)
# scenario.json keys a run may change without leaving the registration: it may run a few
# of the scenario's policies at a time (`--policies`) and more repeats (`--repeat`).
FREE_KEYS = ("policies", "repeat")


class RegistrationError(ValueError):
    """A plan or registration that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class Plan:
    name: str
    policies: tuple[str, ...]
    metric: str = "f_mean"
    repeats: int = MIN_REPEATS
    margin: float = MARGIN_FRACTION
    alpha: float = ALPHA
    holm_family: str = "suite"
    # Scenarios of the registration whose earlier runs the policy was changed after: their
    # verdicts are reported as such (claims.py: `tuned_on`, a Holm family of their own), not
    # as held-out evidence.
    tuned_on: tuple[str, ...] = ()

    def as_data(self) -> dict[str, Any]:
        """The plan as a registration file holds it (lists for the tuples)."""
        return asdict(self) | {"policies": list(self.policies), "tuned_on": list(self.tuned_on)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Plan:
        """A plan from a registration file (one from before `tuned_on` has none)."""
        return cls(
            **{
                **data,
                "policies": tuple(data["policies"]),
                "tuned_on": tuple(data.get("tuned_on", ())),
            }
        )


def load_plan(path: Path) -> Plan:
    """The analysis plan: `policies` (required), `name` (default the file's stem),
    `metric`, `repeats`, `margin`, `alpha`, `holm_family`, `tuned_on` (defaults: Plan's)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RegistrationError(f"{path}: {exc}") from None
    known = set(Plan.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise RegistrationError(f"{path}: unknown keys {unknown}; known: {sorted(known)}")
    policies = data.get("policies")
    if (
        not isinstance(policies, list)
        or not policies
        or not all(isinstance(p, str) and p for p in policies)
    ):
        raise RegistrationError(f"{path}: policies must be a non-empty list of policy names")
    tuned_on = data.get("tuned_on", [])
    if not isinstance(tuned_on, list) or not all(isinstance(n, str) and n for n in tuned_on):
        raise RegistrationError(f"{path}: tuned_on must be a list of scenario names")
    plan = Plan.from_data({**data, "name": data.get("name", path.stem)})
    if plan.metric not in METRICS:
        raise RegistrationError(f"{path}: metric {plan.metric!r}; the claims compare {METRICS}")
    if not isinstance(plan.repeats, int) or plan.repeats < MIN_REPEATS:
        raise RegistrationError(
            f"{path}: repeats {plan.repeats!r}; at least {MIN_REPEATS} paired repeats"
        )
    if not 0 < plan.margin < 1:
        raise RegistrationError(f"{path}: margin {plan.margin!r}: a fraction in (0, 1)")
    if not 0 < plan.alpha < 0.5:
        raise RegistrationError(f"{path}: alpha {plan.alpha!r}: in (0, 0.5)")
    if plan.holm_family not in HOLM_FAMILIES:
        raise RegistrationError(f"{path}: holm_family {plan.holm_family!r}; known: {HOLM_FAMILIES}")
    return plan


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        )
    except subprocess.CalledProcessError as exc:
        raise RegistrationError(f"git {' '.join(args)} in {repo}: {exc.stderr.strip()}") from None
    return done.stdout.strip()


def _in_repo(path: Path, repo: Path) -> str:
    resolved = path.resolve()
    if not resolved.is_relative_to(repo.resolve()):
        raise RegistrationError(f"{path} is outside the repository {repo}: commit it there")
    return str(resolved.relative_to(repo.resolve()))


def register(scenario_paths: Sequence[Path], plan_path: Path, repo: Path, out_dir: Path) -> Path:
    """Writes out_dir/<plan name>.json; refuses uncommitted policy code, scenario files or
    plan, an unknown policy in the plan, and an existing registration of the name."""
    from p4bs_eval.runner import describe  # the testbed and the loop: only when registering

    plan = load_plan(plan_path)
    try:  # the runs take the plan's policies (`p4bs eval run --policies`), not the files'
        check_policies(plan.policies, f"{plan_path}: policies")
    except ScenarioError as exc:
        raise RegistrationError(str(exc)) from None
    files = [_in_repo(p, repo) for p in (*scenario_paths, plan_path)]
    dirty = _git(repo, "status", "--porcelain", "--", POLICY_DIR, *files)
    if dirty:
        raise RegistrationError(
            "uncommitted changes (a registration names committed code and files): "
            + "; ".join(dirty.splitlines())
        )
    scenarios = []
    for path, shown in zip(scenario_paths, files, strict=False):
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:
            raise RegistrationError(str(exc)) from None
        scenarios.append(
            {
                "name": scenario.name,
                "path": shown,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "described": describe(scenario, scenario.policies),
            }
        )
    unknown = sorted(set(plan.tuned_on) - {s["name"] for s in scenarios})
    if unknown:
        raise RegistrationError(f"{plan_path}: tuned_on names scenarios not registered: {unknown}")
    out = out_dir / f"{plan.name}.json"
    if out.exists():
        raise RegistrationError(
            f"{out} exists: a registration is never rewritten; a new one takes a new name"
        )
    data = {
        "made_by": "p4bs eval register",
        "name": plan.name,
        "registered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code_commit": _git(repo, "rev-parse", "HEAD"),
        "policy_tree": _git(repo, "rev-parse", f"HEAD:{POLICY_DIR}"),
        "plan_file": files[-1],
        "plan": plan.as_data(),
        "scenarios": scenarios,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


@dataclass(frozen=True)
class Registration:
    path: str
    name: str
    code_commit: str
    policy_tree: str
    plan: Plan
    scenarios: Mapping[str, Mapping[str, Any]]  # by scenario name

    @property
    def margin(self) -> float:
        return self.plan.margin

    @property
    def alpha(self) -> float:
        return self.plan.alpha

    def identity(self) -> dict[str, Any]:
        """What claims.json records of the registration its verdicts come from."""
        return {
            "file": self.path,
            "name": self.name,
            "code_commit": self.code_commit,
            "policy_tree": self.policy_tree,
            "plan": self.plan.as_data(),
        }


def load_registration(path: Path, shown: str | None = None) -> Registration:
    try:
        data = json.loads(path.read_text())
        plan = data["plan"]
        return Registration(
            path=shown or str(path),
            name=data["name"],
            code_commit=data["code_commit"],
            policy_tree=data["policy_tree"],
            plan=Plan.from_data(plan),
            scenarios={s["name"]: s for s in data["scenarios"]},
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RegistrationError(f"{path}: not a registration ({exc!r})") from None


def check_together(registrations: Sequence[Registration]) -> None:
    """Registrations read into one claims.json: each scenario in at most one of them (a
    folder's rows are screened against one), and one alpha (Holm's families span the file)."""
    named: dict[str, str] = {}
    for registration in registrations:
        for scenario in registration.scenarios:
            if scenario in named:
                raise RegistrationError(
                    f"scenario {scenario!r} is registered in both {named[scenario]} and "
                    f"{registration.path}"
                )
            named[scenario] = registration.path
    alphas = sorted({registration.alpha for registration in registrations})
    if len(alphas) > 1:
        raise RegistrationError(
            f"the registrations' alphas differ ({alphas}): one claims.json's Holm families "
            "need one alpha"
        )


def registration_of(
    scenario: Mapping[str, Any], registrations: Sequence[Registration]
) -> Registration | None:
    """The registration that names the scenario (by its name), if one does."""
    return next((r for r in registrations if scenario.get("name") in r.scenarios), None)


@functools.lru_cache(maxsize=4096)
def made_since(repo: Path, registered: str, commit: str) -> bool | None:
    """Whether `commit` is the registered commit or one after it (`git merge-base
    --is-ancestor`); None when this repository does not know one of them."""
    done = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", registered, commit],
        capture_output=True,
        check=False,
    )
    return {0: True, 1: False}.get(done.returncode)


def screen_rows(
    source: str,
    scenario: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    registration: Registration | None,
    repo: Path,
) -> tuple[list[Mapping[str, Any]], list[dict[str, Any]]]:
    """The rows a folder's claims may use and those refused (each with the reason). A
    folder of a scenario the registration does not name (or without one) is used whole."""
    if registration is None or scenario.get("name") not in registration.scenarios:
        return list(rows), []
    registered = registration.scenarios[scenario["name"]]
    differs = _differs(registered["described"], scenario)
    used, flagged = [], []
    for row in rows:
        reason = _refusal(row, registration, registered["path"], differs, repo)
        if reason is None:
            used.append(row)
        else:
            flagged.append(
                {
                    "source": source,
                    "point": row.get("point"),
                    "policy": row.get("policy"),
                    "repeat": row.get("repeat"),
                    "reason": reason,
                }
            )
    return used, flagged


def refusals_before_running(
    registration: Registration,
    described: Mapping[str, Any],
    identity: Mapping[str, Any],
    repo: Path,
) -> list[str]:
    """Why `registration` would refuse the rows of a run of `described` (scenario.json as
    the runner writes it) made with the code `identity` (runner.code_identity): asked
    before the runs start, so that hours of testbed time do not go into rows that cannot
    count. Empty when every policy's rows would count."""
    name = described["name"]
    if name not in registration.scenarios:
        return [
            f"it does not name scenario {name!r} (it names {', '.join(registration.scenarios)})"
        ]
    registered = registration.scenarios[name]
    differs = _differs(registered["described"], described)
    reasons: list[str] = []
    for policy in described["policies"]:
        reason = _refusal(
            {"policy": policy, **identity}, registration, registered["path"], differs, repo
        )
        if reason is not None and reason not in reasons:
            reasons.append(reason)
    return reasons


def _differs(registered: Mapping[str, Any], scenario: Mapping[str, Any]) -> list[str]:
    """The keys a registered run may not change on which `scenario` differs from it."""
    return [k for k in registered if k not in FREE_KEYS and scenario.get(k) != registered[k]]


def _refusal(
    row: Mapping[str, Any],
    registration: Registration,
    path: str,
    differs: Sequence[str],
    repo: Path,
) -> str | None:
    if differs:
        return f"scenario.json differs from the registered {path} in {', '.join(differs)}"
    policy = row.get("policy", "")
    if policy not in registration.plan.policies and not policy.startswith(FIXED_PREFIX):
        return f"policy {policy!r} is not in the plan"
    tree = row.get("policy_tree")
    if tree is None:
        return "no policy_tree: made without the code identity a registration checks"
    if tree != registration.policy_tree:
        return f"policy_tree {tree}, registered {registration.policy_tree}"
    dirty = row.get("policy_code_dirty")
    if dirty is None:
        return "the policy code's state unknown (git status failed when the run started)"
    if dirty:
        return "made with uncommitted changes to the policy code"
    # The same policies at a testbed or runner from before the registration are not what
    # it registered (e.g. the traffic generator it replaced).
    commit = row.get("code_commit")
    if commit is None:
        return "no code_commit: made without the code identity a registration checks"
    since = made_since(repo, registration.code_commit, commit)
    if since is None:
        return f"code_commit {commit} unknown to this repository"
    if not since:
        return f"made at {commit[:12]}, before the registration ({registration.code_commit[:12]})"
    return None
