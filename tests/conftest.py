"""Fixtures that start the real Kafka broker and InfluxDB with the project's own stack code;
`secured` (secured_stack.py), the TLS + SCRAM broker with a user per component, is shared
from here by the system tests that need it (one conftest for all of tests/: a second one
named conftest in a folder would shadow this one for the modules that import from it)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from secured_stack import secured

from p4bs import paths
from p4bs.bus import ensure_topics
from p4bs.config import load_config
from p4bs_infra.services import InfluxDB
from p4bs_infra.stack import Stack, StackSettings
from p4bs_infra.testbed import Testbed, TestbedPlan
from p4bs_schemas.registry import STREAMS


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = StackSettings.on_free_ports(
        tmp_path_factory.mktemp("stack"), database="p4bs_test", retention_ns=48 * 3600 * 10**9
    )
    running = Stack(settings)
    running.up(timeout_s=90, progress=lambda _: None)
    yield running
    running.down()


_topic_numbers = itertools.count()


@pytest.fixture
def topics(stack: Stack) -> dict[str, str]:
    """A fresh topic per stream for one test, so tests never see each other's records."""
    run = f"t{next(_topic_numbers)}-{uuid.uuid4().hex[:6]}"
    names = {stream: f"{run}.{stream}" for stream in STREAMS}
    ensure_topics(stack.kafka.bootstrap, names, partitions=2, replication_factor=1)
    return names


@pytest.fixture
def influx_database(stack: Stack, tmp_path: Path) -> InfluxDB:
    """A database of one test's own on the session's InfluxDB (made, with the stack's
    retention policies), so tests never read each other's points."""
    settings = dataclasses.replace(stack.influxdb.settings, database=f"t_{uuid.uuid4().hex[:8]}")
    influx = InfluxDB(tmp_path / "influx", stack.influxdb.port, stack.influxdb.rpc_port, settings)
    influx.create_database()
    return influx


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[1]


ROUTER_USER, ROUTER_PASSWORD = "p4bs-test", "not-a-real-secret-42"


@pytest.fixture(scope="session")
def router_credentials() -> Iterator[tuple[str, str]]:
    """The credentials the example config names by reference ($P4BS_ROUTER_*), for tests."""
    patch = pytest.MonkeyPatch()
    patch.setenv("P4BS_ROUTER_USER", ROUTER_USER)
    patch.setenv("P4BS_ROUTER_PASSWORD", ROUTER_PASSWORD)
    yield ROUTER_USER, ROUTER_PASSWORD
    patch.undo()


@pytest.fixture(scope="session")
def unique_plan(
    router_credentials: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., TestbedPlan]:
    """The example testbed under a fresh name and management /30, so tests never collide
    with each other or with a testbed a developer has up."""

    def make(**changes: object) -> TestbedPlan:
        plan = TestbedPlan.from_config(load_config(paths.example_config()))
        name = f"t{uuid.uuid4().hex[:6]}"
        block = random.randrange(1, 16_000)  # a /30 in 10.204.0.0/16
        address = f"10.204.{block // 64}.{(block % 64) * 4 + 2}"
        state = tmp_path_factory.mktemp(name)
        return dataclasses.replace(
            plan, name=name, state_dir=state, router_address=address, **changes
        )

    return make


@pytest.fixture(scope="module")
def testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """The example testbed under a fresh name, shared by one test module."""
    built = Testbed(unique_plan())
    built.up()
    yield built
    built.down()


__all__ = ["secured"]
