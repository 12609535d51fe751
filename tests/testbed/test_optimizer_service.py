"""`p4bs optimizer run` against a simulated link (tests/simlink.py) whose metrics follow the
buffer the real router agent holds: decisions applied over gNMI and read back, recorded on
the decisions topic, the safety guards, a value the router rejects, and resuming a P4BS
search after a kill. Also, in process: a policy whose decide blocks (P4BS fitting its GP)
decides in the decide thread, in order, while the other links go on."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from optimizerproc import Decisions, children_of, optimizer
from simlink import WINDOW_NS, LinkModel, SimulatedLink
from test_agent import _bind, _gnmi, _kernel_limit

from p4bs import paths
from p4bs.bus import RecordProducer
from p4bs.config import Config, LinkConfig, load_config
from p4bs_infra.procs import alive, wait_until
from p4bs_infra.stack import Stack
from p4bs_infra.testbed import Testbed
from p4bs_optimizer import changelog
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.service import OptimizerService

C_BYTES_PER_S = 100_000_000 / 8


def write_config(
    directory: Path,
    bootstrap: str,
    topics: dict[str, str],
    testbed: Testbed,
    policy: str,
    options: str = "{}",
    buffer: str | None = None,
) -> Path:
    """The example config on the test's broker, topics and testbed router, with `policy`,
    a 1 s stale limit and changes at least 0.3 s apart; `buffer` replaces the link's buffer
    table (TOML)."""
    text = (paths.example_config()).read_text()
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    plan = testbed.plan
    replacements = {
        r"^bootstrap = .*$": f'bootstrap = "{bootstrap}"\ntopics = {{ {table} }}',
        r"^address = .*$": (
            f'address = "{plan.router_address}:{plan.gnmi_port}"\n'
            f'ca_file = "{testbed.pki / "ca.pem"}"'
        ),
        r"^policy = .*$": f'policy = "{policy}"\npolicy_options = {options}',
        r"^group = .*$": f'group = "optimizer-{uuid.uuid4().hex[:8]}"',
        r"^stale_after = .*$": 'stale_after = "1s"',
        r"^min_change_interval = .*$": 'min_change_interval = "300ms"',
    }
    if buffer is not None:
        replacements[r"^buffer = \{.*$"] = f"buffer = {buffer}"
    for pattern, value in replacements.items():
        text, n = re.subn(pattern, value, text, count=1, flags=re.M)
        assert n == 1, pattern
    path = directory / "config.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module", autouse=True)
def bound_profile(testbed: Testbed) -> None:
    """The router as p4bs leaves it after its first change, whose buffer the service reads
    when it takes the link: the gNMI driver's profile p4bs-eth1 bound to eth1's output (on a
    router it never changed, no profile is bound and the buffer in force cannot be read)."""
    with _gnmi(testbed) as client:
        _bind(client, testbed.plan.buffer_bytes)


@pytest.fixture
def setup(
    stack: Stack, topics: dict[str, str], testbed: Testbed, tmp_path: Path
) -> Callable[..., tuple[Config, Path, SimulatedLink, Decisions]]:
    made: list[tuple[SimulatedLink, Decisions]] = []

    def make(
        policy: str,
        options: str = "{}",
        *,
        buffer: str | None = None,
        model: LinkModel | None = None,
    ) -> tuple[Config, Path, SimulatedLink, Decisions]:
        bootstrap = stack.kafka.bootstrap
        path = write_config(tmp_path, bootstrap, topics, testbed, policy, options, buffer)
        config = load_config(path)
        producer = RecordProducer(config.kafka.bootstrap, topics, client_id="simlink")
        link = SimulatedLink(config.links[0], producer, lambda: _kernel_limit(testbed), model)
        decisions = Decisions(config)
        made.append((link, decisions))
        return config, path, link, decisions

    yield make
    for _, decisions in made:
        decisions.close()


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


def test_a_value_the_router_rejects_is_recorded_as_failed_and_the_service_goes_on(
    setup: Callable[..., Any], testbed: Testbed
) -> None:
    """A static 300 MiB, within the link's bounds (max raised to 512 MiB) but above the
    256 MiB the router agent accepts (its --max-buffer-bytes default): a `failed` record
    with the agent's reason, nothing changed on the router, and the service goes on: the
    stale-metrics fallback is applied after it, and the policy's value fails again after."""
    asked, agent_max = 300 * 2**20, 256 * 2**20
    config, path, link, decisions = setup(
        "static",
        '{ buffer = "300MiB" }',
        buffer='{ min = "32KiB", max = "512MiB", safe = "48KiB" }',
    )
    safe = config.links[0].safe_buffer_bytes
    before = _kernel_limit(testbed)
    assert before != safe  # or the fallback below could not show that it was applied
    with link, optimizer(path) as process:
        decisions.until(lambda r: any(d["outcome"] == "failed" for d in r), 60)
        (failed,) = decisions.records
        assert (failed["phase"], failed["buffer_bytes"]) == ("static", asked)
        assert failed["previous_buffer_bytes"] == before  # read from the router
        assert "rejected" in failed["reason"]
        assert f"{asked} B is outside [1514, {agent_max}] B" in failed["reason"]
        assert _kernel_limit(testbed) == before

        link.paused.set()
        decisions.until(lambda r: r[-1]["phase"] == "fallback", 10)
        fallback = decisions.records[-1]
        assert (fallback["outcome"], fallback["buffer_bytes"]) == ("applied", safe)
        assert fallback["previous_buffer_bytes"] == before
        assert _kernel_limit(testbed) == safe
        link.paused.clear()
        decisions.until(lambda r: r[-1]["phase"] == "resume", 10)
        resumed = decisions.records[-1]
        assert (resumed["outcome"], resumed["buffer_bytes"]) == ("failed", asked)
        assert f"outside [1514, {agent_max}] B" in resumed["reason"]
        assert _kernel_limit(testbed) == safe
        assert process.poll() is None


