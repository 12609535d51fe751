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

Whoever can write to the topic could steer a router through a saved state (its pending
changes are applied by the next owner), so a state is checked before it is resumed: the
codec refuses values its fields cannot hold; `from_record` refuses a snapshot that is not a
JSON object and a record whose key is not its link; `checked` holds it against the link it
claims (buffers within the link's [min, max]; flow lists, which replace an interface's
classifier, only for a jenks link). A state refused is logged with the link and the reason
and counted (`RESTORE_STATS`); its link starts afresh, as a link without a saved state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import Consumer

from p4bs.bus import Cluster, Received, changelog_reader, not_read_to_end, read_newest
from p4bs.config import LinkConfig
from p4bs.topic_range import SECOND_NS, Deadline
from p4bs_optimizer.policies.base import Decision

log = logging.getLogger(__name__)

STREAM = "optimizer_state"
JENKS = "jenks"  # the one policy that separates flows into queues (classifier changes)


class StateError(ValueError):
    """A saved state that cannot be resumed: what is wrong with it."""


@dataclass
class RestoreStats:
    """Saved states refused by `restore` in this process (their links started afresh)."""

    refused: int = 0
    reasons: list[str] = field(default_factory=list)  # the most recent ones, for reports

    MAX_REASONS = 100

    def refuse(self, link_id: str, where: str, reason: str) -> None:
        self.refused += 1
        self.reasons = [*self.reasons[-self.MAX_REASONS + 1 :], f"{link_id}: {reason}"]
        log.error("link %s: saved state at %s refused, starting afresh: %s", link_id, where, reason)


RESTORE_STATS = RestoreStats()


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


# The values a flat policy snapshot holds: immutable, so a copy of the snapshot keeps them.
_SCALARS = (int, float, str, bool, type(None))


def content(state: LinkState) -> tuple[Any, ...]:
    """What the state holds, but for the windows it covers, as a value that later changes to
    the state leave as it was: states of equal content are saved alike. Containers are
    copied; a policy snapshot holding any (which the policy may change in place) is taken as
    its JSON text. Every LinkState field but `last_window_end_ns`
    (tests/unit/test_optimizer_state.py). Costs a tenth of a record (`to_record`), which the
    service's periodic save of a settled link then need not make."""
    policy_state: Any = state.policy_state
    if all(isinstance(value, _SCALARS) for value in policy_state.values()):
        policy_state = dict(policy_state)
    else:
        policy_state = json.dumps(policy_state, sort_keys=True)
    return (
        state.policy,
        policy_state,
        dict(state.intended),
        dict(state.in_force),
        state.last_change_ns,
        list(state.buffer_changes),
        state.fallback,
        dict(state.unapplied),
        state.epoch,
    )


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


def from_record(record: dict[str, Any], key: str | None = None) -> LinkState:
    """The state an OptimizerLinkState record (decoded, so its values are within their
    fields' ranges) holds. Raises StateError if its policy snapshot is not a JSON object,
    or, given the record's Kafka `key`, if that is not the record's link."""
    if key is not None and key != record["link_id"]:
        raise StateError(f"record of link {record['link_id']!r} under the key {key!r}")
    try:
        policy_state = json.loads(record["policy_state"])
    except ValueError as exc:
        raise StateError(f"policy_state is not JSON: {exc}") from exc
    if not isinstance(policy_state, dict):
        raise StateError(f"policy_state is {type(policy_state).__name__}, not a JSON object")
    return LinkState(
        policy=record["policy"],
        policy_state=policy_state,
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


def checked(link: LinkConfig, state: LinkState) -> LinkState:
    """The saved `state` as the link it claims may resume it. Raises StateError if a buffer
    the link is to get (intended, or a change not yet applied) lies outside the link's
    [min, max], or if one is for a queue other than 0 on a link that does not separate flows
    (jenks). A link whose policy is not jenks keeps no flow list: a classifier change comes
    only from a jenks link (its pending changes keep their buffers, without flows)."""
    low, high = link.min_buffer_bytes, link.max_buffer_bytes
    jenks = link.policy == JENKS
    pending = {q: (d.buffer_bytes, f"unapplied[{q}]") for q, d in state.unapplied.items()}
    intended = {q: (b, f"intended[{q}]") for q, b in state.intended.items()}
    for queue, (buffer_bytes, what) in [*intended.items(), *pending.items()]:
        if not low <= buffer_bytes <= high:
            raise StateError(f"{what}: {buffer_bytes} B is outside the link's [{low}, {high}] B")
        if queue != 0 and not jenks:
            raise StateError(f"{what}: queue {queue} on a link whose policy ({link.policy}) "
                             "does not separate flows into queues")  # fmt: skip
    if jenks:
        return state
    flows = [q for q, d in state.unapplied.items() if d.flows]
    if flows:
        log.warning(
            "link %s: flow lists of the saved pending changes dropped (policy %s, not jenks)",
            link.id,
            link.policy,
        )
    unapplied = {q: replace(d, flows=()) for q, d in state.unapplied.items()}
    return replace(state, unapplied=unapplied)


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
    `p4bs.bus.changelog_reader`) until the deadline: the newest of each key (the link's, or
    `from_record` refuses it), only it decoded. The topic is compacted, but what came since
    its last compaction (up to a minute or two of states) is read whole."""
    read = read_newest(consumer, STREAM, topic, deadline, partitions)
    newest = {r.record["link_id"]: r for r in read.records}  # each partition in its order
    return NewestStates(newest, read.malformed, read.complete)


def restore(
    cluster: Cluster,
    topics: dict[str, str],
    partitions: list[int],
    timeout_s: float,
    links: Mapping[str, LinkConfig] | None = None,
) -> dict[str, tuple[int, LinkState]]:
    """The newest state of every link in the changelog's `partitions`, with its partition.
    A record that cannot be decoded is logged and passed over: its link resumes from an
    older state or afresh, rather than the service stopping. A newest state that cannot be
    resumed (`from_record`; given the `links` by id, `checked` against its link) is refused
    (RESTORE_STATS): its link starts afresh. A transaction still open below an end is waited
    for; raises KafkaException if that takes longer than `timeout_s`."""
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
            state = from_record(r.record, r.key)
            link = (links or {}).get(link_id)
            states[link_id] = (r.partition, state if link is None else checked(link, state))
        except StateError as exc:
            RESTORE_STATS.refuse(link_id, f"{r.topic}[{r.partition}]@{r.offset}", str(exc))
    return states
