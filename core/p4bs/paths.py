"""Where `make setup` put things and where running services keep their state.

The checkout is the home of an install (`P4BS_HOME` overrides it): downloads and builds live
in `.cache/`, the local stack's pid files, logs and data in `.run/` (both git-ignored).
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    override = os.environ.get("P4BS_HOME")
    return Path(override) if override else Path(__file__).resolve().parents[2]


def default_config() -> Path:
    """The example deployment config, which every command reads unless given --config."""
    return home() / "config" / "testbed.toml"


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
