"""The metrics job on a standalone Flink cluster (JobManager + 2 TaskManagers, started by the
stack's own services): it loses a TaskManager running it mid-stream, restarts from its last
checkpoint on the other one, and the windows consumers read (read committed) are every window
exactly once, each equal to the independent computation on the uninterrupted replay."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from offsets import partition_offsets
from replay import (
    EMPTY_COUNTERS,
    assert_windows_match,
    config_for,
    consume,
    expected,
    produce,
    replay,
)

from p4bs.bus import RecordProducer
from p4bs_infra.procs import free_ports, wait_until
from p4bs_infra.services import FlinkJobManager, FlinkTaskManager
from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import flink_configuration
from p4bs_jobs.metrics import run_metrics_job


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    rest, rpc = free_ports(2)
    state = tmp_path_factory.mktemp("flink")
    services: list[Any] = [FlinkJobManager(state, rest, rpc)]
    services += [FlinkTaskManager(state, rest, rpc, i) for i in range(2)]
    try:
        for service in services:
            service.start()
        for service in services:
            assert wait_until(service.ready, 120, 0.5), service.failure("was not ready")
        yield services
    finally:
        for service in reversed(services):
            service.stop()


def _get(jobmanager: FlinkJobManager, path: str) -> Any:
    with urllib.request.urlopen(f"{jobmanager.rest}{path}", timeout=5) as reply:
        return json.loads(reply.read())


def _completed_checkpoints(jm: FlinkJobManager, job: str) -> int:
    return int(_get(jm, f"/jobs/{job}/checkpoints")["counts"]["completed"])


def test_taskmanager_lost_mid_stream_every_window_exactly_once(
    cluster: list[Any], stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    jm, *taskmanagers = cluster
    records = replay()
    config = config_for(repo, stack.kafka.bootstrap)
    want = expected(records, config)
    bootstrap = stack.kafka.bootstrap
    produce(bootstrap, topics, records)
    # The same traffic on links the config does not describe: the SQL reduces them too
    # (LinkMetrics drops them), so the job has work to do when the TaskManager is killed.
    for extra in range(2, 22):
        produce(bootstrap, topics, [{**r, "link_id": f"r1:eth{extra}"} for r in records])

    # Bounded, and held: the job reads the counters up to one record past their end, so it
    # cannot finish before the test writes that record (after the kill), however fast it
    # runs. (Live, a topic's burst after a quiet spell can arrive behind the watermark;
    # streaming-jobs/README.md.)
    ends = partition_offsets(bootstrap, topics["link_counters"])
    held = {p: high + 1 for p, (_, high) in ends.items()}
    conf = flink_configuration(
        "remote",
        f"127.0.0.1:{jm.rest_port}",
        checkpoint_interval_ns=500_000_000,
        checkpoint_dir=tmp_path / "checkpoints",
    )
    result = run_metrics_job(
        config,
        topics,
        conf,
        group_id="cluster-test",
        bounded=True,
        stop_offsets={"link_counters": held},
    )
    job = str(result.get_job_client().get_job_id())

    def finished() -> bool:
        return bool(_get(jm, f"/jobs/{job}")["state"] == "FINISHED")

    try:
        # A checkpoint with state in it, then a TaskManager running the job is killed.
        assert wait_until(lambda: _completed_checkpoints(jm, job) >= 1, 120, 0.2)
        busy = [t["id"] for t in _get(jm, "/taskmanagers")["taskmanagers"] if t["freeSlots"] < 2]
        victim = next(tm for tm in taskmanagers if tm.name in busy)
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        assert _get(jm, f"/jobs/{job}")["state"] == "RUNNING"
        # The held records: counters of a link the config does not describe, past the replay.
        last = max(r["ts_ns"] for r in records if r["kind"] == "link_counters")
        producer = RecordProducer(bootstrap, topics)
        counters = {**EMPTY_COUNTERS, "link_id": "r9:held", "ts_ns": last + 100_000_000}
        for partition in held:
            producer.produce("link_counters", counters, partition=partition)
        assert producer.flush(30) == 0
        assert wait_until(finished, 240, 0.5)
        restarts = _get(jm, f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
        print(f"job finished {time.monotonic() - killed:.1f} s after the kill")
        latest = _get(jm, f"/jobs/{job}/checkpoints")["latest"]
        print(f"restored from checkpoint {latest['restored']['id']}")
        print(f"last checkpoint: {latest['completed']['state_size']} bytes")
    finally:
        if not finished():
            result.get_job_client().cancel()
    assert len(restarts) == 1 and victim.name in json.dumps(restarts[0])
    assert latest["restored"]["id"] >= 1
    assert_windows_match(consume(bootstrap, topics, len(want), "reader", linger_s=3.0), want)
