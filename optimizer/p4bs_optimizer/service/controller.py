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
applying. Across links (guards.py): one change moves a buffer at most `max_step_ratio` (the
rest follows in later changes), a router takes at most `max_changes_per_router_per_minute`
(its links share a `ChangeBudget`), and while the freeze file exists nothing is written. A
policy that raises puts its link, and only it, on the safe buffer until it decides again
(`policy_raised`). A flow list (the interface's whole classifier) is applied only from a
jenks link. A window the state already covers is a replay and skipped, so nothing is decided
twice. The controller gives each window the buffer in force during it (LinkMetrics does not
carry it): the newest it applied before the window's end, kept in the link's state
(`buffer_changes`), so a policy knows which buffer its windows measured as soon as they come,
with no round trip through the decisions topic; before the first change, the router's own,
read when the controller takes the link, so a policy can measure where the link is before it
moves it.

A decision is applied only once a transaction holding it committed: the controller stages its
state with its host (`ControllerHost.stage`), and the host calls `authorize` after the commit.
Everything the controller needs from whoever runs it (the router's driver, staging the state,
recording a decision, the counters, the router's change budget, a failure to report) is the
`ControllerHost`, and its time is a `Clock`, so that a test drives it without Kafka or a
router.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from p4bs.config import LinkConfig
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.drivers.base import DriverError, RouterDriver
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.jenks import JenksPolicy
from p4bs_optimizer.service.guards import ChangeBudget, Guards
from p4bs_optimizer.service.stats import ServiceStats

log = logging.getLogger(__name__)


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

    def stage(self, controller: LinkController, ts_ns: int, *, if_changed: bool = False) -> bool:
        """The controller's state as it is now (with `if_changed`, unless the same as the
        one it staged last but for the windows covered); False if not staged."""
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

    def change_budget(self, router: str) -> ChangeBudget:
        """The change budget of the router named `router`, shared by its links."""
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
        # Why the policy is on the safe buffer (it raised; see policy_raised); None: it is not.
        self.policy_failure: str | None = None
        self.budget = host.change_budget(link.router)
        self.saved_content: tuple[Any, ...] | None = None  # of the state staged last

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
            log.warning(
                "link %s: the buffer in force could not be read: %s",
                self.link.id,
                exc,
                extra={"link": self.link.id},
            )
            return
        self.state.in_force.setdefault(0, buffer)
        if not self.state.buffer_changes:
            self.state.buffer_changed(0, buffer)

    def _decide_here(self, window: Window) -> None:
        if not self._accept(window):
            self._decided(window, None)
            return
        try:
            decisions = self.policy.decide(window)
        except Exception as exc:
            self._decide_failed(window, exc)
            return
        self._decided(window, decisions)

    async def _decide_inbox(self) -> None:
        """Decides the inbox's windows in the decide thread, one after the other, until it is
        empty, the service stops or the link is released (the rest are left to whoever
        resumes the link: their offsets are not committed). A policy that raises puts the
        link on its safe buffer (`policy_raised`), as it would on the loop; a failure of the
        controller itself stops the service."""
        loop = asyncio.get_running_loop()
        try:
            while self.inbox and not self.host.stopping and not self.released:
                window = self.inbox.popleft()
                if not self._accept(window):
                    self._decided(window, None)
                    continue
                # Cancelled here (the link released or the service stopping), the thread
                # goes on deciding: `in_thread` stays set, so that a save keeps the policy's
                # snapshot from before this window, which the saved windows match.
                self.in_thread = True
                try:
                    decisions = await loop.run_in_executor(
                        self.decide_thread, self.policy.decide, window
                    )
                except Exception as exc:
                    self.in_thread = False
                    self._decide_failed(window, exc)
                    continue
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
            # Metrics are back: the policy's own buffers return (unless it raises: then the
            # safe buffer stays until it decides again).
            self.state.fallback = False
            if self.policy_failure is None:
                self._resume(window, "metrics are back; the policy's buffer returns")
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
        if self.policy_failure is not None:
            # The policy decides again: its buffers return (those it decides now win).
            log.info(
                "link %s: policy %s decides again",
                self.link.id,
                self.link.policy,
                extra={"link": self.link.id, "policy": self.link.policy},
            )
            self.policy_failure = None
            self._resume(window, "the policy decides again; its buffer returns")
        made_on = [replace(d, window_end_ns=window.window_end_ns) for d in decisions]
        self.submit(made_on, from_policy=True)

    def _decide_failed(self, window: Window, exc: Exception) -> None:
        """The policy raised on `window`: the window is done (it is not decided again on a
        replay), and the link goes to its safe buffer."""
        self.done += 1
        self.decided_end_ns = window.window_end_ns
        self.dirty = True
        self.policy_raised(exc, f"on the window ending at {window.window_end_ns} ns")

    def policy_raised(self, exc: Exception, where: str) -> None:
        """The link's policy raised: the link goes to its safe buffer (phase "fallback", the
        reason naming the exception) and stays there while it raises; the policy is given
        every later window, and its first decision without raising brings its buffers back.
        The other links and the process go on."""
        self.host.stats.policy_failures += 1
        cause = f"{type(exc).__name__}: {exc}"
        if self.policy_failure is not None:  # on the safe buffer already: one line, no trace
            log.warning(
                "link %s: policy %s raised %s again: %s",
                self.link.id,
                self.link.policy,
                where,
                cause,
                extra={"link": self.link.id, "policy": self.link.policy},
            )
            self.save()
            return
        log.error(
            "link %s: policy %s raised %s: %s; the link is on its safe buffer until the "
            "policy decides again",
            self.link.id,
            self.link.policy,
            where,
            cause,
            exc_info=exc,
            extra={
                "link": self.link.id,
                "policy": self.link.policy,
                "buffer_bytes": self.link.safe_buffer_bytes,
            },
        )
        self.policy_failure = cause
        reason = f"policy {self.link.policy} raised {cause}: the safe buffer"
        self.submit([Decision(self.link.safe_buffer_bytes, "fallback", reason)], from_policy=False)

    def _resume(self, window: Window, why: str) -> None:
        """The policy's own buffers (the state's intended ones) again, phase "resume"."""
        restored = [
            Decision(b, "resume", why, queue=q, window_end_ns=window.window_end_ns)
            for q, b in sorted(self.state.intended.items())
        ]
        self.submit(restored, from_policy=False)

    def check_stale(self, now_ns: int, catching_up: bool = False) -> None:
        """Falls back to the safe buffer once when metrics have been missing too long.
        `catching_up`: the link's partition may still have records to read (the backlog of
        a handover), where its windows may be waiting: missing only at twice the limit."""
        quiet_ns = now_ns - self.last_window_wall_ns
        limit_ns = self.guards.stale_after_ns * (2 if catching_up else 1)
        if self.state.fallback or quiet_ns < limit_ns:
            return
        self.state.fallback = True
        self.dirty = True
        self.host.stats.fallbacks += 1
        reason = (
            f"no link metrics for {quiet_ns / 1e9:.1f} s (limit {limit_ns / 1e9:g} s"
            + (", its partition being caught up" if catching_up else "")
            + "): the safe buffer"
        )
        log.warning(
            "link %s: %s",
            self.link.id,
            reason,
            extra={"link": self.link.id, "buffer_bytes": self.link.safe_buffer_bytes},
        )
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
        """Applies the authorized decisions, at most one change per minimum interval and
        within the router's change budget (both wait; frozen, nothing waits: nothing is
        written). A failure other than the router's (those are recorded) stops the
        service."""
        interval_ns = self.guards.min_change_interval_ns
        try:
            while self.authorized and not self.released:
                if self.guards.frozen() is None:
                    now_ns = self.clock.wall_ns()
                    wait_ns = self.state.last_change_ns + interval_ns - now_ns
                    guard = "min_change_interval"
                    budget_ns = 0 if self.guards.dry_run else self.budget.wait_ns(now_ns)
                    if budget_ns > wait_ns:
                        wait_ns, guard = budget_ns, "router_budget"
                    if wait_ns > 0:
                        self.host.stats.guard_delays[guard] += 1
                        await self.clock.sleep(wait_ns / 1e9)  # a rate limit, not a sync
                        continue
                    if not self.guards.dry_run:
                        self.budget.take(now_ns)
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
        """One change: the decisions' classifier (a jenks link's only) and buffers, each held
        to the link's bounds and the largest step, unless frozen; a decision cut to the step
        is continued by a further change towards its buffer."""
        driver = None if self.guards.dry_run else self.host.driver_of(self.link.router)
        flows = {d.queue: list(d.flows) for d in decisions if d.flows}
        ignored_flows = ""
        if flows and not isinstance(self.policy, JenksPolicy):
            # A flow list replaces the interface's whole classifier: only the policy that
            # separates flows may send one (not, e.g., a saved state of another link's).
            flows = {}
            ignored_flows = f"; its flow list ignored (only a {JenksPolicy.name} link sets one)"
        classifier_error = None
        frozen = self.guards.frozen()
        if flows and driver is not None and frozen is None:
            try:
                await driver.set_classifier(self.link.interface, flows)
            except (DriverError, NotImplementedError) as exc:
                classifier_error = str(exc)
        continued = []
        for decision in decisions:
            aim = self.policy.clamp(decision.buffer_bytes)
            reason = decision.reason + (ignored_flows if decision.flows else "")
            if aim != decision.buffer_bytes:
                reason += f"; held to the link's bounds ({decision.buffer_bytes} B asked)"
                self.host.stats.guard_refusals["bounds"] += 1
            previous = self.state.in_force.get(decision.queue)
            if previous is None and driver is not None:
                with contextlib.suppress(DriverError):  # the set below reports the failure
                    previous = await driver.get_buffer(self.link.interface, decision.queue)
            buffer, step_note = self._step(aim, previous, decision.phase)
            reason += step_note
            if step_note:
                self.host.stats.guard_refusals["max_step_ratio"] += 1
            frozen = self.guards.frozen()  # once more: a freeze takes effect at once
            if frozen is not None:
                outcome, reason = "skipped", f"{reason}; not applied: {frozen}"
                self.host.stats.guard_refusals["freeze"] += 1
            elif driver is None:
                outcome = "dry_run"
            elif classifier_error is not None:
                outcome, reason = "failed", f"{reason}; classifier not set: {classifier_error}"
            elif buffer is None:
                outcome = "failed"
            else:
                try:
                    buffer = await driver.set_buffer(self.link.interface, decision.queue, buffer)
                    outcome = "applied"
                except DriverError as exc:
                    outcome, reason = "failed", f"{reason}; {exc}"
            applied_ns = self.clock.wall_ns()
            if outcome == "applied":
                assert buffer is not None
                self.state.in_force[decision.queue] = buffer
                self.state.last_change_ns = applied_ns
                if decision.queue == 0:
                    if not self.state.buffer_changes and previous is not None:
                        self.state.buffer_changed(0, previous)
                    self.state.buffer_changed(applied_ns, buffer)
                if buffer != aim:
                    continued.append(replace(decision, buffer_bytes=aim, flows=()))
            if self.state.unapplied.get(decision.queue) is decision:
                del self.state.unapplied[decision.queue]
            self.host.outgoing.record(
                DecisionMade(
                    self.link,
                    decision,
                    aim if buffer is None else buffer,
                    previous,
                    reason,
                    outcome,
                    self.state.epoch,
                    applied_ns,
                )
            )
        # The records and the state that no longer holds these decisions commit together;
        # the rest of a cut decision (unless a newer one for its queue came) with them.
        continued = [d for d in continued if d.queue not in self.state.unapplied]
        if continued:
            self.submit(continued, from_policy=False)
        else:
            self.save()

    def _step(self, aim: int, previous: int | None, phase: str) -> tuple[int | None, str]:
        """The buffer one change may set towards `aim` from `previous` (the largest step),
        and a note for the reason; None when the step cannot be held (the buffer in force is
        not known). The safe buffer of a fallback is applied at once."""
        ratio = self.guards.max_step_ratio
        if not ratio or phase == "fallback" or aim == previous:
            return aim, ""
        if previous is None:
            if self.guards.dry_run:
                return aim, ""
            return None, (
                "; not applied: the buffer in force could not be read, so the largest step "
                f"(x{ratio:g}) cannot be held"
            )
        low, high = math.ceil(previous / ratio), math.floor(previous * ratio)
        buffer = self.policy.clamp(min(max(aim, low), high))
        if buffer == aim:
            return aim, ""
        return buffer, (
            f"; a step of at most x{ratio:g} from {previous} B: {buffer} B now, {aim} B in "
            "later changes"
        )

    # ---- state -------------------------------------------------------------------------
    def save(self, *, if_changed: bool = False) -> None:
        """Stages the link's state for the next transaction. While the policy decides in the
        decide thread its snapshot is the one from before (with the windows it covers): the
        state goes on being saved, the policy's part once the decision is in.

        With `if_changed` (the service's periodic save), a state the same as the one last
        staged but for the windows it covers is not staged again: the windows decided since
        left it as it was, so that state covers them too, and their offsets are committed
        on it (a restart resumes after them with the same state). Decisions waiting for a
        transaction to authorize them are always staged."""
        began = time.thread_time_ns()
        if not self.in_thread:
            try:
                self.state.policy_state = self.policy.snapshot()
            except Exception as exc:  # the state saved before stays; the link falls back
                self.in_thread = True  # (its save must not snapshot again)
                try:
                    self.policy_raised(exc, "in its snapshot")
                finally:
                    self.in_thread = False
            self.state.last_window_end_ns = self.decided_end_ns
            self.snapshot_done = self.done
            self.dirty = False
        self.host.outgoing.stage(
            self, self.clock.wall_ns(), if_changed=if_changed and not self.state.unapplied
        )
        self.saved_through = self.snapshot_done
        self.host.stats.cpu_ns["state"] += time.thread_time_ns() - began
