"""The service's counters, shared by its parts (the progress line, `summary_line`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServiceStats:
    windows: int = 0
    replayed: int = 0  # windows the saved state already covered
    unknown_links: int = 0  # windows of links the config does not describe
    decisions: int = 0
    applied: int = 0
    failed: int = 0
    skipped: int = 0
    fallbacks: int = 0  # links put on their safe buffer by stale metrics
    policy_failures: int = 0  # a link's policy raised (the link went to its safe buffer)
    restore_failures: int = 0  # a saved policy state its policy refused (started afresh)
    transactions: int = 0
    aborted: int = 0  # transactions the group refused or that failed: the group rejoined
    assigned: int = 0  # partitions the group gave this process, in all
    revoked: int = 0  # partitions taken back, or lost
    not_held: int = 0  # records of partitions taken back before they were handled
    links_changed: int = 0  # links added or changed by the links topic
    links_removed: int = 0
    bad_links: int = 0  # links topic records that make no valid link (passed over)
