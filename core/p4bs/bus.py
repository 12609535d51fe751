"""The Kafka side of every part: schema'd records keyed by link id, dead letters, topics.

Producers are idempotent with acks=all, so a broker restart neither loses nor duplicates.
Consumers read committed data only, decode with the stream's codec, and send what they cannot
decode to the dead-letter stream with the reason before moving past it: a bad record is
counted and kept, never fatal.

Every client connects as the config's [kafka] says (`client_settings`): in plaintext, or
over TLS with a SASL/SCRAM login whose credentials are resolved from their references when
the client is made and live in its memory only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from p4bs.config import KafkaConfig, SecretRef
from p4bs.topic_range import (
    SECOND_NS,
    Deadline,
    TopicUnavailable,
    partitions_once_known,
    read_ranges,
    reader,
    watermarks,
)
from p4bs_schemas.codec import RecordError, codec
from p4bs_schemas.registry import COMPACTED_STREAMS, STREAMS

log = logging.getLogger(__name__)

DEAD_LETTERS = "dead_letters"

Cluster = KafkaConfig | str
"""Where a client connects: the config's [kafka] with its security settings, or the bare
bootstrap address of a plaintext cluster (local tools and tests)."""


def security_settings(kafka: KafkaConfig) -> dict[str, str]:
    """librdkafka's settings for the cluster's security, its credentials left out."""
    if kafka.security == "plaintext":
        return {"security.protocol": "plaintext"}
    settings = {"security.protocol": "sasl_ssl", "sasl.mechanisms": kafka.sasl_mechanism}
    if kafka.ca_file is not None:
        settings["ssl.ca.location"] = kafka.ca_file
    return settings


def credentials(kafka: KafkaConfig) -> dict[str, SecretRef]:
    """librdkafka's credential settings, by reference (none for a plaintext cluster)."""
    if kafka.security == "plaintext":
        return {}
    assert kafka.username is not None and kafka.password is not None  # the config checks
    return {"sasl.username": kafka.username, "sasl.password": kafka.password}


def client_settings(cluster: Cluster) -> dict[str, Any]:
    """What a librdkafka client needs to reach and log in to the cluster. Raises
    LookupError, naming the reference, when a credential is not where the config says."""
    if isinstance(cluster, str):
        return {"bootstrap.servers": cluster}
    secret = {name: ref.resolve() for name, ref in credentials(cluster).items()}
    return {"bootstrap.servers": cluster.bootstrap, **security_settings(cluster), **secret}


def producer_config(cluster: Cluster, client_id: str) -> dict[str, Any]:
    return {
        **client_settings(cluster),
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        # Keep retrying through a broker restart instead of dropping records.
        "message.timeout.ms": 300_000,
    }


@dataclass
class ProducerStats:
    sent: int = 0
    delivered: int = 0
    failed: int = 0
    last_error: str | None = None


class RecordProducer:
    """Produces records of any stream, encoded with the stream's schema, keyed by link id."""

    def __init__(
        self,
        cluster: Cluster,
        topics: Mapping[str, str],
        client_id: str = "p4bs",
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.topics = dict(topics)
        self.stats = ProducerStats()
        self._producer = Producer({**producer_config(cluster, client_id), **(settings or {})})

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.stats.delivered += 1
        else:
            self.stats.failed += 1
            self.stats.last_error = str(err)
            log.error("delivery failed: %s", err)

    def produce(
        self,
        stream: str,
        record: dict[str, Any],
        key: str | bytes | None = None,
        partition: int | None = None,
    ) -> None:
        """Encode and queue one record keyed by its link (or `key`), into the partition the
        key hashes to (or `partition`).

        Raises RecordError, sending nothing, if the record does not fit its schema.
        """
        schema = codec(STREAMS[stream])
        value = schema.encode(record)
        topic = self.topics[stream]
        key = record["link_id"] if key is None else key
        while True:
            try:
                self._producer.produce(
                    topic,
                    value,
                    key,
                    headers=schema.headers,
                    on_delivery=self._on_delivery,
                    # -1: librdkafka's "unassigned", the partitioner picks by key.
                    partition=-1 if partition is None else partition,
                )
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.1)
        self.stats.sent += 1
        self._producer.poll(0)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Waits for deliveries; returns how many records are still undelivered."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining

    def close(self, timeout_s: float = 10.0) -> int:
        """Waits up to `timeout_s` for deliveries, drops what is still undelivered (the
        client's own close would wait for it without end) and releases the client: its
        threads and connections, which otherwise live, retrying the brokers, for as long as
        this object does. Returns how many records were dropped."""
        dropped = self.flush(timeout_s)
        if dropped:
            log.error("closing with %d record(s) undelivered: dropped", dropped)
            self._producer.purge()
            self._producer.poll(0)  # their delivery reports (purged), counted as failed
        self._producer.close()
        return dropped


