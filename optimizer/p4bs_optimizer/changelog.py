"""Each link's optimizer state, kept in Kafka so that it moves with the link.

The state of a link is a record of the compacted `optimizer_state` topic (the changelog
pattern), keyed by link, in the partition of the same number as the link's `link_metrics`
partition: the process the group gives partition p reads partition p of the changelog from
its start and has the newest state of every link it now drives. The service writes states
in the transactions that also commit the offsets of the windows they cover and the decision
records they made (`p4bs.bus.TransactionalProducer`), so the three are visible together or
not at all, and a process that lost its partitions cannot write any more for them.

A state record carries its writer (`owner`) and the link's `epoch`, which each process that
takes the link over raises by one: the changelog shows who drove a link when.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer

from p4bs.bus import Cluster, Received, changelog_reader, not_read_to_end, read_records
from p4bs.topic_range import SECOND_NS, Deadline
from p4bs_optimizer.policies.base import Decision

log = logging.getLogger(__name__)

STREAM = "optimizer_state"


@dataclass
class LinkState:
    """What the service keeps of one link between windows."""

    policy: str  # the policy the state belongs to; another policy starts afresh
    policy_state: dict[str, Any] = field(default_factory=dict)  # Policy.snapshot()
    last_window_end_ns: int = 0  # windows up to here are done (a replay skips them)
    intended: dict[int, int] = field(default_factory=dict)  # queue -> the policy's buffer
    in_force: dict[int, int] = field(default_factory=dict)  # queue -> applied and read back
    last_change_ns: int = 0  # wall clock of the last applied change
    # Queue 0's buffers in force as (since ns, bytes), oldest first; since 0: the router's
    # own, read before any change. Trimmed to what windows still to come may need.
    buffer_changes: list[tuple[int, int]] = field(default_factory=list)
    fallback: bool = False  # the safe buffer is in force because metrics went stale
    # Per queue, the decision committed (or about to be) and not yet applied and recorded.
    unapplied: dict[int, Decision] = field(default_factory=dict)
    epoch: int = 0  # raised by one by each process that takes the link over

    def buffer_at(self, end_ns: int) -> int | None:
        """Queue 0's buffer for a window ending at `end_ns` (`buffer_in_force`)."""
        return buffer_in_force(self.buffer_changes, end_ns)

    def buffer_changed(self, since_ns: int, buffer_bytes: int) -> None:
        """Queue 0's buffer came into force at `since_ns`; what no window still to come can
        need (every change superseded before the last window decided) is dropped."""
        self.buffer_changes.append((since_ns, buffer_bytes))
        done = self.last_window_end_ns
        while len(self.buffer_changes) > 1 and self.buffer_changes[1][0] < done:
            del self.buffer_changes[0]


def buffer_in_force(changes: Iterable[tuple[int, int]], end_ns: int) -> int | None:
    """The buffer for a window ending at `end_ns`, of `changes` (since ns, bytes) in time
    order: the newest that came into force before the window's end (a change inside a
    window counts for it); None if none did."""
    buffer = None
    for since_ns, buffer_bytes in changes:
        if since_ns >= end_ns:
            break
        buffer = buffer_bytes
    return buffer


def to_record(link_id: str, state: LinkState, owner: str, ts_ns: int) -> dict[str, Any]:
    """The state as an OptimizerLinkState record."""
    return {
        "link_id": link_id,
        "ts_ns": ts_ns,
        "owner": owner,
        "epoch": state.epoch,
        "policy": state.policy,
        "policy_state": json.dumps(state.policy_state, sort_keys=True),
        "last_window_end_ns": state.last_window_end_ns,
        "intended": _buffers(state.intended),
        "in_force": _buffers(state.in_force),
        "last_change_ns": state.last_change_ns,
        "buffer_changes": [
            {"ts_ns": since, "buffer_bytes": buffer} for since, buffer in state.buffer_changes
        ],
        "fallback": state.fallback,
        "unapplied": [
            {
                "queue": d.queue,
                "buffer_bytes": d.buffer_bytes,
                "phase": d.phase,
                "reason": d.reason,
                "trial": d.trial,
                "f": d.f,
                "flows": list(d.flows),
                "window_end_ns": d.window_end_ns,
            }
            for _, d in sorted(state.unapplied.items())
        ],
    }


def from_record(record: dict[str, Any]) -> LinkState:
    """The state an OptimizerLinkState record holds. Raises ValueError if its policy
    snapshot is not JSON."""
    return LinkState(
        policy=record["policy"],
        policy_state=json.loads(record["policy_state"]),
        last_window_end_ns=record["last_window_end_ns"],
        intended={b["queue"]: b["buffer_bytes"] for b in record["intended"]},
        in_force={b["queue"]: b["buffer_bytes"] for b in record["in_force"]},
        last_change_ns=record["last_change_ns"],
        buffer_changes=[(c["ts_ns"], c["buffer_bytes"]) for c in record["buffer_changes"]],
        fallback=record["fallback"],
        unapplied={
            d["queue"]: Decision(
                d["buffer_bytes"],
                d["phase"],
                d["reason"],
                queue=d["queue"],
                trial=d["trial"],
                f=d["f"],
                flows=tuple(d["flows"]),
                window_end_ns=d["window_end_ns"],
            )
            for d in record["unapplied"]
        },
        epoch=record["epoch"],
    )


def _buffers(buffers: dict[int, int]) -> list[dict[str, int]]:
    return [{"queue": q, "buffer_bytes": b} for q, b in sorted(buffers.items())]


@dataclass
class NewestStates:
    """The newest state record of each link in the partitions read, decoded (its partition
    and offset beside it); the reasons of records that could not be decoded (passed over);
    whether every partition was read to its end."""

    records: dict[str, Received]
    malformed: list[str]
    complete: bool


def newest_states(
    consumer: Consumer, topic: str, deadline: Deadline, partitions: Iterable[int] | None = None
) -> NewestStates:
    """Each link's newest committed state record in `partitions` of the changelog `topic`
    (None: all), read from their starts to their ends as they stand now by `consumer` (a
    `p4bs.bus.changelog_reader`) until the deadline. The topic is compacted: reading it whole
    reads little more than one record per link."""
    read = read_records(consumer, STREAM, topic, deadline, partitions)
    newest = {r.record["link_id"]: r for r in read.records}  # each partition in its order
    return NewestStates(newest, read.malformed, read.complete)


def restore(
    cluster: Cluster, topics: dict[str, str], partitions: list[int], timeout_s: float
) -> dict[str, tuple[int, LinkState]]:
    """The newest state of every link in the changelog's `partitions`, with its partition.
    A record that cannot be read is logged and passed over: its link resumes from an older
    state or afresh, rather than the service stopping. A transaction still open below an
    end is waited for; raises KafkaException if that takes longer than `timeout_s`."""
    topic = topics[STREAM]
    consumer = changelog_reader(cluster, STREAM)
    try:
        newest = newest_states(consumer, topic, Deadline(round(timeout_s * SECOND_NS)), partitions)
    finally:
        consumer.close()
    if not newest.complete:
        raise not_read_to_end(topic, partitions, timeout_s)
    for reason in newest.malformed:
        log.error("optimizer state unreadable, passed over: %s", reason)
    states = {}
    for link_id, r in newest.records.items():
        try:
            states[link_id] = (r.partition, from_record(r.record))
        except ValueError as exc:
            log.error(
                "link %s: saved state at %s[%d]@%d unreadable, starting afresh: %s",
                link_id,
                r.topic,
                r.partition,
                r.offset,
                exc,
            )
    return states
