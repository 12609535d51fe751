"""Where `make setup` put things, where running services keep their state, and which config
a command reads.

The checkout is the home of an install (`P4BS_HOME` overrides it): downloads and builds live
in `.cache/`, the local stack's pid files, logs and data in `.run/` (both git-ignored).
An installed package (no checkout) reads its config from `$P4BS_CONFIG` or
`/etc/p4bs/p4bs.toml`: see `deployment_config`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

CONFIG_ENV = "P4BS_CONFIG"
SYSTEM_CONFIG = Path("/etc/p4bs/p4bs.toml")
CONFIG_OPTION_HELP = (
    f"the deployment config; default: ${CONFIG_ENV}, else {SYSTEM_CONFIG}, "
    "else a checkout's config/testbed.toml"
)


class NoConfigFile(Exception):
    """No --config given and no config file where one is looked for; the message names each
    place."""


def home() -> Path:
    override = os.environ.get("P4BS_HOME")
    return Path(override) if override else Path(__file__).resolve().parents[2]


def example_config() -> Path:
    """The checkout's example deployment config (what the tests and the README's commands
    read); an installed package has none."""
    return home() / "config" / "testbed.toml"


def deployment_config() -> Path:
    """The config a command reads when not given --config: the file `$P4BS_CONFIG` names
    (which must exist: a name set on purpose is never passed over), else
    /etc/p4bs/p4bs.toml, else, inside a checkout, its config/testbed.toml. Raises
    NoConfigFile naming every place looked."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        if Path(named).is_file():
            return Path(named)
        raise NoConfigFile(f"${CONFIG_ENV} names {named}, which is not a file")
    looked = [f"--config (not given), ${CONFIG_ENV} (not set)"]
    for place, what in ((SYSTEM_CONFIG, ""), (example_config(), " (a checkout's example)")):
        if place.is_file():
            return place
        looked.append(f"{place}{what}: no such file")
    raise NoConfigFile(
        "no config file; looked at " + "; ".join(looked) + f". Give --config FILE, set "
        f"{CONFIG_ENV}, or install one as {SYSTEM_CONFIG}"
    )


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` on a command; left None when not given, for the command line to
    resolve with `deployment_config` (so that `--help` never needs a config to exist)."""
    parser.add_argument("--config", type=Path, help=CONFIG_OPTION_HELP)
    parser.set_defaults(config_has_default=True)  # (`p4bs analyze`'s own --config has none)


def cache_dir() -> Path:
    return home() / ".cache"


def jars_dir(profile: str) -> Path:
    """JVM jars of one profile of infra/jars/pom.xml: 'kafka' or 'flink'."""
    return cache_dir() / "jars" / profile


def tool(name: str) -> Path:
    """A binary `make setup` built with `go install` (influxd, gnmi_cli)."""
    return cache_dir() / "bin" / name


def built(name: str) -> Path:
    """A binary of the project's own compiled parts (cargo build --release)."""
    return cache_dir() / "target" / "release" / name


def flink_functions_jar() -> Path:
    """The project's Java functions for Flink SQL (streaming-jobs/functions), built by make."""
    return cache_dir() / "build" / "flink-functions" / "p4bs-flink-functions.jar"


def default_state_dir() -> Path:
    override = os.environ.get("P4BS_STATE_DIR")
    return Path(override) if override else home() / ".run" / "stack"
