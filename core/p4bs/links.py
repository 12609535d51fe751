"""The links as data: the compacted `links` topic, one LinkSpec record per link, newest last.

`p4bs links apply --config FILE` makes the topic say what FILE's [[links]] say: a record for
each link that is new or changed (compared with the topic's newest), and with `--prune` a
`removed` record for each link the topic has and FILE has not. The parts follow the topic
instead of their start-up config, so that adding, changing or removing a link needs no
restart. FILE is checked as a whole first (`load_config`): a link is never published with a
problem its config would have been refused for.

The records of one apply take effect together at `ts_ns`, a lead after the command ran: the
metrics job applies a spec from the window its ts_ns falls in, in event time, and drops one
that reaches it after that window has closed (a record behind its watermark). A fresh
producer took 0.5 s to deliver its first record here (an idempotent producer waits for its
id): stamped with the moment it was applied, the record came too late. A delivery that
takes longer than the lead is an error that says so; `republish` sends every link again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from p4bs.bus import Cluster, RecordProducer, read_stream
from p4bs.config import Config, LinkConfig

STREAM = "links"
DEFAULT_LEAD_NS = 2_000_000_000


def spec_record(link: LinkConfig, table: dict[str, Any], ts_ns: int) -> dict[str, Any]:
    """The LinkSpec record of a link from `ts_ns` on: the figures the metrics job needs,
    parsed, and its config entry as written (`table`, as tomllib read it), for the
    optimizer."""
    return {
        "link_id": link.id,
        "ts_ns": ts_ns,
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
    effective_ns: int = 0  # the records' ts_ns


def apply_links(
    config: Config,
    tables: list[dict[str, Any]],
    *,
    prune: bool,
    lead_ns: int = DEFAULT_LEAD_NS,
    republish: bool = False,
) -> Changes:
    """Publishes what `config`'s links (and their entries as written, `tables`, in the same
    order) change in the topic, in effect `lead_ns` from now; with `prune`, removes the links
    it does not have; with `republish`, publishes unchanged links too. Raises RuntimeError if
    the records were not all delivered before they take effect."""
    topics = dict(config.kafka.topics)
    before = published(config.kafka, topics)
    changes = Changes(effective_ns=time.time_ns() + lead_ns)
    producer = RecordProducer(config.kafka, topics, client_id="p4bs-links")
    for link, table in zip(config.links, tables, strict=True):
        record = spec_record(link, table, changes.effective_ns)
        old = before.get(link.id)
        if old is None or old["removed"]:
            changes.added.append(link.id)
        elif _same(old, record):
            changes.unchanged.append(link.id)
            if not republish:
                continue
        else:
            changes.changed.append(link.id)
        producer.produce(STREAM, record)
    if prune:
        kept = {link.id for link in config.links}
        for link_id, old in sorted(before.items()):
            if link_id not in kept and not old["removed"]:
                producer.produce(STREAM, {**old, "removed": True, "ts_ns": changes.effective_ns})
                changes.removed.append(link_id)
    if producer.flush(30.0):
        raise RuntimeError("the links topic did not take every record within 30 s")
    late_ns = time.time_ns() - changes.effective_ns
    if late_ns > 0:
        raise RuntimeError(
            f"the links topic took the records {late_ns / 1e6:.0f} ms after the time they take "
            f"effect ({lead_ns / 1e9:g} s after the command ran): the metrics job may have "
            "passed it and dropped them (the optimizer has them); publish them again with a "
            "longer lead: p4bs links apply --republish --lead 10s"
        )
    return changes


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[k] == b[k] for k in b if k != "ts_ns")