Partition = tuple[str, int]  # topic, partition
# How long a transaction's commit or abort that timed out (a retriable error) is resumed:
# librdkafka resumes the same call, and a broker back within it lets the transaction end one
# way or the other (given up sooner, whether the commit happened is not known).
END_TRANSACTION_S = 60.0
# How long a producer asks for its transactional id. A cluster just started loads its
# transaction coordinators first (the __transaction_state partitions): until then every
# broker answers "not coordinator" or "coordinator load in progress", for longer than one
# call's timeout on a busy machine.
INIT_TRANSACTIONS_S = 60.0
# A transactional producer's first wait before asking again (librdkafka doubles it on each
# refusal, up to retry.backoff.max.ms).
TRANSACTION_RETRY_BACKOFF_MS = 10
# The answers of a coordinator that is not there yet, which librdkafka does not always mark
# as retriable once the call's own timeout has run out.
COORDINATOR_NOT_READY = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
    }
)


class TransactionAborted(Exception):
    """A transaction was aborted: none of its records or offsets is visible. Most often the
    consumer group moved on (a rebalance, or this member was dropped), so what the process
    holds of its partitions may no longer be its own."""


@dataclass(frozen=True)
class Outgoing:
    """A record for a transaction: its stream, the record, and its partition (None: by key)."""

    stream: str
    record: dict[str, Any]
    partition: int | None = None


