"""`p4bs eval run SCENARIO` and `p4bs eval report RUN_DIR`."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p4bs import paths

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def cmd_run(args: argparse.Namespace) -> int:
    from p4bs_eval.report import write_report
    from p4bs_eval.runner import run_eval
    from p4bs_eval.scenario import ScenarioError, check_policies, load_scenario

    path = args.scenario
    if not path.exists() and (SCENARIOS / f"{path}.toml").exists():
        path = SCENARIOS / f"{path}.toml"
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
    out = args.out or paths.home() / ".run" / "eval" / f"{scenario.name}-{stamp}"
    # Both signals unwind the runs (testbed and stack down) as Ctrl-C does, also when the
    # shell that started the eval in the background left SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        failed = run_eval(scenario, out, args.config)
    except KeyboardInterrupt:
        print(f"p4bs eval: interrupted; the finished runs are in {out}", file=sys.stderr)
        return 130
    print(f"report: {write_report(out)}")
    return 1 if failed else 0


def _config_problem(config_path: Path, link_settings: Mapping[str, Any]) -> str | None:
    """Why the runs could not start, before any run tries (every run would fail alike): the
    config with the scenario's link settings in place does not parse, or the testbeds' router
    agents would have no credentials."""
    from p4bs.config import ConfigError, load_config, parse_config
    from p4bs_infra.testbed import TestbedError, TestbedPlan

    try:
        config = load_config(config_path)
        if link_settings:
            data = tomllib.loads(config_path.read_text())
            for link in data.get("links", []):
                link.update(link_settings)
            config = parse_config(data, f"{config_path} with the scenario's [link]")
        plan = TestbedPlan.from_config(config)
        for secret in (plan.username, plan.password):
            if not secret.resolve():
                return f"the router credential {secret.env or secret.file} is empty"
    except (ConfigError, TestbedError, LookupError) as exc:
        return str(exc)
    return None


def cmd_report(args: argparse.Namespace) -> int:
    from p4bs_eval.report import write_report

    if not (args.run_dir / "results.jsonl").exists():
        print(f"p4bs eval: {args.run_dir} holds no results.jsonl", file=sys.stderr)
        return 2
    print(f"report: {write_report(args.run_dir)}")
    return 0


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


def add_parser(sub: Any, default_config: Path) -> None:
    evaluation = sub.add_parser("eval", help="run the papers' experiments and report them")
    eval_sub = evaluation.add_subparsers(dest="action", required=True)
    run = eval_sub.add_parser("run", help="every run of a scenario, then its report")
    run.add_argument(
        "scenario", type=Path, help=f"a scenario file, or the name of one in {SCENARIOS}"
    )
    run.add_argument("--policies", help="comma-separated, instead of the scenario's")
    run.add_argument("--repeat", type=int, help="runs per point and policy")
    run.add_argument("--out", type=Path, help="default: .run/eval/<scenario>-<time>")
    run.add_argument("--config", type=Path, default=default_config, help="default: %(default)s")
    run.set_defaults(func=cmd_run)
    report = eval_sub.add_parser("report", help="report.md and plots from a run folder")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(func=cmd_report)
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
