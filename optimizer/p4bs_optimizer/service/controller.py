"""One link's controller: its policy, the safety guards, its state and the changes in flight.

The service hands each window of a link to its `LinkController` on the asyncio loop; the
controller runs the link's policy, holds its decisions to the safety guards and applies them
through the router's driver without blocking the other links (each driver limits its own
concurrent changes). Most policies decide on the loop; a link whose `decide` may take long (a
P4BS search on log(buffer), fit_pool.py) decides in one of the service's decide threads: its
windows wait in the controller's inbox meanwhile and are decided one at a time, in order,
while the other links go on. The policy is never snapshotted while it decides.

Safety, per link (`Guards`): a buffer is always within the link's [min, max]; two changes are
at least `optimizer.min_change_interval` apart (a decision that comes sooner waits, and a
newer one replaces it); when no window has come for `optimizer.stale_after`, the link's safe
buffer is applied (phase "fallback") until metrics return, and then the policy's buffer
again; every change is read back from the router; `dry_run` decides and records without
applying. A window the state already covers is a replay and skipped, so nothing is decided
twice. The controller gives each window the buffer in force during it (LinkMetrics does not
carry it): the newest it applied before the window's end, kept in the link's state
(`buffer_changes`), so a policy knows which buffer its windows measured as soon as they come,
with no round trip through the decisions topic; before the first change, the router's own,
read when the controller takes the link, so a policy can measure where the link is before it
moves it.

A decision is applied only once a transaction holding it committed: the controller stages its
state with its host (`ControllerHost.stage`), and the host calls `authorize` after the commit.
Everything the controller needs from whoever runs it (the router's driver, staging the state,
recording a decision, the counters, a failure to report) is the `ControllerHost`, and its
time is a `Clock`, so that a test drives it without Kafka or a router.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from p4bs.config import LinkConfig, OptimizerConfig
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.drivers.base import DriverError, RouterDriver
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.service.stats import ServiceStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Guards:
    """The settings of a link's safety guards (the link's [min, max] is its policy's clamp)."""

    min_change_interval_ns: int  # between two changes of the link's buffer
    stale_after_ns: int  # no window this long: the safe buffer
    dry_run: bool = False  # decide and record, apply nothing

    @classmethod
    def of(cls, optimizer: OptimizerConfig, *, dry_run: bool) -> Guards:
        return cls(optimizer.min_change_interval_ns, optimizer.stale_after_ns, dry_run)


class Clock:
    """A controller's time: the wall clock (decision records, and the minimum interval
    between changes, kept in the state across processes), the monotonic one (how long the
    metrics have been missing) and waiting on the loop."""

    def wall_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class DecisionMade:
    """A decision and what became of it: one BufferDecision record."""

    link: LinkConfig
    decision: Decision
    buffer_bytes: int  # applied, or that would have been
    previous_bytes: int | None  # in force before
    reason: str
    outcome: str  # applied, failed, skipped or dry_run
    epoch: int
    ts_ns: int


class Outbox(Protocol):
    """What the next transaction writes (the service's NextTransaction)."""

    def stage(self, controller: LinkController, ts_ns: int) -> None:
        """The controller's state as it is now."""
        ...

    def record(self, made: DecisionMade) -> None:
        """One BufferDecision record."""
        ...


class ControllerHost(Protocol):
    """What a LinkController needs from whoever runs it (the service)."""

    stats: ServiceStats

    @property
    def outgoing(self) -> Outbox:
        """The next transaction; the host calls `authorize` with the decisions a staged state
        holds unapplied once it committed."""
        ...

    @property
    def stopping(self) -> bool:
        """The service is stopping: the decide thread takes no further window."""
        ...

    def driver_of(self, router: str) -> RouterDriver:
        """The driver of the router named `router` (one per router)."""
        ...

    def fail(self, exc: Exception) -> None:
        """A failure off the loop (the decide thread, a change): the host stops and raises
        it."""
        ...