class TransactionalProducer(RecordProducer):
    """Produces records and commits a consumer's offsets in one Kafka transaction: a
    read-committed reader sees the records, and the group the offsets, all or nothing.
    The offsets are committed with the consumer's group metadata, so the group coordinator
    refuses a transaction from a member of an older generation (one whose partitions were
    given to another member): a process that lost its partitions cannot commit anything
    more for them (KIP-447). `transactional_id` must be unique to the process.

    A transaction that fails in any way is aborted and raised as TransactionAborted. One the
    broker aborted itself (it stayed open past its timeout: the process stalled) fences the
    producer for good; it is then made again under the same id, ready for the next."""

    def __init__(
        self,
        cluster: Cluster,
        topics: Mapping[str, str],
        transactional_id: str,
        timeout_ms: int,
    ) -> None:
        settings = {
            "transactional.id": transactional_id,
            # An open transaction of a process that died blocks read-committed readers of
            # its partitions until the broker aborts it, this long after it began.
            "transaction.timeout.ms": timeout_ms,
            "message.timeout.ms": timeout_ms,
            # Right after a commit the coordinator is still writing its markers, and the next
            # transaction's first request is refused (CONCURRENT_TRANSACTIONS) and made again
            # after this backoff: at the default 100 ms, commits that followed another took
            # 100-220 ms instead of 20-40 (optimizer/README.md; the Java client waits 20 ms
            # there, KAFKA-5477).
            "retry.backoff.ms": TRANSACTION_RETRY_BACKOFF_MS,
        }
        super().__init__(cluster, topics, client_id=transactional_id, settings=settings)
        self._config = {**producer_config(cluster, transactional_id), **settings}
        self.transactional_id = transactional_id
        self.timeout_s = timeout_ms / 1000
        self._init_transactions()
        self.committed = 0
        self.renewed = 0  # times it was fenced and made again
        # CPU of the calling threads in `commit`: encoding and producing the records, and
        # the rest (offsets, commit or abort).
        self.produce_cpu_ns = 0
        self.commit_cpu_ns = 0

    def commit(
        self,
        records: Iterable[Outgoing],
        offsets: Mapping[Partition, int],
        group_metadata: object,
    ) -> None:
        """Produces `records` and commits `offsets` (the next offset to read, per topic and
        partition) for the group in one transaction. Raises TransactionAborted, naming the
        error, when it did not commit: nothing of it is visible."""
        began = produced = time.thread_time_ns()
        try:
            self._producer.begin_transaction()
            for out in records:
                self.produce(out.stream, out.record, partition=out.partition)
            produced = time.thread_time_ns()
            if offsets:
                self._producer.send_offsets_to_transaction(
                    [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    group_metadata,
                    self.timeout_s,
                )
            self._resumed(self._producer.commit_transaction)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                self._renew()
            else:
                try:
                    self._resumed(self._producer.abort_transaction)
                except KafkaException:
                    # Not aborted (the broker still out of reach, or the commit it follows
                    # still on its way): a new producer under the same id fences this one,
                    # and the coordinator ends what it left open. Raised, the process
                    # stopped (seen in CI's chaos run, the broker killed mid-commit).
                    self._renew()
            raise TransactionAborted(str(error)) from exc
        finally:
            self.produce_cpu_ns += produced - began
            self.commit_cpu_ns += time.thread_time_ns() - produced
        self.committed += 1

    def _resumed(self, end: Callable[[float], None]) -> None:
        """`end(timeout)`, a transaction's commit or abort, made again while it times out
        (a retriable error: librdkafka resumes the call) for up to END_TRANSACTION_S."""
        deadline = time.monotonic() + END_TRANSACTION_S
        while True:
            try:
                end(self.timeout_s)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() >= deadline:
                    raise

    def _renew(self) -> None:
        """A producer fenced for good is made again (its unsent records are dropped: they
        belonged to the aborted transaction)."""
        self._producer = Producer(self._config)
        self._init_transactions()
        self.renewed += 1

    def _init_transactions(self) -> None:
        """Registers the transactional id (fencing an older producer of it), asking again
        while the cluster has no coordinator for it yet, for up to INIT_TRANSACTIONS_S."""
        deadline = time.monotonic() + INIT_TRANSACTIONS_S
        while True:
            try:
                self._producer.init_transactions(self.timeout_s)
                return
            except KafkaException as exc:
                error = exc.args[0]
                again = error.retriable() or error.code() in COORDINATOR_NOT_READY
                if error.fatal() or not again or time.monotonic() >= deadline:
                    raise
                log.warning("%s: %s; asking again", self.transactional_id, error.str())
                # A new producer under the same id starts its request afresh, whatever
                # state the failed call left the old one's in.
                self._producer = Producer(self._config)


@dataclass
class Received:
    stream: str
    topic: str
    partition: int
    offset: int
    key: str | None
    record: dict[str, Any]


@dataclass
class ConsumerStats:
    received: int = 0
    # Records sent to the dead letters, by (stream, reason): "malformed_record" (the value
    # does not decode as the stream's schema says), "malformed_key" (not UTF-8).
    dead_letters: Counter[tuple[str, str]] = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)  # the most recent ones, for reports

    @property
    def malformed(self) -> int:
        """Records dead-lettered, in all."""
        return sum(self.dead_letters.values())


