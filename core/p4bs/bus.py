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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from p4bs.config import KafkaConfig, SecretRef
from p4bs_schemas.codec import RecordError, codec
from p4bs_schemas.registry import STREAMS

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
        self, cluster: Cluster, topics: Mapping[str, str], client_id: str = "p4bs"
    ) -> None:
        self.topics = dict(topics)
        self.stats = ProducerStats()
        self._producer = Producer(producer_config(cluster, client_id))

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
    malformed: int = 0
    reasons: list[str] = field(default_factory=list)  # the most recent ones, for reports


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
    ) -> None:
        """`store_on_poll=False`: a record's offset is committed only once the caller says
        it is handled (`handled`), for consumers that write records elsewhere in batches.
        `whole_topics`: reads every partition from its start by assignment, without joining
        the group (no wait for a rebalance) and without committing anything."""
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
                "enable.auto.commit": not whole_topics,
                # Tells when a partition is read to its end (transaction markers included):
                # `at_end` without a round trip to the broker per partition.
                "enable.partition.eof": whole_topics,
            }
        )
        self._at_eof: set[tuple[str, int]] = set()
        if whole_topics:
            metadata = self._consumer.list_topics(timeout=30).topics
            missing = sorted(set(self._stream_of) - set(metadata))
            if missing:
                raise KafkaException(f"no such topic: {', '.join(missing)}")
            self._consumer.assign(
                [
                    TopicPartition(topic, partition, OFFSET_BEGINNING)
                    for topic in self._stream_of
                    for partition in metadata[topic].partitions
                ]
            )
        else:
            self._consumer.subscribe(list(self._stream_of))
        self._dead_letters = RecordProducer(cluster, topics, client_id=f"{group}-dlq")

    def poll(self, timeout_s: float) -> Received | None:
        """The next well-formed record, or None when nothing arrived within the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return None
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                self._at_eof.add((msg.topic() or "", msg.partition() or 0))
                continue
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consumer %s: %s", self.group, err)
                continue
            self._at_eof.discard((msg.topic() or "", msg.partition() or 0))
            received = self._decode(msg)
            if received is None or self._store_on_poll:
                self._consumer.store_offsets(msg)
            if received is not None:
                return received
            if time.monotonic() >= deadline:
                return None

    def _decode(self, msg: Message) -> Received | None:
        topic = msg.topic() or ""
        stream = self._stream_of[topic]
        key = msg.key()
        try:
            record = codec(STREAMS[stream]).decode(msg.value(), msg.headers())
            key_text = key.decode() if key is not None else None
        except (RecordError, UnicodeDecodeError) as exc:
            self._dead_letter(msg, str(exc))
            return None
        self.stats.received += 1
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None  # always set on consumed records
        return Received(stream, topic, partition, offset, key_text, record)

    def _dead_letter(self, msg: Message, reason: str) -> None:
        self.stats.malformed += 1
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

    def at_end(self) -> bool:
        """Whether every partition is read up to its end as it stood when last fetched (a
        `whole_topics` consumer only)."""
        assigned = self._consumer.assignment()
        return bool(assigned) and all((tp.topic, tp.partition) in self._at_eof for tp in assigned)

    def close(self) -> None:
        self._consumer.close()
        self._dead_letters.flush(10.0)


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


def ensure_topics(
    cluster: Cluster,
    topics: Iterable[str],
    partitions: int,
    replication_factor: int,
    timeout_s: float = 30.0,
) -> list[str]:
    """Creates the topics that do not exist yet; returns the ones it created."""
    admin = AdminClient(client_settings(cluster))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [t for t in topics if t not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [NewTopic(t, partitions, replication_factor) for t in wanted],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for future in futures.values():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return wanted
