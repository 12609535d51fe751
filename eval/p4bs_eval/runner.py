"""`p4bs eval run`: every run of a scenario through the whole pipeline, one after the other.

One stack (Kafka, InfluxDB) serves the whole evaluation. Each run gets a testbed of its own
(the point's flow groups, the scenario's initial buffer), the closed loop on it (the data
plane model on the taps, the metrics job, the InfluxDB sink and, unless the policy is
`none`, the optimizer with the policy driving the router agent over gNMI), and the
scenario's traffic. Its folder keeps the traffic's raw files and summary, the link metrics
and decisions read back from Kafka, and the loop's logs; `results.jsonl` gets one line of
figures per run (`figures.run_figures`, and per phase of the traffic `phases.py`) with the
code it ran (`code_identity`). A run that fails is recorded with its error and the
evaluation goes on.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
import time
import tomllib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p4bs import paths
from p4bs.bus import read_stream
from p4bs.config import load_config
from p4bs.progress import Progress
from p4bs_eval.figures import read_jsonl, run_figures
from p4bs_eval.keep import KeepError, keep
from p4bs_eval.phases import fct_summary, phase_figures, short_flows_record
from p4bs_eval.report import load_results, run_key
from p4bs_eval.scenario import AQM_POLICIES, NO_POLICY, EvalScenario, Point, fixed_buffer_ms
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import Aqm, Testbed
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_loop.closed_loop import ClosedLoop, own_stack, own_testbed_plan

# A run's time on top of its traffic, for the time-left estimate until one run has been
# measured: the testbed up, the metrics job from cold, the topics read back.
OVERHEAD_GUESS_S = 40.0
# The policies' code, whose git tree a row records: a verdict holds for the code it ran.
POLICY_CODE = "optimizer/p4bs_optimizer/policies"


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_identity(repo: Path) -> dict[str, Any]:
    """What code a run ran, as it starts: `code_commit` (HEAD), `policy_tree` (the git tree of
    the policies' folder at HEAD) and `policy_code_dirty` (changes not committed there,
    untracked files included; when dirty the tree does not name the code that ran). None
    each outside a git checkout."""
    status = _git(repo, "status", "--porcelain", "--", POLICY_CODE)
    return {
        "code_commit": _git(repo, "rev-parse", "HEAD"),
        "policy_tree": _git(repo, "rev-parse", f"HEAD:{POLICY_CODE}"),
        "policy_code_dirty": None if status is None else bool(status),
    }


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """How a policy's run is set up: with an optimizer or not, the router's initial buffer
    (ms of line rate), and the bottleneck's AQM if any."""

    optimizer: bool
    buffer_ms: float
    aqm: Aqm | None = None


def run_setup(scenario: EvalScenario, point: Point, policy: str) -> RunSetup:
    """`none`, the oracle's `fixed:<ms>ms` and the AQM baselines `red` and `codel` run
    without an optimizer: the first at the scenario's initial buffer, the second at its own,
    the AQMs (with their default parameters, p4bs_infra.testbed.Aqm) on the initial buffer."""
    fixed_ms = fixed_buffer_ms(policy)
    if fixed_ms is not None:
        return RunSetup(False, fixed_ms)
    buffer_ms = scenario.buffer_ms_at(point)
    if policy in AQM_POLICIES:
        return RunSetup(False, buffer_ms, Aqm(kind="red" if policy == "red" else "codel"))
    return RunSetup(policy != NO_POLICY, buffer_ms)


class PhaseClock:
    """Wall time of a run's phases (testbed up, loop start, traffic, stop, read back), s:
    where a run's time beyond its traffic goes."""

    def __init__(self) -> None:
        self.took: dict[str, float] = {}
        self.last = time.monotonic()

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.took[phase] = round(now - self.last, 1)
        self.last = now


def dump_stream(loop: ClosedLoop, stream: str, path: Path) -> list[dict[str, Any]]:
    """Every committed record of one of the loop's topics, written as JSON lines."""
    records = read_stream(loop.config.kafka, stream, loop.topics)
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return records


