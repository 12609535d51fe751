"""Least privilege on a real broker (issue 38): the session's secured stack (secured_stack.py)
runs KRaft's StandardAuthorizer with a SCRAM user per component and the ACLs `p4bs stack
acls` derives from the config. Each component's user does its job with only its ACLs (in-
process clients as the component's code makes them: idempotent producers, transactions
with the group's offsets, group members) and is refused what it must not do, each refusal
asserted by the error code the broker gave.

The topics are the config's own (the ACLs name them), used by no other test of the stack.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from secured_stack import OWN_USERS, Secured, client_kafka, example_with

from p4bs.bus import RecordConsumer, client_settings
from p4bs.config import KafkaConfig
from p4bs.topic_range import Deadline, reader, watermarks
from p4bs_cli.main import main
from p4bs_infra import kafka_acls
from p4bs_jobs.metrics import run_metrics_job
from p4bs_schemas.registry import STREAMS
from p4bs_sinks.alerts import AlertDispatcher
from p4bs_sinks.influx_sink import InfluxSink

SECOND_NS = 1_000_000_000
OPTIMIZER_GROUP = "p4bs-optimizer"  # the example config's [optimizer] group


def _as(secured: Secured, component: str) -> KafkaConfig:
    return secured.client.for_component(component)


def _settings(secured: Secured, component: str) -> dict[str, Any]:
    return client_settings(_as(secured, component))


def _produce(settings: dict[str, Any], topic: str, **extra: Any) -> KafkaError | None:
    """Sends one record; the delivery's error (None: stored)."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**settings, "acks": "all", "message.timeout.ms": 15_000, **extra})
    producer.produce(
        topic,
        b"acl-test",
        f"r1:eth{uuid.uuid4().hex[:4]}",
        on_delivery=lambda e, _m: outcome.append(e),
    )
    producer.flush(20)
    assert outcome, f"no delivery report for {topic}"
    return outcome[0]


def _code(error: KafkaError | None) -> int | None:
    return None if error is None else error.code()


@pytest.fixture(scope="module")
def topics(secured: Secured) -> dict[str, str]:
    """The config's topics, with one record from the exporter in link_counters."""
    names = dict(secured.client.topics)
    assert _produce(_settings(secured, "exporter"), names["link_counters"]) is None
    return names


