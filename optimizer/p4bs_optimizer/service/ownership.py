"""Which links this process drives: the partitions the group gives it and takes back.

Kafka gives each process of the group some of the partitions of its windows' stream
(`link_metrics`, or `optimizer_feed` with [metrics] optimizer_feed), and a process
drives exactly the links of its partitions. Each link's state (the policy's snapshot, what is
in force, decisions not yet applied) is a record of the compacted `optimizer_state` topic
(`changelog.py`), in the partition of the same number. The assignment is cooperative: a rebalance
moves only the partitions that change owner. When the group gives partitions, the process
reads their changelog and resumes each link on its first window (a P4BS search continues with
its next trial); when it takes partitions back, the process stops their links' policies,
commits their states and offsets, and drops them; partitions lost (this member was dropped
from the group, another may own them already) are dropped without a commit. The consumer's
callbacks run in the polling thread; what they change of the links runs on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from p4bs.bus import (
    Outgoing,
    Partition,
    RecordConsumer,
    TransactionAborted,
    TransactionalProducer,
)
from p4bs.config import Config, LinkConfig
from p4bs_optimizer import changelog
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.stats import ServiceStats
from p4bs_optimizer.service.transaction import NextTransaction

log = logging.getLogger(__name__)

# When partitions are taken back, how long their links' decisions in the decide thread and
# changes in flight may take to finish before they are cancelled (a cancelled change stays
# in the state: the next owner makes it).
RELEASE_TIMEOUT_S = 5.0
RESTORE_TIMEOUT_S = 60.0  # reading a changelog partition to its end, open transactions too


class LinkHolder(Protocol):
    """The links a process may drive and the controllers of those it drives (the service)."""

    links: dict[str, LinkConfig]
    controllers: dict[str, LinkController]

    def controller(
        self, link_id: str, partition: int, saved: LinkState | None = None
    ) -> LinkController | None:
        """The link's controller, made (resuming from `saved`) if it has none."""
        ...


@dataclass
class Unsaved:
    """A partition's records handled but not yet committed, in order: each one's offset,
    link (None: committed at once) and window number. Three queues, not a tuple a record:
    each tuple would be an object for the garbage collector, a record's for a second until
    its commit, which at thousands a second made its full collections several times as
    frequent (quiet.py has the same)."""

    offsets: deque[int] = field(default_factory=deque)
    controllers: deque[LinkController | None] = field(default_factory=deque)
    numbers: deque[int] = field(default_factory=deque)


