"""The links as data: the compacted `links` topic, one LinkSpec record per link, newest last.

`p4bs links apply --config FILE` makes the topic say what FILE's [[links]] say: a record for
each link that is new or changed (compared with the topic's newest), and with `--prune` a
`removed` record for each link the topic has and FILE has not. The parts follow the topic
instead of their start-up config, so that adding, changing or removing a link needs no
restart. FILE is checked as a whole first (`load_config`): a link is never published with a
problem its config would have been refused for.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from p4bs.bus import Cluster, RecordProducer, read_stream
from p4bs.config import Config, LinkConfig

STREAM = "links"


def spec_record(link: LinkConfig, table: dict[str, Any]) -> dict[str, Any]:
    """The LinkSpec record of a link: the figures the metrics job needs, parsed, and its
    config entry as written (`table`, as tomllib read it), for the optimizer."""
    return {
        "link_id": link.id,
        "ts_ns": time.time_ns(),
        "removed": False,
        "capacity_bps": link.capacity_bps,
        "max_queue_delay_ns": link.max_queue_delay_ns,
        "max_loss": link.max_loss,
        "weight_loss": link.weight_loss,
        "weight_delay": link.weight_delay,
        "config": json.dumps(table, sort_keys=True),
    }


def published(cluster: Cluster, topics: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The topic's newest record per link (removed links included)."""
    return {r["link_id"]: r for r in read_stream(cluster, STREAM, topics, idle_s=5.0)}


@dataclass
class Changes:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def apply_links(config: Config, tables: list[dict[str, Any]], *, prune: bool) -> Changes:
    """Publishes what `config`'s links (and their entries as written, `tables`, in the same
    order) change in the topic; with `prune`, removes the links it does not have."""
    topics = dict(config.kafka.topics)
    before = published(config.kafka, topics)
    changes = Changes()
    producer = RecordProducer(config.kafka, topics, client_id="p4bs-links")
    for link, table in zip(config.links, tables, strict=True):
        record = spec_record(link, table)
        old = before.get(link.id)
        if old is None or old["removed"]:
            changes.added.append(link.id)
        elif _same(old, record):
            changes.unchanged.append(link.id)
            continue
        else:
            changes.changed.append(link.id)
        producer.produce(STREAM, record)
    if prune:
        kept = {link.id for link in config.links}
        for link_id, old in sorted(before.items()):
            if link_id not in kept and not old["removed"]:
                producer.produce(STREAM, {**old, "removed": True, "ts_ns": time.time_ns()})
                changes.removed.append(link_id)
    if producer.flush(30.0):
        raise RuntimeError("the links topic did not take every record within 30 s")
    return changes


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[k] == b[k] for k in b if k != "ts_ns")
