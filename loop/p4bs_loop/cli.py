"""`p4bs demo`: the whole system on this machine, live, with a report; `p4bs chaos run`: the
loop through a fault of each of its parts, checked and costed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from p4bs import paths
from p4bs.config import ConfigError
from p4bs_infra.services import StackError
from p4bs_infra.testbed import TestbedError
from p4bs_loop.closed_loop import ClosedLoopError
from p4bs_optimizer.policies import POLICIES


def _flow_groups(text: str) -> tuple[int, ...]:
    try:
        groups = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"flows per group, comma separated: {text!r}") from None
    if not groups or min(groups) < 1:
        raise argparse.ArgumentTypeError(f"each group needs at least one flow: {text!r}")
    return groups


def cmd_demo(args: argparse.Namespace) -> int:
    from p4bs_loop.demo import DemoSettings, default_out, run_demo

    if args.every * (len(args.groups) - 1) >= args.duration:
        print("p4bs demo: the last group would join after the traffic ends", file=sys.stderr)
        return 2
    try:
        return run_demo(
            DemoSettings(
                config=args.config,
                out=args.out or default_out(),
                policy=args.policy,
                groups=args.groups,
                every_s=args.every,
                duration_s=args.duration,
                initial_buffer_ms=args.initial_buffer_ms,
            )
        )
    except (ConfigError, StackError, TestbedError, ClosedLoopError) as exc:
        print(f"p4bs demo: {exc}", file=sys.stderr)
        return 1


def cmd_chaos_run(args: argparse.Namespace) -> int:
    from p4bs_loop.chaos import ChaosPlan, chaos_run, default_out, failed_checks, summary

    try:
        plan = ChaosPlan(
            flows=args.flows,
            duration_s=args.duration,
            first_fault_s=args.first_fault,
            fault_every_s=args.every,
            down_s=args.down,
        )
    except ValueError as exc:
        print(f"p4bs chaos run: {exc}", file=sys.stderr)
        return 2
    out = args.out or default_out()
    try:
        report = chaos_run(args.config, out, plan)
    except (ConfigError, StackError, TestbedError, ClosedLoopError) as exc:
        print(f"p4bs chaos run: {exc}", file=sys.stderr)
        return 1
    print(summary(report))
    print(f"report: {out / 'report.json'}")
    return 1 if failed_checks(report) else 0


def add_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="the whole system on this machine, live, with a report; torn down after"
    )
    paths.add_config_option(demo)
    demo.add_argument("--policy", default="p4bs", choices=POLICIES, help="default: %(default)s")
    demo.add_argument(
        "--groups", type=_flow_groups, default=(10, 20, 20), help="Cubic flows per group (10,20,20)"
    )
    demo.add_argument("--every", type=float, default=60.0, help="s between groups (60)")
    demo.add_argument("--duration", type=float, default=180.0, help="s of traffic (180)")
    demo.add_argument(
        "--initial-buffer-ms", type=float, default=200.0, help="router buffer at start (200)"
    )
    demo.add_argument("--out", type=Path, help="default: .run/demo/<date-time>")
    demo.set_defaults(func=cmd_demo)

    chaos = sub.add_parser("chaos", help="the loop through a fault of each of its parts")
    chaos_sub = chaos.add_subparsers(dest="action", required=True)
    run = chaos_sub.add_parser(
        "run",
        help="kill (SIGKILL) and restart the exporter, a Kafka node, a TaskManager, an "
        "optimizer instance and the router agent during one closed-loop run; check and cost it",
    )
    paths.add_config_option(run)
    run.add_argument("--flows", type=int, default=20, help="Cubic flows (20)")
    run.add_argument("--duration", type=float, default=150.0, help="s of traffic (150)")
    run.add_argument("--first-fault", type=float, default=30.0, help="s into it (30)")
    run.add_argument("--every", type=float, default=20.0, help="s between faults (20)")
    run.add_argument("--down", type=float, default=5.0, help="s a killed part stays down (5)")
    run.add_argument("--out", type=Path, help="default: .run/chaos/<date-time>")
    run.set_defaults(func=cmd_chaos_run)
