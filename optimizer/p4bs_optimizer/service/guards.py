"""The safety guards' settings and the state they share across links (`[optimizer]`,
optimizer/README.md "Safety guards").

- `Guards`: what every link's controller holds its changes to: the minimum interval between
  two changes of a link, when stale metrics bring the safe buffer, the largest step of one
  change (`max_step_ratio`), the per-router change budget, the freeze file and the dry run.
- `ChangeBudget`: one router's changes in the last minute, shared by the controllers of all
  its links (one per router in the service).
- The freeze file: while it exists, no change reaches any router (`p4bs optimizer freeze`
  writes it, `unfreeze` removes it); every apply looks for it first.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from p4bs.config import OptimizerConfig

MINUTE_NS = 60_000_000_000


@dataclass(frozen=True)
class Guards:
    """The settings of a link's safety guards (the link's [min, max] is its policy's clamp)."""

    min_change_interval_ns: int  # between two changes of the link's buffer
    stale_after_ns: int  # no window this long: the safe buffer
    dry_run: bool = False  # decide and record, apply nothing
    # One change moves a buffer at most this factor up or down (2.0: x2 or /2); 0: no limit.
    max_step_ratio: float = 0.0
    # Changes one router takes per minute, all its links together; 0: no limit.
    max_changes_per_router_per_minute: int = 0
    freeze_file: Path | None = None  # while it exists nothing is written to a router

    @classmethod
    def of(cls, optimizer: OptimizerConfig, *, dry_run: bool) -> Guards:
        """The config's guards; the command line's --dry-run ORs with `optimizer.dry_run`."""
        return cls(
            optimizer.min_change_interval_ns,
            optimizer.stale_after_ns,
            dry_run or optimizer.dry_run,
            optimizer.max_step_ratio,
            optimizer.max_changes_per_router_per_minute,
            Path(optimizer.freeze_file),
        )

    def frozen(self) -> str | None:
        """Why changes are frozen (the freeze file's reason), or None when they are not."""
        if self.freeze_file is None:
            return None
        return frozen_reason(self.freeze_file)


class ChangeBudget:
    """One router's changes in the last minute, against `per_minute` (0: no limit)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._times: deque[int] = deque()  # wall ns of the changes of the last minute

    def wait_ns(self, now_ns: int) -> int:
        """How long until one more change fits in the budget (0: now)."""
        while self._times and self._times[0] <= now_ns - MINUTE_NS:
            self._times.popleft()
        if not self.per_minute or len(self._times) < self.per_minute:
            return 0
        return self._times[0] + MINUTE_NS - now_ns

    def take(self, now_ns: int) -> None:
        """One change made now."""
        self._times.append(now_ns)


def frozen_reason(path: Path) -> str | None:
    """The reason written in the freeze file at `path`, or None when there is none. A file
    that is there but unreadable or not as `freeze` writes it still freezes (it exists)."""
    # Asked before every change, three times a decision: a look at the folder first is ~20
    # times cheaper than opening the file that is usually not there.
    if not os.path.lexists(path):
        return None
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"freeze file {path} (unreadable: {exc.strerror})"
    try:
        data = json.loads(text)
        return f"frozen by {data['by']} at {data['at']}: {data['reason']}"
    except (ValueError, KeyError, TypeError):
        return f"freeze file {path}"


def freeze(path: Path, reason: str) -> str:
    """Writes the freeze file (who, when, why); returns the reason as the optimizer logs it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps({"reason": reason, "by": getpass.getuser(), "at": at}) + "\n")
    reason_now = frozen_reason(path)
    assert reason_now is not None
    return reason_now


def unfreeze(path: Path) -> bool:
    """Removes the freeze file; False if there was none."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
