"""Linux tc driver: a router that is this machine, or a network namespace on it, changed over
rtnetlink (p4bs_linux_tc) without any management server.

The router's queues are laid out as the testbed and the router agent have them: an htb root
whose class 1:<0x10 + k> feeds a bfifo, queue k (p4bs_linux_tc.queues). Setting a
buffer changes that bfifo's byte limit in place (the queue and its packets stay), then reads
the limit back from the kernel.

`address` names where the interfaces are: None for this network namespace, or
"netns:NAME" for the namespace `ip netns` calls NAME (/run/netns/NAME). The driver's threads
enter that namespace (setns) once each; they serve only this driver.
"""

from __future__ import annotations

import errno
import socket
import threading

from p4bs.config import RouterConfig
from p4bs_linux_tc import netns
from p4bs_linux_tc.netlink import NetlinkError, QdiscStats, Rtnetlink
from p4bs_linux_tc.queues import MIN_BUFFER_BYTES, QUEUE_CLASS_BASE
from p4bs_optimizer.drivers.base import (
    DEFAULT_RETRY,
    Attempt,
    ErrorKind,
    Retry,
    RouterDriver,
)

NETNS_PREFIX = "netns:"
MAX_FIFO_LIMIT = 2**32 - 1  # the kernel's limit is a u32


class LinuxTcDriver(RouterDriver):
    classifier_unsupported = (
        "it changes FIFO limits only; flows are steered into queues by the router agent's "
        "classifier (driver 'gnmi')"
    )

    def __init__(self, router: RouterConfig, retry: Retry = DEFAULT_RETRY) -> None:
        super().__init__(router, retry)
        self.netns: str | None = None
        if router.address is not None:
            name = router.address.removeprefix(NETNS_PREFIX)
            if not router.address.startswith(NETNS_PREFIX) or not name or "/" in name:
                raise ValueError(
                    f"router {router.name}: a linux-tc address is 'netns:NAME' (or none for "
                    f"this namespace), got {router.address!r}"
                )
            self.netns = name
        self._thread = threading.local()

    def _enter_namespace(self) -> None:
        if self.netns is None or getattr(self._thread, "entered", False):
            return
        try:
            netns.enter(f"{netns.NETNS_DIR}/{self.netns}")
        except FileNotFoundError:
            raise self._error(
                ErrorKind.UNREACHABLE, f"no network namespace {self.netns!r}"
            ) from None
        self._thread.entered = True

    def _fifo(self, nl: Rtnetlink, interface: str, queue: int) -> QdiscStats:
        try:
            ifindex = socket.if_nametoindex(interface)
        except OSError:
            raise self._error(ErrorKind.REJECTED, f"no interface {interface!r}") from None
        parent = (1 << 16) | (QUEUE_CLASS_BASE + queue)  # htb class 1:<0x10 + queue>
        for qdisc in nl.qdiscs(ifindex):
            if qdisc.kind == "bfifo" and qdisc.parent == parent and qdisc.limit is not None:
                return qdisc
        raise self._error(
            ErrorKind.REJECTED,
            f"{interface} has no queue q{queue} (a bfifo under class 1:"
            f"{QUEUE_CLASS_BASE + queue:x})",
        )

    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        self._enter_namespace()
        if not MIN_BUFFER_BYTES <= buffer_bytes <= MAX_FIFO_LIMIT:
            raise self._error(
                ErrorKind.REJECTED,
                f"{buffer_bytes} B is outside [{MIN_BUFFER_BYTES}, {MAX_FIFO_LIMIT}] B",
            )
        with Rtnetlink() as nl:
            fifo = self._fifo(nl, interface, queue)
            nl.change_fifo_limit(fifo.ifindex, fifo.handle, fifo.parent, buffer_bytes)
            reported = self._fifo(nl, interface, queue).limit
        assert reported is not None  # _fifo returns bfifos, which have a limit
        self._check_readback(interface, queue, buffer_bytes, reported)
        return reported

    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int:
        self._enter_namespace()
        with Rtnetlink() as nl:
            limit = self._fifo(nl, interface, queue).limit
        assert limit is not None
        return limit

    def _forget_connection(self) -> None:
        """Nothing to forget: each call opens its own netlink socket."""

    def _classify(self, error: Exception) -> ErrorKind | None:
        if isinstance(error, NetlinkError | OSError):
            if error.errno in (errno.EPERM, errno.EACCES):
                return ErrorKind.AUTH  # needs CAP_NET_ADMIN (and CAP_SYS_ADMIN for setns)
            return ErrorKind.REJECTED  # the kernel refused the change
        return None
