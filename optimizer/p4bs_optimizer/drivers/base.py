"""What every router driver shares: the asyncio interface the service uses, errors by kind,
retries, the per-router timeout and concurrency limit, and running blocking clients in threads.

A call (set a buffer, read it, set classifier rules):
- runs the blocking client library in the driver's own threads, one per allowed concurrent
  change, so that one event loop drives many routers and a hung router ties up only its own
  threads (the event loop's shared default executor has min(32, cpus + 4) of them);
- holds one of the router's `max_concurrent_changes` slots while it talks to the router;
- gives an attempt the router's `timeout_ns`, then cuts its connection (so that its thread
  ends too) and counts it as a timeout;
- is retried with exponential backoff when the router was unreachable or timed out, never when
  it refused the request or the credentials or read back another value: those fail again.
Setting a buffer always reads it back and returns what the router reports.

Credentials are resolved from their SecretRef when a connection is opened; they are never
logged and never put into an error. Make one driver per router: the limits are per driver.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Self, TypeVar

from p4bs.config import RouterConfig, SecretRef

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """How often a driver tries a call that fails for a transient reason, and how long it
    waits before the second attempt (doubled for each further one, at most MAX_BACKOFF_NS)."""

    attempts: int = 3
    backoff_ns: int = 200_000_000

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")


DEFAULT_RETRY = Retry()

MAX_BACKOFF_NS = 10_000_000_000
# A timed-out attempt's connection is cut; its thread then ends within this. The slot stays
# held until it has, so the router never sees more than max_concurrent_changes calls.
ABORT_GRACE_S = 2.0


class ErrorKind(StrEnum):
    UNREACHABLE = "unreachable"  # no connection (refused, no route, connection lost)
    TIMEOUT = "timeout"  # connected, but no answer within the router's timeout
    REJECTED = "rejected"  # the router refused the request; nothing was changed
    AUTH = "auth"  # credentials or the router's identity (certificate, host key) refused
    MISMATCH = "mismatch"  # the router reports another value than the one just set


TRANSIENT_KINDS = frozenset({ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT})


class DriverError(Exception):
    """A router call that failed, after `attempts` attempts, for the reason `kind`."""

    def __init__(self, kind: ErrorKind, router: str, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.router = router
        self.message = message
        self.attempts = attempts

    def __str__(self) -> str:
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"router {self.router}: {self.kind}: {self.message}{tries}"


@dataclass(frozen=True)
class FlowMatch:
    """One flow key "src:sport>dst:dport/proto" (as the metrics job names flows), parsed."""

    source: str  # IPv4 address
    source_port: int
    destination: str
    destination_port: int
    protocol: int

    @classmethod
    def parse(cls, key: str) -> FlowMatch:
        """Raises ValueError for anything but "10.0.1.2:40000>10.0.2.2:5201/6"."""
        try:
            src, _, rest = key.partition(">")
            dst, _, proto = rest.partition("/")
            src_ip, _, sport = src.rpartition(":")
            dst_ip, _, dport = dst.rpartition(":")
            match = cls(
                str(ipaddress.IPv4Address(src_ip)),
                int(sport),
                str(ipaddress.IPv4Address(dst_ip)),
                int(dport),
                int(proto),
            )
        except ValueError:
            raise ValueError(f"not a flow key 'src:sport>dst:dport/proto': {key!r}") from None
        if not (0 <= match.source_port <= 65535 and 0 <= match.destination_port <= 65535):
            raise ValueError(f"ports are 0..65535: {key!r}")
        if not 0 <= match.protocol <= 255:
            raise ValueError(f"protocols are 0..255: {key!r}")
        return match


class Attempt:
    """What one attempt holds open, so that a timed-out attempt can be cut off from outside
    its thread: the blocking code registers how to close each connection it uses."""

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._aborted = False

    @property
    def aborted(self) -> bool:
        return self._aborted

    def on_abort(self, closer: Callable[[], None]) -> None:
        with self._lock:
            if not self._aborted:
                self._closers.append(closer)
                return
        with contextlib.suppress(Exception):  # aborted already: do not use this connection
            closer()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            closers, self._closers = self._closers, []
        for closer in closers:
            with contextlib.suppress(Exception):
                closer()


def split_endpoint(address: str) -> tuple[str, int]:
    """'10.0.0.2:9339' -> ('10.0.0.2', 9339); '[2001:db8::1]:830' -> ('2001:db8::1', 830)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


