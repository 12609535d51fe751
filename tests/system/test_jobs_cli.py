"""`p4bs jobs run` as an operator runs it: the metrics + SLA job on the topics the config
names, to the end of what they hold (`--bounded`), with its progress and exit code; and live,
killed mid-backlog and resumed from its checkpoint."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from offsets import partition_offsets
from replay import (
    EMPTY_COUNTERS,
    assert_windows_match,
    config_file,
    config_for,
    consume,
    expected,
    interval_records,
    replay,
)
from test_sla import DELAYS_MS, _counters

from p4bs.bus import RecordConsumer, RecordProducer
from p4bs_infra.procs import wait_until
from p4bs_infra.stack import Stack
from p4bs_jobs.cli import latest_checkpoint


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
    config = config_file(repo, stack.kafka.bootstrap, topics, tmp_path / "p4bs.toml")
    run = jobs_run_bounded(config, "cli-test", tmp_path / "ckpt")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "metrics + SLA job (embedded) started" in run.stdout
    assert run.stdout.rstrip().endswith("job finished")
    got = consume(stack.kafka.bootstrap, topics, len(DELAYS_MS), "cli-reader", linger_s=1.0)
    assert sorted(r["window_end_ns"] for r in got) == [
        c["ts_ns"] for c in (_counters(i, d) for i, d in enumerate(DELAYS_MS))
    ]


def _jobs_run_live(
    config: Path, checkpoints: Path, *resume: str, log: Path | None = None
) -> subprocess.Popen[str]:
    """`p4bs jobs run` (live) in a process group of its own: its JVM is killed with it. Its
    output goes to `log` if given."""
    argv = ["jobs", "run", "--config", str(config), "--group", "kill-test"]
    with open(log or os.devnull, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "p4bs_cli", *argv, "--checkpoints", str(checkpoints), *resume],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(job: subprocess.Popen[str]) -> None:
    """SIGTERM (the job is cancelled), then SIGKILL for whatever of the group is left."""
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def test_a_job_killed_mid_backlog_resumes_and_every_window_is_the_uninterrupted_runs(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """`p4bs jobs run`, live, is killed (SIGKILL, with its JVM) once a checkpoint holds part
    of the replay and some windows are out; the rest of the replay arrives while it is down;
    `--resume` restores the checkpoint and catches up on that backlog. The windows a
    consumer reads (read committed) are every window of the replay once, each equal to the
    independent computation on the whole replay. (With the samples, the flow events and the
    counters on three topics, before LinkCounters v3, a restart on a backlog lost the RTT
    samples of some windows: one topic could move event time past another's records.)"""
    bootstrap = stack.kafka.bootstrap
    records = replay()
    want = expected(records, config_for(repo, bootstrap))
    intervals = interval_records(records)
    half = len(intervals) // 2
    producer = RecordProducer(bootstrap, topics)
    for record in intervals[:half]:
        producer.produce("link_counters", record)
    assert producer.flush(30) == 0
    config = config_file(repo, bootstrap, topics, tmp_path / "p4bs.toml")
    checkpoints = tmp_path / "ckpt"
    reader = RecordConsumer(bootstrap, "kill-reader", ["link_metrics"], topics)
    got: list[dict[str, Any]] = []

    def read(until: int) -> bool:
        received = reader.poll(0.5)
        if received is not None:
            got.append(received.record)
        return len(got) >= until

    try:
        first = _jobs_run_live(config, checkpoints)
        try:
            assert wait_until(
                lambda: read(10) and latest_checkpoint(checkpoints) is not None, 240, 0
            )
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        out_before = len(got)
        # The rest of the replay comes while the job is down, then a record past its end in
        # every partition (of a link no config describes) so that its last windows close.
        for record in intervals[half:]:
            producer.produce("link_counters", record)
        end = max(r["ts_ns"] for r in intervals) + 1_000_000_000
        held = {**EMPTY_COUNTERS, "link_id": "r9:held", "ts_ns": end}
        for partition in partition_offsets(bootstrap, topics["link_counters"]):
            producer.produce("link_counters", held, partition=partition)
        assert producer.flush(30) == 0
        resumed_log = tmp_path / "resumed.log"
        second = _jobs_run_live(config, checkpoints, "--resume", log=resumed_log)
        try:
            assert wait_until(lambda: read(len(want)), 240, 0), (len(got), len(want))
            linger = time.monotonic() + 3  # a doubled window would come meanwhile
            while time.monotonic() < linger:
                read(len(want) + 1)
        finally:
            _stop(second)
    finally:
        reader.close()
    print(f"{out_before} of {len(want)} windows out before the kill")
    assert 0 < out_before < len(want)
    assert_windows_match(got, want)
    # SIGTERM cancelled the resumed job cleanly: it said so and logged no error.
    stopped = resumed_log.read_text()
    assert second.returncode == 0 and "cancelling; restart with --resume" in stopped
    assert "Traceback" not in stopped and "ERROR" not in stopped, stopped[-3000:]


def test_a_stop_while_the_job_starts_ends_it_at_once(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    """SIGINT while PyFlink is still building the job, to a process that inherited SIGINT
    ignored (as one started from a background shell job does): it ends within seconds and
    says so. Before, it went on starting the job and ran until its stopper's SIGKILL."""
    config = config_file(repo, stack.kafka.bootstrap, topics, tmp_path / "p4bs.toml")
    log = tmp_path / "job.log"
    argv = ["jobs", "run", "--config", str(config), "--group", "stop-test"]
    argv += ["--checkpoints", str(tmp_path / "ckpt")]
    command = shlex.join([sys.executable, "-m", "p4bs_cli", *argv])
    with open(log, "w") as out:
        job = subprocess.Popen(
            ["sh", "-c", f"trap '' INT; exec {command}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Its first line comes from PyFlink's import, seconds before the job is built.
        assert wait_until(lambda: log.stat().st_size > 0, 60, 0.05)
        job.send_signal(signal.SIGINT)
        assert job.wait(15) == 0
    finally:
        _stop(job)
    said = log.read_text()
    assert "stopped while the job was starting" in said, said[-2000:]
