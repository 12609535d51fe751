"""The Kafka ACLs each component needs, derived from the config, and applying them.

A secured cluster whose brokers run an authorizer (the local stack's: KRaft's
StandardAuthorizer, `allow.everyone.if.no.acl.found=false`) lets a user do only what an ACL
allows. `acl_set` gives each component the least its code does, read from the parts:

- exporter: writes link_counters (idempotent producer).
- metrics_job: reads link_counters and links in its group (offsets committed at each
  checkpoint), writes link_metrics, sla_alerts and optimizer_feed in transactions
  (exactly-once sink, ids `<group>.<stream>-...`; optimizer_feed only with [metrics]
  optimizer_feed, but granted either way, as the switch is the job's config, not the ACLs').
- optimizer: reads link_metrics or optimizer_feed (as [metrics] optimizer_feed says: granted
  both), links and optimizer_state in its group ([optimizer] group),
  writes optimizer_state and buffer_decisions in transactions (ids `<group>-<host>-...`),
  and a record it cannot decode to dead_letters.
- sinks: the InfluxDB sink reads every stream and the alert dispatcher sla_alerts, each in its
  group; both dead-letter what they cannot decode.
- dashboard (the dashboard and `p4bs status`): reads and describes every topic by assignment
  (no group of its own to commit to), describes the groups and the cluster. It writes nothing.
- links (`p4bs links`): reads and writes the links topic.
- admin: creates topics and sets ACLs (the stack makes it a super user as well).

Readers that assign themselves partitions and commit nothing (`p4bs.topic_range.reader`:
the dashboard's feed, `p4bs status`, changelog take-overs, `read_stream`) never join their
group (`<name>-<random>`), but librdkafka still looks its coordinator up, which takes
DESCRIBE on the group: they get DESCRIBE on their name's prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from p4bs.config import KafkaConfig
from p4bs.config.model import KAFKA_COMPONENTS

# The groups and transactional ids the parts use by default (p4bs_jobs.metrics' group_id,
# p4bs_sinks' InfluxSink and AlertDispatcher groups); tests/system/test_kafka_acls.py checks
# that they are still the parts' defaults.
METRICS_GROUP = "p4bs-metrics"
INFLUX_SINK_GROUP = "p4bs-influx-sink"
ALERT_DISPATCHER_GROUP = "p4bs-alert-dispatcher"

# Kafka's resource types, pattern types and operations, by their names in Kafka's tools.
TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER = "TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"
LITERAL, PREFIXED = "LITERAL", "PREFIXED"
CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True, order=True)
class Acl:
    """ALLOW `operation` on a resource to the component's user, from any host."""

    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID or CLUSTER
    name: str
    pattern: str  # LITERAL or PREFIXED
    operation: str  # READ, WRITE, DESCRIBE, CREATE, ALTER, IDEMPOTENT_WRITE, ...

    def line(self, principal: str) -> str:
        """As `kafka-acls.sh --list` shows it, with the principal."""
        return f"{principal}: ALLOW {self.operation} on {self.resource}:{self.pattern}:{self.name}"


def _topics(topics: Mapping[str, str], streams: Iterable[str], *ops: str) -> list[Acl]:
    return [Acl(TOPIC, topics[s], LITERAL, op) for s in streams for op in ops]


def _group(name: str, *ops: str, pattern: str = LITERAL) -> list[Acl]:
    return [Acl(GROUP, name, pattern, op) for op in ops]


def _reader(name: str) -> Acl:
    """A `p4bs.topic_range.reader` named `name` (its group `<name>-<random>`)."""
    return Acl(GROUP, name, PREFIXED, "DESCRIBE")


def _transactions(prefix: str) -> list[Acl]:
    return [Acl(TRANSACTIONAL_ID, prefix, PREFIXED, op) for op in ("WRITE", "DESCRIBE")]


def _producer() -> list[Acl]:
    """An idempotent producer's (every p4bs producer is one)."""
    return [Acl(CLUSTER, CLUSTER_NAME, LITERAL, "IDEMPOTENT_WRITE")]