def run_one(
    scenario: EvalScenario,
    point: Point,
    policy: str,
    repeat: int,
    run_dir: Path,
    stack: Stack,
    base_config: Path,
    progress: Progress,
) -> dict[str, Any]:
    """One run; returns its figures."""
    code = code_identity(paths.home())
    config = load_config(base_config)
    groups = scenario.groups_at(point)
    setup = run_setup(scenario, point, policy)
    # Repeat r's traffic under every policy: the same short-flow arrivals and sizes and the
    # same per-flow extra delays, so that the policies' difference in a repeat is paired.
    seed = repeat
    plan = own_testbed_plan(
        config, run_dir / "testbed", "ev", groups, setup.buffer_ms, delay_seed=seed
    )
    plan = dataclasses.replace(plan, aqm=setup.aqm)
    testbed = Testbed(plan)
    loop: ClosedLoop | None = None
    label = f"{point.label} | {policy} | #{repeat}"
    began = time.monotonic()
    phases = PhaseClock()
    try:
        testbed.up()
        phases.mark("testbed_up")
        loop = ClosedLoop(
            tomllib.loads(base_config.read_text()),
            testbed,
            run_dir / "loop",
            bootstrap=stack.kafka.bootstrap,
            # Without a policy the loop still measures; its config names one it never runs.
            policy=policy if setup.optimizer else "static",
            policy_options=scenario.policy_options.get(policy, {}),
            influx_url=stack.influxdb.url,
            sections=scenario.loop_sections,
            link_settings=scenario.link_settings,
        )
        loop.start(
            optimizer=setup.optimizer,
            progress=lambda line: progress.show(f"{label} | {line}"),
        )
        phases.mark("loop_start")
        traffic = Scenario(
            duration_s=scenario.duration_s,
            warmup_s=scenario.warmup_s,
            short_flows=scenario.short_flows,
            voip=scenario.voip,
            seed=seed,
            stops_s={g.name: g.stop_ns / 1e9 for g in groups if g.stop_ns is not None},
            short_flow_rate_changes=scenario.short_flow_rate_changes(),
        )
        result: dict[str, Any] = {}
        failure: list[BaseException] = []

        def run_traffic() -> None:
            try:
                result.update(TrafficRun(testbed, run_dir / "traffic", traffic).run(lambda _: None))
            except BaseException as exc:  # reported by the waiting thread
                failure.append(exc)

        thread = threading.Thread(target=run_traffic, name="traffic")
        started = time.monotonic()
        thread.start()
        while thread.is_alive():
            thread.join(1.0)
            t = time.monotonic() - started
            progress.show(
                f"{label} | traffic {min(t, scenario.duration_s):4.0f}/{scenario.duration_s:.0f} s",
                elapsed_s=time.monotonic() - began,
            )
        if failure:
            raise failure[0]
        phases.mark("traffic")
    finally:
        if loop is not None:
            loop.stop()
        testbed.down()
    phases.mark("stop")
    windows = dump_stream(loop, "link_metrics", run_dir / "link_metrics.jsonl")
    decisions = dump_stream(loop, "buffer_decisions", run_dir / "decisions.jsonl")
    phases.mark("read_back")
    groups_by_address = {g.address: g.name for g in plan.groups}
    figures = run_figures(
        result, run_dir / "traffic", windows, decisions, groups_by_address, plan.rate_bps
    )
    spans = scenario.phase_spans()
    start_ns = result["timeline"]["traffic_start_ns"]
    flows = read_jsonl(run_dir / "traffic" / "fct.jsonl")
    extra: dict[str, Any] = {
        "seed": seed,
        "phases_s": phases.took,
        "phases": phase_figures(spans, scenario.settle_s, windows, start_ns),
        **code,
    }
    if flows:
        extra["fct"] = fct_summary(spans, flows, start_ns)
        extra["short_flows"] = short_flows_record(flows, start_ns)
    if fixed_buffer_ms(policy) is not None:
        extra["fixed_buffer_bytes"] = plan.buffer_bytes
    if setup.aqm is not None:
        extra["aqm"] = dataclasses.asdict(setup.aqm)  # its parameters, as they ran
    return figures | extra


