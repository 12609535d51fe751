"""Each link's optimizer state on disk, so that a restarted service resumes where it was.

One SQLite database (`links.sqlite`, write-ahead log) under the state folder, a row per
link. A service stages the states that changed and writes them together in one transaction
(`flush`) before it applies anything they decided and before it commits the Kafka offsets
they cover: a crash leaves every row as it was before the flush or as after it. One file
replace per link and decision (the former layout) cost 0.3-0.6 ms each and held a process
to ~300 links at a decision a second; a transaction of a round's states costs a few µs per
link. Processes of one consumer group on one machine share the database (SQLite locks it
between them): when a link moves to another process (the group rebalanced), that process
resumes from its row. SQLite's locking needs a local file system, not a network share.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DATABASE = "links.sqlite"
# How long a process waits for another one's transaction (they take milliseconds).
BUSY_TIMEOUT_MS = 10_000


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
    """Reads and writes `LinkState`s in the database in `folder` (created if missing).
    Used from one thread (the service's event loop)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / DATABASE
        self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000)
        self._db.execute("PRAGMA journal_mode=WAL")
        # In WAL mode a commit survives the process's crash without an fsync per commit;
        # what it risks is the last commits on a power loss, as the file replace did.
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self._db:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS link_state (link_id TEXT PRIMARY KEY, state TEXT)"
            )
        self._staged: dict[str, str] = {}
        self.flushes = 0  # transactions written
        self.rows_written = 0

    def load(self, link_id: str) -> LinkState | None:
        """The link's saved state; None if there is none or it cannot be read (said in the
        log: the link then starts afresh rather than the service stopping)."""
        text = self._staged.get(link_id)
        if text is None:
            row = self._db.execute(
                "SELECT state FROM link_state WHERE link_id = ?", (link_id,)
            ).fetchone()
            if row is None:
                return None
            text = row[0]
        try:
            data = json.loads(text)
            return LinkState(
                policy=data["policy"],
                policy_state=data["policy_state"],
                last_window_end_ns=int(data["last_window_end_ns"]),
                intended={int(q): int(b) for q, b in data["intended"].items()},
                in_force={int(q): int(b) for q, b in data["in_force"].items()},
                last_change_ns=int(data["last_change_ns"]),
                fallback=bool(data["fallback"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("link %s: saved state unreadable, starting afresh: %r", link_id, exc)
            return None

    def stage(self, link_id: str, state: LinkState) -> None:
        """Takes the state as it is now; written by the next `flush`."""
        self._staged[link_id] = json.dumps(asdict(state), sort_keys=True)

    def flush(self) -> None:
        """Writes every staged state in one transaction (nothing to do if none)."""
        if not self._staged:
            return
        rows = list(self._staged.items())
        with self._db:
            self._db.executemany(
                "INSERT INTO link_state (link_id, state) VALUES (?, ?) "
                "ON CONFLICT (link_id) DO UPDATE SET state = excluded.state",
                rows,
            )
        self._staged.clear()
        self.flushes += 1
        self.rows_written += len(rows)
