"""The `p4bs` command line: one entry point wiring each part's own subcommands.

A part's module is imported only when one of its commands runs (or for `p4bs --help`), so a
host that installed one extra (`pip install 'p4bs[optimizer]'`) runs that part's commands,
and another part's command tells which extra it needs. `p4bs --version` imports nothing of
the project's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from p4bs import logs, paths


@dataclass(frozen=True)
class Part:
    """A part's command-line module (its `add_parser(sub)` adds `commands`) and the extra of
    pyproject.toml a host installs to run them (None: the base install has what it needs)."""

    module: str
    extra: str | None
    commands: tuple[str, ...]


PARTS = (
    Part("p4bs_infra.cli", "testbed", ("stack", "testbed")),
    Part("p4bs_exporter.cli", None, ("analyze", "exporter")),
    Part("p4bs_jobs.cli", "jobs", ("jobs",)),
    Part("p4bs_sinks.cli", None, ("sinks",)),
    Part("p4bs_optimizer.cli", "optimizer", ("optimizer",)),
    Part("p4bs_eval.cli", "eval", ("eval",)),
    Part("p4bs_loop.cli", "loop", ("demo", "chaos")),
    Part("p4bs_ops.cli", "ops", ("status", "dashboard")),
)
# `config check` and `links apply|list` (here) ask the optimizer about each link's policy.
POLICY_CHECK = Part("p4bs_optimizer.cli", "optimizer", ("config", "links"))


class MissingExtra(Exception):
    """A part's module needs a package this install lacks; the message names the extra."""


def load(part: Part) -> ModuleType:
    """The part's command-line module, or MissingExtra when a package it imports is not
    installed."""
    try:
        return importlib.import_module(part.module)
    except ModuleNotFoundError as exc:
        raise missing_extra(part, exc) from exc


def missing_extra(part: Part, exc: ModuleNotFoundError) -> MissingExtra:
    """What to install for `part` when importing `exc.name` failed; a missing module of the
    project's own is a broken install, raised as it is."""
    if exc.name is None or exc.name.split(".")[0].startswith("p4bs"):
        raise exc
    extra = f"p4bs[{part.extra}]" if part.extra else "p4bs"
    return MissingExtra(
        f"p4bs {'/'.join(part.commands)} needs the Python package {exc.name!r}, which this "
        f"install lacks: install the {part.extra or 'base'} dependencies "
        f"(pip install '{extra}', with hashes: see README.md, Installing)"
    )


def version_text() -> str:
    """The installed package's version, and the commit when running from a git checkout."""
    import importlib.metadata
    import subprocess

    try:
        version = importlib.metadata.version("p4bs")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    home = paths.home()
    if not (home / ".git").exists():  # an installed package: no checkout around it
        return f"p4bs {version}"
    try:
        commit = subprocess.run(
            ["git", "-C", str(home), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"p4bs {version}"
    return f"p4bs {version} (git {commit})"


class VersionAction(argparse.Action):
    """`--version`: `version_text` when asked for (git runs only then), then exit 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs=0, help="the version, and the git commit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def cmd_config_check(args: argparse.Namespace) -> int:
    """The config as core reads it, then each link's policy as the optimizer makes it."""
    from p4bs.config import ConfigError, load_config

    optimizer_cli = load(POLICY_CHECK)
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
    import tomllib
    from datetime import UTC, datetime

    from confluent_kafka import KafkaException

    from p4bs.config import ConfigError, load_config
    from p4bs.links import DEFAULT_LEAD_NS, apply_links

    optimizer_cli = load(POLICY_CHECK)
    try:
        config = load_config(args.config).for_kafka_component("links")
        problems = optimizer_cli.check_policies(config)
        if problems:
            raise ConfigError(str(args.config), problems)
        tables = tomllib.loads(Path(args.config).read_text())["links"]
        changes = apply_links(
            config,
            tables,
            prune=args.prune,
            lead_ns=DEFAULT_LEAD_NS if args.lead is None else args.lead,
            republish=args.republish,
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
    import json

    from confluent_kafka import KafkaException

    from p4bs.config import ConfigError, load_config
    from p4bs.links import published

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
    from p4bs.units import UnitError, parse_duration_ns

    try:
        return parse_duration_ns(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_parser(command: str | None = None, with_parts: bool = True) -> argparse.ArgumentParser:
    """The command line with the parts of `command` loaded: the one part owning it, none for
    the commands owned here or without `with_parts`, every part when None or unknown
    (`p4bs --help`: a part whose packages are missing is listed with the extra it needs).
    Raises MissingExtra when the part owning `command` cannot be loaded."""
    parser = argparse.ArgumentParser(prog="p4bs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="deployment config files")
    config_sub = config.add_subparsers(dest="action", required=True)
    check = config_sub.add_parser("check", help="validate a config file, listing every problem")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_config_check)

    links = sub.add_parser("links", help="the links as data: the topic the parts follow")
    links_sub = links.add_subparsers(dest="action", required=True)
    apply = links_sub.add_parser(
        "apply", help="publish the config's links: new and changed ones (--prune: remove others)"
    )
    paths.add_config_option(apply)
    apply.add_argument(
        "--prune", action="store_true", help="remove the links the topic has and the config not"
    )
    apply.add_argument(
        "--lead",
        type=duration_ns_arg,
        help="the changes take effect this long after the command runs, so that every part "
        "has them by then (default 2s)",
    )
    apply.add_argument("--republish", action="store_true", help="publish unchanged links again too")
    apply.set_defaults(func=cmd_links_apply)
    listing = links_sub.add_parser("list", help="the links the topic describes now")
    paths.add_config_option(listing)
    listing.add_argument("--all", action="store_true", help="removed links too")
    listing.set_defaults(func=cmd_links_list)

    owning = [part for part in PARTS if command in part.commands]
    if command in POLICY_CHECK.commands or not with_parts:
        return parser
    for part in owning or PARTS:
        try:
            module = load(part)
        except MissingExtra:
            if owning:
                raise
            for name in part.commands:
                sub.add_parser(name, help=f"(not installed: needs the [{part.extra}] extra)")
            continue
        module.add_parser(sub)
    return parser


def command_word(argv: list[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = command_word(argv)
    try:
        parser = build_parser(command, with_parts=command is not None or "--version" not in argv)
    except MissingExtra as exc:
        print(f"p4bs: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    service = " ".join(filter(None, ["p4bs", args.command, getattr(args, "action", None)]))
    logs.configure(getattr(args, "log_format", logs.TEXT), verbose=args.verbose, service=service)
    if getattr(args, "config_has_default", False) and args.config is None:
        try:
            args.config = paths.deployment_config()
        except paths.NoConfigFile as exc:
            print(f"p4bs {args.command}: {exc}", file=sys.stderr)
            return 2
    try:
        code: int = args.func(args)
    except MissingExtra as exc:
        print(f"p4bs: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a part imports its heavy modules when its command runs
        owner = next(p for p in (*PARTS, POLICY_CHECK) if args.command in p.commands)
        print(f"p4bs: {missing_extra(owner, exc)}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
