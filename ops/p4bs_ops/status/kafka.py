"""The Kafka check: every broker the cluster lists and every bootstrap address answers on its
own, the config's topics exist with a leader for each partition, and each consumer group the
project uses (groups.py) with its lag per topic, within `max_lag` when one is set."""

from __future__ import annotations

import concurrent.futures
import contextlib
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from p4bs.config import Config, KafkaConfig
from p4bs.topic_range import Deadline
from p4bs_ops.status.groups import group_lags, lag_text
from p4bs_ops.status.kafka_clients import KafkaErrors, is_kafka_error, kafka_settings, no_cluster
from p4bs_ops.status.runner import PartStatus, StatusOptions, part_check


@part_check("kafka")
def check_kafka(config: Config, options: StatusOptions) -> PartStatus:
    kafka = config.kafka
    deadline = Deadline(options.timeout_ns)
    errors = KafkaErrors()
    admin = AdminClient(kafka_settings(kafka, errors))
    try:
        metadata = admin.list_topics(timeout=deadline.left_s())
    except KafkaException as exc:
        raise no_cluster(kafka, errors, exc, admin) from None

    # Every broker the cluster lists, and every bootstrap address, asked on its own.
    advertised = {f"{b.host}:{b.port}": b.id for b in metadata.brokers.values()}
    bootstrap = [a.strip() for a in kafka.bootstrap.split(",") if a.strip()]
    addresses = list(dict.fromkeys([*sorted(advertised, key=advertised.__getitem__), *bootstrap]))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(addresses)))
    probes = {a: pool.submit(_probe_broker, kafka, a, deadline.left_s()) for a in addresses}
    pool.shutdown(wait=False)
    reachability: dict[str, str | None] = {}
    for address, future in probes.items():
        try:
            reachability[address] = future.result(deadline.left_s() + 1.0)
        except concurrent.futures.TimeoutError:
            reachability[address] = "no answer in time"
    brokers = [
        {
            "id": broker_id,
            "address": address,
            "controller": broker_id == metadata.controller_id,
            "reachable": reachability[address] is None,
            **({"error": reachability[address]} if reachability[address] else {}),
        }
        for address, broker_id in sorted(advertised.items(), key=lambda item: item[1])
    ]
    other_bootstrap = [
        {
            "address": address,
            "reachable": reachability[address] is None,
            **({"error": reachability[address]} if reachability[address] else {}),
        }
        for address in bootstrap
        if address not in advertised
    ]
    problems = [
        f"broker {b['id']} at {b['address']}: {b['error']}" for b in brokers if not b["reachable"]
    ]
    problems += [
        f"bootstrap {b['address']}: {b['error']}" for b in other_bootstrap if not b["reachable"]
    ]

    # The config's topics: there, and a leader for each partition.
    topics: dict[str, dict[str, Any]] = {}
    for stream, topic in kafka.topics.items():
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            reason = "missing" if meta is None or meta.error is None else meta.error.str()
            topics[stream] = {"topic": topic, "error": reason}
            problems.append(f"topic {topic}: {reason}")
            continue
        offline = sorted(p for p, info in meta.partitions.items() if info.leader < 0)
        under = sorted(
            p for p, info in meta.partitions.items() if len(info.isrs) < len(info.replicas)
        )
        topics[stream] = {
            "topic": topic,
            "partitions": len(meta.partitions),
            "offline_partitions": offline,
            "under_replicated_partitions": under,
        }
        if offline:
            problems.append(f"topic {topic}: partitions {offline} have no leader")

    groups = group_lags(admin, config, options, metadata, deadline)
    if options.max_lag is not None:
        for group, info in groups.items():
            for topic, lag in info.get("lag", {}).items():
                if lag.get("lag", 0) > options.max_lag:
                    problems.append(
                        f"group {group}: {lag['lag']:,} records behind on {topic} "
                        f"(over {options.max_lag:,})"
                    )
    lags = ", ".join(f"{group} {lag_text(info)}" for group, info in groups.items())
    reachable = sum(1 for b in brokers if b["reachable"])
    summary = f"{reachable} of {len(brokers)} brokers reachable, {len(topics)} topics; lag: {lags}"
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        summary = "; ".join(problems[:3]) + more
    details = {
        "bootstrap": kafka.bootstrap,
        "brokers": brokers,
        **({"bootstrap_addresses": other_bootstrap} if other_bootstrap else {}),
        "topics": topics,
        "groups": groups,
        "problems": problems,
    }
    return PartStatus("kafka", not problems, summary, details)


def _probe_broker(kafka: KafkaConfig, address: str, timeout_s: float) -> str | None:
    """None when a client bootstrapped from `address` alone gets the cluster's metadata (the
    request goes to that broker, the only one it knows); the reason otherwise."""
    errors = KafkaErrors()
    admin = AdminClient(kafka_settings(kafka, errors, bootstrap=address))
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        with contextlib.suppress(Exception):
            admin.poll(0)
        return errors.last() or (exc.args[0].str() if is_kafka_error(exc) else str(exc))
    return None
