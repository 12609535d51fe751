"""`p4bs stack up|status|down` as an operator runs it: ready, healthy, and nothing left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from p4bs_infra.procs import alive, free_ports, port_open, running_pid


def _p4bs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "p4bs_cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


class _Ports:
    """Free ports for one stack, and `p4bs stack up` on them from a copy of the example."""

    def __init__(self, repo: Path, tmp_path: Path) -> None:
        self.kafka, self.controller, self.influx, self.rpc = free_ports(4)
        self.config = tmp_path / "p4bs.toml"
        self.config.write_text(
            (repo / "config" / "testbed.toml")
            .read_text()
            .replace("127.0.0.1:9092", f"127.0.0.1:{self.kafka}")
            .replace("127.0.0.1:8086", f"127.0.0.1:{self.influx}")
        )

    def all(self) -> tuple[int, ...]:
        return (self.kafka, self.controller, self.influx, self.rpc)

    def up(self, state: Path) -> subprocess.CompletedProcess[str]:
        return _p4bs(
            *("stack", "up", "--config", str(self.config), "--state-dir", str(state)),
            *("--kafka-controller-port", str(self.controller)),
            *("--influx-rpc-port", str(self.rpc)),
        )


def test_stack_up_then_down_leaves_no_process_and_no_port(repo: Path, tmp_path: Path) -> None:
    ports = _Ports(repo, tmp_path)
    state = tmp_path / "state"
    pidfiles = [state / "kafka" / "kafka.pid", state / "influxdb" / "influxdb.pid"]
    try:
        up = ports.up(state)
        assert up.returncode == 0, up.stderr + up.stdout
        assert "stack ready in" in up.stdout
        pids = [running_pid(p) for p in pidfiles]
        assert all(pids), pids
        assert port_open("127.0.0.1", ports.kafka) and port_open("127.0.0.1", ports.influx)

        status = _p4bs("stack", "status", "--state-dir", str(state))
        assert status.returncode == 0, status.stdout
        assert status.stdout.count(" ready ") == 2
        assert "p4bs.link-counters" in status.stdout

        again = ports.up(state)
        assert again.returncode == 0, again.stderr  # idempotent: same processes kept
        assert [running_pid(p) for p in pidfiles] == pids
    finally:
        down = _p4bs("stack", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert "stopped: influxdb, kafka" in down.stdout
    for pid in pids:
        assert pid is not None and not alive(pid)
    assert not any(port_open("127.0.0.1", p) for p in ports.all())
    assert _p4bs("stack", "status", "--state-dir", str(state)).returncode == 1


def test_stack_up_refuses_a_busy_port_and_starts_nothing(repo: Path, tmp_path: Path) -> None:
    ports = _Ports(repo, tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports.influx))
        squatter.listen()
        up = ports.up(tmp_path / "state")
    assert up.returncode == 1
    assert f"influxdb port {ports.influx} on 127.0.0.1 is already in use" in up.stderr
    assert not (tmp_path / "state" / "kafka" / "kafka.pid").exists()


def test_stack_commands_without_a_started_stack_say_so(tmp_path: Path) -> None:
    result = _p4bs("stack", "down", "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert "no stack was started in" in result.stderr
    assert os.listdir(tmp_path) == []
