"""The example config with many links, for tests of what a deployment of several links
does: the links on one router (eth0, eth1, ...), each a copy of the example's link."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path

from p4bs import paths


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
    text = paths.default_config().read_text()
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
