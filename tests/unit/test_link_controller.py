"""The link controller's safety guards, without Kafka or a router: the minimum interval
between changes, the clamp to the link's [min, max], the fallback to the safe buffer when the
metrics stop, skipping windows the saved state already covers, and the dry run.

The controller is driven as the service drives it: windows in (`on_window`), its state staged
in a transaction (the service's own `NextTransaction`) whose commit authorizes the decisions
it holds, and `check_stale` on a clock. The clock is the test's (time moves only when the
test says), the router an in-memory driver noting each call, the policy one that decides the
buffer the test gives it."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from p4bs import paths
from p4bs.config import LinkConfig, OptimizerConfig, RouterConfig, load_config
from p4bs_cli.main import main
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.drivers.base import Attempt, ErrorKind, FlowMatch, RouterDriver
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.service.controller import Clock, LinkController
from p4bs_optimizer.service.guards import ChangeBudget, Guards, freeze, unfreeze
from p4bs_optimizer.service.stats import ServiceStats
from p4bs_optimizer.service.transaction import NextTransaction

SECOND_NS = 1_000_000_000
WINDOW_NS = 500_000_000
START_NS = 1_800_000_000 * SECOND_NS  # the test clock's start (any time will do)
ROUTER_BUFFER = 100_000  # what the router holds before the first change


@functools.cache
def example_link() -> LinkConfig:
    return load_config(paths.example_config()).links[0]


class MemoryRouter(RouterDriver):
    """A router in memory: every buffer set (clock ns, queue, bytes), read and classifier set
    is noted; a set is in force at once and read back as set."""

    classifier_unsupported = None

    def __init__(self, clock: TestClock) -> None:
        super().__init__(RouterConfig("r1", "linux-tc", None, None, None, None, SECOND_NS, 1))
        self.clock = clock
        self.buffers = {0: ROUTER_BUFFER}
        self.sets: list[tuple[int, int, int]] = []
        self.reads: list[int] = []
        self.classifiers: list[dict[int, list[FlowMatch]]] = []

    def _set_classifier(
        self, attempt: Attempt, interface: str, rules: Mapping[int, Sequence[FlowMatch]]
    ) -> None:
        self.classifiers.append({q: list(flows) for q, flows in rules.items()})

    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        self.sets.append((self.clock.wall_ns(), queue, buffer_bytes))
        self.buffers[queue] = buffer_bytes
        return buffer_bytes

    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int:
        self.reads.append(queue)
        return self.buffers[queue]

    def _classify(self, error: Exception) -> ErrorKind | None:
        return None

    def _forget_connection(self) -> None:
        pass


class TestClock(Clock):
    """Time that moves only by `advance`; a sleeper wakes when it has passed its end."""

    __test__ = False  # not a test class

    def __init__(self) -> None:
        self.now_ns = START_NS
        self.sleeps: list[float] = []  # seconds asked, in order
        self.asleep = asyncio.Event()
        self._wake: list[tuple[int, asyncio.Future[None]]] = []

    def wall_ns(self) -> int:
        return self.now_ns

    def monotonic_ns(self) -> int:
        return self.now_ns

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        woken = asyncio.get_running_loop().create_future()
        self._wake.append((self.now_ns + round(seconds * 1e9), woken))
        self.asleep.set()
        await woken

    def advance(self, ns: int) -> None:
        self.now_ns += ns
        for end_ns, woken in self._wake:
            if end_ns <= self.now_ns:
                woken.set_result(None)
        self._wake = [(e, w) for e, w in self._wake if not w.done()]
        if not self._wake:
            self.asleep.clear()


class ScriptedPolicy(Policy):
    """Decides the buffer given by `decide_next` on the next window, nothing otherwise; notes
    the end of every window it is given; raises `raises` while it is set. It does not clamp:
    the controller must."""

    name = "scripted"

    def __init__(self, link: LinkConfig) -> None:
        super().__init__(link, {})
        self.next: int | None = None
        self.seen: list[int] = []
        self.raises: Exception | None = None

    def decide_next(self, buffer_bytes: int) -> None:
        self.next = buffer_bytes

    def decide(self, window: Window) -> list[Decision]:
        self.seen.append(window.window_end_ns)
        if self.raises is not None:
            raise self.raises
        buffer, self.next = self.next, None
        return [] if buffer is None else [Decision(buffer, "scripted", f"asked {buffer} B")]


class Host:
    """What the service is to a controller: the driver, the counters, and the next
    transaction, which `commit` commits (authorizing the decisions its states hold)."""

    def __init__(self, driver: RouterDriver, changes_per_minute: int = 0) -> None:
        self.budget = ChangeBudget(changes_per_minute)  # the one router's
        self.stats = ServiceStats()
        self.stopping = False
        self.driver = driver
        self.records: list[dict[str, Any]] = []  # every BufferDecision record, as made
        self.outgoing = NextTransaction("test", self.stats, self.records.append)
        self.failures: list[Exception] = []

    def driver_of(self, router: str) -> RouterDriver:
        return self.driver

    def change_budget(self, router: str) -> ChangeBudget:
        return self.budget

    def fail(self, exc: Exception) -> None:
        self.failures.append(exc)

    def commit(self) -> None:
        """The next transaction committed: what its states hold unapplied may be applied."""
        _, staged = self.outgoing.take(None)
        for controller, entry in staged:
            controller.authorize(entry.unapplied)


class Link:
    """A controller of the example link with the test's clock, router, policy and host."""

    def __init__(
        self,
        guards: Guards,
        state: LinkState | None = None,
        *,
        beside: Link | None = None,
        interface: str = "eth1",
        decide_thread: ThreadPoolExecutor | None = None,
        policy: type[ScriptedPolicy] = ScriptedPolicy,
    ) -> None:
        """`beside`: a link of the same router, whose clock, router and host this one
        shares."""
        if beside is None:
            self.clock = TestClock()
            self.router = MemoryRouter(self.clock)
            self.host = Host(self.router, guards.max_changes_per_router_per_minute)
        else:
            self.clock, self.router, self.host = beside.clock, beside.router, beside.host
        self.link = replace(example_link(), interface=interface)
        self.policy = policy(self.link)
        self.controller = LinkController(
            self.link,
            self.policy,
            state or LinkState(policy=ScriptedPolicy.name),
            0,
            host=self.host,
            guards=guards,
            decide_thread=decide_thread,
            clock=self.clock,
        )

    async def window(self, decide: int | None = None) -> None:
        """The link's next window, ending now on the test's clock; the policy decides
        `decide` bytes on it (None: nothing)."""
        if decide is not None:
            self.policy.decide_next(decide)
        self.controller.on_window(window(self.link, self.clock.now_ns))
        if self.controller.reading is not None:
            await self.controller.reading  # the router's buffer, read on the first window
        if self.controller.deciding is not None:
            await self.controller.deciding  # the decide thread's turn

    async def commit(self) -> None:
        """Commits the next transaction, then waits until the changes it authorized are
        applied, or one waits out the minimum interval on the clock."""
        self.host.commit()
        await until_applied_or_asleep(self.controller, self.clock)

    def outcomes(self) -> list[tuple[str, str, int]]:
        """Each decision record of this link: its phase, outcome and buffer, in order."""
        return [(r["phase"], r["outcome"], r["buffer_bytes"]) for r in self.records()]

    def records(self) -> list[dict[str, Any]]:
        return [r for r in self.host.records if r["link_id"] == self.link.id]


