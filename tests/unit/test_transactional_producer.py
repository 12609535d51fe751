"""The transactional producer's start (p4bs.bus.TransactionalProducer): registering its
transactional id is asked again, on a new producer, while the cluster has no coordinator for
it yet (a cluster just started loads its coordinators first); any other failure is raised
at once. The client library is replaced by a stand-in whose `init_transactions` answers as
the test says: no broker can be made to answer "not coordinator" on demand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from p4bs import bus

TOPICS = {"buffer_decisions": "t.buffer_decisions"}


class ScriptedProducer:
    """Each producer made takes the next answer of `answers`: an error to raise from
    `init_transactions`, or None to succeed."""

    answers: Iterator[KafkaError | None]
    made: list[ScriptedProducer]

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.answer = next(self.answers)
        self.inits = 0
        self.made.append(self)

    def init_transactions(self, timeout_s: float) -> None:
        self.inits += 1
        if self.answer is not None:
            raise KafkaException(self.answer)


def start(monkeypatch: pytest.MonkeyPatch, *answers: KafkaError | None) -> list[ScriptedProducer]:
    ScriptedProducer.answers = iter(answers)
    ScriptedProducer.made = []
    monkeypatch.setattr(bus, "Producer", ScriptedProducer)
    bus.TransactionalProducer("127.0.0.1:9", TOPICS, "optimizer-0", 6_000)
    return ScriptedProducer.made


def test_a_coordinator_not_ready_yet_is_asked_again_on_a_new_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = start(
        monkeypatch,
        KafkaError(KafkaError.NOT_COORDINATOR),
        KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
        None,
    )
    assert [p.inits for p in made] == [1, 1, 1]
    assert all(p.config["transactional.id"] == "optimizer-0" for p in made)


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError.NOT_COORDINATOR, fatal=True),
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    ],
)
def test_a_fatal_or_other_error_is_raised_at_once(
    monkeypatch: pytest.MonkeyPatch, error: KafkaError
) -> None:
    with pytest.raises(KafkaException) as raised:
        start(monkeypatch, error, None)
    assert raised.value.args[0] is error
    assert len(ScriptedProducer.made) == 1


def test_the_asking_stops_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus, "INIT_TRANSACTIONS_S", 0.0)
    with pytest.raises(KafkaException):
        start(monkeypatch, KafkaError(KafkaError.NOT_COORDINATOR), None)
    assert len(ScriptedProducer.made) == 1


class EndingProducer:
    """A producer whose transactions end as the test says: `commits` and `aborts` are the
    answers of successive commit_transaction and abort_transaction calls (an error to raise,
    or None to succeed), shared by every producer made."""

    commits: list[KafkaError | None]
    aborts: list[KafkaError | None]
    made: list[EndingProducer]

    def __init__(self, config: dict[str, Any]) -> None:
        self.made.append(self)

    def init_transactions(self, timeout_s: float) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def commit_transaction(self, timeout_s: float) -> None:
        self._answer(self.commits)

    def abort_transaction(self, timeout_s: float) -> None:
        self._answer(self.aborts)

    @staticmethod
    def _answer(answers: list[KafkaError | None]) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise KafkaException(answer)


TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, retriable=True)


def ending(
    monkeypatch: pytest.MonkeyPatch,
    commits: list[KafkaError | None],
    aborts: list[KafkaError | None],
) -> bus.TransactionalProducer:
    EndingProducer.commits, EndingProducer.aborts, EndingProducer.made = commits, aborts, []
    monkeypatch.setattr(bus, "Producer", EndingProducer)
    return bus.TransactionalProducer("127.0.0.1:9", TOPICS, "optimizer-0", 6_000)


def test_a_commit_that_times_out_is_resumed_until_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = ending(monkeypatch, [TIMED_OUT, TIMED_OUT, TIMED_OUT, None], [])
    producer.commit([], {}, None)
    assert producer.committed == 1 and len(EndingProducer.made) == 1


def test_an_abort_that_times_out_is_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = KafkaError(KafkaError.INVALID_PRODUCER_EPOCH)
    producer = ending(monkeypatch, [refused], [TIMED_OUT, None])
    with pytest.raises(bus.TransactionAborted):
        producer.commit([], {}, None)
    assert len(EndingProducer.made) == 1  # aborted by the same producer


def test_an_abort_that_cannot_end_renews_the_producer_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker killed mid-commit: the commit times out past its time, the abort conflicts
    with the commit still on its way. A new producer under the same id takes over (it fences
    the old one): the transaction is reported aborted and the process goes on."""
    monkeypatch.setattr(bus, "END_TRANSACTION_S", 0.0)
    conflict = KafkaError(KafkaError._CONFLICT)
    producer = ending(monkeypatch, [TIMED_OUT], [conflict])
    with pytest.raises(bus.TransactionAborted):
        producer.commit([], {}, None)
    assert len(EndingProducer.made) == 2 and producer.renewed == 1
