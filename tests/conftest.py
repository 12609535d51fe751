"""Fixtures that start the real Kafka broker and InfluxDB with the project's own stack code."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from p4bs.bus import ensure_topics
from p4bs_infra.procs import free_ports
from p4bs_infra.stack import Stack, StackSettings
from p4bs_schemas.registry import STREAMS


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    kafka, controller, influx, rpc = free_ports(4)
    settings = StackSettings(
        state_dir=tmp_path_factory.mktemp("stack"),
        kafka_port=kafka,
        kafka_controller_port=controller,
        influx_port=influx,
        influx_rpc_port=rpc,
        database="p4bs_test",
        retention_ns=48 * 3600 * 10**9,
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
    ensure_topics(stack.kafka.bootstrap, names.values(), partitions=2, replication_factor=1)
    return names


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[1]
