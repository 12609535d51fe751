"""`p4bs optimizer run` as a process of its own, and the decisions topic read as it writes
it: for tests that run the optimizer service the way an operator does."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from p4bs.bus import RecordConsumer
from p4bs.config import Config
from p4bs_infra.procs import free_port, wait_until


@contextmanager
def optimizer(
    config_path: Path, *extra: str, log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`p4bs optimizer run` with the config, its output in `log`; stopped (SIGTERM) at the
    end unless it already ended."""
    log = log or config_path.with_name(f"optimizer-{uuid.uuid4().hex[:6]}.log")
    argv = [sys.executable, "-m", "p4bs_cli", "optimizer", "run", "--config", str(config_path)]
    # Its Prometheus endpoint on a port of its own: a test may run several at once (`extra`
    # may name another: the last one given counts).
    argv += ["--metrics-address", f"127.0.0.1:{free_port()}"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*argv, "--report-every", "1", *extra], stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(log.read_text()[-3000:])


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


class Decisions:
    """The decisions topic, read as the optimizer writes it."""

    def __init__(self, config: Config) -> None:
        self.consumer = RecordConsumer(
            config.kafka.bootstrap,
            f"reader-{uuid.uuid4().hex[:6]}",
            ["buffer_decisions"],
            config.kafka.topics,
        )
        self.records: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        while (received := self.consumer.poll(0.1)) is not None:
            self.records.append(received.record)
        return self.records

    def until(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> None:
        if not wait_until(lambda: predicate(self.read()), timeout_s):
            raise AssertionError(
                f"{len(self.records)} decisions so far; the last: {self.records[-3:]}"
            )

    def close(self) -> None:
        self.consumer.close()
