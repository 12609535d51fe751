"""The optimizer service: link metrics in, buffer decisions out and applied to routers.

One process drives many links. A thread polls Kafka (the link_metrics topic, and
rtt_samples when a link separates flows by RTT) and hands each window to its link's
`LinkController` on the asyncio loop; the controller runs the link's policy, holds its
decisions to the safety guards and applies them through the router's driver without blocking
the other links (each driver limits its own concurrent changes). Processes in one consumer
group share the links: Kafka gives each its partitions, and records are keyed by link.

Most policies decide in microseconds and run on the loop. A policy in `OFF_LOOP_POLICIES`
can take far longer (P4BS fits a GP when a trial ends), so its `decide` runs in the service's
decide thread: the link's windows wait in its inbox meanwhile and are decided one at a time,
in order, while the other links go on. The policy is never snapshotted while it decides.

Safety, per link: a buffer is always within the link's [min, max]; two changes are at least
`optimizer.min_change_interval` apart (a decision that comes sooner waits, and a newer one
replaces it); when no window has come for `optimizer.stale_after`, the link's safe buffer is
applied (phase "fallback") until metrics return, and then the policy's buffer again; every
change is read back from the router; `dry_run` decides and records without applying. Every
decision is a BufferDecision record on the decisions topic (the InfluxDB sink stores them).
The router's buffer is read when the service takes a link: until the first change it applies,
the windows (which know a buffer from the applied decisions only) carry that one, so a policy
can measure where the link is before it moves it.

State (the policy's snapshot, what is in force) is saved per link (`state.StateStore`) with
every decision, before it is applied, and otherwise every `PERSIST_INTERVAL_NS` when it
changed; the states of a poll round are written in one transaction. Kafka offsets are
committed only for windows the saved state covers (decided, not merely received), and a
window the saved state already covers is skipped, so a restarted service resumes where it
was, without deciding anything twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from p4bs import paths
from p4bs.bus import Received, RecordConsumer, RecordProducer
from p4bs.config import Config, LinkConfig, RouterConfig
from p4bs_optimizer.drivers import driver_for
from p4bs_optimizer.drivers.base import DriverError, RouterDriver
from p4bs_optimizer.policies import bayes, policy_for
from p4bs_optimizer.policies.base import Decision, Policy, Window
from p4bs_optimizer.policies.jenks import JenksPolicy
from p4bs_optimizer.policies.p4bs import P4bsPolicy
from p4bs_optimizer.state import LinkState, StateStore
from p4bs_schemas.flows import flow_key

log = logging.getLogger(__name__)

# How often changed state is saved when no decision saved it (then the offsets it covers are
# committed). A crash replays at most this much of a link's windows since its last decision,
# which the policy decides again as it did.
PERSIST_INTERVAL_NS = 1_000_000_000
POLL_BATCH = 500  # records handed to the loop at once
POLL_TIMEOUT_S = 0.05
# Policies whose `decide` may hold the loop for long: P4BS fits a GP with Ax when a trial
# ends (0.2-0.3 s, tests/bench/ax_decision.py), and its first fit imports Ax and torch
# (seconds). Their windows are decided in the decide thread, the others' on the loop.
OFF_LOOP_POLICIES = frozenset({P4bsPolicy.name})
# One thread: a fit is Python-bound (4 threads fitting 16 searches took as long as one did),
# so more threads would only take the GIL from the loop more often; and Ax seeds the
# process-wide torch/numpy RNGs around every fit (`with_rng_seed`), which fits running at
# once could interleave, making a search depend on other links' timing.
DECIDE_THREADS = 1
STOP_DECIDING_TIMEOUT_S = 30.0  # at stop, for the decisions in the decide thread
# A round of the poll loop (poll, then hand out the records) is a poll timeout plus
# milliseconds; one this long means the process was held up.
STALLED_ROUND_NS = 500_000_000


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


def default_state_dir(config: Config) -> Path:
    folder = config.optimizer.state_dir
    if folder:
        return Path(folder)
    return paths.home() / ".run" / "optimizer" / config.optimizer.group


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
        decide_thread: ThreadPoolExecutor | None = None,
    ) -> None:
        self.link = link
        self.policy = policy
        self.state = state
        self.service = service
        self.decide_thread = decide_thread  # None: the policy decides on the loop
        self.last_window_wall_ns = time.monotonic_ns()
        self.saved_ns = 0
        self.pending: dict[int, Decision] = {}  # queue -> decision held by the interval guard
        self.applying: asyncio.Task[None] | None = None
        self.dirty = False
        self.inbox: deque[Window] = deque()  # windows waiting for the decide thread
        self.deciding: asyncio.Task[None] | None = None  # works through the inbox
        self.in_thread = False  # the policy is deciding in the decide thread right now
        self.received = 0
        self.done = 0
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
        window = self._with_buffer_in_force(window)
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

    def _with_buffer_in_force(self, window: Window) -> Window:
        """The metrics job knows a window's buffer from the applied decisions only; until the
        first change the service applies, it is the router's own, as read."""
        initial = self.state.in_force.get(0)
        if window.buffer_bytes is not None or initial is None or self.state.last_change_ns:
            return window
        return replace(window, buffer_bytes=initial)

    def _decide_here(self, window: Window) -> None:
        decisions = self.policy.decide(window) if self._accept(window) else None
        self._decided(window, decisions)

    async def _decide_inbox(self) -> None:
        """Decides the inbox's windows in the decide thread, one after the other, until it is
        empty or the service stops (the rest are left to a restart: their offsets are not
        committed). A failing policy stops the service, as it would on the loop."""
        loop = asyncio.get_running_loop()
        try:
            while self.inbox and not self.service.stopping:
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
        """What comes before the policy sees a window: False for a window the saved state
        already covers (a replay); brings back the policy's buffers after a fallback."""
        if window.window_end_ns <= self.state.last_window_end_ns:
            self.service.stats.replayed += 1
            return False
        self.service.stats.windows += 1
        if self.state.fallback:
            # Metrics are back: the policy's own buffers return.
            self.state.fallback = False
            restored = [
                Decision(b, "resume", "metrics are back; the policy's buffer returns", queue=q)
                for q, b in sorted(self.state.intended.items())
            ]
            self.submit(restored, from_policy=False)
        return True

    def _decided(self, window: Window, decisions: list[Decision] | None) -> None:
        """The window is done: `decisions` are the policy's, None for a replay."""
        self.done += 1
        if decisions is None:
            if not self.dirty:
                self.saved_through = self.done  # a replay changes nothing: saved as it is
            return
        # Only now does the state cover the window: a state saved while the policy was
        # deciding must not make a restart skip it.
        self.state.last_window_end_ns = window.window_end_ns
        self.dirty = True
        self.submit(decisions, from_policy=True)

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
        if not decisions:
            return
        for decision in decisions:
            if from_policy:
                self.state.intended[decision.queue] = decision.buffer_bytes
                if self.state.fallback:
                    continue  # remembered; applied when metrics return
            replaced = self.pending.get(decision.queue)
            if replaced is not None:
                self.service.record(
                    self.link,
                    replaced,
                    replaced.buffer_bytes,
                    self.state.in_force.get(replaced.queue),
                    f"{replaced.reason}; replaced by a newer decision within the minimum "
                    "interval between changes",
                    "skipped",
                )
            self.pending[decision.queue] = decision
        # Saved before it is applied: a restart must not decide (and apply) it again from the
        # windows it replays, which for a search would mean old trial buffers in a row.
        self.save()
        if self.applying is None or self.applying.done():
            self.applying = asyncio.get_running_loop().create_task(self._apply_pending())

    async def _apply_pending(self) -> None:
        self.service.store.flush()  # the decisions' state is on disk before they apply
        interval_ns = self.service.config.optimizer.min_change_interval_ns
        while self.pending:
            wait_ns = self.state.last_change_ns + interval_ns - time.time_ns()
            if wait_ns > 0:
                await asyncio.sleep(wait_ns / 1e9)  # a rate limit, not a synchronisation
                continue
            decisions = sorted(self.pending.values(), key=lambda d: d.queue)
            self.pending.clear()
            await self._apply(decisions)

    async def _apply(self, decisions: list[Decision]) -> None:
        service = self.service
        driver = service.driver_of(self.link.router)
        flows = {d.queue: list(d.flows) for d in decisions if d.flows}
        classifier_error = None
        if flows and not service.dry_run:
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
            if previous is None and not service.dry_run:
                with contextlib.suppress(DriverError):  # the set below reports the failure
                    previous = await driver.get_buffer(self.link.interface, decision.queue)
            if service.dry_run:
                outcome = "dry_run"
            elif classifier_error is not None:
                outcome, reason = "failed", f"{reason}; classifier not set: {classifier_error}"
            else:
                try:
                    buffer = await driver.set_buffer(self.link.interface, decision.queue, buffer)
                    outcome = "applied"
                except DriverError as exc:
                    outcome, reason = "failed", f"{reason}; {exc}"
            if outcome == "applied":
                self.state.in_force[decision.queue] = buffer
                self.state.last_change_ns = time.time_ns()
            service.record(self.link, decision, buffer, previous, reason, outcome)
        self.dirty = True

    # ---- state -------------------------------------------------------------------------
    def save(self) -> None:
        """Saves the link's state, unless the policy is deciding in the decide thread (its
        state is changing there): it stays dirty, saved once the decision is in."""
        if self.in_thread:
            self.dirty = True
            return
        self.state.policy_state = self.policy.snapshot()
        self.service.store.stage(self.link.id, self.state)
        self.saved_ns = time.monotonic_ns()
        self.saved_through = self.done
        self.dirty = False