class RouterDriver(ABC):
    """One router, driven through the blocking client its management interface needs.

    Subclasses implement the blocking `_set_buffer`/`_get_buffer` (run in the driver's
    threads) and `_classify`, which names the ErrorKind of a client library's exception.
    """

    # Why this driver cannot set classifier rules; None when it can (it then overrides
    # _set_classifier).
    classifier_unsupported: ClassVar[str | None] = "this driver cannot set classifier rules"

    def __init__(self, router: RouterConfig, retry: Retry = DEFAULT_RETRY) -> None:
        self.router = router
        self.attempts = retry.attempts
        self.backoff_ns = retry.backoff_ns
        self.timeout_s = router.timeout_ns / 1e9
        self._slots = asyncio.Semaphore(router.max_concurrent_changes)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=router.max_concurrent_changes,
            thread_name_prefix=f"p4bs-router-{router.name}",
        )
        self._closed = False

    # ---- the interface -------------------------------------------------------------------
    async def set_buffer(self, interface: str, queue: int, buffer_bytes: int) -> int:
        """Sets queue `queue` of `interface` to hold `buffer_bytes` bytes, reads it back and
        returns the bytes the router reports. Raises DriverError (kind MISMATCH if the router
        reports another value than it was given)."""
        if buffer_bytes <= 0 or queue < 0:
            raise ValueError(f"need a positive size and a queue >= 0: {buffer_bytes} B, q{queue}")
        began = time.perf_counter_ns()
        reported = await self._run(
            f"set {interface} q{queue} to {buffer_bytes} B",
            lambda attempt: self._set_buffer(attempt, interface, queue, buffer_bytes),
        )
        log.info(
            "router %s: %s q%d buffer set to %d B (router reports %d B) in %.1f ms",
            self.router.name,
            interface,
            queue,
            buffer_bytes,
            reported,
            (time.perf_counter_ns() - began) / 1e6,
            extra={
                "router": self.router.name,
                "interface": interface,
                "queue": queue,
                "buffer_bytes": buffer_bytes,
                "reported_bytes": reported,
            },
        )
        return reported

    async def get_buffer(self, interface: str, queue: int) -> int:
        """The bytes the router reports for queue `queue` of `interface`."""
        return await self._run(
            f"read {interface} q{queue}",
            lambda attempt: self._get_buffer(attempt, interface, queue),
        )

    async def set_classifier(self, interface: str, rules: Mapping[int, Sequence[str]]) -> None:
        """Makes `rules` (queue -> flow keys "src:sport>dst:dport/proto") the interface's whole
        classifier: each flow's packets go to its queue, the queues are created if missing,
        earlier rules are removed, everything else goes to queue 0. All or nothing; read back.
        Raises NotImplementedError where the driver cannot, ValueError for a bad flow key."""
        if self.classifier_unsupported is not None:
            raise NotImplementedError(
                f"router {self.router.name} ({self.router.driver}): {self.classifier_unsupported}"
            )
        parsed = {
            queue: [FlowMatch.parse(key) for key in keys] for queue, keys in sorted(rules.items())
        }
        if any(queue < 0 for queue in parsed):
            raise ValueError(f"queues are numbered from 0: {sorted(parsed)}")
        flows = sum(len(v) for v in parsed.values())
        await self._run(
            f"set {interface} classifier ({flows} flows into {len(parsed)} queues)",
            lambda attempt: self._set_classifier(attempt, interface, parsed),
        )
        log.info(
            "router %s: %s classifier set: %d flows into queues %s",
            self.router.name,
            interface,
            flows,
            sorted(parsed),
        )

    async def close(self) -> None:
        """Closes the driver's connections; later calls raise RuntimeError."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        closing = loop.run_in_executor(self._executor, self._close)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(closing, self.timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # ---- what subclasses implement (blocking; run in the driver's threads) ----------------
    @abstractmethod
    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        """Applies, reads back, raises MISMATCH if the router reports another value; returns
        the reported bytes."""

    @abstractmethod
    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int: ...

    def _set_classifier(
        self, attempt: Attempt, interface: str, rules: Mapping[int, Sequence[FlowMatch]]
    ) -> None:
        raise NotImplementedError(self.classifier_unsupported)

    @abstractmethod
    def _classify(self, error: Exception) -> ErrorKind | None:
        """The kind of a client library's exception; None for one that is a bug, not the
        router's doing (it is then raised as it is)."""

    @abstractmethod
    def _forget_connection(self) -> None:
        """Drops kept connections after an error that may have left them unusable, so that
        the next attempt connects (and resolves the credentials) again. Called on the event
        loop: must not block."""

    def _close(self) -> None:
        """Closes kept connections (in a driver thread: may block up to the timeout)."""
        self._forget_connection()

    # ---- helpers for subclasses -------------------------------------------------------------
    def _error(self, kind: ErrorKind, message: str) -> DriverError:
        return DriverError(kind, self.router.name, message)

    def _secret(self, ref: SecretRef | None, what: str) -> str:
        """A credential, resolved now; AUTH error if it is not configured or not there."""
        if ref is None:
            raise self._error(ErrorKind.AUTH, f"no {what} configured")
        try:
            return ref.resolve()
        except LookupError as exc:
            raise self._error(ErrorKind.AUTH, f"{what}: {exc}") from None

    def _check_readback(
        self, interface: str, queue: int, wanted: int, reported: int, unit: str = "B"
    ) -> None:
        if reported != wanted:
            raise self._error(
                ErrorKind.MISMATCH,
                f"{interface} q{queue}: set to {wanted} {unit}, the router reports "
                f"{reported} {unit}",
            )

    # ---- retries, timeouts, slots -------------------------------------------------------
    async def _run(self, what: str, call: Callable[[Attempt], T]) -> T:
        if self._closed:
            raise RuntimeError(f"router {self.router.name}: the driver is closed")
        for number in range(1, self.attempts + 1):
            try:
                async with self._slots:
                    return await self._attempt(call)
            except DriverError as err:
                err.attempts = number
                if err.kind not in (ErrorKind.REJECTED, ErrorKind.MISMATCH):
                    self._forget_connection()
                if err.kind not in TRANSIENT_KINDS or number == self.attempts:
                    log.warning(
                        "router %s: %s failed after %d attempt(s): %s: %s",
                        self.router.name,
                        what,
                        number,
                        err.kind,
                        err.message,
                    )
                    raise
                delay_ns = min(self.backoff_ns * 2 ** (number - 1), MAX_BACKOFF_NS)
                log.warning(
                    "router %s: %s: %s: %s; attempt %d of %d, next in %.2f s",
                    self.router.name,
                    what,
                    err.kind,
                    err.message,
                    number,
                    self.attempts,
                    delay_ns / 1e9,
                )
                await asyncio.sleep(delay_ns / 1e9)
        raise AssertionError("the last attempt returns or raises")

    async def _attempt(self, call: Callable[[Attempt], T]) -> T:
        attempt = Attempt()
        future = asyncio.wrap_future(self._executor.submit(self._guarded, call, attempt))
        future.add_done_callback(_consume_exception)
        try:
            done, _ = await asyncio.wait({future}, timeout=self.timeout_s)
        except BaseException:  # the caller was cancelled: the call must not go on alone
            attempt.abort()
            raise
        if not done:
            attempt.abort()
            await asyncio.wait({future}, timeout=ABORT_GRACE_S)
            raise self._error(ErrorKind.TIMEOUT, f"no answer within {self.timeout_s:g} s")
        return future.result()

    def _guarded(self, call: Callable[[Attempt], T], attempt: Attempt) -> T:
        if attempt.aborted:  # timed out while waiting for a thread: nobody waits for it
            raise self._error(ErrorKind.TIMEOUT, "abandoned before it started")
        try:
            return call(attempt)
        except DriverError:
            raise
        except Exception as exc:
            kind = self._classify(exc)
            if kind is None:
                raise
            raise self._error(kind, _describe(exc)) from exc


def _consume_exception(future: asyncio.Future[Any]) -> None:
    """An abandoned (timed-out) attempt's exception is expected: do not log it as lost."""
    if not future.cancelled():
        future.exception()


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
