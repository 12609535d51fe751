"""Which schema each stream carries, and the committed versions of every schema.

`avro/<Name>.avsc` is the version writers use now. `avro/released/<Name>.v<N>.avsc` are the
versions that have been on the wire; the newest must equal the current one, and every version
must be readable by every later one (see `compat.py`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

Schema = dict[str, Any]

# stream -> record schema name. A stream is a logical topic; the config maps it to a Kafka topic.
STREAMS: dict[str, str] = {
    "link_counters": "LinkCounters",
    "link_metrics": "LinkMetrics",
    "sla_alerts": "SlaAlert",
    "buffer_decisions": "BufferDecision",
    "dead_letters": "DeadLetter",
    "optimizer_state": "OptimizerLinkState",
    "links": "LinkSpec",
    # The link_metrics windows the optimizer needs ([metrics] optimizer_feed), same keys and
    # partitions: for links of some policies only those that can change a decision.
    "optimizer_feed": "LinkMetrics",
}

# Streams whose topic keeps the newest record per key (Kafka's log compaction) rather than
# a time window of records: a changelog, read from its start by whoever takes a key over.
COMPACTED_STREAMS = frozenset({"optimizer_state", "links"})

_RELEASED = re.compile(r"^(?P<name>\w+)\.v(?P<version>[0-9]+)\.avsc$")


def default_topic(stream: str) -> str:
    return "p4bs." + stream.replace("_", "-")


def _avro_dir() -> Any:
    return resources.files("p4bs_schemas") / "avro"


@cache
def current_schema(name: str) -> Schema:
    """The schema writers use now, as JSON (custom attributes such as `allowed` kept)."""
    path = _avro_dir() / f"{name}.avsc"
    if not path.is_file():
        raise KeyError(f"no schema named {name!r}")
    schema: Schema = json.loads(path.read_text())
    return schema


@cache
def released_schemas(name: str) -> tuple[tuple[int, Schema], ...]:
    """Every committed version of `name`, oldest first."""
    versions = []
    for entry in (_avro_dir() / "released").iterdir():
        m = _RELEASED.match(entry.name)
        if m and m["name"] == name:
            versions.append((int(m["version"]), json.loads(entry.read_text())))
    return tuple(sorted(versions, key=lambda v: v[0]))


def schema_names() -> list[str]:
    return sorted(STREAMS.values())