async def until_applied_or_asleep(controller: LinkController, clock: TestClock) -> None:
    task = controller.applying
    if task is None or task.done():
        return
    asleep = asyncio.ensure_future(clock.asleep.wait())
    await asyncio.wait([task, asleep], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    asleep.cancel()


def window(link: LinkConfig, end_ns: int) -> Window:
    return Window(
        link_id=link.id,
        window_start_ns=end_ns - WINDOW_NS,
        window_end_ns=end_ns,
        rtt_samples=10,
        rtt_flows=2,
        rtt_hmean_ns=20_000_000,
        srtt_ns=20_000_000,
        rtt_min_ns=20_000_000,
        long_flows=2,
        data_packets=1_000,
        retransmissions=0,
        loss_rate=0.0,
        loss_rate_ewma=0.0,
        queue_delay_samples=10,
        queue_delay_ns=1_000_000,
        queue_delay_ewma_ns=1_000_000,
        throughput_bps=90_000_000,
        utilisation=0.9,
        f=-0.1,
        zscore=0.0,
        change=False,
        buffer_bytes=None,
    )


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


GUARDS = Guards(min_change_interval_ns=SECOND_NS, stale_after_ns=5 * SECOND_NS)


def sets_of(router: MemoryRouter) -> Sequence[tuple[int, int]]:
    """The buffers set, each with its time since the clock's start."""
    return [(at - START_NS, buffer) for at, _, buffer in router.sets]


def test_a_change_within_the_minimum_interval_waits_and_a_newer_one_replaces_it() -> None:
    """A decision 0.2 s after a change waits out the rest of the 1 s; one that comes while it
    waits (0.3 s after the change) replaces it, recorded as skipped, and is applied when the
    second is up."""
    link = Link(GUARDS)

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(SECOND_NS // 5)
        await link.window(decide=300_000)
        await link.commit()
        assert link.clock.sleeps == [pytest.approx(0.8)], "the second change did not wait"
        assert sets_of(link.router) == [(0, 200_000)]
        link.clock.advance(SECOND_NS // 10)
        await link.window(decide=400_000)
        await link.commit()
        link.clock.advance(SECOND_NS * 7 // 10)
        await until_applied_or_asleep(link.controller, link.clock)

    run(scenario)
    assert sets_of(link.router) == [(0, 200_000), (SECOND_NS, 400_000)]
    assert link.outcomes() == [
        ("scripted", "applied", 200_000),
        ("scripted", "skipped", 300_000),
        ("scripted", "applied", 400_000),
    ]
    assert "replaced by a newer decision" in link.host.records[1]["reason"]
    assert link.host.records[2]["previous_buffer_bytes"] == 200_000
    assert link.host.stats.skipped == 1 and link.host.stats.applied == 2


def test_a_buffer_outside_the_link_s_bounds_is_applied_at_the_bound() -> None:
    low, high = example_link().min_buffer_bytes, example_link().max_buffer_bytes
    link = Link(GUARDS)

    async def scenario() -> None:
        await link.window(decide=high + 1_000)
        await link.commit()
        link.clock.advance(SECOND_NS)
        await link.window(decide=low - 1_000)
        await link.commit()

    run(scenario)
    assert sets_of(link.router) == [(0, high), (SECOND_NS, low)]
    assert link.outcomes() == [("scripted", "applied", high), ("scripted", "applied", low)]
    assert f"held to the link's bounds ({high + 1_000} B asked)" in link.host.records[0]["reason"]
    assert link.controller.state.in_force[0] == low


def test_stale_metrics_apply_the_safe_buffer_then_the_policy_s_buffer_returns() -> None:
    """No window for `stale_after`: the safe buffer (phase fallback), once; the first window
    after that brings back the policy's buffer (phase resume), and a buffer the policy
    decides while metrics are missing waits for them."""
    safe = example_link().safe_buffer_bytes
    link = Link(GUARDS)

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(GUARDS.stale_after_ns - 1)
        link.controller.check_stale(link.clock.monotonic_ns())
        assert link.host.stats.fallbacks == 0, "fell back before stale_after"
        link.clock.advance(1)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()
        link.clock.advance(SECOND_NS)
        link.controller.check_stale(link.clock.monotonic_ns())  # once only
        await link.window()
        await link.commit()

    run(scenario)
    assert sets_of(link.router) == [
        (0, 200_000),
        (GUARDS.stale_after_ns, safe),
        (GUARDS.stale_after_ns + SECOND_NS, 200_000),
    ]
    assert [phase for phase, _, _ in link.outcomes()] == ["scripted", "fallback", "resume"]
    assert "no link metrics for 5.0 s (limit 5 s)" in link.host.records[1]["reason"]
    assert link.host.stats.fallbacks == 1
    assert not link.controller.state.fallback


def test_a_link_whose_partition_is_being_caught_up_falls_back_only_at_twice_the_limit() -> None:
    """After a handover its windows may wait in the partition's backlog: late, not missing."""
    link = Link(GUARDS)

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(2 * GUARDS.stale_after_ns - 1)
        link.controller.check_stale(link.clock.monotonic_ns(), catching_up=True)
        assert link.host.stats.fallbacks == 0, "fell back while its partition was caught up"
        link.clock.advance(1)
        link.controller.check_stale(link.clock.monotonic_ns(), catching_up=True)
        await link.commit()

    run(scenario)
    assert [phase for phase, _, _ in link.outcomes()] == ["scripted", "fallback"]
    reason = link.host.records[1]["reason"]
    assert "for 10.0 s (limit 10 s, its partition being caught up)" in reason


def test_a_decision_made_while_falling_back_is_applied_when_metrics_return() -> None:
    safe = example_link().safe_buffer_bytes
    link = Link(GUARDS)

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(GUARDS.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()
        link.clock.advance(SECOND_NS)  # past the minimum interval: nothing holds it but that
        # (e.g. a decision from the decide thread, on a window before the metrics stopped)
        link.controller.submit([Decision(300_000, "scripted", "meanwhile")], from_policy=True)
        await link.commit()
        assert link.router.buffers[0] == safe, "applied while falling back"
        await link.window()
        await link.commit()

    run(scenario)
    assert link.router.buffers[0] == 300_000
    assert link.outcomes()[-1] == ("resume", "applied", 300_000)


def test_a_window_the_saved_state_covers_is_not_decided_again() -> None:
    """A resumed link's state covers windows up to its last decided one: those coming again
    (the offsets after the last commit are read again) are skipped, the next one decided."""
    decided_ns = START_NS
    link = Link(GUARDS, LinkState(policy=ScriptedPolicy.name, last_window_end_ns=decided_ns))

    async def scenario() -> None:
        await link.window(decide=200_000)  # ends at decided_ns: a replay
        link.clock.advance(WINDOW_NS)
        await link.window(decide=300_000)
        await link.commit()

    run(scenario)
    assert link.policy.seen == [decided_ns + WINDOW_NS]
    assert link.host.stats.replayed == 1 and link.host.stats.windows == 1
    assert link.outcomes() == [("scripted", "applied", 300_000)]
    assert link.controller.done == 2  # both done: the replay's offset may be committed


class CountingPolicy(ScriptedPolicy):
    """A ScriptedPolicy whose state is the windows it was given while `counting`."""

    counting = False

    def snapshot(self) -> dict[str, Any]:
        return {"seen": len(self.seen)} if self.counting else {}


def test_the_periodic_save_stages_a_state_only_when_it_changed() -> None:
    """The service's save each second: windows that left the link's state as it was are
    covered by the state already staged, without a new changelog record (their offsets are
    committed on it); a state the windows changed is staged, and so is every decision."""
    link = Link(GUARDS, policy=CountingPolicy)
    outgoing = link.host.outgoing
    policy = link.policy
    assert isinstance(policy, CountingPolicy)

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()  # applied: the state that no longer holds it is staged
        link.host.commit()
        for _ in range(3):
            link.clock.advance(WINDOW_NS)
            await link.window()
        link.controller.save(if_changed=True)
        assert outgoing.staged == {}
        assert link.controller.saved_through == link.controller.done == 4
        policy.counting = True  # the windows now change the policy's state
        link.clock.advance(WINDOW_NS)
        await link.window()
        link.controller.save(if_changed=True)
        assert list(outgoing.staged) == [link.link.id]
        link.host.commit()
        link.clock.advance(SECOND_NS)
        policy.counting = False
        await link.window(decide=300_000)  # a decision: staged at once
        assert list(outgoing.staged) == [link.link.id]

    run(scenario)
    assert link.outcomes() == [("scripted", "applied", 200_000)]


def test_a_dry_run_decides_and_records_but_never_asks_the_router() -> None:
    link = Link(Guards(SECOND_NS, 5 * SECOND_NS, dry_run=True))

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(SECOND_NS)
        await link.window(decide=300_000)
        await link.commit()
        link.clock.advance(GUARDS.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()

    run(scenario)
    assert link.router.sets == [] and link.router.reads == []
    assert link.outcomes() == [
        ("scripted", "dry_run", 200_000),
        ("scripted", "dry_run", 300_000),
        ("fallback", "dry_run", example_link().safe_buffer_bytes),
    ]
    assert link.controller.state.in_force == {}  # nothing was applied


def test_the_router_s_buffer_is_read_once_when_the_link_is_taken() -> None:
    """The buffer in force before the first change is the router's (for the windows before
    it): read on the first window, once; each window reaches the policy once, in order."""
    link = Link(GUARDS)

    async def scenario() -> None:
        for _ in range(3):
            await link.window()
            link.clock.advance(WINDOW_NS)

    run(scenario)
    assert link.router.reads == [0]
    assert link.controller.state.buffer_changes == [(0, ROUTER_BUFFER)]
    assert link.policy.seen == [START_NS + i * WINDOW_NS for i in range(3)]


@pytest.mark.parametrize("in_thread", [False, True], ids=["on the loop", "in the decide thread"])
def test_a_policy_that_raises_puts_only_its_link_on_the_safe_buffer(in_thread: bool) -> None:
    """eth1's policy raises: eth1 gets its safe buffer (phase fallback, the reason naming the
    exception), once while it keeps raising; eth2 beside it goes on, and nothing stops the
    service. eth1's policy is given the next windows, and its first decision without raising
    brings its buffer back."""
    safe = example_link().safe_buffer_bytes
    thread = ThreadPoolExecutor(1) if in_thread else None
    failing = Link(GUARDS, decide_thread=thread)
    other = Link(GUARDS, beside=failing, interface="eth2")

    async def scenario() -> None:
        await failing.window(decide=200_000)
        await failing.commit()
        failing.clock.advance(SECOND_NS)
        failing.policy.raises = ValueError("cannot convert float NaN to integer")
        await failing.window()
        await other.window(decide=300_000)
        await failing.commit()
        await other.commit()
        failing.clock.advance(SECOND_NS)
        await failing.window()  # raises again: no second fallback
        await failing.commit()
        failing.policy.raises = None
        failing.clock.advance(SECOND_NS)
        await failing.window()
        await failing.commit()

    try:
        run(scenario)
    finally:
        if thread is not None:
            thread.shutdown()
    assert failing.host.failures == []
    assert failing.outcomes() == [
        ("scripted", "applied", 200_000),
        ("fallback", "applied", safe),
        ("resume", "applied", 200_000),
    ]
    reason = failing.records()[1]["reason"]
    assert "policy p4bs raised ValueError: cannot convert float NaN to integer" in reason
    assert other.outcomes() == [("scripted", "applied", 300_000)]
    assert failing.host.stats.policy_failures == 2  # each window it raised on, counted
    assert failing.controller.done == 4 and failing.controller.policy_failure is None
    assert len(failing.policy.seen) == 4  # given every window, the failing ones too


class HeldPolicy(ScriptedPolicy):
    """Notes each window in its state (its snapshot: the windows seen), then holds the
    decide thread until `go` is set."""

    def __init__(self, link: LinkConfig) -> None:
        super().__init__(link)
        self.deciding = threading.Event()
        self.go = threading.Event()

    def decide(self, window: Window) -> list[Decision]:
        decisions = super().decide(window)
        self.deciding.set()
        self.go.wait(10)
        return decisions

    def snapshot(self) -> dict[str, Any]:
        return {"seen": len(self.seen)}


def test_a_link_released_mid_decision_saves_the_state_from_before_the_window() -> None:
    """The link's partition is taken back while the decide thread is still on a window (the
    release waited its time and cancelled the decision): the state saved for the next owner
    is the one from before that window, snapshot and windows covered alike, so the next owner
    decides that window once more from where this one stood. A snapshot taken while the
    thread goes on would already hold the window, and the next owner would decide it twice
    (found under load in test_optimizer_group)."""
    thread = ThreadPoolExecutor(1)
    link = Link(GUARDS, decide_thread=thread, policy=HeldPolicy)
    held = link.policy
    assert isinstance(held, HeldPolicy)
    first_end = link.clock.now_ns

    async def scenario() -> None:
        held.go.set()
        await link.window(decide=200_000)  # decided whole: its window is in the state
        held.go.clear()
        held.deciding.clear()
        link.clock.advance(WINDOW_NS)
        link.controller.on_window(window(link.link, link.clock.now_ns))
        assert await asyncio.to_thread(held.deciding.wait, 10)  # the thread is on it
        link.controller.released = True  # as Ownership.release does, after its wait
        deciding = link.controller.deciding
        assert deciding is not None
        deciding.cancel()
        await asyncio.gather(deciding, return_exceptions=True)
        link.controller.save()

    try:
        run(scenario)
    finally:
        held.go.set()
        thread.shutdown()
    assert len(held.seen) == 2  # the thread did take the second window
    _, staged = link.host.outgoing.take(None)
    (state,) = [entry.record.record for _, entry in staged]
    assert state["last_window_end_ns"] == first_end
    assert json.loads(state["policy_state"]) == {"seen": 1}
    assert link.controller.saved_through == 1  # the second window's offset stays uncommitted


def test_a_change_larger_than_the_largest_step_comes_in_steps() -> None:
    """max_step_ratio 2 from the router's 100,000 B to 1,000,000 B: 200,000, 400,000, 800,000,
    then 1,000,000 B, one change per minimum interval, each recorded with the step; the safe
    buffer of a fallback comes at once."""
    guards = replace(GUARDS, max_step_ratio=2.0)
    link = Link(guards)

    async def scenario() -> None:
        await link.window(decide=1_000_000)
        await link.commit()
        for _ in range(3):
            link.clock.advance(SECOND_NS)
            await link.commit()  # the continuation, staged by the change before
        link.clock.advance(guards.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()

    run(scenario)
    assert [buffer for _, buffer in sets_of(link.router)] == [
        200_000,
        400_000,
        800_000,
        1_000_000,
        example_link().safe_buffer_bytes,  # 625,000 B: /1.6 from 1,000,000, at once anyway
    ]
    assert (
        "a step of at most x2 from 100000 B: 200000 B now, 1000000 B in later"
        in (link.records()[0]["reason"])
    )


def test_a_large_fallback_is_not_held_to_the_step() -> None:
    guards = replace(GUARDS, max_step_ratio=2.0)
    link = Link(guards)
    link.router.buffers[0] = 40_000_000  # far above the link's max: the bound wins, then safe

    async def scenario() -> None:
        await link.window()
        link.clock.advance(guards.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()

    run(scenario)
    assert sets_of(link.router) == [(guards.stale_after_ns, example_link().safe_buffer_bytes)]


def test_a_router_s_change_budget_holds_its_links_changes_for_the_minute() -> None:
    """One change a minute for the router: eth1's change is made, eth2's (the same router)
    waits until a minute after it."""
    guards = replace(GUARDS, max_changes_per_router_per_minute=1)
    first = Link(guards)
    second = Link(guards, beside=first, interface="eth2")

    async def scenario() -> None:
        # One after the other: the links share the host, so a commit with both decisions
        # staged would let either take the minute's one change first.
        await first.window(decide=200_000)
        await first.commit()
        await second.window(decide=300_000)
        await second.commit()
        assert first.clock.sleeps == [pytest.approx(60.0)], "eth2 did not wait for the budget"
        first.clock.advance(60 * SECOND_NS - 1)
        await until_applied_or_asleep(second.controller, first.clock)
        assert len(first.router.sets) == 1
        first.clock.advance(1)
        await until_applied_or_asleep(second.controller, first.clock)

    run(scenario)
    assert sets_of(first.router) == [(0, 200_000), (60 * SECOND_NS, 300_000)]


def test_while_the_freeze_file_exists_nothing_is_written_to_the_router(tmp_path: Path) -> None:
    """Frozen: decisions (the safe buffer's too) are recorded as skipped with the freeze's
    reason and never applied, also one already waiting out the minimum interval; unfrozen,
    the next decision is applied."""
    flag = tmp_path / "optimizer.freeze"
    link = Link(replace(GUARDS, freeze_file=flag))

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(SECOND_NS // 5)
        await link.window(decide=300_000)
        await link.commit()  # waits out the rest of the interval
        freeze(flag, "maintenance window CHG-42")
        link.clock.advance(SECOND_NS)
        await until_applied_or_asleep(link.controller, link.clock)
        link.clock.advance(GUARDS.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())
        await link.commit()
        assert unfreeze(flag)
        await link.window(decide=400_000)
        await link.commit()

    run(scenario)
    assert [buffer for _, buffer in sets_of(link.router)] == [200_000, 400_000]
    outcomes = link.outcomes()
    assert outcomes[1:3] == [
        ("scripted", "skipped", 300_000),
        ("fallback", "skipped", example_link().safe_buffer_bytes),
    ]
    assert "maintenance window CHG-42" in link.records()[1]["reason"]
    assert outcomes[-1] == ("scripted", "applied", 400_000)


def test_the_config_s_dry_run_ors_with_the_command_line_s() -> None:
    config = OptimizerConfig(dry_run=True)
    assert Guards.of(config, dry_run=False).dry_run
    assert Guards.of(OptimizerConfig(), dry_run=True).dry_run
    assert not Guards.of(OptimizerConfig(), dry_run=False).dry_run


def test_a_pending_change_from_a_saved_state_is_checked_again_and_sets_no_classifier() -> None:
    """A saved state's unapplied decision (1 B, with a flow list) on a link whose policy does
    not separate flows: held to the link's bounds and the step, the classifier left alone."""
    saved = LinkState(
        policy=ScriptedPolicy.name,
        in_force={0: ROUTER_BUFFER},
        unapplied={
            0: Decision(1, "optimise", "from a saved state", flows=("10.0.0.1:1>10.0.0.2:2/6",))
        },
    )
    link = Link(replace(GUARDS, max_step_ratio=2.0), saved)

    async def scenario() -> None:
        link.controller.save()  # as the service does for a state restored with decisions
        await link.commit()

    run(scenario)
    assert link.router.classifiers == []
    assert sets_of(link.router) == [(0, ROUTER_BUFFER // 2)]
    reason = link.records()[0]["reason"]
    assert "held to the link's bounds (1 B asked)" in reason
    assert "flow list ignored" in reason and "x2" in reason


def test_the_freeze_command_writes_the_file_the_guards_read(tmp_path: Path) -> None:
    """`p4bs optimizer freeze --reason` makes the config's guards frozen, with the reason;
    `unfreeze` lets changes through again."""
    flag = tmp_path / "frozen" / "optimizer.freeze"
    config = tmp_path / "p4bs.toml"
    example = paths.example_config().read_text()
    config.write_text(example.replace("[optimizer]\n", f'[optimizer]\nfreeze_file = "{flag}"\n'))
    guards = Guards.of(load_config(config).optimizer, dry_run=False)
    assert guards.frozen() is None
    assert main(["optimizer", "freeze", "--config", str(config), "--reason", "CHG-7"]) == 0
    reason = guards.frozen()
    assert reason is not None and reason.endswith(": CHG-7") and reason.startswith("frozen by ")
    assert main(["optimizer", "unfreeze", "--config", str(config)]) == 0
    assert guards.frozen() is None and not flag.exists()
