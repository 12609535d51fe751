"""Each link's optimizer state on disk, so that a restarted service resumes where it was.

One JSON file per link under the state folder, replaced atomically (written beside it, then
renamed), so that a crash leaves the old state or the new one, never half of one. Processes
of one consumer group share the folder: when a link moves to another process (the group
rebalanced), that process resumes from the file.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class LinkState:
    """What the service keeps of one link between windows (JSON-able)."""

    policy: str  # the policy the state belongs to; another policy starts afresh
    policy_state: dict[str, Any] = field(default_factory=dict)  # Policy.snapshot()
    last_window_end_ns: int = 0  # windows up to here are done (a replay skips them)
    intended: dict[int, int] = field(default_factory=dict)  # queue -> the policy's buffer
    in_force: dict[int, int] = field(default_factory=dict)  # queue -> applied and read back
    last_change_ns: int = 0  # wall clock of the last applied change
    fallback: bool = False  # the safe buffer is in force because metrics went stale


class StateStore:
    """Reads and writes `LinkState`s in `folder` (created if missing)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, link_id: str) -> Path:
        return self.folder / f"{urllib.parse.quote(link_id, safe='')}.json"

    def load(self, link_id: str) -> LinkState | None:
        """The link's saved state; None if there is none or it cannot be read (said in the
        log: the link then starts afresh rather than the service stopping)."""
        path = self._path(link_id)
        try:
            data = json.loads(path.read_text())
            return LinkState(
                policy=data["policy"],
                policy_state=data["policy_state"],
                last_window_end_ns=int(data["last_window_end_ns"]),
                intended={int(q): int(b) for q, b in data["intended"].items()},
                in_force={int(q): int(b) for q, b in data["in_force"].items()},
                last_change_ns=int(data["last_change_ns"]),
                fallback=bool(data["fallback"]),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("link %s: state %s unreadable, starting afresh: %r", link_id, path, exc)
            return None

    def save(self, link_id: str, state: LinkState) -> None:
        path = self._path(link_id)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(asdict(state), sort_keys=True))
        os.replace(partial, path)
