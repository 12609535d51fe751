"""What the next transaction holds: the link states staged and the decision records made.

A round of the service's loop writes the states that changed, the decision records made and
the consumer offsets of the windows those states cover in one Kafka transaction (service.py);
the decisions a staged state holds unapplied are applied once it committed. After an aborted
transaction what it held is put back for the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from p4bs.bus import Outgoing
from p4bs_optimizer import changelog
from p4bs_optimizer.policies.base import Decision
from p4bs_optimizer.service.stats import ServiceStats

if TYPE_CHECKING:
    from p4bs_optimizer.service.controller import DecisionMade, LinkController

log = logging.getLogger(__name__)


@dataclass
class Staged:
    """A link's state as it stood when saved, for the next transaction, and the decisions
    that state holds unapplied (applied once it is committed)."""

    record: Outgoing
    unapplied: dict[int, Decision]


@dataclass(frozen=True)
class Transaction:
    """One round's transaction, as the service's `on_transaction` callback is told of it."""

    states: int  # link states it held
    decisions: list[dict[str, Any]]  # the BufferDecision records it held
    seconds: float  # in the producer's commit
    committed: bool  # False: aborted; what it held goes in the next one


class NextTransaction:
    """The states and decision records for the next transaction, taken by the one that
    commits them. `on_record` is called with each BufferDecision record as it is made."""

    def __init__(
        self,
        instance: str,
        stats: ServiceStats,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.instance = instance  # the records' owner
        self.stats = stats
        self.on_record = on_record
        self.staged: dict[str, tuple[LinkController, Staged]] = {}
        self.outbox: list[Outgoing] = []

    def __bool__(self) -> bool:
        return bool(self.staged or self.outbox)

    def stage(self, controller: LinkController, ts_ns: int, *, if_changed: bool = False) -> bool:
        """The controller's state as it is now; with `if_changed`, only if it differs from
        the one it staged last in more than its time and windows covered (the state already
        saved covers those windows too). False if it was not staged."""
        content = changelog.content(controller.state)
        if if_changed and content == controller.saved_content:
            return False
        controller.saved_content = content
        record = changelog.to_record(controller.link.id, controller.state, self.instance, ts_ns)
        self.staged[controller.link.id] = (
            controller,
            Staged(
                Outgoing(changelog.STREAM, record, partition=controller.partition),
                dict(controller.state.unapplied),
            ),
        )
        return True

    def record(self, made: DecisionMade) -> None:
        """One BufferDecision record, and the log line an operator reads."""
        link, decision, outcome = made.link, made.decision, made.outcome
        self.stats.decisions += 1
        if outcome == "applied":
            self.stats.applied += 1
        elif outcome == "failed":
            self.stats.failed += 1
        elif outcome == "skipped":
            self.stats.skipped += 1
        elif outcome == "dry_run":
            self.stats.dry_run += 1
        if decision.window_end_ns is not None:
            self.stats.window_lag.observe(max(0, made.ts_ns - decision.window_end_ns) / 1e9)
        record = {
            "link_id": link.id,
            "ts_ns": made.ts_ns,
            "queue": decision.queue,
            "policy": link.policy,
            "phase": decision.phase,
            "buffer_bytes": made.buffer_bytes,
            "previous_buffer_bytes": made.previous_bytes,
            "reason": made.reason,
            "trial": decision.trial,
            "outcome": outcome,
            "f": decision.f,
            "window_end_ns": decision.window_end_ns,
            "owner": self.instance,
            "epoch": made.epoch,
        }
        self.outbox.append(Outgoing("buffer_decisions", record))
        level = logging.WARNING if outcome == "failed" else logging.INFO
        log.log(
            level,
            "link %s q%d: %s %s %d B (%s): %s",
            link.id,
            decision.queue,
            link.policy,
            decision.phase,
            made.buffer_bytes,
            outcome,
            made.reason,
        )
        if self.on_record is not None:
            self.on_record(record)

    def take(
        self, links: set[str] | None
    ) -> tuple[list[Outgoing], list[tuple[LinkController, Staged]]]:
        """The staged states and the decision records of `links` (None: all), taken for a
        transaction: the records, states first, and the states with their controllers."""
        if links is None:
            staged, self.staged = list(self.staged.values()), {}
            outbox, self.outbox = self.outbox, []
        else:
            staged = [self.staged.pop(link) for link in links if link in self.staged]
            outbox = [o for o in self.outbox if o.record["link_id"] in links]
            self.outbox = [o for o in self.outbox if o.record["link_id"] not in links]
        return [s.record for _, s in staged] + outbox, staged

    def put_back(
        self,
        staged: list[tuple[LinkController, Staged]],
        outbox: list[Outgoing],
        controllers: Mapping[str, LinkController],
    ) -> None:
        """After an aborted transaction: what it held goes in the next one (a state staged
        since replaces its own; the state of a link no longer driven by the same controller,
        in `controllers`, is dropped). Nothing of it was applied, and what this process still
        holds is the group's to say: most aborts are a rebalance under way (the coordinator
        refuses the generation this one began in), after which the process keeps its
        partitions, or this member was dropped, when the consumer reports the partitions
        lost and they are released."""
        for controller, entry in staged:
            link_id = controller.link.id
            if link_id not in self.staged and controllers.get(link_id) is controller:
                self.staged[link_id] = (controller, entry)
        self.outbox[:0] = outbox