class RecordConsumer:
    """Consumes streams, yielding decoded records and dead-lettering malformed ones."""

    MAX_REASONS = 100

    def __init__(
        self,
        cluster: Cluster,
        group: str,
        streams: Iterable[str],
        topics: Mapping[str, str],
        *,
        from_beginning: bool = True,
        store_on_poll: bool = True,
        whole_topics: bool = False,
        transactional: bool = False,
        report_ends: bool = False,
        settings: Mapping[str, Any] | None = None,
        on_assign: Callable[[list[Partition]], None] | None = None,
        on_revoke: Callable[[list[Partition]], None] | None = None,
        on_lost: Callable[[list[Partition]], None] | None = None,
    ) -> None:
        """`store_on_poll=False`: a record's offset is committed only once the caller says
        it is handled (`handled`), for consumers that write records elsewhere in batches.
        `whole_topics`: reads every partition from its start by assignment, without joining
        the group (no wait for a rebalance) and without committing anything.
        `transactional`: commits nothing itself; the caller commits offsets in its
        transactions (`TransactionalProducer.commit` with `group_metadata()`).
        `report_ends`: the client tells when it reaches a partition's end, for
        `at_end_of` (a `whole_topics` consumer always does, for `at_end`).
        `on_assign`, `on_revoke` and `on_lost` are called from `poll` when the group gives
        this consumer partitions, takes them back, or finds it had lost them (this member
        was dropped from the group: another may own them already)."""
        self.group = group
        self._store_on_poll = store_on_poll
        self.stats = ConsumerStats()
        self._stream_of = {topics[s]: s for s in streams}
        self._consumer = Consumer(
            {
                **client_settings(cluster),
                "group.id": group,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                # Offsets are stored only once a record is handled (or dead-lettered).
                "enable.auto.offset.store": False,
                "enable.auto.commit": not (whole_topics or transactional),
                # Tells when a partition is read to its end (transaction markers included):
                # `at_end` without a round trip to the broker per partition.
                "enable.partition.eof": whole_topics or report_ends,
                **(settings or {}),
            }
        )
        # Partitions whose end the client reported after the last record taken of them.
        self._at_eof: set[tuple[str, int]] = set()
        # The last poll_batch took all the client held (its queue, of every partition, is one:
        # a partition's end reported may have newer records of it queued behind others').
        self._drained = True
        self._behind_ms = 0  # how old the last full batch's newest record was, ms
        if whole_topics:
            deadline = Deadline(30 * SECOND_NS)
            try:
                assignment = [
                    TopicPartition(topic, partition, OFFSET_BEGINNING)
                    for topic in self._stream_of
                    for partition in partitions_once_known(self._consumer, topic, deadline)
                ]
            except TopicUnavailable as exc:
                raise KafkaException(f"no such topic: {exc.topic} ({exc.reason})") from exc
            self._consumer.assign(assignment)
        else:

            def call(handler: Callable[[list[Partition]], None] | None) -> Any:
                if handler is None:
                    return lambda _consumer, _partitions: None
                return lambda _consumer, partitions: handler(
                    [(tp.topic, tp.partition) for tp in partitions]
                )

            def assigned(partitions: list[Partition]) -> None:
                self._at_eof.difference_update(partitions)  # read from their offsets now
                if on_assign is not None:
                    on_assign(partitions)

            self._consumer.subscribe(
                list(self._stream_of),
                on_assign=call(assigned),
                on_revoke=call(on_revoke),
                on_lost=call(on_lost),
            )
        self._dead_letters = RecordProducer(cluster, topics, client_id=f"{group}-dlq")

    def poll(self, timeout_s: float) -> Received | None:
        """The next well-formed record, or None when nothing arrived within the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return None
            received = self._take(msg)
            if received is not None:
                return received
            if time.monotonic() >= deadline:
                return None

    def poll_batch(self, max_records: int, timeout_s: float) -> list[Received]:
        """Up to `max_records` well-formed records: those that have arrived, taken from the
        client at once, else those that came with the first to arrive within the timeout
        ([] if none did, or none was well-formed)."""
        messages = self._consumer.consume(max_records, 0)
        if not messages:
            first = self._consumer.poll(timeout_s)
            if first is None:
                self._drained, self._behind_ms = True, 0
                return []
            messages = [first]
            if max_records > 1:
                messages += self._consumer.consume(max_records - 1, 0)
        self._drained = len(messages) < max_records
        self._behind_ms = 0
        kind, newest_ms = messages[-1].timestamp()  # its producer's clock
        if not self._drained and kind != TIMESTAMP_NOT_AVAILABLE:
            self._behind_ms = max(0, int(time.time() * 1000) - newest_ms)
        return [received for msg in messages if (received := self._take(msg)) is not None]

    def _take(self, msg: Message) -> Received | None:
        """A message from the client: its record if it is one and well-formed; None for an
        end of partition, an error (raised if fatal) or a malformed record (dead-lettered)."""
        err = msg.error()
        partition = (msg.topic() or "", msg.partition() or 0)
        if err is not None and err.code() == KafkaError._PARTITION_EOF:
            self._at_eof.add(partition)
            return None
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            log.warning("consumer %s: %s", self.group, err)
            return None
        self._at_eof.discard(partition)
        received = self._decode(msg)
        if received is None or self._store_on_poll:
            self._consumer.store_offsets(msg)
        return received

    def _decode(self, msg: Message) -> Received | None:
        try:
            received = _received(self._stream_of[msg.topic() or ""], msg)
        except (RecordError, UnicodeDecodeError) as exc:
            kind = "malformed_key" if isinstance(exc, UnicodeDecodeError) else "malformed_record"
            self._dead_letter(msg, str(exc), kind)
            return None
        self.stats.received += 1
        return received

    def _dead_letter(self, msg: Message, reason: str, kind: str) -> None:
        self.stats.dead_letters[self._stream_of[msg.topic() or ""], kind] += 1
        self.stats.reasons = [*self.stats.reasons[-self.MAX_REASONS + 1 :], reason]
        log.warning(
            "%s[%d]@%d malformed, sent to dead letters: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            reason,
        )
        self._dead_letters.produce(
            DEAD_LETTERS,
            {
                "source_topic": msg.topic(),
                "source_partition": msg.partition(),
                "source_offset": msg.offset(),
                "consumer": self.group,
                "ts_ns": time.time_ns(),
                "error": reason,
                "key": msg.key(),
                "value": msg.value(),
            },
            key=msg.key() or b"",
        )
        # The offset moves past the record only once its dead letter is safely stored.
        if self._dead_letters.flush(30.0):
            raise KafkaException(f"dead letter for {msg.topic()}@{msg.offset()} not delivered")

    def handled(self, records: Iterable[Received]) -> None:
        """Marks records (and everything before them in their partitions) as done."""
        last: dict[tuple[str, int], int] = {}
        for r in records:
            last[(r.topic, r.partition)] = max(r.offset, last.get((r.topic, r.partition), -1))
        if last:
            self._consumer.store_offsets(
                offsets=[TopicPartition(t, p, offset + 1) for (t, p), offset in last.items()]
            )

    def assigned(self) -> bool:
        """Whether the group has given this consumer any partition yet."""
        return bool(self._consumer.assignment())

    def group_metadata(self) -> object:
        """This member of the group as it is now (for a transaction's offsets)."""
        return self._consumer.consumer_group_metadata()

    def member_id(self) -> str:
        """This consumer's member id in the group; "" while it has none (not joined yet, or
        dropped from the group and not yet told the application its partitions are lost)."""
        return self._consumer.memberid() or ""

    def committed(
        self, partitions: Iterable[Partition], timeout_s: float = 30.0
    ) -> dict[Partition, int]:
        """The group's next offset to read per partition: its committed offset, or the
        partition's first offset when the group has committed none there."""
        result = {}
        asked = [TopicPartition(t, p) for t, p in partitions]
        deadline = Deadline(round(timeout_s * SECOND_NS))
        for tp in self._consumer.committed(asked, timeout=timeout_s):
            offset = tp.offset
            if offset < 0:
                # A topic just made may have no leader yet (a group given it at once).
                marks = watermarks(self._consumer, tp.topic, deadline, [tp.partition])
                offset = marks[tp.partition][0]
            result[(tp.topic, tp.partition)] = offset
        return result

    def seek(self, offsets: Mapping[Partition, int]) -> None:
        """Reads each partition on from the offset given."""
        for (topic, partition), offset in offsets.items():
            self._consumer.seek(TopicPartition(topic, partition, offset))

    @property
    def behind_ns(self) -> int:
        """How far behind the last `poll_batch` was reading: 0 if it took all the client
        held, else the age of the newest record it took (by the record's timestamp, its
        producer's clock)."""
        return self._behind_ms * 1_000_000

    def at_end(self) -> bool:
        """Whether every partition is read up to its end as it stood when last fetched (a
        `whole_topics` consumer only)."""
        assigned = self._consumer.assignment()
        return bool(assigned) and all((tp.topic, tp.partition) in self._at_eof for tp in assigned)

    def at_end_of(self, topic: str) -> set[int]:
        """The partitions of `topic` known to be read to their end: the client reported it
        after the last record taken (a `report_ends` consumer), neither their assignment
        nor `forget_ends` came since, and the last `poll_batch` took all the client held
        (none while it reads a backlog in full batches). A partition given in a handover
        is not among them until its backlog is read."""
        if not self._drained:
            return set()
        return {p for t, p in self._at_eof if t == topic}

    def forget_ends(self) -> None:
        """No partition is known to be at its end any more: the caller held up polling, so
        records may have come since the client last reported an end."""
        self._at_eof.clear()

    def close(self) -> None:
        self._consumer.close()
        self._dead_letters.close(10.0)


def read_stream(
    cluster: Cluster,
    stream: str,
    topics: Mapping[str, str],
    *,
    idle_s: float = 10.0,
) -> list[dict[str, Any]]:
    """Every committed record of a stream as it stands now, for streams nobody writes to any
    more: stops at the partitions' ends, or once nothing has arrived for `idle_s`."""
    consumer = RecordConsumer(
        cluster, f"read-{stream}-{time.time_ns()}", [stream], topics, whole_topics=True
    )
    records = []
    try:
        last_arrival = time.monotonic()
        while time.monotonic() - last_arrival < idle_s:
            received = consumer.poll(0.2)
            if received is not None:
                records.append(received.record)
                last_arrival = time.monotonic()
            elif consumer.at_end():
                break
    finally:
        consumer.close()
    return records


def _received(stream: str, msg: Message) -> Received:
    """A record of the stream, decoded. Raises RecordError or UnicodeDecodeError (its key)
    if it cannot be."""
    record = codec(STREAMS[stream]).decode(msg.value(), msg.headers())
    key = msg.key()
    key_text = key.decode() if key is not None else None
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None  # consumed
    return Received(stream, topic, partition, offset, key_text, record)


def _decoded(stream: str, msg: Message, malformed: list[str]) -> Received | None:
    """A record of the stream, decoded; None if it cannot be, its place and reason then
    added to `malformed`."""
    try:
        return _received(stream, msg)
    except (RecordError, UnicodeDecodeError) as exc:
        malformed.append(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {exc}")
        return None


@dataclass
class RecordsRead:
    """What `read_records` read: the records decoded, in each partition's order; the reasons
    of those that could not be (skipped); whether every partition was read to its end."""

    records: list[Received]
    malformed: list[str]
    complete: bool


def read_records(
    consumer: Consumer,
    stream: str,
    topic: str,
    deadline: Deadline,
    partitions: Iterable[int] | None = None,
) -> RecordsRead:
    """The records of `partitions` of the stream's topic (None: all), from their starts to
    their ends as they stand now, read by a `p4bs.topic_range.reader` until the deadline."""
    ranges = watermarks(consumer, topic, deadline, partitions)
    read = RecordsRead([], [], complete=False)

    def decode(msg: Message) -> None:
        received = _decoded(stream, msg, read.malformed)
        if received is not None:
            read.records.append(received)

    read.complete = read_ranges(consumer, topic, ranges, deadline, decode)
    return read


def read_newest(
    consumer: Consumer,
    stream: str,
    topic: str,
    deadline: Deadline,
    partitions: Iterable[int] | None = None,
) -> RecordsRead:
    """As `read_records`, but only the newest well-formed record of each key in a partition:
    what a changelog's compaction keeps. Only those are decoded (the records read can be
    tens of times as many as the keys between two compactions); one that does not decode is
    named and the key's next newest stands in. A record without a key is malformed."""
    ranges = watermarks(consumer, topic, deadline, partitions)
    by_key: dict[tuple[int, bytes], list[Message]] = {}
    malformed: list[str] = []

    def keep(msg: Message) -> None:
        partition, key = msg.partition(), msg.key()
        assert partition is not None  # set on every record consumed
        if key is None:
            malformed.append(f"{topic}[{partition}]@{msg.offset()}: no key")
        else:
            by_key.setdefault((partition, key), []).append(msg)

    read = RecordsRead([], malformed, read_ranges(consumer, topic, ranges, deadline, keep))
    for messages in by_key.values():
        for msg in reversed(messages):
            received = _decoded(stream, msg, malformed)
            if received is not None:
                read.records.append(received)
                break
    read.records.sort(key=lambda r: (r.partition, r.offset))
    return read


def read_partitions(
    cluster: Cluster,
    stream: str,
    topics: Mapping[str, str],
    partitions: Iterable[int],
    timeout_s: float = 60.0,
) -> tuple[list[Received], list[str]]:
    """Every committed record of the stream's `partitions`, from their starts to their ends
    as they stand now (a changelog being taken over), and the reasons of the records that
    could not be decoded (skipped). A transaction still open below an end is waited for,
    so everything committed before the call is read; raises KafkaException if that takes
    longer than `timeout_s`."""
    topic = topics[stream]
    partitions = list(partitions)
    consumer = changelog_reader(cluster, stream)
    try:
        read = read_records(
            consumer, stream, topic, Deadline(round(timeout_s * SECOND_NS)), partitions
        )
    finally:
        consumer.close()
    if not read.complete:
        raise not_read_to_end(topic, partitions, timeout_s)
    return read.records, read.malformed


def changelog_reader(cluster: Cluster, stream: str) -> Consumer:
    """A `p4bs.topic_range.reader` of the stream's committed records (`read_records`)."""
    # A partition's end event makes the poll return as soon as the end is reached.
    return reader(
        client_settings(cluster), f"read-{stream}", settings={"enable.partition.eof": True}
    )


def not_read_to_end(topic: str, partitions: Iterable[int], timeout_s: float) -> KafkaException:
    """The error of a read of a changelog's partitions that did not reach their ends."""
    return KafkaException(
        f"{topic} partitions {sorted(partitions)} not read to their ends within "
        f"{timeout_s:g} s (a transaction left open?)"
    )


# A changelog topic keeps the newest record per key; old ones are compacted away within
# about a minute, so that reading a partition from its start (a process taking its links
# over) reads little more than one record per link.
COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "min.cleanable.dirty.ratio": "0.1",
    "min.compaction.lag.ms": "0",
}


def ensure_topics(
    cluster: Cluster,
    topics: Mapping[str, str],
    partitions: int,
    replication_factor: int,
    timeout_s: float = 30.0,
) -> list[str]:
    """Creates the topics (stream -> topic) that do not exist yet, a changelog stream's
    compacted; returns the ones it created."""
    admin = AdminClient(client_settings(cluster))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = {s: t for s, t in topics.items() if t not in existing}
    if not wanted:
        return []
    futures = admin.create_topics(
        [
            NewTopic(
                t,
                partitions,
                replication_factor,
                config=COMPACTION if s in COMPACTED_STREAMS else {},
            )
            for s, t in wanted.items()
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for future in futures.values():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return sorted(wanted.values())
