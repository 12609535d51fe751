"""What the broker holds of a topic, read without joining a consumer group."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition


def partition_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of `topic`: its low and high watermark (first offset, next offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in partitions
        }
    finally:
        consumer.close()
