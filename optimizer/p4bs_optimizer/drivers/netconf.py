"""NETCONF driver (ncclient over SSH) for OpenConfig QoS in bytes ("netconf"); its sessions,
host-key check and errors serve the Junos driver (junos.py) too.

"netconf" edits a queue's `dedicated-buffer` (bytes) in the buffer-allocation-profile named
like the interface (namespace http://openconfig.net/yang/qos, see p4bs_infra.agent.datastore)
and reads back the queue's state/dedicated-buffer.

How a change is committed follows what the server offers. With :candidate and
:confirmed-commit: lock the candidate, edit it, commit confirmed (confirm-timeout: the router's
`confirm_window` in seconds), read the running value back, the confirming commit, and read it
again (a rollback that fired before the confirmation is a mismatch); a read back that differs
before the confirmation cancels the commit (or, with confirmed-commit 1.0, hangs up, which
makes the router roll back) and so does any failure in between. Without them (the router
agent: `running` only, each edit-config validated whole and applied all or nothing): read
the running value, edit running, read back, and on a different read back write the previous
value again (what a confirmed commit's rollback would do).

The router's SSH host key is checked: `ca_file`, if set, is an OpenSSH known_hosts file with
the router's key (entry `[host]:port` or `host`); otherwise ~/.ssh/known_hosts is used.
Sessions are kept (one per concurrent change) and reused.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

import paramiko
from lxml import etree
from ncclient import manager
from ncclient.operations.errors import OperationError, TimeoutExpiredError
from ncclient.operations.rpc import RPCError
from ncclient.transport.errors import (
    AuthenticationError,
    SSHUnknownHostError,
    TransportError,
)

from p4bs.config import RouterConfig
from p4bs_optimizer.drivers.base import (
    DEFAULT_RETRY,
    Attempt,
    DriverError,
    ErrorKind,
    Retry,
    RouterDriver,
    split_endpoint,
)

OC_QOS_NS = "http://openconfig.net/yang/qos"
CANDIDATE = "urn:ietf:params:netconf:capability:candidate:1.0"
CONFIRMED_COMMIT = "urn:ietf:params:netconf:capability:confirmed-commit:1.0"
CONFIRMED_COMMIT_11 = "urn:ietf:params:netconf:capability:confirmed-commit:1.1"


@dataclass
class Session:
    """A NETCONF session and the socket under it."""

    manager: Any  # ncclient.manager.Manager
    sock: socket.socket

    def hang_up(self) -> None:
        """Cuts the session at once, from any thread, without waiting: the SSH transport
        sees the socket end, stops its thread and closes the socket."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Ends the session politely (blocking, at most the session's RPC timeout)."""
        with contextlib.suppress(Exception):
            self.manager.close_session()
        self.hang_up()


