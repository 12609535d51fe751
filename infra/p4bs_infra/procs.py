"""Background server processes with pid files: start detached, check, stop exactly them.

A pid file holds the pid and the process start time (from /proc), so a recycled pid is never
mistaken for our server and never signalled.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """Start time in clock ticks since boot, or None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return fields[19]


def start_detached(
    argv: Sequence[str],
    pidfile: Path,
    logfile: Path,
    env: Mapping[str, str] | None = None,
) -> int:
    """Starts `argv` in its own session (it outlives the caller) and records its pid."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    started = _start_time(proc.pid)
    pidfile.write_text(f"{proc.pid} {started}\n")
    return proc.pid


def running_pid(pidfile: Path) -> int | None:
    """The pid recorded in `pidfile` if that very process is still alive."""
    try:
        pid_text, started = pidfile.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return pid if _start_time(pid) == started else None


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (killed, not yet reaped by its parent) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(pidfile: Path, timeout_s: float = 20.0) -> bool:
    """SIGTERM the recorded process group, SIGKILL after `timeout_s`; True if one was running."""
    return bool(stop_together([pidfile], timeout_s))


def stop_together(pidfiles: list[Path], timeout_s: float = 20.0) -> list[Path]:
    """SIGTERM every recorded process group at once, SIGKILL those left after `timeout_s`;
    returns the pid files whose process was running. For servers that shut down cleanly only
    together: the last node of a KRaft cluster stopped alone waits for a quorum that is gone."""
    running = {pidfile: pid for pidfile in pidfiles if (pid := running_pid(pidfile)) is not None}
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        for pid in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)  # the server is its session's leader: pgid == pid
        if wait_until(lambda: all(running_pid(p) is None for p in running), wait_s):
            break
    for pidfile in pidfiles:
        pidfile.unlink(missing_ok=True)
    return list(running)


def stop_session(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM to the session `process` leads (started with start_new_session), SIGKILL to
    it after `timeout_s`; returns once the leader has exited."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Polls `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports, e.g. for a server and its control listener."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def free_port_block(count: int, avoid: Iterable[int] = ()) -> int:
    """The first of `count` consecutive ports on 127.0.0.1 free to bind right now and not in
    `avoid` (a Kafka cluster's nodes take consecutive ports), below the kernel's ephemeral
    range: a block inside it could be taken by any outgoing connection before its servers
    bind it."""
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    avoided = set(avoid)
    rng = random.Random()
    while True:
        base = rng.randrange(10_000, low - count)
        block = range(base, base + count)
        if not avoided.intersection(block) and all(_bindable(port) for port in block):
            return base


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def log_tail(logfile: Path, lines: int = 20) -> str:
    try:
        return "\n".join(logfile.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_logged(argv: Sequence[str], logfile: Path, timeout_s: float = 120.0) -> bool:
    """Runs a setup command to completion, appending its output to `logfile`."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as log:
        result = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
    return result.returncode == 0
