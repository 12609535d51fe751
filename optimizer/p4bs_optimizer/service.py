"""The optimizer service: link metrics in, buffer decisions out and applied to routers.

One process drives many links. A thread polls Kafka (the link_metrics topic, and the RTT
samples of link_counters when a link separates flows by RTT) and hands each window to its
link's `LinkController` on the asyncio loop; the controller runs the link's policy, holds its
decisions to the safety guards and applies them through the router's driver without blocking
the other links (each driver limits its own concurrent changes). Processes in one consumer
group share the links: Kafka gives each its partitions, and records are keyed by link.

Policies decide on the loop: most in microseconds, P4BS in a few milliseconds when a trial
ends and its default search, on the authors' grid, fits its GP. A P4BS search on log(buffer)
fits with Ax, 0.1-0.3 s (`_decides_off_loop`), so such a link's `decide` runs in one of the
service's decide threads: the link's windows wait in its inbox meanwhile and are decided one
at a time, in order, while the other links go on. Those GP fits run in a pool of processes,
one per core (`optimizer.fit_processes`): fits are Python-bound, so threads could not run two
at once, and each process seeds its own random generators around a fit, so a search never
depends on what other links' fits did. The policy is never snapshotted while it decides.
(Handing every window of the grid searches to a thread cost more than their fits: 200
searching links send 2,000 windows a second.)

Safety, per link: a buffer is always within the link's [min, max]; two changes are at least
`optimizer.min_change_interval` apart (a decision that comes sooner waits, and a newer one
replaces it); when no window has come for `optimizer.stale_after`, the link's safe buffer is
applied (phase "fallback") until metrics return, and then the policy's buffer again; every
change is read back from the router; `dry_run` decides and records without applying. Every
decision is a BufferDecision record on the decisions topic (the InfluxDB sink stores them).
The service gives each window the buffer in force during it (LinkMetrics does not carry it):
the newest it applied before the window's end, kept in the link's state (`buffer_changes`),
so a policy knows which buffer its windows measured as soon as they come, with no round trip
through the decisions topic; before the first change, the router's own, read when the service
takes the link, so a policy can measure where the link is before it moves it.

Ownership and state: Kafka gives each process of the group some of the `link_metrics`
partitions, and a process drives exactly the links of its partitions. Each link's state (the
policy's snapshot, what is in force, decisions not yet applied) is a record of the compacted
`optimizer_state` topic (`state.py`), in the partition of the same number. A round of the
loop writes the states that changed, the decision records made, and the consumer offsets of
the windows those states cover in one Kafka transaction, committed with the consumer's group
metadata: the group coordinator refuses it from a process that is no longer a member of the
current generation. A decision is applied to a router only after the transaction that holds
it committed, so a process that lost its links (a rebalance, or it stalled and was dropped)
cannot change their routers; an aborted transaction's states and records go in the next one,
and the consumer's callbacks say what the process still holds (the assignment is
cooperative: a rebalance moves only the partitions that change owner). When the group takes
partitions back, the process stops their links' policies, commits their states and offsets,
and drops them; when it gives partitions, the process reads their changelog and resumes each
link on its first window (a P4BS search continues with its next trial). A window the state
already covers is a replay and skipped, so nothing is decided twice; a decision committed
but not applied (the process died) is applied and recorded by the next owner, so each
decision is recorded once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaException

from p4bs.bus import (
    Outgoing,
    Partition,
    Received,
    RecordConsumer,
    TransactionAborted,
    TransactionalProducer,
)
from p4bs.config import Config, ConfigError, LinkConfig, RouterConfig, link_from_table
from p4bs_optimizer import state as changelog
from p4bs_optimizer.drivers import driver_for
from p4bs_optimizer.drivers.base import DriverError, RouterDriver
from p4bs_optimizer.policies import bayes, policy_for
from p4bs_optimizer.policies.base import Decision, Policy, PolicyOptionError, Window
from p4bs_optimizer.policies.jenks import JenksPolicy
from p4bs_optimizer.policies.p4bs import P4bsOptions, P4bsPolicy
from p4bs_optimizer.state import LinkState
from p4bs_schemas.flows import flow_key

log = logging.getLogger(__name__)

# How often changed state is saved when no decision saved it (then the offsets it covers are
# committed). A crash replays at most this much of a link's windows since its last decision,
# which the policy decides again as it did.
PERSIST_INTERVAL_NS = 1_000_000_000
POLL_BATCH = 500  # records handed to the loop at once
POLL_TIMEOUT_S = 0.05
# Handling a batch, what it staged is committed at least this often (tests/bench/
# optimizer_service.py, searching).
HANDLE_SLICE_NS = 100_000_000
STOP_DECIDING_TIMEOUT_S = 30.0  # at stop, for the decisions in the decide thread
# When partitions are taken back, how long their links' decisions in the decide thread and
# changes in flight may take to finish before they are cancelled (a cancelled change stays
# in the state: the next owner makes it).
RELEASE_TIMEOUT_S = 5.0
# A round of the poll loop (poll, then hand out the records) is a poll timeout plus
# milliseconds; one this long means the process was held up.
STALLED_ROUND_NS = 500_000_000
# A transaction open longer than this is aborted by the broker: what a process that died
# mid-transaction leaves, which holds up read-committed readers of its partitions (the next
# owner restoring the changelog) until then. Ours last milliseconds.
TRANSACTION_TIMEOUT_MS = 6_000
# How often a fit process looks whether its service is still there.
FIT_PARENT_POLL_S = 1.0
WARM_UP_GRID_STEP_BYTES = 1_000  # the throwaway grid search's (any step will do)
RESTORE_TIMEOUT_S = 60.0  # reading a changelog partition to its end, open transactions too


@dataclass
class ServiceStats:
    windows: int = 0
    replayed: int = 0  # windows the saved state already covered
    unknown_links: int = 0  # windows of links the config does not describe
    decisions: int = 0
    applied: int = 0
    failed: int = 0
    skipped: int = 0
    fallbacks: int = 0
    transactions: int = 0
    aborted: int = 0  # transactions the group refused or that failed: the group rejoined
    assigned: int = 0  # partitions the group gave this process, in all
    revoked: int = 0  # partitions taken back, or lost
    not_held: int = 0  # records of partitions taken back before they were handled
    links_changed: int = 0  # links added or changed by the links topic
    links_removed: int = 0
    bad_links: int = 0  # links topic records that make no valid link (passed over)


@dataclass
class Staged:
    """A link's state as it stood when saved, for the next transaction, and the decisions
    that state holds unapplied (applied once it is committed)."""

    record: Outgoing
    unapplied: dict[int, Decision]


def default_instance(config: Config) -> str:
    """A name unique to this process: the group, the host, the process id and a nonce (a
    restarted process is another instance; its predecessor's open transaction is aborted)."""
    host = socket.gethostname()
    return f"{config.optimizer.group}-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


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
        service: OptimizerService,
        partition: int,
        decide_thread: ThreadPoolExecutor | None = None,
    ) -> None:
        self.link = link
        self.policy = policy
        self.state = state
        self.service = service
        self.partition = partition  # of link_metrics, and of the changelog
        self.decide_thread = decide_thread  # None: the policy decides on the loop
        self.last_window_wall_ns = time.monotonic_ns()
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
        self.last_window_wall_ns = time.monotonic_ns()
        self.received += 1
        if self.reading is None and not self.service.dry_run and 0 not in self.state.in_force:
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
        driver = self.service.driver_of(self.link.router)
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
            while self.inbox and not self.service.stopping and not self.released:
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
            self.service.fail(exc)
        finally:
            self.deciding = None

    def _accept(self, window: Window) -> bool:
        """What comes before the policy sees a window: False for a window the state already
        covers (a replay); brings back the policy's buffers after a fallback."""
        if window.window_end_ns <= self.decided_end_ns:
            self.service.stats.replayed += 1
            return False
        self.service.stats.windows += 1
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
        if self.state.fallback or quiet_ns < self.service.config.optimizer.stale_after_ns:
            return
        self.state.fallback = True
        self.dirty = True
        self.service.stats.fallbacks += 1
        reason = (
            f"no link metrics for {quiet_ns / 1e9:.1f} s (limit "
            f"{self.service.config.optimizer.stale_after_ns / 1e9:g} s): the safe buffer"
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
                self.service.record(
                    self.link,
                    replaced,
                    replaced.buffer_bytes,
                    self.state.in_force.get(replaced.queue),
                    f"{replaced.reason}; replaced by a newer decision within the minimum "
                    "interval between changes",
                    "skipped",
                    self.state.epoch,
                    time.time_ns(),
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
        interval_ns = self.service.config.optimizer.min_change_interval_ns
        try:
            while self.authorized and not self.released:
                wait_ns = self.state.last_change_ns + interval_ns - time.time_ns()
                if wait_ns > 0:
                    await asyncio.sleep(wait_ns / 1e9)  # a rate limit, not a synchronisation
                    continue
                decisions = sorted(self.authorized.values(), key=lambda d: d.queue)
                self.authorized.clear()
                self.in_apply = {d.queue: d for d in decisions}
                try:
                    await self._apply(decisions)
                finally:
                    self.in_apply = {}
        except Exception as exc:
            self.service.fail(exc)

    async def _apply(self, decisions: list[Decision]) -> None:
        service = self.service
        driver = None if service.dry_run else service.driver_of(self.link.router)
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
            applied_ns = time.time_ns()
            if outcome == "applied":
                self.state.in_force[decision.queue] = buffer
                self.state.last_change_ns = applied_ns
                if decision.queue == 0:
                    if not self.state.buffer_changes and previous is not None:
                        self.state.buffer_changed(0, previous)
                    self.state.buffer_changed(applied_ns, buffer)
            if self.state.unapplied.get(decision.queue) is decision:
                del self.state.unapplied[decision.queue]
            service.record(
                self.link, decision, buffer, previous, reason, outcome, self.state.epoch, applied_ns
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
        self.service.stage(self)
        self.saved_through = self.snapshot_done


@dataclass
class Ownership:
    """What this process holds of the group's partitions."""

    partitions: set[Partition] = field(default_factory=set)
    next_offsets: dict[Partition, int] = field(default_factory=dict)  # as last committed
    # Records not yet committed, per partition in order, each with its link and window number.
    unsaved: dict[Partition, deque[tuple[int, LinkController | None, int]]] = field(
        default_factory=dict
    )

    def saved_offsets(self, partitions: set[Partition]) -> dict[Partition, int]:
        """Moves each partition's next offset past the records whose windows the saved state
        covers, up to the first that it does not; returns the next offsets of `partitions`."""
        for partition in partitions:
            queue = self.unsaved.get(partition)
            while queue:
                offset, controller, number = queue[0]
                if controller is not None and controller.saved_through < number:
                    break
                self.next_offsets[partition] = offset + 1
                queue.popleft()
        return {p: self.next_offsets[p] for p in partitions if p in self.next_offsets}


class OptimizerService:
    """The links of one process (those on the partitions Kafka gives its consumer)."""

    def __init__(
        self,
        config: Config,
        *,
        dry_run: bool = False,
        instance: str | None = None,
        make_driver: Callable[[RouterConfig], RouterDriver] | None = None,
    ) -> None:
        self.config = config
        self.dry_run = dry_run
        self.instance = instance or default_instance(config)
        self.stats = ServiceStats()
        self.links = {link.id: link for link in config.links}
        self.routers = {router.name: router for router in config.routers}
        self.controllers: dict[str, LinkController] = {}
        self.owned = Ownership()
        self._metrics_topic = config.kafka.topics["link_metrics"]
        self._drivers: dict[str, RouterDriver] = {}
        self._make_driver = make_driver or self._driver_for
        self._producer: TransactionalProducer | None = None
        self._staged: dict[str, tuple[LinkController, Staged]] = {}
        self._outbox: list[Outgoing] = []
        self._stop = threading.Event()
        self._failure: Exception | None = None
        fits = self._fits = config.optimizer.fit_processes or os.cpu_count() or 1
        self._decide_thread = ThreadPoolExecutor(fits, thread_name_prefix="decide")
        self._fit_pool: ProcessPoolExecutor | None = None
        if any(_decides_off_loop(link) for link in config.links):
            # Spawned, not forked: this process runs Kafka clients' threads.
            self._fit_pool = ProcessPoolExecutor(
                fits, mp_context=multiprocessing.get_context("spawn"), initializer=_fit_worker
            )

    def _driver_for(self, router: RouterConfig) -> RouterDriver:
        return driver_for(
            router, links=self.config.links, attempts=self.config.optimizer.apply_attempts
        )

    def driver_of(self, router: str) -> RouterDriver:
        driver = self._drivers.get(router)
        if driver is None:
            driver = self._drivers[router] = self._make_driver(self.routers[router])
        return driver

    def controller(
        self, link_id: str, partition: int, saved: LinkState | None = None
    ) -> LinkController | None:
        """The link's controller: made when its partition is given, resuming from `saved`
        (its changelog), or on its first window. A saved state of another policy gives the
        buffers in force and the windows done; the link's policy starts afresh."""
        controller = self.controllers.get(link_id)
        if controller is not None:
            return controller
        link = self.links.get(link_id)
        if link is None:
            self.stats.unknown_links += 1
            return None
        policy = policy_for(link)
        if saved is not None and saved.policy == link.policy:
            policy.restore(saved.policy_state)
            state = saved
            log.info("link %s: resumed %s from its changelog", link_id, link.policy)
        elif saved is not None:
            state = LinkState(
                policy=link.policy,
                last_window_end_ns=saved.last_window_end_ns,
                in_force=saved.in_force,
                last_change_ns=saved.last_change_ns,
                epoch=saved.epoch,
            )
        else:
            state = LinkState(policy=link.policy)
        state.epoch += 1
        decide_thread = None
        if _decides_off_loop(link):
            decide_thread = self._decide_thread
            if isinstance(policy, P4bsPolicy) and self._fit_pool is not None:
                policy.planner = self._plan_in_pool
        controller = LinkController(link, policy, state, self, partition, decide_thread)
        self.controllers[link_id] = controller
        if state.unapplied:
            controller.save()  # this owner's transaction authorizes them
        return controller

    def _link_changed(self, spec: dict[str, Any]) -> None:
        """A LinkSpec from the links topic, on the loop: the link is added, changed (its
        controller made again under the new settings: a policy kept goes on from its state,
        another starts afresh) or removed (its controller stops; its state stays in the
        changelog). A spec that does not make a valid link is logged and passed over."""
        link_id = spec["link_id"]
        if spec["removed"]:
            if self.links.pop(link_id, None) is not None:
                self.stats.links_removed += 1
                log.info("link %s: removed from the links topic", link_id)
                self._drop(link_id)
            return
        try:
            table = json.loads(spec["config"])
            link = link_from_table(self.config, table, f"links topic, {link_id}")
            if link.id != link_id:
                raise ValueError(f"the entry describes {link.id}")
            policy_for(link)
        except (ValueError, ConfigError, PolicyOptionError) as exc:
            self.stats.bad_links += 1
            log.error("link %s from the links topic passed over: %s", link_id, exc)
            return
        old = self.links.get(link_id)
        if old == link:
            return
        self.links[link_id] = link
        self.stats.links_changed += 1
        log.info("link %s: %s from the links topic", link_id, "changed" if old else "added")
        dropped = self._drop(link_id)
        if dropped is not None:
            self.controller(link_id, dropped.partition, dropped.state)

    def _drop(self, link_id: str) -> LinkController | None:
        """Stops the link's controller, if any, after saving its state; returns it."""
        controller = self.controllers.pop(link_id, None)
        if controller is None:
            return None
        controller.save()
        controller.released = True
        for task in (controller.deciding, controller.applying, controller.reading):
            if task is not None:
                task.cancel()
        return controller

    def _follow_links(self, loop: asyncio.AbstractEventLoop) -> None:
        """In its own thread until the service stops: the links topic from its start, each
        record handed to the loop."""
        try:
            consumer = RecordConsumer(
                self.config.kafka,
                f"{self.config.optimizer.group}-links",
                ["links"],
                self.config.kafka.topics,
                whole_topics=True,
            )
        except KafkaException as exc:  # a deployment without the topic: the config's links
            log.warning("links topic not followed: %s", exc)
            return
        try:
            while not self._stop.is_set():
                received = consumer.poll(0.2)
                if received is not None:
                    loop.call_soon_threadsafe(self._link_changed, received.record)
        finally:
            consumer.close()

    def _plan_in_pool(self, spec: bayes.SearchSpec) -> bayes.Plan:
        """A P4BS search's next step, computed in a fit process (the decide thread waits)."""
        assert self._fit_pool is not None
        return self._fit_pool.submit(bayes.plan, spec).result()

    def stage(self, controller: LinkController) -> None:
        """The controller's state as it is now, for the next transaction."""
        record = changelog.to_record(
            controller.link.id, controller.state, self.instance, time.time_ns()
        )
        self._staged[controller.link.id] = (
            controller,
            Staged(
                Outgoing(changelog.STREAM, record, partition=controller.partition),
                dict(controller.state.unapplied),
            ),
        )

    def record(
        self,
        link: LinkConfig,
        decision: Decision,
        buffer: int,
        previous: int | None,
        reason: str,
        outcome: str,
        epoch: int,
        ts_ns: int,
    ) -> None:
        """One BufferDecision record (for the next transaction), and the log line an
        operator reads."""
        self.stats.decisions += 1
        if outcome == "applied":
            self.stats.applied += 1
        elif outcome == "failed":
            self.stats.failed += 1
        elif outcome == "skipped":
            self.stats.skipped += 1
        self._outbox.append(
            Outgoing(
                "buffer_decisions",
                {
                    "link_id": link.id,
                    "ts_ns": ts_ns,
                    "queue": decision.queue,
                    "policy": link.policy,
                    "phase": decision.phase,
                    "buffer_bytes": buffer,
                    "previous_buffer_bytes": previous,
                    "reason": reason,
                    "trial": decision.trial,
                    "outcome": outcome,
                    "f": decision.f,
                    "window_end_ns": decision.window_end_ns,
                    "owner": self.instance,
                    "epoch": epoch,
                },
            )
        )
        level = logging.WARNING if outcome == "failed" else logging.INFO
        log.log(
            level,
            "link %s q%d: %s %s %d B (%s): %s",
            link.id,
            decision.queue,
            link.policy,
            decision.phase,
            buffer,
            outcome,
            reason,
        )

    # ---- the loop ----------------------------------------------------------------------
    def _streams(self) -> list[str]:
        streams = ["link_metrics"]
        if any(link.policy == JenksPolicy.name for link in self.config.links):
            streams.append("link_counters")
        return streams

    def handle(self, received: Received) -> None:
        """One record from Kafka, on the loop. A window's offset may be committed once the
        controller's `saved_through` reaches its number (other records': at once). A record
        of a partition taken back while its batch was being polled is passed over: its
        partition's new holder reads it."""
        partition = (received.topic, received.partition)
        if partition not in self.owned.partitions:
            self.stats.not_held += 1
            return
        link_id = received.record["link_id"]
        controller, number = None, 0
        if received.stream == "link_metrics":
            controller = self.controller(link_id, received.partition)
            if controller is not None:
                controller.partition = received.partition  # its windows' is its changelog's
                window = Window.from_record(
                    received.record, controller.state.buffer_at(received.record["window_end_ns"])
                )
                number = controller.on_window(window)
        else:
            # RTT samples of a link this process drives (their partitions may differ).
            driven = self.controllers.get(link_id)
            sampled = bool(received.record["rtt_ns"])
            if sampled and driven is not None and isinstance(driven.policy, JenksPolicy):
                driven.policy.observe_flows(
                    received.record["ts_ns"], flow_min_rtts(received.record)
                )
        queue = self.owned.unsaved.setdefault(partition, deque())
        queue.append((received.offset, controller, number))

    async def _handle_batch(self, batch: list[Received], consumer: RecordConsumer) -> None:
        """Handles a polled batch, committing what it staged every HANDLE_SLICE_NS: a batch
        that ends many searches' trials at once holds their fits (200 P4BS links in step:
        ~0.5 s), and each decision waits for a transaction before it is applied, then for
        another that holds its record."""
        began = time.monotonic_ns()
        for received in batch:
            self.handle(received)
            if self._staged and time.monotonic_ns() - began >= HANDLE_SLICE_NS:
                await self._commit(consumer)
                # The decisions it authorized are applied now, so that their records go in
                # the next slice's transaction.
                await asyncio.sleep(0)
                began = time.monotonic_ns()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def fail(self, exc: Exception) -> None:
        """A policy failed in the decide thread: `run` raises it, as a failure on the loop
        would have been raised."""
        if self._failure is None:
            self._failure = exc
        self._stop.set()

    def _take_outgoing(
        self, links: set[str] | None
    ) -> tuple[list[Outgoing], list[tuple[LinkController, Staged]]]:
        """The staged states and the decision records of `links` (None: all), taken for a
        transaction."""
        if links is None:
            staged, self._staged = list(self._staged.values()), {}
            outbox, self._outbox = self._outbox, []
        else:
            staged = [self._staged.pop(link) for link in links if link in self._staged]
            outbox = [o for o in self._outbox if o.record["link_id"] in links]
            self._outbox = [o for o in self._outbox if o.record["link_id"] not in links]
        return [s.record for _, s in staged] + outbox, staged

    async def _commit(self, consumer: RecordConsumer) -> None:
        """One transaction: the staged states, the decision records, and the offsets of
        every partition held (so that the coordinator checks this member's generation);
        then the decisions it holds are applied. If it is aborted, the process joins the group
        again and resumes what it is given from what was committed."""
        assert self._producer is not None
        records, staged = self._take_outgoing(None)
        offsets = self.owned.saved_offsets(self.owned.partitions)
        if not records and not offsets:
            return
        try:
            await asyncio.to_thread(
                self._producer.commit, records, offsets, consumer.group_metadata()
            )
        except TransactionAborted as exc:
            self.stats.aborted += 1
            log.warning("transaction aborted (%s): its states and records go in the next one", exc)
            self._restage(staged, records[len(staged) :])
            return
        self.stats.transactions += 1
        for controller, entry in staged:
            controller.authorize(entry.unapplied)

    # ---- partitions given and taken back (called from the polling thread) -------------
    def _assigned(
        self, consumer: RecordConsumer, loop: asyncio.AbstractEventLoop, given: list[Partition]
    ) -> None:
        numbers = sorted(p for t, p in given if t == self._metrics_topic)
        states = changelog.restore(
            self.config.kafka, self.config.kafka.topics, numbers, RESTORE_TIMEOUT_S
        )
        offsets = consumer.committed(given)
        log.info(
            "given %s: %d link states read from the changelog",
            ", ".join(f"{t}[{p}]" for t, p in sorted(given)),
            len(states),
        )
        asyncio.run_coroutine_threadsafe(self._take(given, states, offsets), loop).result()

    async def _take(
        self,
        given: list[Partition],
        states: dict[str, tuple[int, LinkState]],
        offsets: dict[Partition, int],
    ) -> None:
        """Holds the partitions given, and resumes their links at once: a link whose
        metrics stopped with its previous owner falls back after `stale_after` here."""
        self.stats.assigned += len(given)
        self.owned.partitions.update(given)
        self.owned.next_offsets.update(offsets)
        for link_id, (partition, saved) in states.items():
            if link_id in self.links:
                self.controller(link_id, partition, saved)

    def _revoked(
        self,
        consumer: RecordConsumer,
        loop: asyncio.AbstractEventLoop,
        taken: list[Partition],
        *,
        lost: bool,
    ) -> None:
        """Stops the links of the partitions taken back; unless they were lost (another
        member may own them already), commits their states and offsets first."""
        future = asyncio.run_coroutine_threadsafe(self._release(set(taken), lost=lost), loop)
        records, offsets = future.result()
        if lost or not (records or offsets):
            return
        assert self._producer is not None
        try:
            self._producer.commit(records, offsets, consumer.group_metadata())
            self.stats.transactions += 1
        except TransactionAborted as exc:
            self.stats.aborted += 1
            log.warning(
                "handing over: transaction aborted (%s); the next owner resumes "
                "from the state committed before",
                exc,
            )

    async def _release(
        self, taken: set[Partition], *, lost: bool
    ) -> tuple[list[Outgoing], dict[Partition, int]]:
        self.stats.revoked += len(taken)
        numbers = {p for t, p in taken if t == self._metrics_topic}
        released = [c for c in self.controllers.values() if c.partition in numbers]
        for controller in released:
            controller.released = True
        tasks = [t for c in released for t in (c.deciding, c.applying, c.reading) if t]
        if tasks:
            if not lost:
                await asyncio.wait(tasks, timeout=RELEASE_TIMEOUT_S)
            for task in tasks:
                task.cancel()
        for controller in released:
            if not lost:
                controller.save()
            del self.controllers[controller.link.id]
        links = {c.link.id for c in released}
        records, _ = self._take_outgoing(links)
        offsets = self.owned.saved_offsets(taken)
        # The offsets of every partition held, so that the coordinator checks the generation.
        fence = {p: o for p, o in self.owned.next_offsets.items() if p in self.owned.partitions}
        self.owned.partitions -= taken
        for partition in taken:
            self.owned.unsaved.pop(partition, None)
            self.owned.next_offsets.pop(partition, None)
        if released:
            log.info(
                "%s %s: %d links handed over",
                "lost" if lost else "taken back",
                ", ".join(f"{t}[{p}]" for t, p in sorted(taken)),
                len(released),
            )
        return records, {**fence, **offsets}

    def _restage(self, staged: list[tuple[LinkController, Staged]], outbox: list[Outgoing]) -> None:
        """After an aborted transaction: what it held goes in the next one (a state staged
        since replaces its own). Nothing of it was applied, and what this process still
        holds is the group's to say: most aborts are a rebalance under way (the coordinator
        refuses the generation this one began in), after which the process keeps its
        partitions, or this member was dropped, when the consumer reports the partitions
        lost and they are released."""
        for controller, entry in staged:
            link_id = controller.link.id
            if link_id not in self._staged and self.controllers.get(link_id) is controller:
                self._staged[link_id] = (controller, entry)
        self._outbox[:0] = outbox

    async def run(self, on_tick: Callable[[OptimizerService], None] | None = None) -> None:
        """Consumes until `stop()`; `on_tick` is called about once a second (progress)."""
        loop = asyncio.get_running_loop()
        self._producer = await asyncio.to_thread(
            TransactionalProducer,
            self.config.kafka,
            self.config.kafka.topics,
            self.instance,
            TRANSACTION_TIMEOUT_MS,
        )
        if any(_fits_on_loop(link) for link in self.config.links):
            # Before the first window: the first fit would otherwise hold the loop, and every
            # link's windows with it, while it imports numpy and scipy (bayes.warm_up).
            seconds = await asyncio.to_thread(bayes.warm_up, WARM_UP_GRID_STEP_BYTES)
            log.info("grid GP fit warmed up in %.2f s", seconds)
        consumer: RecordConsumer | None = None

        def assigned(given: list[Partition]) -> None:
            assert consumer is not None
            self._assigned(consumer, loop, given)

        def revoked(taken: list[Partition]) -> None:
            assert consumer is not None
            self._revoked(consumer, loop, taken, lost=False)

        def lost(taken: list[Partition]) -> None:
            assert consumer is not None
            self._revoked(consumer, loop, taken, lost=True)

        session_ms = self.config.optimizer.session_timeout_ns // 1_000_000
        consumer = RecordConsumer(
            self.config.kafka,
            self.config.optimizer.group,
            self._streams(),
            self.config.kafka.topics,
            store_on_poll=False,
            transactional=True,
            settings={
                "session.timeout.ms": session_ms,
                "heartbeat.interval.ms": max(100, session_ms // 4),
                "client.id": self.instance,  # the group's member, by its owner name
                # A rebalance moves only the partitions that change owner; the other links
                # stay where they are (the eager default takes every partition back and gives
                # them out again: every process restores all its links from the changelog).
                "partition.assignment.strategy": "cooperative-sticky",
            },
            on_assign=assigned,
            on_revoke=revoked,
            on_lost=lost,
        )
        follower = threading.Thread(target=self._follow_links, args=(loop,), name="links")
        follower.start()
        if self._fit_pool is not None:
            # Each fit process imports Ax and torch and fits once as it starts (seconds),
            # before the links' first fits come.
            for _ in range(self._fits):
                self._fit_pool.submit(int)
        last_persist = last_tick = last_round = time.monotonic_ns()
        try:
            while not self._stop.is_set():
                batch = await asyncio.to_thread(_poll_batch, consumer)
                await self._handle_batch(batch, consumer)
                now = time.monotonic_ns()
                if now - last_round < STALLED_ROUND_NS:
                    for controller in self.controllers.values():
                        controller.check_stale(now)
                # else this process stalled (e.g. a thread held the GIL loading torch): the
                # windows of that time may be waiting in the consumer, not missing, so
                # staleness is judged after the next poll.
                last_round = now
                if now - last_persist >= PERSIST_INTERVAL_NS:
                    for controller in self.controllers.values():
                        if controller.dirty:
                            controller.save()
                    await self._commit(consumer)
                    last_persist = now
                elif self._staged or self._outbox:
                    await self._commit(consumer)
                if on_tick is not None and now - last_tick >= 1_000_000_000:
                    on_tick(self)
                    last_tick = now
            if self._failure is not None:
                raise self._failure
        finally:
            self._stop.set()  # also when the loop failed: the inboxes stop being decided
            await asyncio.to_thread(follower.join)
            deciding = [c.deciding for c in self.controllers.values() if c.deciding]
            if deciding:  # each stops after the decision in the thread
                await asyncio.wait(deciding, timeout=STOP_DECIDING_TIMEOUT_S)
            in_flight = [
                task
                for c in self.controllers.values()
                for task in (c.applying, c.reading)
                if task is not None
            ]
            if in_flight:
                await asyncio.wait(in_flight, timeout=10)
            for controller in self.controllers.values():
                controller.save()
            with contextlib.suppress(TransactionAborted):
                await self._commit(consumer)
            # Leaving the group hands the partitions over at once (the revoke finds nothing
            # more to commit); the callbacks come back to this loop, so not from it.
            await asyncio.to_thread(consumer.close)
            self._producer.flush(10.0)
            self._decide_thread.shutdown(wait=False, cancel_futures=True)
            if self._fit_pool is not None:
                self._fit_pool.shutdown(wait=False, cancel_futures=True)
            for driver in self._drivers.values():
                await driver.close()


def _p4bs_options(link: LinkConfig) -> P4bsOptions | None:
    """A P4BS link's options; None for another policy's link, or for options the link's
    controller refuses (it reports them when it is made)."""
    if link.policy != P4bsPolicy.name:
        return None
    try:
        return P4bsOptions.parse(link.policy_options)
    except PolicyOptionError:
        return None


def _decides_off_loop(link: LinkConfig) -> bool:
    """A link whose `decide` may hold the loop for long: a P4BS search on log(buffer), which
    fits its GP with Ax when a trial ends (0.1-0.3 s; the authors' grid search, P4BS's
    default, a few ms: tests/bench/ax_decision.py)."""
    options = _p4bs_options(link)
    return options is not None and options.grid_step_ns == 0


def _fits_on_loop(link: LinkConfig) -> bool:
    """A link whose policy fits a GP on the loop: P4BS on the authors' grid."""
    options = _p4bs_options(link)
    return options is not None and options.grid_step_ns > 0


def _fit_worker() -> None:
    """A fit process as it starts: Ctrl-C is the service's to handle (it stops the pool), it
    ends with its service, and Ax and torch are loaded and a first GP fitted before any
    link's fit comes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    service = os.getppid()
    threading.Thread(target=_exit_with, args=(service,), name="service", daemon=True).start()
    bayes.warm_up()


def _exit_with(service: int) -> None:
    """Ends this fit process once its service is gone (the process is then re-parented): a
    killed service cannot stop its pool, whose processes would otherwise stay for ever."""
    while os.getppid() == service:
        time.sleep(FIT_PARENT_POLL_S)  # a poll: a parent's death gives nothing to wait on
    os._exit(0)


def flow_min_rtts(batch: dict[str, Any]) -> dict[str, int]:
    """The flows of a LinkCounters record's RTT samples ("src:sport>dst:dport/proto") and
    their lowest RTT, ns."""
    lowest: dict[int, int] = {}
    for index, rtt_ns in zip(batch["flow_index"], batch["rtt_ns"], strict=True):
        if rtt_ns < lowest.get(index, rtt_ns + 1):
            lowest[index] = rtt_ns
    flows = batch["flows"]
    return {
        flow_key(f["src_ip"], f["src_port"], f["dst_ip"], f["dst_port"], f["protocol"]): rtt
        for f, rtt in ((flows[i], rtt) for i, rtt in lowest.items())
    }


def _poll_batch(consumer: RecordConsumer) -> list[Received]:
    """Up to POLL_BATCH records, waiting at most POLL_TIMEOUT_S for the first."""
    batch: list[Received] = []
    first = consumer.poll(POLL_TIMEOUT_S)
    while first is not None:
        batch.append(first)
        if len(batch) >= POLL_BATCH:
            break
        first = consumer.poll(0)
    return batch


def summary_line(service: OptimizerService) -> str:
    s = service.stats
    return (
        f"links {len(service.controllers)}, windows {s.windows} (replayed {s.replayed}), "
        f"decisions {s.decisions}: applied {s.applied}, failed {s.failed}, "
        f"fallbacks {s.fallbacks}, unknown links {s.unknown_links}, partitions "
        f"{len(service.owned.partitions)}, transactions {s.transactions} (aborted {s.aborted})"
    )
