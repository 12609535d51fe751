"""The optimizer's check: the members of the optimizer's group and the links each owns, from
the newest `optimizer_state` record of each link (`owner`, `epoch`)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from p4bs.config import Config
from p4bs.topic_range import Deadline, TopicUnavailable
from p4bs_ops.status.groups import describe_group
from p4bs_ops.status.kafka_clients import KafkaErrors, kafka_settings, no_cluster, status_reader
from p4bs_ops.status.runner import CheckFailed, PartStatus, StatusOptions, part_check
from p4bs_optimizer.changelog import STREAM, newest_states


@part_check("optimizer")
def check_optimizer(config: Config, options: StatusOptions) -> PartStatus:
    """The optimizer group's members and the partitions of its windows' stream (link_metrics,
    or optimizer_feed when [metrics] optimizer_feed) each holds; each
    link's newest optimizer_state record (its `owner` and `epoch`, in the partition of the
    link's windows), and the member holding that partition now."""
    deadline = Deadline(options.timeout_ns)
    group = config.optimizer.group
    errors = KafkaErrors()
    admin = AdminClient(kafka_settings(config.kafka, errors))
    try:
        admin.list_topics(timeout=deadline.left_s())  # the cluster answers at all
    except KafkaException as exc:
        raise no_cluster(config.kafka, errors, exc, admin) from None
    group_state, group_members = describe_group(admin, group, deadline)
    metrics_topic = config.kafka.topics[config.metrics.optimizer_stream]
    members = []
    holder: dict[int, str] = {}  # windows' partition -> member
    for member in group_members:
        label = f"{member.client_id}@{member.host.lstrip('/')}"
        assigned = sorted(
            tp.partition
            for tp in (member.assignment.topic_partitions if member.assignment else [])
            if tp.topic == metrics_topic
        )
        for p in assigned:
            holder[p] = label
        members.append(
            {
                "member": label,
                "client_id": member.client_id,
                "host": member.host.lstrip("/"),
                "member_id": member.member_id,
                "partitions": assigned,
            }
        )
    # Each link's newest state as the optimizer restores it (records it cannot decode are
    # passed over, as there).
    consumer = status_reader(config.kafka, errors, committed_only=True)
    try:
        newest = newest_states(consumer, config.kafka.topics[STREAM], deadline)
    except TopicUnavailable as exc:
        raise CheckFailed(str(exc)) from None
    except KafkaException as exc:
        raise no_cluster(config.kafka, errors, exc, consumer) from None
    finally:
        consumer.close()
    states = newest.records
    now_ns = time.time_ns()
    links: dict[str, dict[str, Any]] = {}
    unowned, unheld = [], []
    for link in config.links:
        state = states.get(link.id)
        if state is None:
            links[link.id] = {"owner": None}
            unowned.append(link.id)
            continue
        record, partition = state.record, state.partition
        held_by = holder.get(partition)
        links[link.id] = {
            "owner": record["owner"],
            "epoch": record["epoch"],
            "partition": partition,
            "state_age_ns": max(0, now_ns - record["ts_ns"]),
            "held_by": held_by,
        }
        if held_by is None:
            unheld.append(link.id)
    for entry in members:
        entry["links"] = sorted(
            link_id
            for link_id, info in links.items()
            if info.get("partition") in entry["partitions"]
        )
    owners: dict[str, list[str]] = {}
    for link_id, info in links.items():
        if info["owner"] is not None:
            owners.setdefault(info["owner"], []).append(link_id)
    details: dict[str, Any] = {
        "group": group,
        "state": group_state,
        "instances": members,
        "links": links,
        "unowned": unowned,
    }
    others = sorted(set(states) - {link.id for link in config.links})
    if others:
        details["not_in_config"] = others
    if not newest.complete:
        details["note"] = "the state topic was not read to its end within the timeout"
    problems = []
    if not members:
        problems.append(f"no instance in group {group}")
    if unowned:
        problems.append(f"links with no owner: {', '.join(unowned)}")
    if members and unheld:
        problems.append(f"links whose partition no instance holds: {', '.join(unheld)}")
    if problems:
        return PartStatus("optimizer", False, "; ".join(problems), details)
    owned = ", ".join(
        f"{owner} {len(ids)} link{'s' if len(ids) != 1 else ''}"
        for owner, ids in sorted(owners.items())
    )
    summary = f"{len(members)} instance{'s' if len(members) != 1 else ''}; owners: {owned}"
    return PartStatus("optimizer", True, summary, details)
