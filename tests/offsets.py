"""What the broker holds of a topic, read without joining a consumer group."""

from __future__ import annotations

from p4bs.topic_range import SECOND_NS, Deadline, reader, watermarks


def partition_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of `topic`: its low and high watermark (first offset, next offset)."""
    consumer = reader({"bootstrap.servers": bootstrap}, "offsets")
    try:
        return watermarks(consumer, topic, Deadline(10 * SECOND_NS))
    finally:
        consumer.close()
