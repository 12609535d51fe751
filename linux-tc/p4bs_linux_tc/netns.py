"""Network namespaces for one thread (setns(2)): only the calling thread moves, the threads it
starts afterwards start where it is, and a socket stays in the namespace it was made in. So a
thread can talk to a router in its namespace, and a test can run a server and its clients in
a namespace of its own, without a process per namespace."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

NETNS_DIR = "/run/netns"  # where `ip netns add` names its namespaces
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), what)


def enter(path: str) -> None:
    """Moves the calling thread into the network namespace at `path` (a file under
    NETNS_DIR, or /proc/PID/ns/net). Raises FileNotFoundError if there is none."""
    with open(path, "rb") as namespace:
        _setns(namespace.fileno(), path)


@contextlib.contextmanager
def inside(path: str) -> Iterator[None]:
    """The calling thread inside the namespace at `path` for the block, then back where it
    was (threads started inside stay there)."""
    home = f"/proc/self/task/{threading.get_native_id()}/ns/net"
    with open(home, "rb") as origin:
        enter(path)
        try:
            yield
        finally:
            _setns(origin.fileno(), home)