class NetconfDriver(RouterDriver):
    """OpenConfig QoS over NETCONF: buffers in bytes."""

    LEAF = "dedicated-buffer"
    classifier_unsupported = (
        "classifier rules are set by the gnmi driver only: replacing them needs deletes, "
        "which the router agent's NETCONF server does not take"
    )

    def __init__(self, router: RouterConfig, retry: Retry = DEFAULT_RETRY) -> None:
        super().__init__(router, retry)
        if router.address is None:
            raise ValueError(f"router {router.name}: {router.driver} needs an address (host:port)")
        self._host, self._port = split_endpoint(router.address)
        self._idle: list[Session] = []
        self._idle_lock = threading.Lock()

    # ---- sessions -----------------------------------------------------------------------------
    def _host_key(self) -> str | None:
        """The router's host key (base64) from the known_hosts file `ca_file`, if set."""
        if self.router.ca_file is None:
            return None
        try:
            known = paramiko.HostKeys(self.router.ca_file)
        except OSError as exc:
            raise self._error(
                ErrorKind.AUTH, f"known_hosts file {self.router.ca_file}: {exc.strerror}"
            ) from None
        keys = known.lookup(f"[{self._host}]:{self._port}") or known.lookup(self._host)
        if not keys:
            raise self._error(
                ErrorKind.AUTH,
                f"{self.router.ca_file} has no host key for [{self._host}]:{self._port}",
            )
        return str(next(iter(keys.values())).get_base64())

    def _connect(self, attempt: Attempt) -> Session:
        username = self._secret(self.router.username, "username")
        password = self._secret(self.router.password, "password")
        host_key = self._host_key()
        sock = socket.create_connection((self._host, self._port), timeout=self.timeout_s)
        attempt.on_abort(lambda: sock.shutdown(socket.SHUT_RDWR))
        try:
            session = manager.connect(
                host=self._host,
                port=self._port,
                sock=sock,
                username=username,
                password=password,
                hostkey_verify=True,
                hostkey_b64=host_key,
                look_for_keys=False,
                allow_agent=False,
                timeout=self.timeout_s,
            )
        except BaseException:
            sock.close()
            raise
        return Session(session, sock)

    @contextlib.contextmanager
    def _session(self, attempt: Attempt) -> Iterator[Any]:
        """A connected session for one call: reused if one is idle; kept for the next call if
        the call succeeds, hung up if it fails (its state is then unknown)."""
        with self._idle_lock:
            while self._idle and not self._idle[-1].manager.connected:
                self._idle.pop().hang_up()
            session = self._idle.pop() if self._idle else None
        if session is None:
            session = self._connect(attempt)
        attempt.on_abort(session.hang_up)
        try:
            yield session.manager
        except BaseException:
            session.hang_up()
            raise
        with self._idle_lock:
            self._idle.append(session)

    def _forget_connection(self) -> None:
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for session in idle:
            session.hang_up()

    def _close(self) -> None:
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for session in idle:
            session.close()

    # ---- reading and writing --------------------------------------------------------------
    def _edit(self, interface: str, queue: int, value: int) -> str:
        return (
            f'<config><qos xmlns="{OC_QOS_NS}"><buffer-allocation-profiles>'
            f"<buffer-allocation-profile><name>{escape(interface)}</name><queues><queue>"
            f"<name>q{queue}</name><config><name>q{queue}</name>"
            f"<{self.LEAF}>{value}</{self.LEAF}></config>"
            f"</queue></queues></buffer-allocation-profile></buffer-allocation-profiles></qos>"
            f"</config>"
        )

    def _read(self, session: Any, interface: str, queue: int) -> int:
        """The queue's value in force (its state leaf), in the router's unit."""
        selection = (
            f'<qos xmlns="{OC_QOS_NS}"><buffer-allocation-profiles><buffer-allocation-profile>'
            f"<name>{escape(interface)}</name></buffer-allocation-profile>"
            f"</buffer-allocation-profiles></qos>"
        )
        reply = session.get(filter=("subtree", selection))
        found = etree.fromstring(reply.xml.encode()).xpath(
            "//q:buffer-allocation-profile[q:name=$interface]/q:queues/q:queue[q:name=$queue]"
            f"/q:state/q:{self.LEAF}/text()",
            namespaces={"q": OC_QOS_NS},
            interface=interface,
            queue=f"q{queue}",
        )
        if len(found) != 1:
            raise self._error(
                ErrorKind.REJECTED, f"the router has no queue q{queue} on {interface}"
            )
        text = str(found[0]).strip()
        if not text.isdigit():
            raise self._error(ErrorKind.MISMATCH, f"{self.LEAF} is not a number: {text!r}")
        return int(text)

    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        with self._session(attempt) as session:
            capabilities = session.server_capabilities
            if CANDIDATE in capabilities and (
                CONFIRMED_COMMIT in capabilities or CONFIRMED_COMMIT_11 in capabilities
            ):
                return self._commit_confirmed(session, interface, queue, buffer_bytes)
            return self._edit_running(session, interface, queue, buffer_bytes)

    def _edit_running(self, session: Any, interface: str, queue: int, value: int) -> int:
        previous = self._read(session, interface, queue)
        session.edit_config(target="running", config=self._edit(interface, queue, value))
        reported = self._read(session, interface, queue)
        if value != reported:
            session.edit_config(target="running", config=self._edit(interface, queue, previous))
            raise self._mismatch(interface, queue, value, reported, "previous value restored")
        return reported

    def _commit_confirmed(self, session: Any, interface: str, queue: int, value: int) -> int:
        # If this process dies before confirming, the router rolls back by itself. The
        # standard <commit>'s confirm-timeout is in seconds (RFC 6241).
        confirm_timeout_s = max(1, -(-self.router.confirm_window_ns // 1_000_000_000))
        with session.locked("candidate"):
            session.discard_changes()  # commit only this change, not edits others left
            session.edit_config(target="candidate", config=self._edit(interface, queue, value))
            session.commit(confirmed=True, timeout=str(confirm_timeout_s))
            reported = self._read(session, interface, queue)
            if value != reported:
                if CONFIRMED_COMMIT_11 not in session.server_capabilities:
                    # 1.0 has no cancel-commit: a confirmed commit is rolled back when the
                    # session that made it ends, which _session does on this error.
                    raise self._mismatch(interface, queue, value, reported, "hung up to roll back")
                session.cancel_commit()
                raise self._mismatch(interface, queue, value, reported, "commit cancelled")
            session.commit()
            # In force only if still there after the confirmation (not rolled back before it).
            reported = self._read(session, interface, queue)
            if value != reported:
                raise self._mismatch(interface, queue, value, reported, "rolled back")
        return reported

    def _mismatch(
        self, interface: str, queue: int, written: int, reported: int, done: str
    ) -> DriverError:
        return self._error(
            ErrorKind.MISMATCH,
            f"{interface} q{queue}: set to {written} B, the router reports {reported} B; {done}",
        )

    def _get_buffer(self, attempt: Attempt, interface: str, queue: int) -> int:
        with self._session(attempt) as session:
            return self._read(session, interface, queue)

    # ---- errors -----------------------------------------------------------------------------
    def _classify(self, error: Exception) -> ErrorKind | None:
        if isinstance(error, AuthenticationError | SSHUnknownHostError):
            return ErrorKind.AUTH
        if isinstance(error, RPCError):
            return ErrorKind.AUTH if error.tag == "access-denied" else ErrorKind.REJECTED
        if isinstance(error, TimeoutExpiredError | TimeoutError):
            return ErrorKind.TIMEOUT
        if isinstance(error, TransportError | OSError | paramiko.SSHException):
            return ErrorKind.UNREACHABLE  # refused, reset, or the session was lost
        if isinstance(error, OperationError):
            return ErrorKind.REJECTED
        return None
