"""`p4bs stack` with a Kafka cluster of three KRaft nodes: topics with three replicas, two
in sync, and a node killed (SIGKILL) while records stream in loses none of them."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from simlink import WINDOW_NS, LinkModel

from p4bs import paths
from p4bs.bus import RecordProducer, ensure_topics, read_stream
from p4bs.config import load_config
from p4bs_infra.procs import wait_until
from p4bs_infra.services import wait_ready
from p4bs_infra.stack import Stack, StackSettings
from p4bs_schemas.registry import STREAMS

NODES = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(StackSettings.on_free_ports(tmp_path / "stack", kafka_brokers=NODES))
    try:
        stack.up(timeout_s=180, progress=lambda _: None)
        yield stack
    finally:
        stack.down()


def test_a_killed_node_loses_no_record(cluster: Stack) -> None:
    """Windows of four links stream in (idempotent producer, acks=all) while the node that
    leads most partitions is killed and, later, started again: every window is on the topic
    once, and the topic has three replicas with two required in sync."""
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    run = uuid.uuid4().hex[:6]
    topics = {stream: f"cluster-{run}.{stream}" for stream in STREAMS}
    ensure_topics(cluster.bootstrap, topics, partitions=4, replication_factor=3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # The node that answers may learn of a topic just created a moment after the controller.
    assert wait_until(lambda: topics["link_metrics"] in admin.list_topics(timeout=5).topics, 30)
    metadata = admin.list_topics(timeout=30).topics[topics["link_metrics"]]
    assert all(len(p.replicas) == NODES for p in metadata.partitions.values())
    resource = ConfigResource(ConfigResource.Type.BROKER, "1")
    broker_config = admin.describe_configs([resource])[resource].result(30)
    assert broker_config["min.insync.replicas"].value == "2"

    links = load_config(paths.example_config()).links[0]
    link_ids = [f"r1:eth{i}" for i in range(4)]
    model = LinkModel()
    producer = RecordProducer(cluster.bootstrap, topics, client_id="cluster-test")
    sent: list[tuple[str, int]] = []
    stop = threading.Event()

    def produce() -> None:
        end_ns = (time.time_ns() // WINDOW_NS) * WINDOW_NS
        while not stop.is_set():
            end_ns += WINDOW_NS
            for link_id in link_ids:
                record = model.window(links, 100_000, end_ns) | {"link_id": link_id}
                producer.produce("link_metrics", record)
                sent.append((link_id, end_ns))
            stop.wait(0.02)  # a pace, not a synchronisation

    leaders = [p.leader for p in metadata.partitions.values()]
    victim = next(b for b in cluster.brokers if b.node_id == max(leaders, key=leaders.count))
    thread = threading.Thread(target=produce)
    thread.start()
    try:
        assert wait_until(lambda: len(sent) > 200, 30)
        pid = victim.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: victim.pid is None, 10)
        count = len(sent)
        assert wait_until(lambda: len(sent) > count + 400, 60)  # on two nodes
        victim.start()
        wait_ready(victim, 120)
        count = len(sent)
        assert wait_until(lambda: len(sent) > count + 200, 60)
    finally:
        stop.set()
        thread.join(30)
    assert producer.flush(60) == 0
    assert producer.stats.failed == 0 and producer.stats.delivered == len(sent)
    got = read_stream(cluster.bootstrap, "link_metrics", topics)
    assert sorted((r["link_id"], r["window_end_ns"]) for r in got) == sorted(sent)
