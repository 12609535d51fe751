"""One poison record on the real broker (issue 38): a LinkMetrics window with NaN written by a
writer other than the codec is dead-lettered by the RecordConsumer with the field and the
value as its reason, counted, and the next good window still comes; a saved optimizer state
that cannot be resumed (under another link's key, a buffer outside its link's bounds, a
snapshot that is not JSON) is refused by `changelog.restore`, counted, and its link starts
afresh, while a good one resumes."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from poison import metrics_window, raw_avro

from p4bs import paths
from p4bs.bus import Received, RecordConsumer, RecordProducer, read_stream
from p4bs.config import load_config
from p4bs_infra.stack import Stack
from p4bs_optimizer import changelog
from p4bs_optimizer.changelog import LinkState

T0 = 1_800_000_000_000_000_000


def one_at_a_time(consumer: RecordConsumer) -> list[Received]:
    received = consumer.poll(0.5)
    return [] if received is None else [received]


def in_batches(consumer: RecordConsumer) -> list[Received]:
    return consumer.poll_batch(500, 0.5)


@pytest.mark.parametrize("take", [one_at_a_time, in_batches])
def test_a_nan_window_is_dead_lettered_with_its_reason_and_the_next_window_comes(
    stack: Stack, topics: dict[str, str], take: Callable[[RecordConsumer], list[Received]]
) -> None:
    """Read one record at a time (`poll`) or as many as have come (`poll_batch`, as the
    optimizer reads)."""
    cluster = stack.kafka.bootstrap
    raw = Producer({"bootstrap.servers": cluster})
    link_id = "r1:eth1"
    good = [metrics_window(link_id, T0 + i * 500_000_000, -0.1) for i in range(3)]
    poison = metrics_window(link_id, T0 + 700_000_000, math.nan)
    for record in (good[0], poison, good[1]):
        raw.produce(topics["link_metrics"], raw_avro("LinkMetrics", record), link_id.encode())
    raw.produce(topics["link_metrics"], b"\x00not avro at all", link_id.encode())
    raw.produce(topics["link_metrics"], raw_avro("LinkMetrics", good[2]), link_id.encode())
    assert raw.flush(30) == 0
    consumer = RecordConsumer(cluster, "poison-test", ["link_metrics"], topics)
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 3 and time.monotonic() < deadline:
            got += [received.record for received in take(consumer)]
        stats = consumer.stats
    finally:
        consumer.close()
    assert [r["window_end_ns"] for r in got] == [w["window_end_ns"] for w in good]
    assert stats.malformed == 2
    assert "LinkMetrics.f: nan is not a finite number" in stats.reasons[0]
    letters = read_stream(cluster, "dead_letters", topics, idle_s=5)
    assert sorted(d["consumer"] for d in letters) == ["poison-test"] * 2
    assert any("LinkMetrics.f: nan is not a finite number" in d["error"] for d in letters)
    assert any("undecodable" in d["error"] for d in letters)


def test_a_saved_state_that_cannot_be_resumed_is_refused_and_counted(
    stack: Stack, topics: dict[str, str]
) -> None:
    config = load_config(paths.example_config())
    base = config.links[0]
    links = {
        name: dataclasses.replace(base, interface=name, policy="p4bs")
        for name in ("good", "stranger", "huge", "garbage")
    }
    by_id = {link.id: link for link in links.values()}
    producer = RecordProducer(stack.kafka.bootstrap, topics, client_id="poison-states")

    def save(link_id: str, state: LinkState, key: str | None = None) -> None:
        record = changelog.to_record(link_id, state, "opt-x", T0)
        producer.produce("optimizer_state", record, key=key or link_id)

    resumable = LinkState("p4bs", intended={0: base.safe_buffer_bytes}, epoch=4)
    save(links["good"].id, resumable)
    save(links["stranger"].id, resumable, key=links["good"].id + "x")  # another link's key
    save(links["huge"].id, LinkState("p4bs", intended={0: base.max_buffer_bytes + 1}))
    raw = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    garbage = changelog.to_record(links["garbage"].id, resumable, "opt-x", T0)
    garbage["policy_state"] = "[1, 2"
    raw.produce(
        topics["optimizer_state"],
        raw_avro("OptimizerLinkState", garbage),
        links["garbage"].id.encode(),
    )
    assert producer.flush(30) == 0 and raw.flush(30) == 0
    refused_before = changelog.RESTORE_STATS.refused
    states = changelog.restore(stack.kafka.bootstrap, topics, [0, 1], 60, links=by_id)
    assert set(states) == {links["good"].id}
    assert states[links["good"].id][1].epoch == 4
    assert changelog.RESTORE_STATS.refused - refused_before == 3
    reasons = "\n".join(changelog.RESTORE_STATS.reasons[-3:])
    assert "under the key" in reasons
    assert f"is outside the link's [{base.min_buffer_bytes}, {base.max_buffer_bytes}] B" in reasons
    assert "policy_state is not JSON" in reasons
    json.dumps(reasons)  # plain text, for the log and reports
