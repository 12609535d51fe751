"""The optimizer service: link metrics in, buffer decisions out and applied to routers.

One process drives many links. A thread polls Kafka (the link_metrics topic, or the
optimizer feed with [metrics] optimizer_feed (`feed.py`), and the RTT samples of
link_counters when a link separates flows by RTT) and hands each window to its
link's controller (controller.py: the policy and the safety guards) on the asyncio loop.
Processes in one consumer group share the links: Kafka gives each its partitions, and records
are keyed by link (ownership.py). Policies that fit a GP for long do it off the loop
(fit_pool.py); the links topic adds, changes and removes links while the service runs
(links_follower.py). This module wires them: the loop, the drivers, and the transactions.

State and transactions: each link's state is a record of the compacted `optimizer_state`
topic (`changelog.py`). A round of the loop writes the states that changed, the decision records
made, and the consumer offsets of the windows those states cover in one Kafka transaction
(transaction.py), committed with the consumer's group metadata: the group coordinator refuses
it from a process that is no longer a member of the current generation. A decision is applied
to a router only after the transaction that holds it committed, so a process that lost its
links (a rebalance, or it stalled and was dropped) cannot change their routers; an aborted
transaction's states and records go in the next one, and the consumer's callbacks say what
the process still holds. A window the state already covers is a replay and skipped, so
nothing is decided twice; a decision committed but not applied (the process died) is applied
and recorded by the next owner, so each decision is recorded once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import threadpoolctl

from p4bs.bus import (
    ConsumerStats,
    Partition,
    Received,
    RecordConsumer,
    TransactionAborted,
    TransactionalProducer,
)
from p4bs.config import Config, RouterConfig
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.drivers import driver_for
from p4bs_optimizer.drivers.base import RouterDriver
from p4bs_optimizer.policies import policy_for
from p4bs_optimizer.policies.base import Policy, Window
from p4bs_optimizer.policies.jenks import JenksPolicy
from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.fit_pool import FitPool, warm_up_grid
from p4bs_optimizer.service.guards import ChangeBudget, Guards
from p4bs_optimizer.service.links_follower import LinksFollower
from p4bs_optimizer.service.ownership import Ownership
from p4bs_optimizer.service.quiet import QuietWatch
from p4bs_optimizer.service.stats import ServiceStats
from p4bs_optimizer.service.transaction import NextTransaction, Transaction
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
# Reading a backlog (full batches of records this old), what was staged goes in a transaction
# every HANDLE_SLICE_NS, not after each batch: a transaction takes ~25 ms here, so one a batch
# of POLL_BATCH capped a survivor taking over a killed instance's links at ~12,000 windows a
# second, as many as its links' live ones. A burst of fresh windows (a tick's of many links)
# is committed batch by batch, as the latency of the decisions in it wants.
BACKLOG_NS = 1_000_000_000
STOP_DECIDING_TIMEOUT_S = 30.0  # at stop, for the decisions in the decide thread
# A round of the poll loop (poll, then hand out the records) is a poll timeout plus
# milliseconds; one this long means the process was held up.
STALLED_ROUND_NS = 500_000_000
# Staleness is a matter of seconds: judged ten times a second, not after every batch (a
# backlog is read in tens of batches a second), of the links that may be quiet (quiet.py).
STALE_CHECK_NS = 100_000_000
# A transaction open longer than this is aborted by the broker: what a process that died
# mid-transaction leaves, which holds up read-committed readers of its partitions (the next
# owner restoring the changelog) until then. Ours last milliseconds. With the broker's check
# every second (the stack's setting) a dead process's transaction is gone within 4 s, before
# its session timeout (6 s at least) gives its partitions to another; at 6 s the abort could
# come up to 7 s after a kill, later than the handover's start (5.4-6.6 s).
TRANSACTION_TIMEOUT_MS = 3_000
# ~900 of the group benchmark's windows (18 B each, lz4), fewer of a real feed's: a fraction
# of a second of a partition's links.
MAX_PARTITION_FETCH_BYTES = 16 * 1024


# While the service runs, the garbage collector takes its young generation after 20,000 net
# allocations rather than Python's 700. A batch of 500 windows keeps thousands of objects
# alive at once: at 700 the collector ran every few batches and promoted them, and the oldest
# generation, which it then collects whole (0.1-0.5 s at 10,000 links: every link's
# controller, policy and state), grew by a quarter within seconds. In process, 10,000 links
# with a window a second each: 442 young and 1 full collection in 15 s at 700, none at
# 20,000; a young collection of 20,000 objects takes a millisecond or two.
GC_YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def fewer_young_collections() -> Iterator[None]:
    """The collector's young threshold at GC_YOUNG_THRESHOLD, then back as it was."""
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def blas_on_one_thread() -> threadpoolctl.threadpool_limits:
    """numpy's BLAS (OpenBLAS) on one thread while the service runs, then back as it was.

    OpenBLAS starts a thread per core, and after a parallel product its threads spin for a
    while waiting for the next. The loop's GP fits (P4BS on the grid: products of a few
    hundred candidates by a few trials) are small and come often, so the spinning took CPU
    from the loop, the broker and the window producer: with 200 P4BS searches in the
    process, it cost a third of the service's CPU and doubled its decisions' lag p99
    (optimizer/README.md, "CPU per link"). scipy's own OpenBLAS, loaded with the first fit,
    is left as it is: limiting numpy's alone measured the same as OPENBLAS_NUM_THREADS=1,
    which limits both (0.36-0.38 CPU s/s and the same lag)."""
    return threadpoolctl.threadpool_limits(limits=1, user_api="blas")


