"""The example config with many links, for tests of what a deployment of several links
does: the links on one router (eth0, eth1, ...), each a copy of the example's link; and
their windows, produced as a metrics job would."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simlink import WINDOW_NS, LinkModel

from p4bs import paths
from p4bs.bus import RecordProducer
from p4bs.config import LinkConfig


def many_links_config(
    path: Path,
    bootstrap: str,
    topics: dict[str, str],
    interfaces: list[int],
    policy: str,
    options: str = "{}",
    *,
    capacities: Mapping[int, str] | None = None,
) -> Path:
    """Writes to `path` the example config on the broker and topics, with one link per
    number in `interfaces` (eth<n>, taps tap<n>-in/-out; the example's 100 Mbit/s unless
    `capacities` says otherwise), each driven by `policy` with `options` (TOML), in a
    consumer group of its own."""
    text = paths.example_config().read_text()
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    block = re.search(r"^\[\[links\]\]\n(?:.*\n)*?policy = .*\n", text, re.M)
    assert block is not None
    link = re.sub(
        r"^policy = .*$", f'policy = "{policy}"\npolicy_options = {options}', block[0], flags=re.M
    )
    rates = capacities or {}
    links = "".join(
        re.sub(r"^capacity = .*$", f'capacity = "{rates.get(i, "100Mbit")}"', link, flags=re.M)
        .replace('interface = "eth1"', f'interface = "eth{i}"')
        .replace('"tap-r1-in"', f'"tap{i}-in"')
        .replace('"tap-r1-out"', f'"tap{i}-out"')
        + "\n"
        for i in interfaces
    )
    text = text.replace(block[0], links)
    replacements = {
        r"^bootstrap = .*$": f'bootstrap = "{bootstrap}"\ntopics = {{ {table} }}',
        r"^group = .*$": f'group = "group-{uuid.uuid4().hex[:8]}"',
    }
    for pattern, value in replacements.items():
        text, n = re.subn(pattern, value, text, count=1, flags=re.M)
        assert n == 1, pattern
    path.write_text(text)
    return path


class Windows:
    """Each link's windows, produced as they end (10 a second each) while in the `with`,
    link i on partition i modulo `partitions`, at `buffer` bytes; the utilisation swings
    between 1.0 and 0.9 every half second (so ADT's buffer goes up and down). `sent` holds
    each link's windows as produced."""

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, str],
        links: Sequence[LinkConfig],
        buffer: int,
        partitions: int,
    ) -> None:
        self.links, self.buffer, self.partitions = links, buffer, partitions
        self.producer = RecordProducer(bootstrap, topics, client_id="windows")
        self.sent: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.model = LinkModel()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="windows")

    def __enter__(self) -> Windows:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(10) == 0

    def _run(self) -> None:
        end_ns = (time.time_ns() // WINDOW_NS + 1) * WINDOW_NS
        index = 0
        while not self._stop.wait(max(0.0, (end_ns - time.time_ns()) / 1e9)):
            for number, link in enumerate(self.links):
                window = self.model.window(link, self.buffer, end_ns)
                window["utilisation"] = 1.0 if (index // 5 + number) % 2 else 0.9
                self.producer.produce("link_metrics", window, partition=number % self.partitions)
                self.sent[link.id].append(window)
            self.producer.flush(5)
            end_ns += WINDOW_NS
            index += 1
