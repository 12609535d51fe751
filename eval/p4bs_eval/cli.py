"""`p4bs eval run SCENARIO`, `report RUN_DIR`, `claims`, `register` and the other `p4bs eval`
subcommands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p4bs import paths

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
RESULTS = SCENARIOS.parent / "results"  # the committed summaries
# `p4bs eval offline`'s default policies: this project's, P4BS and the static rules of P4BS
# Fig. 11.
OFFLINE_POLICIES = ("loss-delay-fit", "p4bs", "bdp", "stanford", "tiny", "bloated", "bscl", "adt")
# `p4bs eval all`, in order (p4bs-fig17's run gives Fig. 10 its measured curve).
FULL_SET = (
    "globecom-test1",
    "globecom-test2",
    "globecom-test3",
    "gomez-jenks",
    "p4bs-fig11",
    "p4bs-fig14",
    "p4bs-fig17",
)


def cmd_run(args: argparse.Namespace) -> int:
    from p4bs_eval.report import write_report
    from p4bs_eval.runner import ResumeError, keep_after_run, run_eval
    from p4bs_eval.scenario import ScenarioError, check_policies, load_scenario

    if args.resume and args.out:
        print("p4bs eval: --resume RUN_DIR is the folder; give no --out", file=sys.stderr)
        return 2
    path = args.scenario
    if not path.exists() and (SCENARIOS / f"{path}.toml").exists():
        path = SCENARIOS / f"{path}.toml"
    # With --resume, --policies are the folder's policies and any added (each added one's
    # runs pair with the finished ones); fewer than the folder's are refused (runner.py).
    policies: tuple[str, ...] | None = None
    try:
        scenario = load_scenario(path)
        if args.policies:
            policies = tuple(args.policies.split(","))
            check_policies(policies, "--policies")
            scenario = dataclasses.replace(scenario, policies=policies)
    except ScenarioError as exc:
        print(f"p4bs eval: {exc}", file=sys.stderr)
        return 2
    problem = _config_problem(args.config, scenario.link_settings)
    if problem:
        print(f"p4bs eval: {problem}", file=sys.stderr)
        return 2
    if args.repeat is not None:
        if args.repeat < 1:
            print("p4bs eval: --repeat must be at least 1", file=sys.stderr)
            return 2
        scenario = dataclasses.replace(scenario, repeat=args.repeat)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.resume or args.out or paths.home() / ".run" / "eval" / f"{scenario.name}-{stamp}"
    if args.registration and not _counts_for(args.registration, scenario, policies, args.resume):
        return 2
    _unwind_on_signals()
    try:
        failed = run_eval(
            scenario,
            out,
            args.config,
            policies,
            resume=args.resume is not None,
            keep_into=args.keep_into,
        )
    except ResumeError as exc:
        print(f"p4bs eval: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"p4bs eval: interrupted; the finished runs are in {out} "
            f"(`p4bs eval run {args.scenario} --resume {out}` completes them)",
            file=sys.stderr,
        )
        return 130
    print(f"report: {write_report(out)}")
    if args.keep_into:
        # Once more, for the report.
        keep_after_run(
            out, args.keep_into, lambda line: print(f"p4bs eval: {line}", file=sys.stderr)
        )
    return 1 if failed else 0


def _counts_for(
    path: Path, scenario: Any, policies: tuple[str, ...] | None, resume: Path | None
) -> bool:
    """Whether the registration at `path` would use the rows of these runs, made with the
    code of this checkout; if not, says why."""
    from p4bs_eval.registration import (
        RegistrationError,
        load_registration,
        refusals_before_running,
    )
    from p4bs_eval.runner import code_identity, describe, folder_policies

    try:
        registration = load_registration(path)
    except RegistrationError as exc:
        print(f"p4bs eval: {exc}", file=sys.stderr)
        return False
    running = policies or (resume and folder_policies(resume)) or scenario.policies
    reasons = refusals_before_running(
        registration, describe(scenario, running), code_identity(paths.home()), paths.home()
    )
    for reason in reasons:
        print(f"p4bs eval: {path} would refuse these runs: {reason}", file=sys.stderr)
    return not reasons


def _unwind_on_signals() -> None:
    """SIGINT and SIGTERM unwind the runs (testbed and stack down) as Ctrl-C does, also when
    the shell that started the eval in the background left SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def cmd_all(args: argparse.Namespace) -> int:
    """Every scenario of the full set, then Fig. 10 on seeded curves and on the p4bs-fig17
    run's measured f; each step's wall time goes to times.md as it finishes."""
    from p4bs_eval.acquisition import CurveError, run_acquisitions
    from p4bs_eval.report import write_report
    from p4bs_eval.runner import run_eval
    from p4bs_eval.scenario import ScenarioError, load_scenario

    try:
        scenarios = [load_scenario(SCENARIOS / f"{name}.toml") for name in FULL_SET]
    except ScenarioError as exc:
        print(f"p4bs eval: {exc}", file=sys.stderr)
        return 2
    for scenario in scenarios:
        problem = _config_problem(args.config, scenario.link_settings)
        if problem:
            print(f"p4bs eval: {scenario.name}: {problem}", file=sys.stderr)
            return 2
    out = args.out or paths.home() / ".run" / "eval" / f"all-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, str, float]] = []

    def finished(name: str, runs: str, began: float) -> None:
        steps.append((name, runs, time.monotonic() - began))
        total = sum(took for _, _, took in steps)
        rows = [f"| {n} | {r} | {took / 60:.1f} |" for n, r, took in steps]
        (out / "times.md").write_text(
            "| step | runs | minutes |\n|---|---|---|\n"
            + "\n".join(rows)
            + f"\n| total | | {total / 60:.1f} |\n"
        )
        print(f"p4bs eval all: {name} done, {total / 60:.1f} min so far", flush=True)

    failed = 0
    _unwind_on_signals()
    try:
        for scenario in scenarios:
            began = time.monotonic()
            failed += run_eval(scenario, out / scenario.name, args.config)
            write_report(out / scenario.name)
            finished(scenario.name, str(len(list(scenario.runs()))), began)
        for name, curve in (("acquisition", None), ("acquisition-curve", out / "p4bs-fig17")):
            began = time.monotonic()
            run_acquisitions(out / name, 10, 50, curve)
            finished(name, "10 seeds", began)
    except KeyboardInterrupt:
        print(f"p4bs eval: interrupted; the finished steps are in {out}", file=sys.stderr)
        return 130
    except CurveError as exc:  # p4bs-fig17's runs failed
        print(f"p4bs eval: acquisition-curve: {exc}", file=sys.stderr)
        return 1
    print(f"times: {out / 'times.md'}")
    return 1 if failed else 0