def test_a_killed_optimizer_resumes_its_p4bs_search_from_saved_state(
    setup: Callable[..., Any], testbed: Testbed, tmp_path: Path
) -> None:
    """P4BS on a link whose f = -(2.5 exp(-B / 20 kB) + 0.5 B / 125 kB) (+ noise 0.01) peaks
    at ~69 kB, inside its bounds [C·RTT_min/√N, C·d_hat] = [35 kB, 125 kB]. Killed (SIGKILL)
    during its second trial and started again with the same config, it goes on from its
    saved state: no new bound search, the trials numbered on from where they were, settled
    on a buffer better than either bound, in force on the router. The search is the
    continuous one, capped at C·d_hat as the options say; ei_stop 0 makes it take all 5
    trials, however the noise falls. (The restarted process gets the link's partition once
    Kafka drops the killed member of the group, after its session timeout of 6 s.)"""
    model = LinkModel(loss_scale_bytes=20_000, f_noise=0.01)
    options = (
        '{ settle_ns = "500ms", settle_per_buffer = 0, measure_ns = "1s", max_trials = 5, '
        'ei_stop = 0.0, search_max_ns = "10ms", high_loss = 1, grid_step_ns = 0, '
        "warm_start = true }"
    )
    config, path, link, decisions = setup("p4bs", options, model=model)
    assert config.links[0].max_queue_delay_ns == 10_000_000  # search_max = C·d_hat
    spec = config.links[0]
    bounds = (
        round(C_BYTES_PER_S * model.base_rtt_ns / 1e9 / math.sqrt(model.long_flows)),
        round(C_BYTES_PER_S * spec.max_queue_delay_ns / 1e9),
    )
    restarted_log = tmp_path / "restarted.log"

    def optimising(trial: int) -> Callable[[list[dict[str, Any]]], bool]:
        return lambda records: any(
            d["phase"] == "optimise" and d["trial"] >= trial and d["outcome"] == "applied"
            for d in records
        )

    with link:
        with optimizer(path) as first:
            decisions.until(optimising(2), 120)
            fit_processes = children_of(first.pid)  # and the pool's resource tracker
            assert fit_processes
            first.send_signal(signal.SIGKILL)  # no chance to save anything more
            first.wait(10)
        killed_ns = time.time_ns()
        # The killed service's fit processes end with it.
        assert wait_until(lambda: not any(alive(p) for p in fit_processes), 15), [
            p for p in fit_processes if alive(p)
        ]
        with optimizer(path, log=restarted_log):
            decisions.until(
                lambda r: any(d["ts_ns"] > killed_ns and d["phase"] == "settled" for d in r), 240
            )
            (settled,) = [d for d in decisions.records if d["phase"] == "settled"]
            assert settled["outcome"] == "applied"
            assert _kernel_limit(testbed) == settled["buffer_bytes"]

    before = [d for d in decisions.records if d["ts_ns"] < killed_ns]
    after = [d for d in decisions.records if d["ts_ns"] > killed_ns]
    assert before[0]["phase"] == "bound_search"
    assert before[0]["buffer_bytes"] == bounds[1]  # the BDP, capped at C·d_hat
    tried_before = [d["trial"] for d in before if d["phase"] == "optimise"]
    tried_after = [d["trial"] for d in after if d["phase"] == "optimise"]
    assert {1, 2} <= set(tried_before)
    assert not any(d["phase"] == "bound_search" for d in after)  # no new search
    assert tried_after == sorted(tried_after) and min(tried_after) >= max(tried_before)
    assert sorted(set(tried_before + tried_after)) == [1, 2, 3, 4, 5]
    assert "resumed p4bs from its changelog" in restarted_log.read_text()
    assert bounds[0] < settled["buffer_bytes"] < bounds[1]
    best_bound = max(model.f(spec, b) for b in bounds)
    assert model.f(spec, settled["buffer_bytes"]) > best_bound


