"""`p4bs optimizer run` against a simulated link (tests/simlink.py) whose metrics follow the
buffer the real router agent holds: decisions applied over gNMI and read back, recorded on
the decisions topic, the safety guards, and resuming after a kill."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from simlink import LinkModel, SimulatedLink
from test_agent import _kernel_limit

from p4bs import paths
from p4bs.bus import RecordConsumer, RecordProducer
from p4bs.config import Config, load_config
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import Testbed, TestbedPlan

C_BYTES_PER_S = 100_000_000 / 8


@pytest.fixture(scope="module")
def testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    built = Testbed(unique_plan())
    built.up()
    yield built
    built.down()


def write_config(
    directory: Path,
    bootstrap: str,
    topics: dict[str, str],
    testbed: Testbed,
    policy: str,
    options: str = "{}",
) -> Path:
    """The example config on the test's broker, topics and testbed router, with `policy`,
    a 1 s stale limit and changes at least 0.3 s apart."""
    text = (paths.home() / "config" / "testbed.toml").read_text()
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    plan = testbed.plan
    replacements = {
        r"^bootstrap = .*$": f'bootstrap = "{bootstrap}"\ntopics = {{ {table} }}',
        r"^address = .*$": (
            f'address = "{plan.router_address}:{plan.gnmi_port}"\n'
            f'ca_file = "{testbed.pki / "ca.pem"}"'
        ),
        r"^policy = .*$": f'policy = "{policy}"\npolicy_options = {options}',
        r"^group = .*$": f'group = "optimizer-{uuid.uuid4().hex[:8]}"\nstate_dir = '
        f'"{directory / "state"}"',
        r"^stale_after = .*$": 'stale_after = "1s"',
        r"^min_change_interval = .*$": 'min_change_interval = "300ms"',
    }
    for pattern, value in replacements.items():
        text, n = re.subn(pattern, value, text, count=1, flags=re.M)
        assert n == 1, pattern
    path = directory / "config.toml"
    path.write_text(text)
    return path


@contextmanager
def optimizer(config_path: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    log = config_path.with_name(f"optimizer-{uuid.uuid4().hex[:6]}.log")
    argv = [sys.executable, "-m", "p4bs.cli", "optimizer", "run", "--config", str(config_path)]
    with log.open("wb") as out:
        proc = subprocess.Popen([*argv, "--report-every", "1", *extra], stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(log.read_text()[-3000:])


class Decisions:
    """The decisions topic, read as the optimizer writes it."""

    def __init__(self, config: Config) -> None:
        self.consumer = RecordConsumer(
            config.kafka.bootstrap,
            f"reader-{uuid.uuid4().hex[:6]}",
            ["buffer_decisions"],
            config.kafka.topics,
        )
        self.records: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        while (received := self.consumer.poll(0.1)) is not None:
            self.records.append(received.record)
        return self.records

    def until(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> None:
        if not wait_until(lambda: predicate(self.read()), timeout_s):
            raise AssertionError(f"decisions so far: {self.records}")


@pytest.fixture
def setup(
    stack: Stack, topics: dict[str, str], testbed: Testbed, tmp_path: Path
) -> Callable[..., tuple[Config, Path, SimulatedLink, Decisions]]:
    made: list[tuple[SimulatedLink, Decisions]] = []

    def make(policy: str, options: str = "{}") -> tuple[Config, Path, SimulatedLink, Decisions]:
        path = write_config(tmp_path, stack.kafka.bootstrap, topics, testbed, policy, options)
        config = load_config(path)
        producer = RecordProducer(config.kafka.bootstrap, topics, client_id="simlink")
        link = SimulatedLink(config.links[0], producer, lambda: _kernel_limit(testbed))
        decisions = Decisions(config)
        made.append((link, decisions))
        return config, path, link, decisions

    yield make
    for _, decisions in made:
        decisions.consumer.close()


def _applied(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["outcome"] == "applied"]


def test_globecom_converges_on_the_router_and_records_every_change(
    setup: Callable[..., Any], testbed: Testbed
) -> None:
    """Stanford on SRTT and N, with SRTT = base + buffer / C, has the fixed point
    B = C·base/√N / (1 - 1/√N); GLOBECOM stops within gamma (10%) of it."""
    config, path, link, decisions = setup("globecom")
    start = _kernel_limit(testbed)
    n = LinkModel().long_flows
    fixed_point = C_BYTES_PER_S * 0.020 / n**0.5 / (1 - 1 / n**0.5)
    with link, optimizer(path):

        def settled(records: list[dict[str, Any]]) -> bool:
            applied = _applied(records)
            return bool(applied) and abs(applied[-1]["buffer_bytes"] / fixed_point - 1) < 0.12

        decisions.until(settled, 60)
        applied = _applied(decisions.records)
        assert _kernel_limit(testbed) == applied[-1]["buffer_bytes"]  # read back, in force
    assert applied[0]["previous_buffer_bytes"] == start  # read from the router first
    for before, after in itertools.pairwise(applied):
        assert after["previous_buffer_bytes"] == before["buffer_bytes"]
        assert after["ts_ns"] - before["ts_ns"] >= 300_000_000  # the minimum interval
    assert all(r["policy"] == "globecom" and r["phase"] == "recompute" for r in applied)
    low, high = config.links[0].min_buffer_bytes, config.links[0].max_buffer_bytes
    assert all(low <= r["buffer_bytes"] <= high for r in decisions.records)


def test_stale_metrics_fall_back_to_the_safe_buffer_and_the_policy_returns(
    setup: Callable[..., Any], testbed: Testbed
) -> None:
    config, path, link, decisions = setup("static", '{ buffer = "64KiB" }')
    safe = config.links[0].safe_buffer_bytes
    with link, optimizer(path):
        decisions.until(lambda r: any(d["buffer_bytes"] == 65_536 for d in _applied(r)), 60)
        assert _kernel_limit(testbed) == 65_536
        link.paused.set()
        decisions.until(lambda r: r[-1]["phase"] == "fallback", 10)
        assert _applied(decisions.records)[-1]["buffer_bytes"] == safe
        assert _kernel_limit(testbed) == safe
        assert "no link metrics for" in decisions.records[-1]["reason"]
        link.paused.clear()
        decisions.until(lambda r: r[-1]["phase"] == "resume", 10)
        assert _kernel_limit(testbed) == 65_536


def test_dry_run_decides_and_records_but_changes_nothing(
    setup: Callable[..., Any], testbed: Testbed
) -> None:
    _, path, link, decisions = setup("static", '{ buffer = "96KiB" }')
    before = _kernel_limit(testbed)
    with link, optimizer(path, "--dry-run"):
        decisions.until(lambda r: any(d["outcome"] == "dry_run" for d in r), 60)
    assert _kernel_limit(testbed) == before != 96 * 1024
    assert {d["outcome"] for d in decisions.records} == {"dry_run"}