def _config_problem(config_path: Path, link_settings: Mapping[str, Any]) -> str | None:
    """Why the runs could not start, before any run tries (every run would fail alike): the
    config with the scenario's link settings in place does not parse, or the testbeds' router
    agents would have no credentials."""
    from p4bs.config import ConfigError
    from p4bs_eval.scenario import config_with_link_settings
    from p4bs_infra.testbed import TestbedError, TestbedPlan

    try:
        plan = TestbedPlan.from_config(config_with_link_settings(config_path, link_settings))
        for secret in (plan.username, plan.password):
            if not secret.resolve():
                return f"the router credential {secret.env or secret.file} is empty"
    except (ConfigError, TestbedError, LookupError) as exc:
        return str(exc)
    return None


def late_apply_shares(text: str) -> tuple[tuple[int, float], ...]:
    """`s:share,...` as (ns, share) pairs; argparse's type for --late-apply."""
    try:
        pairs = [item.split(":") for item in text.split(",")]
        shares = tuple((round(float(s) * 1e9), float(share)) for s, share in pairs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected s:share,...") from None
    if any(ns < 0 or share < 0 for ns, share in shares) or sum(w for _, w in shares) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: delays and shares >= 0, some share > 0")
    return shares


# The offline runs' timing: option, the dynamic scenario's key, the default otherwise.
OFFLINE_TIMING = (
    ("duration", "duration_s", 60.0),
    ("warmup", "warmup_s", 10.0),
    ("initial_buffer_ms", "buffer_ms", 200.0),
)


def cmd_offline(args: argparse.Namespace) -> int:
    """The policies on the buffer sweep's measured surfaces, cell by cell (offline_report.py)."""
    from p4bs.config import ConfigError
    from p4bs_eval.offline_report import cell_report, evaluate, summary_data
    from p4bs_eval.scenario import ScenarioError, check_policies, config_with_link_settings
    from p4bs_eval.simulator import (
        MEASURED_LAG_NS,
        MEASURED_LATE_APPLY,
        MEASURED_SHRINK_BURST,
        LoopTiming,
    )
    from p4bs_eval.surface import SurfaceError
    from p4bs_eval.surface_file import load_surfaces
    from p4bs_optimizer.policies.base import PolicyOptionError

    try:
        policies = tuple(args.policies.split(","))
        check_policies(policies, "--policies")
        found, link_settings, origin, _ = load_surfaces(args.source)
        config = config_with_link_settings(args.config, link_settings)
    except (ScenarioError, SurfaceError, ConfigError) as exc:
        print(f"p4bs eval offline: {exc}", file=sys.stderr)
        return 2
    # A dynamic scenario's surfaces run as its live runs do; a sweep's as Fig. 11's.
    for key, scenario_key, default in OFFLINE_TIMING:
        if getattr(args, key) is None:
            setattr(args, key, origin.get(scenario_key, default))
    if args.seeds < 1 or args.warmup >= args.duration:
        print("p4bs eval offline: --seeds >= 1 and --warmup < --duration", file=sys.stderr)
        return 2
    if args.lag is None:
        args.lag = MEASURED_LAG_NS / 1e9
    timing = LoopTiming(
        metrics_lag_ns=round(args.lag * 1e9),
        late_apply=MEASURED_LATE_APPLY if args.late_apply is None else args.late_apply,
        router_buffer_read=args.router_buffer_read,
        duration_ns=round(args.duration * 1e9),
        warmup_ns=round(args.warmup * 1e9),
    )
    link = config.links[0]
    initial = round(link.capacity_bps / 8 * args.initial_buffer_ms / 1000)
    shrink_burst = MEASURED_SHRINK_BURST if args.shrink_burst else 0.0
    seeds = range(1, args.seeds + 1)
    lines = [
        f"# Offline evaluation on the surfaces of {args.source}",
        "",
        *(
            [f"The oracle's fixed buffers of `{origin['name']}`, its traffic's phases in time.", ""]
            if origin
            else []
        ),
        f"{args.seeds} seeds per policy and cell (seed s draws the same measured runs for every "
        f"policy: paired); {args.duration:g} s runs, the first {args.warmup:g} s left out of "
        f"f; windows of {timing.window_ns / 1e6:g} ms reach the optimizer {args.lag:g} s late; "
        + (
            "a decision is applied later by "
            + ", ".join(f"{ns / 1e9:g} s ({share:.0%})" for ns, share in timing.late_apply)
            + "; "
            if any(ns for ns, _ in timing.late_apply)
            else ""
        )
        + f"initial buffer {args.initial_buffer_ms:g} ms"
        + (
            " (read by the service); "
            if args.router_buffer_read
            else " (not known to the policy); "
        )
        + (
            f"a lowered buffer loses {shrink_burst:g} times the queue above it; "
            if shrink_burst
            else ""
        )
        + f"link {link.id} "
        f"({link.capacity_bps / 1e6:g} Mbit/s, d-hat {link.max_queue_delay_ns / 1e6:g} ms, "
        f"p-hat {link.max_loss:g}).",
    ]
    began = time.monotonic()
    cells = {}
    try:
        for cell, surface in found.items():
            summaries = []
            for policy in policies:
                started = time.monotonic()
                summaries.append(
                    evaluate(
                        policy,
                        {},
                        surface,
                        link,
                        config.metrics,
                        initial,
                        timing,
                        seeds,
                        shrink_burst,
                    )
                )
                print(f"{cell} | {policy}: {time.monotonic() - started:.1f} s", flush=True)
            lines += ["", *cell_report(cell, surface, summaries, link.capacity_bps)]
            cells[cell] = summaries
    except PolicyOptionError as exc:
        print(f"p4bs eval offline: {exc}", file=sys.stderr)
        return 2
    lines += ["", f"Simulated in {time.monotonic() - began:.0f} s."]
    if args.out:
        out = args.out
    elif args.source.is_dir():
        out = args.source / "offline.md"
    else:
        out = args.source.parent / f"{args.source.name.split('.')[0]}-offline.md"
    out.write_text("\n".join(lines) + "\n")
    data = {
        "source": str(args.source),
        "scenario": origin.get("name"),  # checked against this scenario's live runs only
        "seeds": args.seeds,
        "cells": summary_data(cells),
    }
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"report: {out} (and {out.with_suffix('.json').name} for `p4bs eval claims`)")
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    """eval/claims.json from the committed summaries (claims.py), with each registered
    scenario's rows screened against its registration (registration.py)."""
    from p4bs_eval.claims import build, shown_path
    from p4bs_eval.claims_tables import markdown
    from p4bs_eval.registration import RegistrationError, load_registration

    if not args.results.is_dir():
        print(f"p4bs eval claims: no folder {args.results}", file=sys.stderr)
        return 2
    try:
        registrations = [
            load_registration(path, str(shown_path(path.resolve(), paths.home())))
            for path in args.registration
        ]
        data = build(args.results, paths.home(), registrations)
    except RegistrationError as exc:
        print(f"p4bs eval claims: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(data))
    for claim, verdicts in data["summary"].items():
        shown_counts = ", ".join(f"{v} {n}" for v, n in verdicts.items())
        print(f"{claim}: {shown_counts}")
    if data["flagged"]:
        print(f"flagged (refused): {len(data['flagged'])} rows, reasons in {args.out}")
    print(f"claims: {args.out} (tables: {args.out.with_suffix('.md').name})")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    """eval/registrations/<name>.json: the suite's scenarios and plan at the policy code's
    commit, before its first run (registration.py)."""
    from p4bs_eval.registration import RegistrationError, register

    scenarios = [
        path
        if path.exists() or not (SCENARIOS / f"{path}.toml").exists()
        else SCENARIOS / f"{path}.toml"
        for path in args.scenarios
    ]
    try:
        out_dir = args.out_dir or paths.home() / "eval" / "registrations"
        out = register(scenarios, args.plan, paths.home(), out_dir)
    except RegistrationError as exc:
        print(f"p4bs eval register: {exc}", file=sys.stderr)
        return 2
    print(f"registration: {out} (commit it before the first run)")
    return 0


def cmd_surfaces(args: argparse.Namespace) -> int:
    from p4bs_eval.surface import SurfaceError
    from p4bs_eval.surface_file import load_surfaces, save_surfaces, with_steps

    try:
        found, link_settings, origin, traffic = load_surfaces(args.source)
        for step_dir in args.steps:
            found = with_steps(found, step_dir, traffic)
    except SurfaceError as exc:
        print(f"p4bs eval surfaces: {exc}", file=sys.stderr)
        return 2
    save_surfaces(args.out, found, link_settings, origin, traffic)
    runs = sum(len(r) for s in found.values() for r in s.runs.values())
    steps = sum(len(r) for s in found.values() for r in s.steps.values())
    print(
        f"{args.out}: {len(found)} cells, {runs} fixed-buffer runs, {steps} step runs, "
        f"{args.out.stat().st_size:,} bytes"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from p4bs_eval.report import write_report

    if not (args.run_dir / "results.jsonl").exists():
        print(f"p4bs eval: {args.run_dir} holds no results.jsonl", file=sys.stderr)
        return 2
    print(f"report: {write_report(args.run_dir)}")
    return 0


def cmd_keep(args: argparse.Namespace) -> int:
    from p4bs_eval.keep import KeepError, keep

    try:
        kept = keep(args.run_dir, args.out)
    except KeepError as exc:
        print(f"p4bs eval keep: {exc}", file=sys.stderr)
        return 2
    print(f"keep: {args.out}: {kept.rows} rows, {kept.runs_added} runs' files added")
    for problem in kept.incomplete:
        print(f"p4bs eval keep: {problem}", file=sys.stderr)
    return 1 if kept.incomplete else 0


def cmd_acquisition(args: argparse.Namespace) -> int:
    from p4bs_eval.acquisition import CurveError, run_acquisitions

    if args.seeds < 1 or args.iterations < 2:
        print("p4bs eval: --seeds >= 1 and --iterations >= 2", file=sys.stderr)
        return 2
    if args.curve and not (args.curve / "results.jsonl").exists():
        print(f"p4bs eval: {args.curve} holds no results.jsonl", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or paths.home() / ".run" / "eval" / f"acquisition-{stamp}"
    try:
        report = run_acquisitions(out, args.seeds, args.iterations, args.curve)
    except CurveError as exc:
        print(f"p4bs eval: {exc}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0


def _option_value(text: str) -> Any:
    """A `--option` value: a number or true/false as JSON reads it, else the text ('10s')."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def cmd_objective(args: argparse.Namespace) -> int:
    """Per folder and cell, the buffer f picks at each exchange rate of loss for delay
    against the buffer the short flows' median FCT prefers (objective.py): objective.md."""
    from p4bs.config import ConfigError
    from p4bs_eval.objective import ObjectiveError, cells, exchange_ms, markdown
    from p4bs_eval.report import load_results
    from p4bs_eval.scenario import config_with_link_settings

    if any(not (r > 0 and math.isfinite(r)) for r in args.rates):
        print("p4bs eval objective: --rates must be positive numbers of ms", file=sys.stderr)
        return 2
    try:
        for folder in args.run_dirs:
            scenario, rows = load_results(folder, ObjectiveError)
            config = config_with_link_settings(args.config, scenario.get("link_settings", {}))
            link = config.links[0]
            figures = cells(rows, link)
            if not figures:
                raise ObjectiveError(f"{folder}: no run under a fixed buffer")
            text = "\n".join(markdown(scenario["name"], figures, exchange_ms(link), args.rates))
            (folder / "objective.md").write_text(text + "\n")
            print(text)
    except (ObjectiveError, ConfigError) as exc:
        print(f"p4bs eval objective: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_detection(args: argparse.Namespace) -> int:
    """Each folder's runs replayed through loss-delay-fit's traffic detector and scored, with
    the metrics job's flag, against the phases (detection.py): detection.json and .md."""
    from p4bs.config import ConfigError
    from p4bs_eval.detection import DetectionError, folder_summary, markdown
    from p4bs_eval.report import load_results
    from p4bs_eval.scenario import config_with_link_settings
    from p4bs_optimizer.policies.base import PolicyOptionError
    from p4bs_optimizer.policies.baselines import OptionReader
    from p4bs_optimizer.policies.traffic_change import TrafficChangeOptions

    if args.within is not None and args.within <= 0:
        print("p4bs eval detection: --within must be a positive number of seconds", file=sys.stderr)
        return 2
    given = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("traffic_"):
            print(
                f"p4bs eval detection: --option {item!r} is not traffic_NAME=VALUE", file=sys.stderr
            )
            return 2
        given[key] = _option_value(value)
    try:
        reader = OptionReader("loss-delay-fit", given)
        options = TrafficChangeOptions.parse(reader)
        reader.finish()
        for folder in args.run_dirs:
            scenario, rows = load_results(folder, DetectionError)
            config = config_with_link_settings(args.config, scenario.get("link_settings", {}))
            summary = folder_summary(folder, scenario, rows, config.links[0], options, args.within)
            (folder / "detection.json").write_text(json.dumps(summary, indent=1) + "\n")
            table = "\n".join(markdown(summary)) + "\n"
            (folder / "detection.md").write_text(table)
            print(table)
    except (PolicyOptionError, DetectionError, ConfigError) as exc:
        print(f"p4bs eval detection: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any) -> None:
    evaluation = sub.add_parser("eval", help="run the papers' experiments and report them")
    eval_sub = evaluation.add_subparsers(dest="action", required=True)
    run = eval_sub.add_parser("run", help="every run of a scenario, then its report")
    run.add_argument(
        "scenario", type=Path, help=f"a scenario file, or the name of one in {SCENARIOS}"
    )
    run.add_argument("--policies", help="comma-separated, instead of the scenario's")
    run.add_argument("--repeat", type=int, help="runs per point and policy")
    run.add_argument("--out", type=Path, help="default: .run/eval/<scenario>-<time>")
    run.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="complete the runs this folder of the same scenario has not finished (missing, "
        "or failed); --repeat may add repeats",
    )
    run.add_argument(
        "--registration",
        type=Path,
        metavar="FILE",
        help="a registration (eval/registrations/*.json) the runs are for: refuse to start if "
        "it would refuse their rows (scenario file, policies, code)",
    )
    run.add_argument(
        "--keep-into",
        type=Path,
        metavar="OUT",
        help="after each run, bring `p4bs eval keep RUN_DIR OUT` up to date",
    )
    paths.add_config_option(run)
    run.set_defaults(func=cmd_run)
    report = eval_sub.add_parser("report", help="report.md and plots from a run folder")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(func=cmd_report)
    keeping = eval_sub.add_parser(
        "keep",
        help="copy what is worth committing of a run folder (rows, each run's windows, "
        "decisions and timeline) into another; again as runs finish, to add the new ones",
    )
    keeping.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    keeping.add_argument("out", type=Path, metavar="OUT", help="e.g. eval/results/<name>")
    keeping.set_defaults(func=cmd_keep)
    offline = eval_sub.add_parser(
        "offline",
        help="policies on a buffer sweep's measured surfaces, simulated with the loop's timing",
    )
    offline.add_argument(
        "source",
        type=Path,
        help="a buffer sweep's run folder (policy none), or the surfaces file `eval surfaces` "
        "wrote of one",
    )
    offline.add_argument(
        "--policies", default=",".join(OFFLINE_POLICIES), help="default: %(default)s"
    )
    offline.add_argument("--seeds", type=int, default=20, help="runs per policy and cell (20)")
    offline.add_argument(
        "--duration", type=float, help="s per run (a dynamic scenario's own, else 60)"
    )
    offline.add_argument(
        "--warmup", type=float, help="s left out of f (a dynamic scenario's own, else 10)"
    )
    offline.add_argument(
        "--lag",
        type=float,
        help="s a window reaches the optimizer (default: the third round's testbed's, "
        "eval/README.md)",
    )
    offline.add_argument(
        "--late-apply",
        type=late_apply_shares,
        help="s:share,... delays added to a decision's apply time, one drawn per decision "
        "(default: the shares measured on the third round's testbed, eval/README.md; 0:1 "
        "for none)",
    )
    offline.add_argument(
        "--router-buffer-read",
        action="store_true",
        help="the windows before the first change say the router's buffer (the service read "
        "it when it took the link; on the third round's testbed it never had)",
    )
    offline.add_argument(
        "--shrink-burst",
        action="store_true",
        help="a buffer lowered below its standing queue loses a burst of packets, as many "
        "as measured live per packet of the queue above it (eval/README.md)",
    )
    offline.add_argument(
        "--initial-buffer-ms",
        type=float,
        help="the router's buffer at start (a dynamic scenario's own, else 200)",
    )
    paths.add_config_option(offline)
    offline.add_argument(
        "--out", type=Path, help="default: RUN_DIR/offline.md, or NAME-offline.md beside FILE"
    )
    offline.set_defaults(func=cmd_offline)
    claims = eval_sub.add_parser(
        "claims", help="eval/claims.json: every claim's verdict from the committed summaries"
    )
    claims.add_argument(
        "--results", type=Path, default=RESULTS, help="the summaries (default: %(default)s)"
    )
    claims.add_argument(
        "--out", type=Path, default=RESULTS.parent / "claims.json", help="default: %(default)s"
    )
    claims.add_argument(
        "--registration",
        type=Path,
        action="append",
        default=[],
        help="a registration (eval/registrations/NAME.json; repeat for several, each "
        "scenario in one): its scenarios' rows made at other policy code, or in another "
        "scenario, are refused and listed as flagged",
    )
    claims.set_defaults(func=cmd_claims)
    register = eval_sub.add_parser(
        "register",
        help="pre-register a suite: its scenarios and analysis plan at the policy code's commit",
    )
    register.add_argument(
        "scenarios",
        type=Path,
        nargs="+",
        metavar="SCENARIO",
        help=f"files, or names in {SCENARIOS}",
    )
    register.add_argument(
        "--plan",
        type=Path,
        required=True,
        help="PLAN.toml: policies, metric, repeats, margin, alpha, holm_family (eval/README.md)",
    )
    register.add_argument(
        "--out-dir", type=Path, help="default: eval/registrations of the checkout (P4BS_HOME)"
    )
    register.set_defaults(func=cmd_register)
    export = eval_sub.add_parser(
        "surfaces", help="a buffer sweep's measured surfaces as one compact file (to commit)"
    )
    export.add_argument(
        "source", type=Path, help="a buffer sweep's run folder, or a surfaces file to add to"
    )
    export.add_argument(
        "--steps",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="run folders of policy step: their moves join the cells' surfaces",
    )
    export.add_argument("--out", type=Path, required=True, help="FILE.json.gz")
    export.set_defaults(func=cmd_surfaces)
    acquisition = eval_sub.add_parser(
        "acquisition", help="P4BS Fig. 10: BO convergence with EI, UCB and PI"
    )
    acquisition.add_argument("--seeds", type=int, default=10)
    acquisition.add_argument("--iterations", type=int, default=50)
    acquisition.add_argument("--out", type=Path, help="default: .run/eval/acquisition-<time>")
    acquisition.add_argument(
        "--curve",
        type=Path,
        metavar="RUN_DIR",
        help="search the f measured by this run folder's buffer sweep (p4bs-fig17) instead "
        "of seeded Fig. 18-shaped curves",
    )
    acquisition.set_defaults(func=cmd_acquisition)
    detection = eval_sub.add_parser(
        "detection",
        help="change detectors on run folders' windows against their phases: delay, misses, "
        "false alarms",
    )
    detection.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    detection.add_argument(
        "--within",
        type=float,
        metavar="S",
        help="a change missed when not detected within S s (default: before its phase ends)",
    )
    detection.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="traffic_NAME=VALUE",
        help="a threshold of the traffic detector, as a policy option (optimizer/README.md)",
    )
    paths.add_config_option(detection)
    detection.set_defaults(func=cmd_detection)
    objective = eval_sub.add_parser(
        "objective",
        help="the buffer f picks at other exchange rates of loss for queueing delay, against "
        "the buffer the short flows' median FCT prefers",
    )
    objective.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    objective.add_argument(
        "--rates",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[50.0, 25.0, 10.0, 5.0, 2.0],
        metavar="MS,MS,...",
        help="exchange rates: ms of queueing delay worth 1%% of loss (default 50,25,10,5,2)",
    )
    paths.add_config_option(objective)
    objective.set_defaults(func=cmd_objective)
    everything = eval_sub.add_parser(
        "all",
        help=f"the full set: {', '.join(FULL_SET)}, then Fig. 10 (seeded and measured curves)",
    )
    everything.add_argument("--out", type=Path, help="default: .run/eval/all-<time>")
    paths.add_config_option(everything)
    everything.set_defaults(func=cmd_all)