def acl_set(kafka: KafkaConfig, optimizer_group: str) -> dict[str, list[Acl]]:
    """Each component (KAFKA_COMPONENTS) and the ACLs its user needs on the cluster of
    `kafka` (its topics), sorted; `optimizer_group` is the config's [optimizer] group."""
    t = kafka.topics
    every = list(t)
    dead_letters = _topics(t, ["dead_letters"], "WRITE")
    acls: dict[str, list[Acl]] = {
        "exporter": [*_topics(t, ["link_counters"], "WRITE"), *_producer()],
        "metrics_job": [
            *_topics(t, ["link_counters", "links"], "READ"),
            *_topics(t, ["link_metrics", "sla_alerts", "optimizer_feed"], "WRITE"),
            *_group(METRICS_GROUP, "READ"),
            *_transactions(METRICS_GROUP),
            *_producer(),
        ],
        "optimizer": [
            *_topics(t, ["link_metrics", "optimizer_feed", "links", "optimizer_state"], "READ"),
            *_topics(t, ["optimizer_state", "buffer_decisions"], "WRITE"),
            *dead_letters,
            # Its group, and `<group>-links`, the links topic's follower.
            *_group(optimizer_group, "READ", pattern=PREFIXED),
            _reader("read-optimizer_state"),  # the changelog of the links it takes over
            *_transactions(f"{optimizer_group}-"),
            *_producer(),
        ],
        "sinks": [
            *_topics(t, every, "READ"),
            *dead_letters,
            *_group(INFLUX_SINK_GROUP, "READ"),
            *_group(ALERT_DISPATCHER_GROUP, "READ"),
            *_producer(),
        ],
        "dashboard": [
            *_topics(t, every, "READ", "DESCRIBE"),
            *[
                acl
                for group in (optimizer_group, METRICS_GROUP, INFLUX_SINK_GROUP)
                for acl in _group(group, "DESCRIBE")
            ],
            *_group(ALERT_DISPATCHER_GROUP, "DESCRIBE"),
            _reader("p4bs-dashboard"),
            _reader("p4bs-status"),
            Acl(CLUSTER, CLUSTER_NAME, LITERAL, "DESCRIBE"),
        ],
        "links": [*_topics(t, ["links"], "READ", "WRITE"), _reader("read-links"), *_producer()],
        "admin": [
            *[Acl(CLUSTER, CLUSTER_NAME, LITERAL, op) for op in ("CREATE", "ALTER", "DESCRIBE")],
            *_topics(t, every, "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
        ],
    }
    assert set(acls) == set(KAFKA_COMPONENTS)
    return {component: sorted(set(acls[component])) for component in KAFKA_COMPONENTS}


def usernames(kafka: KafkaConfig) -> dict[str, str]:
    """Each component's user, resolved from the config's references ([kafka.users.<c>], or
    [kafka]'s). Raises LookupError naming a reference that does not resolve, ValueError
    for a plaintext cluster (no users)."""
    if kafka.security == "plaintext":
        raise ValueError('a plaintext cluster has no users; ACLs need security = "sasl_ssl"')
    names = {}
    for component in KAFKA_COMPONENTS:
        username = kafka.for_component(component).username
        assert username is not None  # a sasl_ssl config has one (the config checks)
        names[component] = username.resolve()
    return names


def render(kafka: KafkaConfig, optimizer_group: str) -> str:
    """The ACL set as text: per component, its user and each ACL."""
    users = usernames(kafka)
    lines = []
    for component, acls in acl_set(kafka, optimizer_group).items():
        principal = f"User:{users[component]}"
        lines.append(f"# {component} ({principal})")
        lines += [acl.line(principal) for acl in acls]
    return "\n".join(lines) + "\n"


def apply(
    admin_settings: Mapping[str, Any],
    kafka: KafkaConfig,
    optimizer_group: str,
    timeout_s: float = 30.0,
) -> int:
    """Creates every ACL of the set (an existing one is left as it is) with an AdminClient
    connected as `admin_settings` say (a user allowed to ALTER the cluster); returns how many
    it asked for. Raises KafkaException naming the first ACL the cluster refused."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    users = usernames(kafka)
    bindings = [
        AclBinding(
            # librdkafka names Kafka's CLUSTER resource BROKER.
            ResourceType["BROKER" if acl.resource == CLUSTER else acl.resource],
            acl.name,
            ResourcePatternType[acl.pattern],
            f"User:{users[component]}",
            "*",
            AclOperation[acl.operation],
            AclPermissionType.ALLOW,
        )
        for component, acls in acl_set(kafka, optimizer_group).items()
        for acl in acls
    ]
    admin = AdminClient(dict(admin_settings))
    futures = admin.create_acls(bindings, request_timeout=timeout_s)
    for binding, future in futures.items():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            raise KafkaException(f"ACL {binding}: {exc.args[0]}") from exc
    return len(bindings)
