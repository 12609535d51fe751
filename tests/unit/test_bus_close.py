"""Closing a Kafka client releases it: librdkafka's threads (and their retries of the brokers)
end with `close`, not when the Python object is collected. Run in a child process of its own,
where no other test's threads come and go, against a port nobody listens on, so nothing can
be delivered."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, os, sys, tomllib
from p4bs.bus import RecordConsumer, RecordProducer
from p4bs.config import parse_config

def threads():
    return len(os.listdir("/proc/self/task"))

data = tomllib.loads(open(sys.argv[1]).read())
data["kafka"]["bootstrap"] = sys.argv[2]
kafka = parse_config(data).kafka
seen = {"before": threads()}
producer = RecordProducer(kafka, {"dead_letters": "dlq"})
producer.produce("dead_letters", {
    "source_topic": "t", "source_partition": 0, "source_offset": 7, "consumer": "g",
    "ts_ns": 1, "error": "undecodable", "key": b"k", "value": b"\\xff",
}, key=b"k")
seen["producing"] = threads()
seen["dropped"] = producer.close(0.2)
seen["failed"] = producer.stats.failed
seen["producer_closed"] = threads()
consumer = RecordConsumer(kafka, "g", ["link_counters"], {"link_counters": "t"})
seen["consuming"] = threads()
consumer.close()
seen["consumer_closed"] = threads()
print(json.dumps(seen))
"""


@pytest.fixture
def seen(repo: Path) -> dict[str, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        no_broker = f"127.0.0.1:{s.getsockname()[1]}"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(repo / "config" / "testbed.toml"), no_broker],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, int] = json.loads(child.stdout)
    return found


def test_a_producer_closed_with_records_undelivered_drops_them_and_ends_its_threads(
    seen: dict[str, int],
) -> None:
    assert seen["producing"] > seen["before"]
    assert (seen["dropped"], seen["failed"]) == (1, 1)
    assert seen["producer_closed"] == seen["before"]


def test_a_consumer_closed_ends_its_dead_letter_producers_threads_too(
    seen: dict[str, int],
) -> None:
    assert seen["consuming"] > seen["before"]
    assert seen["consumer_closed"] == seen["before"]