# What a run folder's scenario.json must still say for `--resume` to add runs to it; the
# number of repeats may grow. A folder from before phases existed has none.
RESUME_KEYS = (
    "name", "duration_s", "warmup_s", "buffer_ms", "points", "sweep_keys", "phases", "settle_s",
)  # fmt: skip
RESUME_DEFAULTS: dict[str, Any] = {"phases": [], "settle_s": 0.0}


class ResumeError(ValueError):
    """A run folder `--resume` cannot complete; the message says why."""


def describe(scenario: EvalScenario, policies: tuple[str, ...]) -> dict[str, Any]:
    """What scenario.json records: enough for reports, and for a resume to check the folder."""
    return {
        "name": scenario.name,
        "title": scenario.title,
        "reports": list(scenario.reports),
        "policies": list(policies),
        "repeat": scenario.repeat,
        "duration_s": scenario.duration_s,
        "warmup_s": scenario.warmup_s,
        "buffer_ms": scenario.buffer_ms,
        "points": [p.label for p in scenario.points()],
        "sweep_keys": [key for key, _ in scenario.sweep],
        "link_settings": dict(scenario.link_settings),
        # Each phase with its end (s from the traffic's start): what a per-phase oracle
        # stitches; none without [[phases]].
        "phases": [
            {"name": p.name, "start_s": p.start_s, "end_s": span.end_s}
            for p, span in zip(scenario.phases, scenario.phase_spans(), strict=False)
        ],
        "settle_s": scenario.settle_s,
        "oracle_buffers_ms": list(scenario.oracle_buffers_ms),
        "traffic": traffic_of(scenario),
    }


def traffic_of(scenario: EvalScenario) -> dict[str, Any]:
    """What shapes a run's traffic, but for the sweep's values (a cell's name holds those):
    the step runs `p4bs eval surfaces --steps` adds to a surface must have had the same."""
    return {
        "duration_s": scenario.duration_s,
        "warmup_s": scenario.warmup_s,
        "groups": [dataclasses.asdict(g) for g in scenario.groups],
        "short_flows": dataclasses.asdict(scenario.short_flows) if scenario.short_flows else None,
        "voip": dataclasses.asdict(scenario.voip) if scenario.voip else None,
        "phases": [dataclasses.asdict(p) for p in scenario.phases],
    }


def finished_runs(out: Path, described: dict[str, Any]) -> set[tuple[str, str, int]]:
    """The runs of a folder that ran without an error, once its scenario.json is checked to
    describe the same scenario: the same points and timing, and its policies among those
    now (a resume may add policies, as it may add repeats: repeat r's traffic is the same
    for every policy, so the new one's runs pair with the finished ones)."""
    if not (out / "scenario.json").exists() or not (out / "results.jsonl").exists():
        raise ResumeError(f"{out}: no scenario.json and results.jsonl to resume")
    before, rows = load_results(out)
    there = {key: before.get(key, RESUME_DEFAULTS.get(key)) for key in RESUME_KEYS}
    changed = [
        f"{key}: {there[key]!r} there, {described[key]!r} now"
        for key in RESUME_KEYS
        if there[key] != described[key]
    ]
    dropped = [p for p in before.get("policies", []) if p not in described["policies"]]
    if dropped:
        changed.append(f"policies {dropped!r} there, not in {described['policies']!r} now")
    if changed:
        raise ResumeError(f"{out} holds another scenario: " + "; ".join(changed))
    return {run_key(row) for row in rows if "error" not in row}


