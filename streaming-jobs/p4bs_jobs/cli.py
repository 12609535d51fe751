"""`p4bs jobs run|submit`: the streaming jobs (the sinks beside them: p4bs_sinks).

PyFlink is imported only by the commands that need it (it takes seconds to load).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from p4bs import logs, paths
from p4bs.config import Config, ConfigError, load_config


def _checkpoints(args: argparse.Namespace) -> Path:
    default = paths.home() / ".run" / "flink" / "checkpoints" / args.group
    return Path(args.checkpoints or default).resolve()


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest completed checkpoint under `folder` (`<job id>/chk-<n>/_metadata`)."""
    done = [m.parent for m in folder.glob("*/chk-*/_metadata")]
    return max(done, key=lambda c: c.stat().st_mtime, default=None)


def _start_job(args: argparse.Namespace, mode: str) -> tuple[Any, Config]:
    from p4bs_jobs.flink_env import flink_configuration
    from p4bs_jobs.metrics import run_metrics_job

    config = load_config(args.config)
    checkpoints = _checkpoints(args)
    restore = latest_checkpoint(checkpoints) if args.resume else None
    if args.resume and restore is None:
        raise ConfigError(str(checkpoints), ["--resume: no completed checkpoint there"])
    if config.flink.jvm_args:
        # Read by PyFlink when it starts its JVM, which the first Flink object below does.
        os.environ["JVM_ARGS"] = config.flink.jvm_args
    conf = flink_configuration(
        mode,
        args.jobmanager or config.flink.jobmanager,
        config.flink.parallelism,
        config.flink.checkpoint_interval_ns,
        checkpoint_dir=checkpoints,
        restore_from=restore,
    )
    topics = config.kafka.topics
    result = run_metrics_job(config, topics, conf, group_id=args.group, bounded=args.bounded)
    where = f"from {restore}" if restore else "from the group's committed offsets"
    feed = f", {topics['optimizer_feed']}" if config.metrics.optimizer_feed else ""
    logs.status_line(
        f"metrics + SLA job ({mode}) started {where}: {topics['link_counters']}, "
        f"{topics['links']} -> "
        f"{topics['link_metrics']}, {topics['sla_alerts']}{feed}; checkpoints in {checkpoints}"
    )
    return result, config


def cmd_run(args: argparse.Namespace) -> int:
    # Explicit handlers: a process started from a background shell job inherits SIGINT
    # ignored, and Python then never raises KeyboardInterrupt; SIGTERM cancels the same way.
    # Set before the job starts, which takes seconds: a stop meanwhile ends the process then
    # (ignored, it waited here for the stopper's SIGKILL, 30 s later).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result, _ = _start_job(args, "embedded")
    except ConfigError as exc:
        print(f"p4bs jobs run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        logs.status_line("stopped while the job was starting")
        return 0
    client = result.get_job_client()
    # The job's end is awaited on a thread of its own: a stop signal raised inside that py4j
    # call made py4j log an ERROR with a traceback on every normal stop.
    ended: list[Exception | None] = []
    done = threading.Event()

    def await_end() -> None:
        try:
            client.get_job_execution_result().result()  # returns when the job ends
            ended.append(None)
        except Exception as exc:  # the job failed or was cancelled
            ended.append(exc)
        finally:
            done.set()

    threading.Thread(target=await_end, name="job-end", daemon=True).start()
    try:
        done.wait()
    except KeyboardInterrupt:
        logs.status_line("cancelling; restart with --resume to continue from the last checkpoint")
        client.cancel().result()
        return 0
    if ended[0] is not None:  # the job failed; Flink's own exception says why
        print(f"p4bs jobs run: the job failed: {ended[0]}", file=sys.stderr)
        return 1
    logs.status_line("job finished")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        result, config = _start_job(args, "remote")
    except ConfigError as exc:
        print(f"p4bs jobs submit: {exc}", file=sys.stderr)
        return 2
    job = result.get_job_client().get_job_id()
    rest = args.jobmanager or config.flink.jobmanager
    print(f"submitted job {job}; its state: http://{rest}/jobs/{job}")
    return 0


def add_parser(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="the streaming jobs (Flink)")
    jobs_sub = jobs.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    paths.add_config_option(common)
    job = argparse.ArgumentParser(add_help=False, parents=[common])
    job.add_argument("--group", default="p4bs-metrics", help="Kafka group and checkpoint name")
    job.add_argument("--checkpoints", type=Path, help="default: .run/flink/checkpoints/<group>")
    job.add_argument("--resume", action="store_true", help="restore the latest checkpoint")
    job.add_argument("--bounded", action="store_true", help="stop at the topics' current end")
    job.add_argument("--jobmanager", help="host:port of the REST endpoint (default: config)")
    run = jobs_sub.add_parser(
        "run", parents=[job], help="metrics + SLA job in the embedded MiniCluster"
    )
    logs.add_log_format_option(run)
    run.set_defaults(func=cmd_run)
    submit = jobs_sub.add_parser(
        "submit", parents=[job], help="submit the metrics + SLA job to a standalone cluster"
    )
    submit.set_defaults(func=cmd_submit)
