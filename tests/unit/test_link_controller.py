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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from p4bs import paths
from p4bs.config import LinkConfig, RouterConfig, load_config
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.drivers.base import Attempt, ErrorKind, RouterDriver
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.service.controller import Clock, Guards, LinkController
from p4bs_optimizer.service.stats import ServiceStats
from p4bs_optimizer.service.transaction import NextTransaction

SECOND_NS = 1_000_000_000
WINDOW_NS = 500_000_000
START_NS = 1_800_000_000 * SECOND_NS  # the test clock's start (any time will do)
ROUTER_BUFFER = 100_000  # what the router holds before the first change


@functools.cache
def example_link() -> LinkConfig:
    return load_config(paths.default_config()).links[0]


class MemoryRouter(RouterDriver):
    """A router in memory: every buffer set (clock ns, queue, bytes) and read is noted; a set
    is in force at once and read back as set."""

    def __init__(self, clock: TestClock) -> None:
        super().__init__(RouterConfig("r1", "linux-tc", None, None, None, None, SECOND_NS, 1))
        self.clock = clock
        self.buffers = {0: ROUTER_BUFFER}
        self.sets: list[tuple[int, int, int]] = []
        self.reads: list[int] = []

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
    the end of every window it is given. It does not clamp: the controller must."""

    name = "scripted"

    def __init__(self, link: LinkConfig) -> None:
        super().__init__(link, {})
        self.next: int | None = None
        self.seen: list[int] = []

    def decide_next(self, buffer_bytes: int) -> None:
        self.next = buffer_bytes

    def decide(self, window: Window) -> list[Decision]:
        self.seen.append(window.window_end_ns)
        buffer, self.next = self.next, None
        return [] if buffer is None else [Decision(buffer, "scripted", f"asked {buffer} B")]


class Host:
    """What the service is to a controller: the driver, the counters, and the next
    transaction, which `commit` commits (authorizing the decisions its states hold)."""

    def __init__(self, driver: RouterDriver) -> None:
        self.stats = ServiceStats()
        self.stopping = False
        self.driver = driver
        self.records: list[dict[str, Any]] = []  # every BufferDecision record, as made
        self.outgoing = NextTransaction("test", self.stats, self.records.append)
        self.failures: list[Exception] = []

    def driver_of(self, router: str) -> RouterDriver:
        return self.driver

    def fail(self, exc: Exception) -> None:
        self.failures.append(exc)

    def commit(self) -> None:
        """The next transaction committed: what its states hold unapplied may be applied."""
        _, staged = self.outgoing.take(None)
        for controller, entry in staged:
            controller.authorize(entry.unapplied)


class Link:
    """A controller of the example link with the test's clock, router, policy and host."""

    def __init__(self, guards: Guards, state: LinkState | None = None) -> None:
        self.clock = TestClock()
        self.router = MemoryRouter(self.clock)
        self.host = Host(self.router)
        self.link = example_link()
        self.policy = ScriptedPolicy(self.link)
        self.controller = LinkController(
            self.link,
            self.policy,
            state or LinkState(policy=ScriptedPolicy.name),
            0,
            host=self.host,
            guards=guards,
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

    async def commit(self) -> None:
        """Commits the next transaction, then waits until the changes it authorized are
        applied, or one waits out the minimum interval on the clock."""
        self.host.commit()
        await until_applied_or_asleep(self.controller, self.clock)

    def outcomes(self) -> list[tuple[str, str, int]]:
        """Each decision record's phase, outcome and buffer, in order."""
        return [(r["phase"], r["outcome"], r["buffer_bytes"]) for r in self.host.records]


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
