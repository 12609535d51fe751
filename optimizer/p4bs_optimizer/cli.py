"""`p4bs optimizer run`: the optimizer service for the links of a config; `freeze` and
`unfreeze`: stop and allow again every change to the routers (the config's freeze_file)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p4bs import logs, paths
from p4bs.config import Config, ConfigError, load_config
from p4bs.metrics_endpoint import (
    EndpointError,
    MetricsEndpoint,
    add_metrics_address_option,
    serve_metrics,
    with_metrics_address,
)

if TYPE_CHECKING:
    from p4bs_optimizer.service import OptimizerService


METRICS_KEY = "optimizer.metrics_address"


def check_policies(config: Config) -> list[str]:
    """Every link's policy made once with its options, and whether the windows the optimizer
    reads serve it (the optimizer feed thins some links' windows): the problems, one line
    each."""
    from p4bs_optimizer.policies import policy_for
    from p4bs_optimizer.policies.base import PolicyOptionError
    from p4bs_optimizer.service.feed import feed_problem

    problems = []
    for link in config.links:
        try:
            policy_for(link)
        except PolicyOptionError as exc:
            problems.append(f"link {link.id}: {exc}")
        problem = feed_problem(config, link)
        if problem is not None:
            problems.append(problem)
    return problems


def cmd_run(args: argparse.Namespace) -> int:
    from p4bs_optimizer.service import OptimizerService, summary_line

    try:
        config = load_config(args.config).for_kafka_component("optimizer")
        problems = check_policies(config)
        if problems:
            raise ConfigError(str(args.config), problems)
    except ConfigError as exc:
        print(f"p4bs optimizer run: {exc}", file=sys.stderr)
        return 2
    config = with_metrics_address(config, METRICS_KEY, args.metrics_address)
    service = OptimizerService(config, dry_run=args.dry_run, instance=args.instance)
    try:
        endpoint = _start_metrics(service)
    except EndpointError as exc:
        print(f"p4bs optimizer run: {exc}", file=sys.stderr)
        return 2
    topics = config.kafka.topics
    logs.status_line(
        f"optimizer{' (dry run: deciding, not applying)' if service.dry_run else ''}: "
        f"{topics[config.metrics.optimizer_stream]} -> {topics['buffer_decisions']} and the "
        f"routers; group "
        f"{config.optimizer.group} (instance {service.instance}), {len(config.links)} links "
        f"in the config, their state in {topics['optimizer_state']}",
        instance=service.instance,
        dry_run=service.dry_run,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, service.stop)
        ticks = 0

        def progress(s: OptimizerService) -> None:
            nonlocal ticks
            ticks += 1
            if ticks % args.report_every == 0:
                logs.status_line(summary_line(s))

        await service.run(progress)

    try:
        asyncio.run(main())
    finally:
        if endpoint is not None:
            endpoint.stop()
    logs.status_line(f"optimizer stopped: {summary_line(service)}")
    return 0


def _start_metrics(service: OptimizerService) -> MetricsEndpoint | None:
    """The process's Prometheus endpoint ([optimizer] metrics_address or --metrics-address),
    said on stdout; None when the address is ""."""
    from p4bs_optimizer.service.metrics import OptimizerCollector

    endpoint = serve_metrics(service.config, METRICS_KEY, OptimizerCollector(service))
    if endpoint is not None:
        logs.status_line(f"optimizer metrics on {endpoint.url}", metrics_url=endpoint.url)
    return endpoint


def _freeze_file(args: argparse.Namespace, command: str) -> Path | None:
    """The config's freeze file, or None (said on stderr) when the config does not load."""
    try:
        return Path(load_config(args.config).optimizer.freeze_file)
    except ConfigError as exc:
        print(f"p4bs optimizer {command}: {exc}", file=sys.stderr)
        return None


def cmd_freeze(args: argparse.Namespace) -> int:
    """Writes the config's freeze file: no optimizer using it writes to a router until
    `unfreeze` (each checks it before every change)."""
    from p4bs_optimizer.service.guards import freeze

    path = _freeze_file(args, "freeze")
    if path is None:
        return 2
    print(f"{path}: {freeze(path, args.reason)}; no change reaches a router until unfreeze")
    return 0


def cmd_unfreeze(args: argparse.Namespace) -> int:
    from p4bs_optimizer.service.guards import unfreeze

    path = _freeze_file(args, "unfreeze")
    if path is None:
        return 2
    if unfreeze(path):
        print(f"{path}: removed; changes are applied again")
    else:
        print(f"{path}: not there; changes were not frozen")
    return 0


def add_parser(sub: Any) -> None:
    optimizer = sub.add_parser("optimizer", help="decide and apply buffer sizes")
    optimizer_sub = optimizer.add_subparsers(dest="action", required=True)
    run = optimizer_sub.add_parser("run", help="the optimizer service, until Ctrl-C")
    paths.add_config_option(run)
    run.add_argument("--dry-run", action="store_true", help="decide and record, apply nothing")
    run.add_argument(
        "--instance",
        help="this process's name in the group, unique to it (its Kafka transactional id); "
        "default: <group>-<host>-<pid>-<nonce>",
    )
    run.add_argument("--report-every", type=int, default=10, help="seconds between progress lines")
    add_metrics_address_option(run, METRICS_KEY)  # a second process on a host: its own port
    logs.add_log_format_option(run)
    run.set_defaults(func=cmd_run)
    frozen = optimizer_sub.add_parser(
        "freeze", help="stop every change to the routers at once (the config's freeze_file)"
    )
    paths.add_config_option(frozen)
    frozen.add_argument("--reason", required=True, help="why, recorded with each held decision")
    frozen.set_defaults(func=cmd_freeze)
    thawed = optimizer_sub.add_parser("unfreeze", help="let changes reach the routers again")
    paths.add_config_option(thawed)
    thawed.set_defaults(func=cmd_unfreeze)