def default_instance(config: Config) -> str:
    """A name unique to this process: the group, the host, the process id and a nonce (a
    restarted process is another instance; its predecessor's open transaction is aborted)."""
    host = socket.gethostname()
    return f"{config.optimizer.group}-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class OptimizerService:
    """The links of one process (those on the partitions Kafka gives its consumer).

    `on_record` is called on the loop with each BufferDecision record as it is made, and
    `on_transaction` after each round's transaction (not the handover's when partitions are
    taken back): what a benchmark measures."""

    def __init__(
        self,
        config: Config,
        *,
        dry_run: bool = False,
        instance: str | None = None,
        make_driver: Callable[[RouterConfig], RouterDriver] | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        on_transaction: Callable[[Transaction], None] | None = None,
    ) -> None:
        self.config = config
        self.guards = Guards.of(config.optimizer, dry_run=dry_run)
        self.dry_run = self.guards.dry_run  # the flag or the config's
        self.instance = instance or default_instance(config)
        self.stats = ServiceStats()
        # Its consumer's counts (records taken, dead letters): those of the consumer `run`
        # makes, once it runs.
        self.consumer_stats = ConsumerStats()
        self.links = {link.id: link for link in config.links}
        self.routers = {router.name: router for router in config.routers}
        self.controllers: dict[str, LinkController] = {}
        self.quiet = QuietWatch()  # which of them the stale check asks
        self.outgoing = NextTransaction(self.instance, self.stats, on_record)
        self.owned = Ownership(config, self.stats, self, self.outgoing)
        self.follower = LinksFollower(config, self.stats, self)
        self.fits = FitPool(config)
        self._on_transaction = on_transaction
        self._drivers: dict[str, RouterDriver] = {}
        self._budgets: dict[str, ChangeBudget] = {}
        self._make_driver = make_driver or self._driver_for
        self._producer: TransactionalProducer | None = None
        self._stop = threading.Event()
        self._round_began_ns = 0  # the last commit_round's start (monotonic)
        self._failure: Exception | None = None

    def _driver_for(self, router: RouterConfig) -> RouterDriver:
        return driver_for(
            router, links=self.config.links, attempts=self.config.optimizer.apply_attempts
        )

    # ---- what a controller asks of the service (controller.ControllerHost) -------------
    def driver_of(self, router: str) -> RouterDriver:
        driver = self._drivers.get(router)
        if driver is None:
            driver = self._drivers[router] = self._make_driver(self.routers[router])
        return driver

    def change_budget(self, router: str) -> ChangeBudget:
        budget = self._budgets.get(router)
        if budget is None:
            per_minute = self.guards.max_changes_per_router_per_minute
            budget = self._budgets[router] = ChangeBudget(per_minute)
        return budget

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def fail(self, exc: Exception) -> None:
        """A policy failed in the decide thread: `run` raises it, as a failure on the loop
        would have been raised."""
        if self._failure is None:
            self._failure = exc
        self._stop.set()

    # ---- the links ----------------------------------------------------------------------
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
        if saved is not None and saved.policy == link.policy and self._restore(policy, saved):
            state = saved
            log.info("link %s: resumed %s from its changelog", link_id, link.policy)
        elif saved is not None:  # another policy's, or one its policy refused
            if saved.policy == link.policy:
                policy = policy_for(link)  # afresh: restore may have left it half-done
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
        controller = LinkController(
            link,
            policy,
            state,
            partition,
            host=self,
            guards=self.guards,
            decide_thread=self.fits.decide_thread_for(link, policy),
        )
        self.controllers[link_id] = controller
        self.quiet.heard(controller)
        if state.unapplied:
            controller.save()  # this owner's transaction authorizes them
        return controller

    def _restore(self, policy: Policy, saved: LinkState) -> bool:
        """Resumes `policy` from a saved state of its own; False (counted) when the policy
        refuses it (`Policy.restore` logs why): the link goes on, its policy afresh."""
        try:
            refused = policy.restore(saved.policy_state)
        except Exception as exc:  # a policy's own load that raises past restore's checks
            refused = f"{type(exc).__name__}: {exc}"
            log.error(
                "link %s: its saved %s state was refused (%s)",
                policy.link.id,
                saved.policy,
                refused,
            )
        if refused is None:
            return True
        self.stats.restore_failures += 1
        return False

    # ---- the loop ----------------------------------------------------------------------
    def _streams(self) -> list[str]:
        streams = [self.config.metrics.optimizer_stream]
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
        if received.stream == self.config.metrics.optimizer_stream:
            controller = self.controller(link_id, received.partition)
            if controller is not None:
                controller.partition = received.partition  # its windows' is its changelog's
                window = Window.from_record(
                    received.record,
                    controller.state.buffer_at(received.record["window_end_ns"]),
                    checked=True,  # RecordConsumer's codec checked the record's values
                )
                number = controller.on_window(window)
                self.quiet.heard(controller)
        else:
            # RTT samples of a link this process drives (their partitions may differ).
            driven = self.controllers.get(link_id)
            sampled = bool(received.record["rtt_ns"])
            if sampled and driven is not None and isinstance(driven.policy, JenksPolicy):
                try:
                    driven.policy.observe_flows(
                        received.record["ts_ns"], flow_min_rtts(received.record)
                    )
                except Exception as exc:  # this link falls back; the others go on
                    driven.policy_raised(exc, "observing its flows' RTTs")
        self.owned.received(partition, received.offset, controller, number)

    async def _handle_batch(self, batch: list[Received], consumer: RecordConsumer) -> None:
        """Handles a polled batch, committing what it staged every HANDLE_SLICE_NS: a batch
        that ends many searches' trials at once holds their fits (200 P4BS links in step:
        ~0.5 s), and each decision waits for a transaction before it is applied, then for
        another that holds its record."""
        cpu = self.stats.cpu_ns
        cpu_began, state_began = time.thread_time_ns(), cpu["state"]
        began = time.monotonic_ns()
        for received in batch:
            self.handle(received)
            if self.outgoing.staged and time.monotonic_ns() - began >= HANDLE_SLICE_NS:
                await self.commit_round(consumer)
                # The decisions it authorized are applied now, so that their records go in
                # the next slice's transaction.
                await asyncio.sleep(0)
                began = time.monotonic_ns()
        cpu["windows"] += time.thread_time_ns() - cpu_began - (cpu["state"] - state_began)

    def stop(self) -> None:
        self._stop.set()

    async def commit_round(self, consumer: RecordConsumer) -> None:
        """One transaction: the staged states, the decision records, and the offsets of
        every partition held (so that the coordinator checks this member's generation);
        then the decisions it holds are applied. If it is aborted, the process joins the group
        again and resumes what it is given from what was committed."""
        assert self._producer is not None
        self._round_began_ns = time.monotonic_ns()
        records, staged = self.outgoing.take(None)
        offsets = self.owned.saved_offsets(self.owned.partitions)
        if not records and not offsets:
            return
        # The metadata first: if the member id is cleared after it, it names the old member,
        # whom the coordinator refuses.
        metadata = consumer.group_metadata()
        if not consumer.member_id():
            # Dropped from the group (its session expired while the process stalled), the
            # consumer has cleared its member id and not yet reported its partitions lost.
            # The coordinator checks a transaction's offsets against the member only when
            # they name one: this transaction would commit decisions on links another
            # process drives now. What it holds waits for the next round (the partitions'
            # loss drops it).
            self.stats.not_member += 1
            log.warning("not a member of the group any more: nothing committed this round")
            self.outgoing.put_back(staged, records[len(staged) :], self.controllers)
            return
        began = time.perf_counter()
        committed = False
        try:
            await asyncio.to_thread(self._producer.commit, records, offsets, metadata)
            committed = True
        except TransactionAborted as exc:
            self.stats.aborted += 1
            log.warning("transaction aborted (%s): its states and records go in the next one", exc)
            self.outgoing.put_back(staged, records[len(staged) :], self.controllers)
        finally:
            if self._on_transaction is not None:
                decisions = [r.record for r in records[len(staged) :]]
                seconds = time.perf_counter() - began
                self._on_transaction(Transaction(len(staged), decisions, seconds, committed))
            self.stats.cpu_ns["produce"] = self._producer.produce_cpu_ns
            self.stats.cpu_ns["commit"] = self._producer.commit_cpu_ns
        if not committed:
            return
        self.stats.transactions += 1
        for controller, entry in staged:
            controller.authorize(entry.unapplied)

    async def run(self, on_tick: Callable[[OptimizerService], None] | None = None) -> None:
        """Consumes until `stop()`; `on_tick` is called about once a second (progress)."""
        with fewer_young_collections(), blas_on_one_thread():
            await self._consume(on_tick)

    async def _consume(self, on_tick: Callable[[OptimizerService], None] | None) -> None:
        loop = asyncio.get_running_loop()
        self._producer = producer = await asyncio.to_thread(
            TransactionalProducer,
            self.config.kafka,
            self.config.kafka.topics,
            self.instance,
            TRANSACTION_TIMEOUT_MS,
        )
        seconds = await asyncio.to_thread(warm_up_grid, self.config.links)
        if seconds is not None:
            log.info("grid GP fit warmed up in %.2f s", seconds)
        consumer: RecordConsumer | None = None

        def assigned(given: list[Partition]) -> None:
            assert consumer is not None
            self.owned.assigned(consumer, loop, given)

        def revoked(taken: list[Partition]) -> None:
            assert consumer is not None
            self.owned.revoked(consumer, producer, loop, taken, lost=False)

        def lost(taken: list[Partition]) -> None:
            assert consumer is not None
            self.owned.revoked(consumer, producer, loop, taken, lost=True)

        session_ms = self.config.optimizer.session_timeout_ns // 1_000_000
        consumer = RecordConsumer(
            self.config.kafka,
            self.config.optimizer.group,
            self._streams(),
            self.config.kafka.topics,
            store_on_poll=False,
            transactional=True,
            report_ends=True,  # check_stale waits for a partition's backlog (at_end_of)
            settings={
                "session.timeout.ms": session_ms,
                # A dead member's session ends a session timeout after its last heartbeat,
                # and the others learn of the rebalance at their next: at a tenth of the
                # session timeout (a quarter before) a handover starts 5.4-6.6 s after a
                # kill rather than 4.5-7.5 s, for a heartbeat or two a second.
                "heartbeat.interval.ms": max(100, session_ms // 10),
                "client.id": self.instance,  # the group's member, by its owner name
                # A rebalance moves only the partitions that change owner; the other links
                # stay where they are (the eager default takes every partition back and gives
                # them out again: every process restores all its links from the changelog).
                "partition.assignment.strategy": "cooperative-sticky",
                # A fetch brings at most this much of each partition, and the client queues
                # each partition's share in turn. At the default (1 MiB, compressed) one
                # fetch held a handed-over partition's whole backlog, so the links of the
                # other partitions given waited for all of it to be decided.
                "max.partition.fetch.bytes": MAX_PARTITION_FETCH_BYTES,
            },
            on_assign=assigned,
            on_revoke=revoked,
            on_lost=lost,
        )
        self.consumer_stats = consumer.stats
        follower = threading.Thread(
            target=self.follower.follow, args=(loop, self._stop), name="links"
        )
        follower.start()
        self.fits.start()
        windows_topic = self.config.kafka.topics[self.config.metrics.optimizer_stream]
        last_persist = last_tick = last_round = last_stale_check = time.monotonic_ns()
        batch: list[Received] = []
        try:
            while not self._stop.is_set():
                # The decisions the last transaction authorized are applied (a dry run's at
                # once) and their records staged; what is staged after a batch then waits
                # for no record to come (after an empty one it does: a transaction that
                # failed is not tried again at once).
                await asyncio.sleep(0)
                timeout_s = 0.0 if self.outgoing and batch else POLL_TIMEOUT_S
                batch = await asyncio.to_thread(_poll_batch, consumer, self.stats, timeout_s)
                await self._handle_batch(batch, consumer)
                now = time.monotonic_ns()
                if now - last_round >= STALLED_ROUND_NS:
                    # This process stalled (a thread held the GIL loading torch, a commit
                    # waited for a rebalance): the windows of that time may be waiting in
                    # the consumer, not missing, so staleness is judged after the next poll,
                    # and no partition is known to be at its end until it says so again.
                    consumer.forget_ends()
                elif now - last_stale_check >= STALE_CHECK_NS:
                    # A partition not known to be read to its end (given in a handover, or
                    # records came since) may hold a link's windows: they are late there,
                    # not missing, until twice the limit.
                    at_end = consumer.at_end_of(windows_topic)
                    for controller in self.quiet.quiet(now, self.guards.stale_after_ns):
                        controller.check_stale(now, controller.partition not in at_end)
                    last_stale_check = now
                last_round = now
                if now - last_persist >= PERSIST_INTERVAL_NS:
                    for controller in self.controllers.values():
                        if controller.dirty:
                            controller.save(if_changed=True)
                    await self.commit_round(consumer)
                    last_persist = now
                elif self.outgoing and (
                    consumer.behind_ns < BACKLOG_NS or now - self._round_began_ns >= HANDLE_SLICE_NS
                ):
                    await self.commit_round(consumer)
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
                await self.commit_round(consumer)
            # Leaving the group hands the partitions over at once (the revoke finds nothing
            # more to commit); the callbacks come back to this loop, so not from it.
            await asyncio.to_thread(consumer.close)
            producer.flush(10.0)
            self.fits.shutdown()
            for driver in self._drivers.values():
                await driver.close()


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


def _poll_batch(consumer: RecordConsumer, stats: ServiceStats, timeout_s: float) -> list[Received]:
    """Up to POLL_BATCH records, waiting at most `timeout_s` for the first."""
    began = time.thread_time_ns()
    batch = consumer.poll_batch(POLL_BATCH, timeout_s)
    stats.cpu_ns["decode"] += time.thread_time_ns() - began
    return batch


def summary_line(service: OptimizerService) -> str:
    s = service.stats
    return (
        f"links {len(service.controllers)}, windows {s.windows} (replayed {s.replayed}), "
        f"decisions {s.decisions}: applied {s.applied}, failed {s.failed}, "
        f"fallbacks {s.fallbacks}, policy failures {s.policy_failures}, unknown links "
        f"{s.unknown_links}, partitions {len(service.owned.partitions)}, transactions "
        f"{s.transactions} (aborted {s.aborted})"
    )
