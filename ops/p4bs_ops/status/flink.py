"""The Flink check: the metrics job's state and its last completed checkpoint's age (the
JobManager's REST API), or, for the embedded mini cluster, that nothing outside `p4bs jobs run`
can see it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from p4bs.config import Config
from p4bs.topic_range import Deadline
from p4bs.units import format_duration_ns
from p4bs_ops.status.runner import (
    MS_NS,
    CheckFailed,
    PartStatus,
    StatusOptions,
    describe_error,
    part_check,
)

RUNNING = "RUNNING"


@part_check("flink")
def check_flink(config: Config, options: StatusOptions) -> PartStatus:
    flink = config.flink
    if flink.mode == "embedded":
        return PartStatus(
            "flink",
            True,
            "embedded mini cluster: the job is not observable from here (it runs inside "
            f"`p4bs jobs run`); its progress is group {options.metrics_group}'s lag (kafka)",
            {
                "mode": "embedded",
                "to_watch_it": '[flink] mode = "remote" with jobmanager = HOST:PORT, a '
                "standalone cluster there, and the job submitted with `p4bs jobs submit`",
            },
        )
    deadline = Deadline(options.timeout_ns)
    rest = f"http://{flink.jobmanager}"
    url = f"{rest}/jobs/overview"
    try:
        overview = _get_json(url, deadline.left_s())
    except (OSError, ValueError) as exc:
        raise CheckFailed(
            f"JobManager {_http_reason(url, exc)}", {"mode": "remote", "jobmanager": rest}
        ) from None
    jobs = [j for j in overview.get("jobs", []) if options.flink_job in str(j.get("name", ""))]
    details: dict[str, Any] = {"mode": "remote", "jobmanager": rest}
    if not jobs:
        names = sorted(str(j.get("name")) for j in overview.get("jobs", []))
        details["jobs"] = names
        raise CheckFailed(
            f"no metrics job (name containing {options.flink_job!r}) on {rest}; submit it with "
            "`p4bs jobs submit`",
            details,
        )
    # A running one first, else the newest: jobs cancelled earlier stay listed for a while.
    jobs.sort(key=lambda j: (j.get("state") == RUNNING, j.get("start-time", 0)), reverse=True)
    job = jobs[0]
    jid, state = str(job.get("jid")), str(job.get("state"))
    details.update(
        {
            "job_id": jid,
            "name": job.get("name"),
            "state": state,
            "running_ns": int(job.get("duration", 0)) * MS_NS,
            "max_checkpoint_age_ns": options.checkpoint_age_limit_ns(config),
        }
    )
    running = sum(j.get("state") == RUNNING for j in jobs)
    if running > 1:
        details["running_jobs"] = running
    if state != RUNNING:
        return PartStatus("flink", False, f"metrics job {jid} is {state}", details)
    url = f"{rest}/jobs/{jid}/checkpoints"
    try:
        checkpoints = _get_json(url, deadline.left_s())
    except (OSError, ValueError) as exc:
        reason = _http_reason(url, exc)
        raise CheckFailed(f"metrics job {jid} is RUNNING; {reason}", details) from None
    completed = (checkpoints.get("latest") or {}).get("completed")
    counts = checkpoints.get("counts") or {}
    details["checkpoints"] = {k: counts.get(k) for k in ("completed", "failed", "in_progress")}
    limit = options.checkpoint_age_limit_ns(config)
    if not completed:
        if details["running_ns"] <= limit:
            return PartStatus(
                "flink",
                True,
                f"metrics job {jid} RUNNING for {format_duration_ns(details['running_ns'])}, "
                "no checkpoint completed yet",
                details,
            )
        return PartStatus(
            "flink",
            False,
            f"metrics job {jid} RUNNING for {format_duration_ns(details['running_ns'])} with no "
            "completed checkpoint",
            details,
        )
    age = max(0, time.time_ns() - int(completed["latest_ack_timestamp"]) * MS_NS)
    details["last_checkpoint"] = {"id": completed.get("id"), "age_ns": age}
    if age > limit:
        return PartStatus(
            "flink",
            False,
            f"metrics job {jid} RUNNING, but its last checkpoint ({completed.get('id')}) is "
            f"{format_duration_ns(age)} old (limit {format_duration_ns(limit)})",
            details,
        )
    return PartStatus(
        "flink",
        True,
        f"metrics job {jid} RUNNING, last checkpoint {format_duration_ns(age)} ago",
        details,
    )


def _get_json(url: str, timeout_s: float) -> Any:
    """The JobManager's answer at `url`, parsed."""
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return json.loads(reply.read())


def _http_reason(url: str, exc: BaseException) -> str:
    """A failed GET of `url` in one line that names it."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"{url}: HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        text = getattr(reason, "strerror", None) or str(reason)
        return f"{url}: {text}"
    if isinstance(exc, TimeoutError):
        return f"{url}: no answer in time"
    if isinstance(exc, ValueError):
        return f"{url}: not JSON ({exc})"
    return f"{url}: {describe_error(exc)}"
