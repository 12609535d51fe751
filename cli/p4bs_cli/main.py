"""The `p4bs` command line: one entry point wiring each part's own subcommands."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import KafkaException

from p4bs import paths
from p4bs.config import ConfigError, load_config
from p4bs.links import DEFAULT_LEAD_NS, apply_links, published
from p4bs.units import UnitError, parse_duration_ns
from p4bs_eval import cli as eval_cli
from p4bs_exporter import cli as exporter_cli
from p4bs_infra import cli as infra_cli
from p4bs_jobs import cli as jobs_cli
from p4bs_loop import cli as loop_cli
from p4bs_ops import cli as ops_cli
from p4bs_optimizer import cli as optimizer_cli
from p4bs_sinks import cli as sinks_cli


def cmd_config_check(args: argparse.Namespace) -> int:
    """The config as core reads it, then each link's policy as the optimizer makes it."""
    try:
        config = load_config(args.file)
        problems = optimizer_cli.check_policies(config)
        if problems:
            raise ConfigError(str(args.file), problems)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"{args.file}: ok — {len(config.links)} link(s), {len(config.routers)} router(s), "
        f"{len(config.switches)} switch(es)"
    )
    for link in config.links:
        print(
            f"  {link.id}: {link.capacity_bps / 1e6:g} Mbit/s, policy {link.policy}, "
            f"buffer [{link.min_buffer_bytes}, {link.max_buffer_bytes}] B, "
            f"safe {link.safe_buffer_bytes} B"
        )
    return 0


def cmd_links_apply(args: argparse.Namespace) -> int:
    """The links topic made to say what the config's [[links]] say (core/p4bs/links.py)."""
    try:
        config = load_config(args.config).for_kafka_component("links")
        problems = optimizer_cli.check_policies(config)
        if problems:
            raise ConfigError(str(args.config), problems)
        tables = tomllib.loads(Path(args.config).read_text())["links"]
        changes = apply_links(
            config, tables, prune=args.prune, lead_ns=args.lead, republish=args.republish
        )
    except (ConfigError, KafkaException, RuntimeError) as exc:
        print(f"p4bs links apply: {exc}", file=sys.stderr)
        return 1
    topic = config.kafka.topics["links"]
    for what, ids in (
        ("added", changes.added),
        ("changed", changes.changed),
        ("removed", changes.removed),
    ):
        for link_id in ids:
            print(f"  {what} {link_id}")
    print(
        f"{topic}: {len(changes.added)} added, {len(changes.changed)} changed, "
        f"{len(changes.removed)} removed, {len(changes.unchanged)} unchanged"
        + (" (republished)" if args.republish else "")
        + ("" if args.prune else " (links only the topic has are kept: --prune removes them)")
    )
    at = datetime.fromtimestamp(changes.effective_ns / 1e9, UTC).isoformat(timespec="milliseconds")
    print(f"in effect from {at} (the metrics job's windows from that time on)")
    return 0


def cmd_links_list(args: argparse.Namespace) -> int:
    """The links the topic describes now."""
    try:
        config = load_config(args.config).for_kafka_component("links")
        links = published(config.kafka, dict(config.kafka.topics))
    except (ConfigError, KafkaException) as exc:
        print(f"p4bs links list: {exc}", file=sys.stderr)
        return 1
    for link_id, spec in sorted(links.items()):
        if spec["removed"] and not args.all:
            continue
        policy = json.loads(spec["config"]).get("policy", "?")
        state = "removed" if spec["removed"] else "current"
        print(
            f"  {link_id}: {spec['capacity_bps'] / 1e6:g} Mbit/s, policy {policy}, d-hat "
            f"{spec['max_queue_delay_ns'] / 1e6:g} ms, p-hat {spec['max_loss']:g} ({state})"
        )
    current = sum(not spec["removed"] for spec in links.values())
    print(f"{config.kafka.topics['links']}: {current} links ({len(links) - current} removed)")
    return 0


def duration_ns_arg(text: str) -> int:
    """A command-line duration ("2s", "500ms") in ns."""
    try:
        return parse_duration_ns(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p4bs", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="deployment config files")
    config_sub = config.add_subparsers(dest="action", required=True)
    check = config_sub.add_parser("check", help="validate a config file, listing every problem")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_config_check)

    default_config = paths.default_config()
    links = sub.add_parser("links", help="the links as data: the topic the parts follow")
    links_sub = links.add_subparsers(dest="action", required=True)
    apply = links_sub.add_parser(
        "apply", help="publish the config's links: new and changed ones (--prune: remove others)"
    )
    apply.add_argument("--config", type=Path, default=default_config, help="default: %(default)s")
    apply.add_argument(
        "--prune", action="store_true", help="remove the links the topic has and the config not"
    )
    apply.add_argument(
        "--lead",
        type=duration_ns_arg,
        default=DEFAULT_LEAD_NS,
        help="the changes take effect this long after the command runs, so that every part "
        "has them by then (default 2s)",
    )
    apply.add_argument("--republish", action="store_true", help="publish unchanged links again too")
    apply.set_defaults(func=cmd_links_apply)
    listing = links_sub.add_parser("list", help="the links the topic describes now")
    listing.add_argument("--config", type=Path, default=default_config, help="default: %(default)s")
    listing.add_argument("--all", action="store_true", help="removed links too")
    listing.set_defaults(func=cmd_links_list)

    parts = (
        infra_cli,
        exporter_cli,
        jobs_cli,
        sinks_cli,
        optimizer_cli,
        eval_cli,
        loop_cli,
        ops_cli,
    )
    for part in parts:
        part.add_parser(sub, default_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
