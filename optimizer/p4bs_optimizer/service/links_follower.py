"""Links as data: the service follows the compacted `links` topic (`p4bs links apply`,
core/p4bs/links.py) from its start, in a thread of its own. A link added there is driven from
its next window; a changed one gets its controller made again under the new settings (the
same policy goes on from its state; another starts afresh, with the buffers in force and the
windows done kept); a removed one stops being decided (its state stays in the changelog). An
entry that does not make a valid link against the config's routers and switches is logged and
passed over, as is one whose policy needs every window while the optimizer reads a feed
that thins its links (`feed.py`). Links the topic never mentions are the config's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from confluent_kafka import KafkaException

from p4bs.bus import RecordConsumer
from p4bs.config import Config, ConfigError, link_from_table
from p4bs_optimizer.policies import policy_for
from p4bs_optimizer.policies.base import PolicyOptionError
from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.feed import feed_problem
from p4bs_optimizer.service.ownership import LinkHolder
from p4bs_optimizer.service.stats import ServiceStats

log = logging.getLogger(__name__)


class LinksFollower:
    """Applies the links topic's records to the links `holder` may drive."""

    def __init__(self, config: Config, stats: ServiceStats, holder: LinkHolder) -> None:
        self.config = config
        self.stats = stats
        self.holder = holder

    def follow(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """In its own thread until `stop`: the links topic from its start, each record handed
        to the loop."""
        try:
            consumer = RecordConsumer(
                self.config.kafka,
                f"{self.config.optimizer.group}-links",
                ["links"],
                self.config.kafka.topics,
                whole_topics=True,
            )
        except KafkaException as exc:  # a deployment without the topic: the config's links
            log.warning("links topic not followed: %s", exc)
            return
        try:
            while not stop.is_set():
                received = consumer.poll(0.2)
                if received is not None:
                    loop.call_soon_threadsafe(self.changed, received.record)
        finally:
            consumer.close()

    def changed(self, spec: dict[str, Any]) -> None:
        """A LinkSpec from the links topic, on the loop: the link is added, changed (its
        controller made again under the new settings: a policy kept goes on from its state,
        another starts afresh) or removed (its controller stops; its state stays in the
        changelog). A spec that does not make a valid link is logged and passed over."""
        link_id = spec["link_id"]
        links = self.holder.links
        if spec["removed"]:
            if links.pop(link_id, None) is not None:
                self.stats.links_removed += 1
                log.info("link %s: removed from the links topic", link_id)
                self.drop(link_id)
            return
        try:
            table = json.loads(spec["config"])
            link = link_from_table(self.config, table, f"links topic, {link_id}")
            if link.id != link_id:
                raise ValueError(f"the entry describes {link.id}")
            policy_for(link)
            problem = feed_problem(self.config, link)
            if problem is not None:
                raise ValueError(problem)
        except (ValueError, ConfigError, PolicyOptionError) as exc:
            self.stats.bad_links += 1
            log.error("link %s from the links topic passed over: %s", link_id, exc)
            return
        old = links.get(link_id)
        if old == link:
            return
        links[link_id] = link
        self.stats.links_changed += 1
        log.info("link %s: %s from the links topic", link_id, "changed" if old else "added")
        dropped = self.drop(link_id)
        if dropped is not None:
            self.holder.controller(link_id, dropped.partition, dropped.state)

    def drop(self, link_id: str) -> LinkController | None:
        """Stops the link's controller, if any, after saving its state; returns it."""
        controller = self.holder.controllers.pop(link_id, None)
        if controller is None:
            return None
        controller.save()
        controller.released = True
        for task in (controller.deciding, controller.applying, controller.reading):
            if task is not None:
                task.cancel()
        return controller