class OptimizerService:
    """The links of one process (those on the partitions Kafka gives its consumer)."""

    def __init__(
        self,
        config: Config,
        *,
        dry_run: bool = False,
        state_dir: Path | None = None,
        make_driver: Callable[[RouterConfig], RouterDriver] | None = None,
    ) -> None:
        self.config = config
        self.dry_run = dry_run
        self.store = StateStore(state_dir or default_state_dir(config))
        self.stats = ServiceStats()
        self.links = {link.id: link for link in config.links}
        self.routers = {router.name: router for router in config.routers}
        self.controllers: dict[str, LinkController] = {}
        self._drivers: dict[str, RouterDriver] = {}
        self._make_driver = make_driver or self._driver_for
        self._producer = RecordProducer(
            config.kafka, config.kafka.topics, client_id=f"{config.optimizer.group}"
        )
        self._stop = threading.Event()
        self._failure: Exception | None = None
        self._decide_thread = ThreadPoolExecutor(DECIDE_THREADS, thread_name_prefix="decide")

    def _driver_for(self, router: RouterConfig) -> RouterDriver:
        return driver_for(
            router, links=self.config.links, attempts=self.config.optimizer.apply_attempts
        )

    def driver_of(self, router: str) -> RouterDriver:
        driver = self._drivers.get(router)
        if driver is None:
            driver = self._drivers[router] = self._make_driver(self.routers[router])
        return driver

    def controller(self, link_id: str) -> LinkController | None:
        """The link's controller, made (and resumed from saved state) on its first record."""
        controller = self.controllers.get(link_id)
        if controller is not None:
            return controller
        link = self.links.get(link_id)
        if link is None:
            self.stats.unknown_links += 1
            return None
        policy = policy_for(link)
        saved = self.store.load(link_id)
        if saved is not None and saved.policy == link.policy:
            policy.restore(saved.policy_state)
            state = saved
            log.info("link %s: resumed %s from saved state", link_id, link.policy)
        else:
            state = LinkState(policy=link.policy)
        decide_thread = self._decide_thread if link.policy in OFF_LOOP_POLICIES else None
        controller = LinkController(link, policy, state, self, decide_thread)
        self.controllers[link_id] = controller
        return controller

    def record(
        self,
        link: LinkConfig,
        decision: Decision,
        buffer: int,
        previous: int | None,
        reason: str,
        outcome: str,
    ) -> None:
        """One BufferDecision record, and the log line an operator reads."""
        self.stats.decisions += 1
        if outcome == "applied":
            self.stats.applied += 1
        elif outcome == "failed":
            self.stats.failed += 1
        elif outcome == "skipped":
            self.stats.skipped += 1
        self._producer.produce(
            "buffer_decisions",
            {
                "link_id": link.id,
                "ts_ns": time.time_ns(),
                "queue": decision.queue,
                "policy": link.policy,
                "phase": decision.phase,
                "buffer_bytes": buffer,
                "previous_buffer_bytes": previous,
                "reason": reason,
                "trial": decision.trial,
                "outcome": outcome,
                "f": decision.f,
            },
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
            streams.append("rtt_samples")
        return streams

    def handle(self, received: Received) -> tuple[LinkController | None, int]:
        """One record from Kafka, on the loop. Returns the link's controller and, for a
        window, its number: the record's offset may be committed once the controller's
        `saved_through` reaches it (other records: at once)."""
        controller = self.controller(received.record["link_id"])
        if controller is None:
            return None, 0
        if received.stream == "link_metrics":
            return controller, controller.on_window(Window.from_record(received.record))
        if isinstance(controller.policy, JenksPolicy):
            controller.policy.observe_flows(
                received.record["ts_ns"], flow_min_rtts(received.record)
            )
        return controller, 0

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

    async def run(self, on_tick: Callable[[OptimizerService], None] | None = None) -> None:
        """Consumes until `stop()`; `on_tick` is called about once a second (progress)."""
        consumer = RecordConsumer(
            self.config.kafka,
            self.config.optimizer.group,
            self._streams(),
            self.config.kafka.topics,
            store_on_poll=False,
        )
        if any(link.policy in OFF_LOOP_POLICIES for link in self.links.values()):
            # Queued first in the decide thread, so the links' first fits come after it.
            self._decide_thread.submit(_warm_up_ax)
        # Records not yet committed, in arrival order, each with its link and window number.
        unsaved: deque[tuple[Received, LinkController | None, int]] = deque()
        last_persist = last_tick = last_round = time.monotonic_ns()
        try:
            while not self._stop.is_set():
                batch = await asyncio.to_thread(_poll_batch, consumer)
                for received in batch:
                    unsaved.append((received, *self.handle(received)))
                self.store.flush()  # the round's decisions, before their applies start
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
                    self.store.flush()
                    consumer.handled(_saved_prefix(unsaved))
                    last_persist = now
                if on_tick is not None and now - last_tick >= 1_000_000_000:
                    on_tick(self)
                    last_tick = now
            if self._failure is not None:
                raise self._failure
        finally:
            self._stop.set()  # also when the loop failed: the inboxes stop being decided
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
            self.store.flush()
            consumer.handled(_saved_prefix(unsaved))
            consumer.close()
            self._producer.flush(10.0)
            self._decide_thread.shutdown(wait=False, cancel_futures=True)
            for driver in self._drivers.values():
                await driver.close()


def _warm_up_ax() -> None:
    seconds = bayes.warm_up()
    log.info("Ax and torch loaded and a first GP fitted in %.1f s", seconds)


def flow_min_rtts(batch: dict[str, Any]) -> dict[str, int]:
    """An RttSampleBatch's flows ("src:sport>dst:dport/proto") and their lowest RTT, ns."""
    lowest: dict[int, int] = {}
    for index, rtt_ns in zip(batch["flow_index"], batch["rtt_ns"], strict=True):
        if rtt_ns < lowest.get(index, rtt_ns + 1):
            lowest[index] = rtt_ns
    flows = batch["flows"]
    return {
        flow_key(f["src_ip"], f["src_port"], f["dst_ip"], f["dst_port"], f["protocol"]): rtt
        for f, rtt in ((flows[i], rtt) for i, rtt in lowest.items())
    }


def _saved_prefix(unsaved: deque[tuple[Received, LinkController | None, int]]) -> list[Received]:
    """Takes from the front of `unsaved` the records whose windows the saved state covers,
    up to the first that it does not: offsets are committed per partition up to a record,
    and arrival order keeps each partition's order."""
    saved = []
    while unsaved:
        received, controller, number = unsaved[0]
        if controller is not None and controller.saved_through < number:
            break
        saved.append(received)
        unsaved.popleft()
    return saved


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
        f"fallbacks {s.fallbacks}, unknown links {s.unknown_links}"
    )