class Ownership:
    """What this process holds of the group's partitions, and the offsets it may commit."""

    def __init__(
        self, config: Config, stats: ServiceStats, holder: LinkHolder, outgoing: NextTransaction
    ) -> None:
        self.config = config
        self.stats = stats
        self.holder = holder
        self.outgoing = outgoing
        # link_metrics, or the optimizer feed: the changelog is co-partitioned with either.
        self.metrics_topic = config.kafka.topics[config.metrics.optimizer_stream]
        self.partitions: set[Partition] = set()
        self.next_offsets: dict[Partition, int] = {}  # as last committed
        # Records not yet committed, per partition in order, each with its link and window
        # number.
        self.unsaved: dict[Partition, Unsaved] = {}

    def received(
        self, partition: Partition, offset: int, controller: LinkController | None, number: int
    ) -> None:
        """A record handled: its offset may be committed once `controller`'s saved state
        covers its window `number` (None: at once)."""
        unsaved = self.unsaved.get(partition)
        if unsaved is None:
            unsaved = self.unsaved[partition] = Unsaved()
        unsaved.offsets.append(offset)
        unsaved.controllers.append(controller)
        unsaved.numbers.append(number)

    def saved_offsets(self, partitions: set[Partition]) -> dict[Partition, int]:
        """Moves each partition's next offset past the records whose windows the saved state
        covers, up to the first that it does not; returns the next offsets of `partitions`."""
        for partition in partitions:
            unsaved = self.unsaved.get(partition)
            if unsaved is None:
                continue
            offsets, controllers, numbers = unsaved.offsets, unsaved.controllers, unsaved.numbers
            while offsets:
                controller = controllers[0]
                if controller is not None and controller.saved_through < numbers[0]:
                    break
                self.next_offsets[partition] = offsets.popleft() + 1
                controllers.popleft()
                numbers.popleft()
        return {p: self.next_offsets[p] for p in partitions if p in self.next_offsets}

    # ---- the consumer's callbacks (in the polling thread) --------------------------------
    def assigned(
        self, consumer: RecordConsumer, loop: asyncio.AbstractEventLoop, given: list[Partition]
    ) -> None:
        numbers = sorted(p for t, p in given if t == self.metrics_topic)
        started_ns = time.monotonic_ns()
        # Each saved state is held against the link it claims (its bounds, jenks-only flow
        # lists) as this process knows the link now.
        states = changelog.restore(
            self.config.kafka,
            self.config.kafka.topics,
            numbers,
            RESTORE_TIMEOUT_S,
            links=self.holder.links,
        )
        offsets = consumer.committed(given)
        log.info(
            "given %s: %d link states read from the changelog in %.2f s",
            ", ".join(f"{t}[{p}]" for t, p in sorted(given)),
            len(states),
            (time.monotonic_ns() - started_ns) / 1e9,
        )
        asyncio.run_coroutine_threadsafe(self.take(given, states, offsets), loop).result()

    def revoked(
        self,
        consumer: RecordConsumer,
        producer: TransactionalProducer,
        loop: asyncio.AbstractEventLoop,
        taken: list[Partition],
        *,
        lost: bool,
    ) -> None:
        """Stops the links of the partitions taken back; unless they were lost (another
        member may own them already), commits their states and offsets first."""
        future = asyncio.run_coroutine_threadsafe(self.release(set(taken), lost=lost), loop)
        records, offsets = future.result()
        if lost or not (records or offsets):
            return
        try:
            producer.commit(records, offsets, consumer.group_metadata())
            self.stats.transactions += 1
        except TransactionAborted as exc:
            self.stats.aborted += 1
            log.warning(
                "handing over: transaction aborted (%s); the next owner resumes "
                "from the state committed before",
                exc,
            )

    # ---- on the loop ---------------------------------------------------------------------
    async def take(
        self,
        given: list[Partition],
        states: dict[str, tuple[int, LinkState]],
        offsets: dict[Partition, int],
    ) -> None:
        """Holds the partitions given, and resumes their links at once: a link whose
        metrics stopped with its previous owner falls back after `stale_after` here."""
        self.stats.assigned += len(given)
        self.partitions.update(given)
        self.next_offsets.update(offsets)
        for link_id, (partition, saved) in states.items():
            if link_id in self.holder.links:
                self.holder.controller(link_id, partition, saved)

    async def release(
        self, taken: set[Partition], *, lost: bool
    ) -> tuple[list[Outgoing], dict[Partition, int]]:
        """Stops and drops the links of `taken`; returns what to commit for them: their
        states and records, and the offsets (those of every partition held, so that the
        coordinator checks the generation)."""
        self.stats.revoked += len(taken)
        numbers = {p for t, p in taken if t == self.metrics_topic}
        controllers = self.holder.controllers
        released = [c for c in controllers.values() if c.partition in numbers]
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
            del controllers[controller.link.id]
        links = {c.link.id for c in released}
        records, _ = self.outgoing.take(links)
        offsets = self.saved_offsets(taken)
        # The offsets of every partition held, so that the coordinator checks the generation.
        fence = {p: o for p, o in self.next_offsets.items() if p in self.partitions}
        self.partitions -= taken
        for partition in taken:
            self.unsaved.pop(partition, None)
            self.next_offsets.pop(partition, None)
        if released:
            log.info(
                "%s %s: %d links handed over",
                "lost" if lost else "taken back",
                ", ".join(f"{t}[{p}]" for t, p in sorted(taken)),
                len(released),
            )
        return records, {**fence, **offsets}