class LinkController:
    """One link: its policy, its safety guards, its state, and the changes in flight.

    Windows are numbered as they arrive (`on_window`); `done` counts those the policy has
    decided (or that were replays), `saved_through` those the saved state covers, which is
    what the service may commit to Kafka."""

    def __init__(
        self,
        link: LinkConfig,
        policy: Policy,
        state: LinkState,
        partition: int,
        *,
        host: ControllerHost,
        guards: Guards,
        decide_thread: ThreadPoolExecutor | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.link = link
        self.policy = policy
        self.state = state
        self.partition = partition  # of link_metrics, and of the changelog
        self.host = host
        self.guards = guards
        self.decide_thread = decide_thread  # None: the policy decides on the loop
        self.clock = clock or Clock()
        self.last_window_wall_ns = self.clock.monotonic_ns()
        self.decided_end_ns = state.last_window_end_ns  # the last window the policy decided
        self.authorized: dict[int, Decision] = {}  # committed, to apply (queue -> decision)
        self.in_apply: dict[int, Decision] = {}  # being applied right now
        self.applying: asyncio.Task[None] | None = None
        self.dirty = False
        self.released = False  # the link went to another process: nothing more is done
        self.inbox: deque[Window] = deque()  # windows waiting for the decide thread
        self.deciding: asyncio.Task[None] | None = None  # works through the inbox
        self.in_thread = False  # the policy is deciding in the decide thread right now
        self.received = 0
        self.done = 0
        self.snapshot_done = 0  # windows the policy's last snapshot covers
        self.saved_through = 0
        self.reading: asyncio.Task[None] | None = None  # the router's buffer, read once

    # ---- windows in --------------------------------------------------------------------
    def on_window(self, window: Window) -> int:
        """Takes the link's next window; returns its number, which `saved_through` reaches
        once the saved state covers it."""
        self.last_window_wall_ns = self.clock.monotonic_ns()
        self.received += 1
        if self.reading is None and not self.guards.dry_run and 0 not in self.state.in_force:
            self.reading = asyncio.get_running_loop().create_task(self._read_buffer_in_force())
        if self.decide_thread is None:
            self._decide_here(window)
        else:
            self.inbox.append(window)
            if self.deciding is None:
                self.deciding = asyncio.get_running_loop().create_task(self._decide_inbox())
        return self.received

    async def _read_buffer_in_force(self) -> None:
        """Reads the router's buffer when the service takes the link, for the windows before
        its first change (and as the first change's previous buffer)."""
        driver = self.host.driver_of(self.link.router)
        try:
            buffer = await driver.get_buffer(self.link.interface, 0)
        except DriverError as exc:
            log.warning("link %s: the buffer in force could not be read: %s", self.link.id, exc)
            return
        self.state.in_force.setdefault(0, buffer)
        if not self.state.buffer_changes:
            self.state.buffer_changed(0, buffer)

    def _decide_here(self, window: Window) -> None:
        decisions = self.policy.decide(window) if self._accept(window) else None
        self._decided(window, decisions)

    async def _decide_inbox(self) -> None:
        """Decides the inbox's windows in the decide thread, one after the other, until it is
        empty, the service stops or the link is released (the rest are left to whoever
        resumes the link: their offsets are not committed). A failing policy stops the
        service, as it would on the loop."""
        loop = asyncio.get_running_loop()
        try:
            while self.inbox and not self.host.stopping and not self.released:
                window = self.inbox.popleft()
                decisions = None
                if self._accept(window):
                    self.in_thread = True
                    try:
                        decisions = await loop.run_in_executor(
                            self.decide_thread, self.policy.decide, window
                        )
                    finally:
                        self.in_thread = False
                self._decided(window, decisions)
        except Exception as exc:
            self.host.fail(exc)
        finally:
            self.deciding = None

    def _accept(self, window: Window) -> bool:
        """What comes before the policy sees a window: False for a window the state already
        covers (a replay); brings back the policy's buffers after a fallback."""
        if window.window_end_ns <= self.decided_end_ns:
            self.host.stats.replayed += 1
            return False
        self.host.stats.windows += 1
        if self.state.fallback:
            # Metrics are back: the policy's own buffers return.
            self.state.fallback = False
            restored = [
                Decision(
                    b,
                    "resume",
                    "metrics are back; the policy's buffer returns",
                    queue=q,
                    window_end_ns=window.window_end_ns,
                )
                for q, b in sorted(self.state.intended.items())
            ]
            self.submit(restored, from_policy=False)
        return True

    def _decided(self, window: Window, decisions: list[Decision] | None) -> None:
        """The window is done: `decisions` are the policy's, None for a replay."""
        self.done += 1
        if decisions is None:
            if not self.dirty:
                self.snapshot_done = self.done  # a replay changes nothing
            return
        self.decided_end_ns = window.window_end_ns
        self.dirty = True
        made_on = [replace(d, window_end_ns=window.window_end_ns) for d in decisions]
        self.submit(made_on, from_policy=True)

    def check_stale(self, now_ns: int) -> None:
        """Falls back to the safe buffer once when metrics have been missing too long."""
        quiet_ns = now_ns - self.last_window_wall_ns
        if self.state.fallback or quiet_ns < self.guards.stale_after_ns:
            return
        self.state.fallback = True
        self.dirty = True
        self.host.stats.fallbacks += 1
        reason = (
            f"no link metrics for {quiet_ns / 1e9:.1f} s (limit "
            f"{self.guards.stale_after_ns / 1e9:g} s): the safe buffer"
        )
        log.warning("link %s: %s", self.link.id, reason)
        self.submit([Decision(self.link.safe_buffer_bytes, "fallback", reason)], from_policy=False)

    # ---- decisions out -----------------------------------------------------------------
    def submit(self, decisions: list[Decision], *, from_policy: bool) -> None:
        """Takes decisions into the link's state; each is applied once a transaction holding
        it has committed. A decision not yet applied is replaced by a newer one for its
        queue (recorded as skipped)."""
        if not decisions:
            return
        for decision in decisions:
            if from_policy:
                self.state.intended[decision.queue] = decision.buffer_bytes
                if self.state.fallback:
                    continue  # remembered; applied when metrics return
            replaced = self.state.unapplied.get(decision.queue)
            if replaced is not None and replaced is not self.in_apply.get(decision.queue):
                self.authorized.pop(decision.queue, None)
                self.host.outgoing.record(
                    DecisionMade(
                        self.link,
                        replaced,
                        replaced.buffer_bytes,
                        self.state.in_force.get(replaced.queue),
                        f"{replaced.reason}; replaced by a newer decision within the minimum "
                        "interval between changes",
                        "skipped",
                        self.state.epoch,
                        self.clock.wall_ns(),
                    )
                )
            self.state.unapplied[decision.queue] = decision
        # Saved before it is applied: a restart must not decide (and apply) it again from the
        # windows it replays, which for a search would mean old trial buffers in a row.
        self.save()

    def authorize(self, unapplied: dict[int, Decision]) -> None:
        """A transaction holding `unapplied` committed: those still to make are applied."""
        if self.released:
            return
        for queue, decision in unapplied.items():
            if self.state.unapplied.get(queue) is decision and decision is not self.in_apply.get(
                queue
            ):
                self.authorized[queue] = decision
        if self.authorized and (self.applying is None or self.applying.done()):
            self.applying = asyncio.get_running_loop().create_task(self._apply_authorized())

    async def _apply_authorized(self) -> None:
        """Applies the authorized decisions, at most one change per minimum interval. A
        failure other than the router's (those are recorded) stops the service."""
        interval_ns = self.guards.min_change_interval_ns
        try:
            while self.authorized and not self.released:
                wait_ns = self.state.last_change_ns + interval_ns - self.clock.wall_ns()
                if wait_ns > 0:
                    await self.clock.sleep(wait_ns / 1e9)  # a rate limit, not a synchronisation
                    continue
                decisions = sorted(self.authorized.values(), key=lambda d: d.queue)
                self.authorized.clear()
                self.in_apply = {d.queue: d for d in decisions}
                try:
                    await self._apply(decisions)
                finally:
                    self.in_apply = {}
        except Exception as exc:
            self.host.fail(exc)

    async def _apply(self, decisions: list[Decision]) -> None:
        driver = None if self.guards.dry_run else self.host.driver_of(self.link.router)
        flows = {d.queue: list(d.flows) for d in decisions if d.flows}
        classifier_error = None
        if flows and driver is not None:
            try:
                await driver.set_classifier(self.link.interface, flows)
            except (DriverError, NotImplementedError) as exc:
                classifier_error = str(exc)
        for decision in decisions:
            buffer = self.policy.clamp(decision.buffer_bytes)
            reason = decision.reason
            if buffer != decision.buffer_bytes:
                reason += f"; held to the link's bounds ({decision.buffer_bytes} B asked)"
            previous = self.state.in_force.get(decision.queue)
            if previous is None and driver is not None:
                with contextlib.suppress(DriverError):  # the set below reports the failure
                    previous = await driver.get_buffer(self.link.interface, decision.queue)
            if driver is None:
                outcome = "dry_run"
            elif classifier_error is not None:
                outcome, reason = "failed", f"{reason}; classifier not set: {classifier_error}"
            else:
                try:
                    buffer = await driver.set_buffer(self.link.interface, decision.queue, buffer)
                    outcome = "applied"
                except DriverError as exc:
                    outcome, reason = "failed", f"{reason}; {exc}"
            applied_ns = self.clock.wall_ns()
            if outcome == "applied":
                self.state.in_force[decision.queue] = buffer
                self.state.last_change_ns = applied_ns
                if decision.queue == 0:
                    if not self.state.buffer_changes and previous is not None:
                        self.state.buffer_changed(0, previous)
                    self.state.buffer_changed(applied_ns, buffer)
            if self.state.unapplied.get(decision.queue) is decision:
                del self.state.unapplied[decision.queue]
            self.host.outgoing.record(
                DecisionMade(
                    self.link,
                    decision,
                    buffer,
                    previous,
                    reason,
                    outcome,
                    self.state.epoch,
                    applied_ns,
                )
            )
        # The records and the state that no longer holds these decisions commit together.
        self.save()

    # ---- state -------------------------------------------------------------------------
    def save(self) -> None:
        """Stages the link's state for the next transaction. While the policy decides in the
        decide thread its snapshot is the one from before (with the windows it covers): the
        state goes on being saved, the policy's part once the decision is in."""
        if not self.in_thread:
            self.state.policy_state = self.policy.snapshot()
            self.state.last_window_end_ns = self.decided_end_ns
            self.snapshot_done = self.done
            self.dirty = False
        self.host.outgoing.stage(self, self.clock.wall_ns())
        self.saved_through = self.snapshot_done
