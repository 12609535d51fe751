"""Stopping servers by their pid files: several signalled together (as the nodes of a Kafka
cluster must be), and one that ignores SIGTERM killed after the timeout."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from p4bs_infra import procs

# A server whose clean exit needs its peer to have been told to stop too: on SIGTERM it marks
# itself and waits for the peer's mark. Stopped one after the other, the first never exits
# cleanly. It marks itself ready once its trap is set.
PEERED = (
    "trap 'touch {me}.term; while [ ! -e {peer}.term ]; do sleep 0.05; done; "
    "touch {me}.clean; exit 0' TERM; touch {me}.ready; while :; do sleep 0.1; done"
)


def _start(tmp_path: Path, name: str, script: str) -> tuple[Path, int]:
    pidfile = tmp_path / f"{name}.pid"
    pid = procs.start_detached(["sh", "-c", script], pidfile, tmp_path / f"{name}.log")
    return pidfile, pid


def _kill_left(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def test_servers_stopped_together_are_all_told_before_any_is_waited_for(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    started = [
        _start(tmp_path, "a", PEERED.format(me=a, peer=b)),
        _start(tmp_path, "b", PEERED.format(me=b, peer=a)),
    ]
    try:
        assert procs.wait_until(lambda: all(Path(f"{x}.ready").exists() for x in (a, b)), 10)
        stopped = procs.stop_together([pidfile for pidfile, _ in started], timeout_s=20)
        assert stopped == [pidfile for pidfile, _ in started]
        assert (tmp_path / "a.clean").exists() and (tmp_path / "b.clean").exists()
        assert not any(procs.alive(pid) for _, pid in started)
        assert not any(pidfile.exists() for pidfile, _ in started)
        assert procs.stop_together([pidfile for pidfile, _ in started]) == []
    finally:
        _kill_left([pid for _, pid in started])


def test_a_server_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path: Path) -> None:
    ready = tmp_path / "stubborn.ready"
    script = f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done"
    pidfile, pid = _start(tmp_path, "stubborn", script)
    try:
        assert procs.wait_until(ready.exists, 10)
        assert procs.stop(pidfile, timeout_s=0.3)
        assert not procs.alive(pid) and not pidfile.exists()
        assert not procs.stop(pidfile)
    finally:
        _kill_left([pid])