async def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    """Polls `condition` on the loop (the service under test runs on it) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


class GatedPolicy(Policy):
    """Stands in for P4BS fitting its GP: `decide` waits until `gate` is set, noting each
    window's end and the thread it ran in; a decision for every window. `snapshot` notes
    when it is called while a decide runs (it must never be)."""

    name = "gated"

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.deciding = False
        self.seen: list[tuple[int, str]] = []
        self.snapshots_while_deciding = 0

    def decide(self, window: Window) -> list[Decision]:
        self.deciding = True
        self.entered.set()
        assert self.gate.wait(30)
        self.seen.append((window.window_end_ns, threading.current_thread().name))
        self.deciding = False
        return [Decision(self.link.min_buffer_bytes + len(self.seen), "gated", "test")]

    def snapshot(self) -> dict[str, Any]:
        self.snapshots_while_deciding += self.deciding
        return {"seen": len(self.seen)}


def test_a_blocking_policy_decides_in_its_thread_in_order_while_other_links_go_on(
    stack: Stack,
    topics: dict[str, str],
    testbed: Testbed,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two links in one service (in this process, dry run, windows through Kafka): a P4BS
    link searching on log(buffer) (Ax: its fits take 0.1-0.3 s, so it decides off the loop)
    whose decide blocks, and a GLOBECOM one. While the P4BS link's decide is held, its later
    windows wait and the GLOBECOM link's window is decided and recorded; once released, the
    P4BS windows are decided in the decide thread, in arrival order, each once, and only then
    does the saved state cover them. A P4BS link with the default grid search (fits of a few
    ms) decides on the loop, its fit warmed up before the first window."""
    path = write_config(tmp_path, stack.kafka.bootstrap, topics, testbed, "p4bs")
    base = load_config(path)
    slow_link = dataclasses.replace(base.links[0], policy_options={"grid_step_ns": 0})
    fast_link = dataclasses.replace(base.links[0], interface="eth2", policy="globecom")
    grid_link = dataclasses.replace(base.links[0], interface="eth3")
    # No fallback while the consumer joins: the controller exists before its first window.
    patient = dataclasses.replace(base.optimizer, stale_after_ns=600_000_000_000)
    config = dataclasses.replace(base, links=[slow_link, fast_link, grid_link], optimizer=patient)
    model = LinkModel()
    ends = [(time.time_ns() // WINDOW_NS + i) * WINDOW_NS for i in range(1, 6)]
    producer = RecordProducer(config.kafka.bootstrap, topics, client_id="windows")

    def send(link: LinkConfig, end_ns: int) -> None:
        producer.produce("link_metrics", model.window(link, 100_000, end_ns))
        assert producer.flush(10) == 0

    async def scenario() -> GatedPolicy:
        service = OptimizerService(config, dry_run=True)
        slow = service.controller(slow_link.id, 0)
        assert slow is not None and slow.decide_thread is not None
        grid = service.controller(grid_link.id, 0)
        assert grid is not None and grid.decide_thread is None
        gated = slow.policy = GatedPolicy(slow_link, {})
        running = asyncio.get_running_loop().create_task(service.run())
        for end_ns in ends:
            send(slow_link, end_ns)
        await until(lambda: gated.entered.is_set() and slow.received == 5, 60)  # joined
        assert slow.in_thread and len(slow.inbox) == 4
        send(fast_link, ends[0])  # decided on the loop meanwhile
        await until(lambda: service.stats.decisions == 1)
        # Saved while its policy decides: with the policy's snapshot from before it, which
        # covers no window.
        committed = service.stats.transactions
        slow.save()
        assert not gated.gate.is_set() and slow.saved_through == 0
        await until(lambda: service.stats.transactions > committed + 1)
        states = await asyncio.to_thread(changelog.restore, config.kafka, topics, [0, 1], 30)
        assert states[slow_link.id][1].last_window_end_ns == 0

        gated.gate.set()
        await until(lambda: service.stats.decisions == 6)
        await until(lambda: slow.saved_through == 5)
        service.stop()
        await running
        return gated

    with caplog.at_level(logging.INFO, logger="p4bs_optimizer.service"):
        gated = asyncio.run(scenario())
    assert "grid GP fit warmed up" in caplog.text
    assert [end for end, _ in gated.seen] == ends
    assert all(thread.startswith("decide") for _, thread in gated.seen)  # not the loop's
    assert gated.snapshots_while_deciding == 0
    states = changelog.restore(config.kafka, topics, [0, 1], 30)
    assert states[slow_link.id][1].last_window_end_ns == ends[-1]
    assert states[fast_link.id][1].last_window_end_ns == ends[0]


class RecordingPolicy(Policy):
    """Notes the buffer each window it sees says is in force; decides `decide_at` (bytes) on
    the window numbered `decide_on`, nothing otherwise."""

    name = "recording"

    def __init__(self, link: LinkConfig, decide_on: int, decide_at: int) -> None:
        super().__init__(link, {})
        self.decide_on, self.decide_at = decide_on, decide_at
        self.buffers: list[int | None] = []

    def decide(self, window: Window) -> list[Decision]:
        self.buffers.append(window.buffer_bytes)
        if len(self.buffers) == self.decide_on:
            return [Decision(self.decide_at, "recording", "test")]
        return []

    def snapshot(self) -> dict[str, Any]:
        return {}


def test_windows_carry_the_buffer_read_from_the_router_then_the_service_s_own_change(
    stack: Stack, topics: dict[str, str], testbed: Testbed, tmp_path: Path
) -> None:
    """LinkMetrics does not carry the buffer: the service gives each window the one in force
    before its end. It reads the router's buffer over gNMI when it takes the link, and the
    windows before its first change carry that one; a window ending after the change carries
    the new buffer as it comes, with no round trip through the decisions topic."""
    path = write_config(tmp_path, stack.kafka.bootstrap, topics, testbed, "static")
    base = load_config(path)
    link = base.links[0]
    patient = dataclasses.replace(base.optimizer, stale_after_ns=600_000_000_000)
    config = dataclasses.replace(base, optimizer=patient)
    start = _kernel_limit(testbed)
    changed_to = 96 * 1024 if start != 96 * 1024 else 128 * 1024  # within the link's bounds
    producer = RecordProducer(config.kafka.bootstrap, topics, client_id="windows")
    model = LinkModel()
    # The first four windows ended before the test began, so before any change.
    before = (time.time_ns() // WINDOW_NS - 10) * WINDOW_NS
    ends = iter(before + i * WINDOW_NS for i in range(1, 5))

    def send(end_ns: int) -> None:
        producer.produce("link_metrics", model.window(link, 100_000, end_ns))
        assert producer.flush(10) == 0

    async def scenario() -> tuple[RecordingPolicy, OptimizerService]:
        service = OptimizerService(config)
        controller = service.controller(link.id, 0)
        assert controller is not None
        policy = controller.policy = RecordingPolicy(link, decide_on=3, decide_at=changed_to)
        running = asyncio.get_running_loop().create_task(service.run())
        send(next(ends))
        await until(lambda: 0 in controller.state.in_force, 60)  # joined, and read
        for _ in range(3):
            send(next(ends))
        await until(lambda: controller.state.last_change_ns > 0, 60)  # the third one's change
        send((controller.state.last_change_ns // WINDOW_NS + 1) * WINDOW_NS)
        await until(lambda: len(policy.buffers) == 5, 60)
        service.stop()
        await running
        return policy, service

    policy, service = asyncio.run(scenario())
    assert policy.buffers[1:] == [start, start, start, changed_to]
    assert policy.buffers[0] in (None, start)  # read while (or before) it was decided
    assert _kernel_limit(testbed) == changed_to
    assert service.stats.applied == 1 and service.stats.decisions == 1  # a read records nothing
