"""A network namespace of one test's own, entered by the test's thread: for a server run
in-process that binds every address (the `netconf` package's NETCONF server binds :: and
0.0.0.0, with no choice), so that it and its clients talk over that namespace's loopback and
nothing listens on the machine's addresses. Needs root (`ip netns`, setns)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from p4bs_linux_tc import netns


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def own_network_namespace(prefix: str = "p4bs-t") -> Iterator[str]:
    """A new namespace with its loopback up; the calling thread is inside it for the block
    (threads it starts there stay there), and it is deleted at the end."""
    if os.geteuid() != 0:
        pytest.skip("serves in a network namespace of the test's own (root)")
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        with netns.inside(f"{netns.NETNS_DIR}/{name}"):
            yield name
    finally:
        _ip("netns", "del", name)