@contextmanager
def _member(settings: dict[str, Any], group: str, topics: list[str]) -> Iterator[Consumer]:
    """A member of `group` subscribed to `topics`, once it has read a record (the group's
    join and the fetch are allowed), committing nothing by itself."""
    consumer = Consumer(
        {
            **settings,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.subscribe(topics)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                break
        else:
            raise AssertionError(f"{group}: no record of {topics} within 30 s")
        yield consumer
    finally:
        consumer.close()


def _transaction(
    settings: dict[str, Any], transactional_id: str, topics: list[str], member: Consumer
) -> None:
    """Writes a record to each of `topics` and commits the member's position for its group,
    in one transaction (as the optimizer and Flink's exactly-once sink do)."""
    producer = Producer({**settings, "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for topic in topics:
        producer.produce(topic, b"acl-test", b"r1:eth1")
    producer.send_offsets_to_transaction(
        member.position(member.assignment()), member.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)


def test_the_acl_set_names_the_parts_own_groups_and_the_command_prints_it(
    secured: Secured, capsys: pytest.CaptureFixture[str]
) -> None:
    def default(call: Any, name: str) -> Any:
        return inspect.signature(call).parameters[name].default

    assert default(run_metrics_job, "group_id") == kafka_acls.METRICS_GROUP
    assert default(InfluxSink, "group") == kafka_acls.INFLUX_SINK_GROUP
    assert default(AlertDispatcher, "group") == kafka_acls.ALERT_DISPATCHER_GROUP
    # The config a client needs: the [kafka] lines the stack wrote (its CA among them).
    config = secured.folder / "acls.toml"
    config.write_text(example_with({"kafka": client_kafka(secured)}))
    assert main(["stack", "acls", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "User:p4bs-dashboard: ALLOW READ on TOPIC:LITERAL:p4bs.links" in printed
    assert "User:p4bs-exporter: ALLOW WRITE on TOPIC:LITERAL:p4bs.link-counters" in printed
    # The dashboard's user is given nothing but READ and DESCRIBE.
    dashboard = [line for line in printed.splitlines() if line.startswith("User:p4bs-dashboard")]
    assert dashboard and all(" READ " in x or " DESCRIBE " in x for x in dashboard)
    # Applying again (the stack applied them at start) leaves them as they are.
    assert main(["stack", "acls", "--config", str(config), "--apply"]) == 0
    assert "applied" in capsys.readouterr().out


def test_the_exporter_writes_link_counters_and_not_the_links_topic(
    secured: Secured, topics: dict[str, str]
) -> None:
    exporter = _settings(secured, "exporter")
    assert _produce(exporter, topics["link_counters"]) is None
    refused = _produce(exporter, topics["links"])
    assert _code(refused) == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused


def test_the_metrics_job_reads_counters_and_writes_metrics_in_its_transactions(
    secured: Secured, topics: dict[str, str]
) -> None:
    job = _settings(secured, "metrics_job")
    with _member(job, kafka_acls.METRICS_GROUP, [topics["link_counters"]]) as member:
        # Flink's exactly-once sink: ids <prefix>-<subtask>-<checkpoint>.
        written = [topics["link_metrics"], topics["sla_alerts"], topics["optimizer_feed"]]
        _transaction(job, f"{kafka_acls.METRICS_GROUP}.link_metrics-0-1", written, member)
    refused = _produce(job, topics["buffer_decisions"])
    assert _code(refused) == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused


def test_the_dashboard_reads_everything_and_writes_nothing(
    secured: Secured, topics: dict[str, str]
) -> None:
    dashboard = _settings(secured, "dashboard")
    consumer = reader(dashboard, "p4bs-dashboard")  # the feed's name
    try:
        deadline = Deadline(30 * SECOND_NS)
        for topic in topics.values():
            watermarks(consumer, topic, deadline)  # DESCRIBE and the offsets: allowed
        counters = topics["link_counters"]
        ends = watermarks(consumer, counters, deadline)
        consumer.assign([TopicPartition(counters, p, low) for p, (low, _) in ends.items()])
        msg = None
        while msg is None and deadline.left_s() > 0:
            msg = consumer.poll(0.5)
        assert msg is not None and msg.error() is None and msg.value() == b"acl-test"
    finally:
        consumer.close()
    # `p4bs status`'s look at the optimizer group (the metrics job's member made it).
    admin = AdminClient(dashboard)
    admin.list_topics(timeout=30)
    group = kafka_acls.METRICS_GROUP
    described = admin.describe_consumer_groups([group], request_timeout=20)[group].result(30)
    assert described.group_id == group
    # Not one topic takes its records, whether its producer is idempotent or not.
    for topic in (topics["links"], topics["buffer_decisions"], topics["link_metrics"]):
        refused = _produce(dashboard, topic, **{"enable.idempotence": False})
        assert _code(refused) == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, refused)
    # An idempotent producer (every p4bs producer) does not even get a producer id.
    with pytest.raises(KafkaException) as idempotent:
        _produce(dashboard, topics["links"], **{"enable.idempotence": True})
    assert idempotent.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_the_optimizer_commits_state_and_decisions_with_its_groups_offsets(
    secured: Secured, topics: dict[str, str]
) -> None:
    optimizer = _settings(secured, "optimizer")
    # A window for it to read, from the job's user.
    assert _produce(_settings(secured, "metrics_job"), topics["link_metrics"]) is None
    windows = [topics["link_metrics"], topics["optimizer_feed"]]  # as [metrics] optimizer_feed
    with _member(optimizer, OPTIMIZER_GROUP, windows) as member:
        written = [topics["optimizer_state"], topics["buffer_decisions"]]
        _transaction(optimizer, f"{OPTIMIZER_GROUP}-host-1-{uuid.uuid4().hex[:6]}", written, member)
    # It cannot add a link, nor write metrics it would then act on.
    for topic in (topics["links"], topics["link_metrics"], topics["optimizer_feed"]):
        refused = _produce(optimizer, topic)
        assert _code(refused) == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, refused)
    # A transactional id outside its prefix is refused.
    with pytest.raises(KafkaException) as other_id:
        Producer({**optimizer, "transactional.id": "someone-else"}).init_transactions(15)
    assert other_id.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_a_sink_reads_in_its_group_dead_letters_and_cannot_commit_for_another_group(
    secured: Secured, topics: dict[str, str]
) -> None:
    sinks = _as(secured, "sinks")
    # The sink's own consumer: the exporter's record is not a LinkCounters one, so it is
    # dead-lettered, which the sinks' user may write.
    consumer = RecordConsumer(sinks, kafka_acls.INFLUX_SINK_GROUP, STREAMS, topics)
    try:
        deadline = time.monotonic() + 30
        while consumer.stats.malformed == 0 and time.monotonic() < deadline:
            consumer.poll(0.5)  # the dead letters are among what it reads
        assert consumer.stats.malformed >= 1
    finally:
        consumer.close()
    settings = client_settings(sinks)
    with _member(settings, kafka_acls.ALERT_DISPATCHER_GROUP, [topics["link_counters"]]) as member:
        member.commit(asynchronous=False)  # its own group: allowed
    # Offsets committed for a group (OffsetCommit, as a member's commit sends it): its own
    # group's are taken, the optimizer's group's refused.
    admin = AdminClient(settings)
    offsets = [TopicPartition(topics["link_counters"], 0, 0)]

    def commit(group: str) -> None:
        request = ConsumerGroupTopicPartitions(group, offsets)
        admin.alter_consumer_group_offsets([request], request_timeout=15)[group].result(20)

    commit(kafka_acls.ALERT_DISPATCHER_GROUP)
    with pytest.raises(KafkaException) as other_group:
        commit(OPTIMIZER_GROUP)
    assert other_group.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    refused = _produce(settings, topics["links"])
    assert _code(refused) == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused


def test_links_are_written_by_the_links_user_and_every_component_has_its_own(
    secured: Secured, topics: dict[str, str]
) -> None:
    assert _produce(_settings(secured, "links"), topics["links"]) is None
    logins = {_as(secured, c).username for c in OWN_USERS}
    assert len(logins) == len(OWN_USERS) and secured.client.username not in logins
