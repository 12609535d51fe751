"""The optimizer's round transaction (`OptimizerService.commit_round`) when the group has
dropped this process (its session expired while it stalled) and the consumer has not yet
reported the partitions lost: nothing is committed, what the round held waits. The group
coordinator checks a transaction's offsets against the member only when they name one, so a
commit then would put decisions on links another process drives now (seen under load in
test_optimizer_group: a stalled process's fallbacks, written after the handover)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, cast

from p4bs import paths
from p4bs.bus import Outgoing, Partition, RecordConsumer, TransactionalProducer
from p4bs.config import load_config
from p4bs_optimizer.service import OptimizerService


class Producer:
    """Notes each transaction it is asked to commit."""

    def __init__(self) -> None:
        self.commits: list[tuple[list[Outgoing], dict[Partition, int], object]] = []
        self.produce_cpu_ns = self.commit_cpu_ns = 0  # as TransactionalProducer counts

    def commit(
        self, records: Iterable[Outgoing], offsets: Mapping[Partition, int], metadata: object
    ) -> None:
        self.commits.append((list(records), dict(offsets), metadata))


class Consumer:
    """A group member with `member` as its id ("" once the group dropped it)."""

    def __init__(self, member: str) -> None:
        self.member = member

    def group_metadata(self) -> object:
        return ("generation of", self.member)

    def member_id(self) -> str:
        return self.member


def decision(link_id: str) -> Outgoing:
    record: dict[str, Any] = {"link_id": link_id, "phase": "fallback", "outcome": "dry_run"}
    return Outgoing("buffer_decisions", record)


def test_a_round_is_committed_only_while_the_process_is_a_member_of_the_group() -> None:
    service = OptimizerService(load_config(paths.example_config()), dry_run=True)
    producer = Producer()
    service._producer = cast(TransactionalProducer, producer)
    service.outgoing.outbox.append(decision("r1:eth1"))

    dropped = cast(RecordConsumer, Consumer(""))
    asyncio.run(service.commit_round(dropped))
    assert producer.commits == []
    assert [o.record["link_id"] for o in service.outgoing.outbox] == ["r1:eth1"]  # it waits
    assert service.stats.not_member == 1 and service.stats.transactions == 0

    member = cast(RecordConsumer, Consumer("p4bs-optimizer-1"))
    asyncio.run(service.commit_round(member))
    ((records, _, metadata),) = producer.commits
    assert [o.record["link_id"] for o in records] == ["r1:eth1"]
    assert metadata == ("generation of", "p4bs-optimizer-1")
    assert service.stats.transactions == 1 and not service.outgoing.outbox
