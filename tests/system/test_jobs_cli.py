"""`p4bs jobs run --bounded` as an operator runs it: the metrics + SLA job on the topics the
config names, to the end of what they hold, with its progress and exit code."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from replay import consume
from test_sla import DELAYS_MS, _counters

from p4bs.bus import RecordProducer
from p4bs_infra.stack import Stack


def jobs_run_bounded(
    config: Path, group: str, checkpoints: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`p4bs jobs run --bounded` in a process of its own, its output captured."""
    argv = ["jobs", "run", "--bounded", "--config", str(config), "--group", group]
    return subprocess.run(
        [sys.executable, "-m", "p4bs_cli", *argv, "--checkpoints", str(checkpoints)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env=env,
    )


def test_jobs_run_bounded_writes_every_window(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    producer = RecordProducer(stack.kafka.bootstrap, topics)
    for i, delay in enumerate(DELAYS_MS):
        producer.produce("link_counters", _counters(i, delay))
    assert producer.flush(30) == 0
    config = tmp_path / "p4bs.toml"
    names = "".join(f'{stream} = "{topic}"\n' for stream, topic in topics.items())
    config.write_text(
        (repo / "config" / "testbed.toml")
        .read_text()
        .replace("127.0.0.1:9092", stack.kafka.bootstrap)
        + f"\n[kafka.topics]\n{names}"
    )
    run = jobs_run_bounded(config, "cli-test", tmp_path / "ckpt")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "metrics + SLA job (embedded) started" in run.stdout
    assert run.stdout.rstrip().endswith("job finished")
    got = consume(stack.kafka.bootstrap, topics, len(DELAYS_MS), "cli-reader", linger_s=1.0)
    assert sorted(r["window_end_ns"] for r in got) == [
        c["ts_ns"] for c in (_counters(i, d) for i, d in enumerate(DELAYS_MS))
    ]
