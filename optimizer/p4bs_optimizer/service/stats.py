"""The service's counters, shared by its parts (the progress line, `summary_line`, and the
Prometheus endpoint, metrics.py, which reads these same counts when it is scraped)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import Histogram

# The service's CPU by part (ServiceStats.cpu_ns): "decode", polling and decoding records (the
# poll thread); "windows", handing them to their links (window objects, replay checks,
# guards, the policies' decide) and what else runs on the loop meanwhile, saves left out;
# "state", saving link states (the policy's snapshot, the changelog record); "produce",
# encoding and producing a transaction's records; "commit", its offsets and commit (the
# commit thread). The Kafka client's own threads are in none of them.
CPU_PARTS = ("decode", "windows", "state", "produce", "commit")

# Window end to decision, seconds: a window is decided within a second or two, a search's
# fit within a few; past a minute the optimizer is far behind its input.
WINDOW_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


def _window_lag() -> Histogram:
    # registry=None: the service's own collector (metrics.py) exposes it, so two services
    # in one process (tests, benchmarks) do not clash in the global registry.
    return Histogram(
        "p4bs_optimizer_window_lag_seconds",
        "From a window's end to the decision made on it (its BufferDecision record)",
        buckets=WINDOW_LAG_BUCKETS,
        registry=None,
    )


@dataclass
class ServiceStats:
    windows: int = 0
    replayed: int = 0  # windows the saved state already covered
    unknown_links: int = 0  # windows of links the config does not describe
    decisions: int = 0
    applied: int = 0
    failed: int = 0
    skipped: int = 0
    dry_run: int = 0  # decided and recorded, not applied (a dry run)
    fallbacks: int = 0  # links put on their safe buffer by stale metrics
    policy_failures: int = 0  # a link's policy raised (the link went to its safe buffer)
    restore_failures: int = 0  # a saved policy state its policy refused (started afresh)
    transactions: int = 0
    aborted: int = 0  # transactions the group refused or that failed: the group rejoined
    not_member: int = 0  # rounds not committed: the group had dropped this member
    assigned: int = 0  # partitions the group gave this process, in all
    revoked: int = 0  # partitions taken back, or lost
    not_held: int = 0  # records of partitions taken back before they were handled
    links_changed: int = 0  # links added or changed by the links topic
    links_removed: int = 0
    bad_links: int = 0  # links topic records that make no valid link (passed over)
    # Changes a safety guard did not let through as decided, by guard: "freeze" (not
    # applied), "max_step_ratio" (cut to the largest step, or not applied: the buffer in
    # force unknown), "bounds" (held to the link's [min, max]).
    guard_refusals: Counter[str] = field(default_factory=Counter)
    # Changes a guard made wait: "min_change_interval", "router_budget".
    guard_delays: Counter[str] = field(default_factory=Counter)
    window_lag: Histogram = field(default_factory=_window_lag)
    cpu_ns: Counter[str] = field(default_factory=Counter)  # by part, CPU_PARTS
