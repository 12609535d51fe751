"""The `p4bs` command line: one entry point wiring each part's own subcommands."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from p4bs import paths
from p4bs.config import ConfigError, load_config
from p4bs_eval import cli as eval_cli
from p4bs_exporter import cli as exporter_cli
from p4bs_infra import cli as infra_cli
from p4bs_jobs import cli as jobs_cli
from p4bs_loop import cli as loop_cli
from p4bs_optimizer import cli as optimizer_cli


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
    for part in (infra_cli, exporter_cli, jobs_cli, optimizer_cli, eval_cli, loop_cli):
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
