"""Benchmark: how long `p4bs stack up` takes until Kafka and InfluxDB are ready.

Target (issue 2): ready in under 30 s on this machine. Runs the real CLI REPEAT times on free
ports in a fresh state folder each time (a cold start: KRaft storage formatted, topics and
database created) and prints each time, the median, and the median's ratio to the target.

    .venv/bin/python tests/bench/stack_start.py [REPEAT]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p4bs import paths
from p4bs_infra.procs import free_ports

TARGET_S = 30.0


def one_cold_start(config_text: str) -> float:
    kafka, controller, influx, rpc = free_ports(4)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "p4bs.toml"
        config.write_text(
            config_text.replace("127.0.0.1:9092", f"127.0.0.1:{kafka}").replace(
                "127.0.0.1:8086", f"127.0.0.1:{influx}"
            )
        )
        state = ["--state-dir", f"{tmp}/state"]
        cli = [sys.executable, "-m", "p4bs_cli", "stack"]
        began = time.monotonic()
        try:
            subprocess.run(
                [
                    *cli,
                    "up",
                    "--config",
                    str(config),
                    *state,
                    "--kafka-controller-port",
                    str(controller),
                    "--influx-rpc-port",
                    str(rpc),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            return time.monotonic() - began
        finally:
            subprocess.run([*cli, "down", *state], check=False, capture_output=True)


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    config_text = (paths.example_config()).read_text()
    times = []
    for i in range(repeat):
        times.append(one_cold_start(config_text))
        print(f"run {i + 1}/{repeat}: stack ready in {times[-1]:.2f} s", flush=True)
    median = statistics.median(times)
    print(
        f"p4bs stack up (cold): median {median:.2f} s over {repeat} runs "
        f"(min {min(times):.2f}, max {max(times):.2f}); target {TARGET_S:.0f} s; "
        f"median/target = {median / TARGET_S:.2f}"
    )


if __name__ == "__main__":
    main()
