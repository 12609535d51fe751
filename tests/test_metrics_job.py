"""The metrics job on the recorded replay against an independent computation (replay.py)."""

from __future__ import annotations

from pathlib import Path

from replay import assert_windows_match, config_for, consume, decisions, expected, produce, replay

from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import flink_configuration
from p4bs_jobs.metrics import run_metrics_job


def test_every_window_matches_an_independent_computation(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    records = replay()
    config = config_for(repo, stack.kafka.bootstrap)
    made = decisions(min(r["ts_ns"] for r in records))
    want = expected(records, made, config)
    assert sum(e["long_flows"] > 0 for e in want) > 20  # the replay exercises every part
    assert any(e["retransmissions"] for e in want) and any(e["change"] for e in want)
    produce(stack.kafka.bootstrap, topics, records, made)

    conf = flink_configuration(
        checkpoint_interval_ns=1_000_000_000, checkpoint_dir=tmp_path / "checkpoints"
    )
    run_metrics_job(config, topics, conf, group_id="metrics-test", bounded=True).wait(300_000)

    assert_windows_match(consume(stack.kafka.bootstrap, topics, len(want), "reader"), want)