def folder_policies(out: Path) -> tuple[str, ...] | None:
    """The policies a run folder was made for (None without its scenario.json): what a
    resume without `--policies` completes, so that a folder made for a few of a scenario's
    policies does not grow the others."""
    try:
        return tuple(json.loads((out / "scenario.json").read_text())["policies"])
    except FileNotFoundError:
        return None


def pending_runs(
    scenario: EvalScenario, out: Path, policies: tuple[str, ...] | None, *, resume: bool
) -> list[tuple[Point, str, int]]:
    """The runs to make: all of them, or with `resume` those `out` has not finished."""
    runs = list(scenario.runs(policies))
    if not resume:
        return runs
    done = finished_runs(out, describe(scenario, policies or scenario.policies))
    todo = [(point, policy, r) for point, policy, r in runs if (point.label, policy, r) not in done]
    print(f"p4bs eval: resuming {out}: {len(runs) - len(todo)} runs finished, {len(todo)} to run")
    return todo


def keep_after_run(out: Path, keep_into: Path, say: Callable[[str], None]) -> None:
    """`keep` after a run; what it could not keep is said, and the runs go on."""
    try:
        problems = keep(out, keep_into).incomplete
    except (KeepError, OSError) as exc:  # KeepError: the folder is not a run folder
        problems = (f"keep into {keep_into} failed: {exc}",)
    for problem in problems:
        say(f"not kept: {problem}")


def run_eval(
    scenario: EvalScenario,
    out: Path,
    base_config: Path,
    policies: tuple[str, ...] | None = None,
    *,
    resume: bool = False,
    keep_into: Path | None = None,
) -> int:
    """Runs every point x policy x repeat (with `resume`, those `out` has not finished
    without an error); returns the number of failed runs. With `keep_into`, what is kept of
    `out` (keep.py) is brought up to date there after each run."""
    if resume and policies is None:
        policies = folder_policies(out)
    described = describe(scenario, policies or scenario.policies)
    runs = pending_runs(scenario, out, policies, resume=resume)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.json").write_text(json.dumps(described, indent=2) + "\n")
    if not runs:
        return 0
    progress = Progress(len(runs), first_guess_s=scenario.duration_s + OVERHEAD_GUESS_S)
    stack = own_stack(load_config(base_config), out / "stack")
    failed = 0
    print(f"p4bs eval {scenario.name}: {len(runs)} runs of {scenario.duration_s:g} s into {out}")
    try:
        stack.up(progress=lambda line: progress.show(f"stack: {line}", final=True))
        with (out / "results.jsonl").open("a") as results:
            for point, policy, repeat in runs:
                run_dir = out / "runs" / point.slug / policy / f"r{repeat}"
                if run_dir.exists():
                    shutil.rmtree(run_dir)
                run_dir.mkdir(parents=True)
                began = time.monotonic()
                row: dict[str, Any] = {
                    "point": point.label,
                    "values": dict(point.values),
                    "policy": policy,
                    "repeat": repeat,
                    "run_dir": str(run_dir.relative_to(out)),
                }
                try:
                    row |= run_one(
                        scenario, point, policy, repeat, run_dir, stack, base_config, progress
                    )
                except Exception as exc:
                    failed += 1
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    (run_dir / "error.txt").write_text(traceback.format_exc())
                row["wall_s"] = round(time.monotonic() - began, 1)
                progress.finished(row["wall_s"])
                results.write(json.dumps(row) + "\n")
                results.flush()
                outcome = row.get("error") or (
                    f"utilisation {row['utilisation']:.1%}, mean RTT "
                    f"{row['rtt_mean_ms']:.1f} ms, Jain {row['jain_flows']:.3f}"
                )
                progress.show(
                    f"{point.label} | {policy} | #{repeat}: {outcome} ({row['wall_s']:.0f} s)",
                    final=True,
                )
                if keep_into is not None:
                    keep_after_run(out, keep_into, lambda line: progress.show(line, final=True))
    finally:
        stack.down()
    return failed
