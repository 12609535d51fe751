"""Which links may read the optimizer feed (streaming-jobs/README.md, [metrics] optimizer_feed).

The metrics job thins the feed for the links of the policies named in `[metrics]
feed_policies`: it passes on only the windows that can move a decision made on the window in
hand (N changed, SRTT or RTT_min moved past a deadband, the change flag, an SLA alert) and a
heartbeat. A policy that keeps anything from one window to the next beyond its last decision
(a search, an estimator that pools windows, a traffic start) would decide wrong on such a
feed, so a link of one is refused there. Which policies decide on the window in hand is the
service's knowledge (tests/unit/test_optimizer_feed.py checks it against the policies' code).
"""

from __future__ import annotations

from p4bs.config import Config, LinkConfig

# Each decides from the window in hand alone: a target from its SRTT (else its RTT harmonic
# mean) and N, or a constant, against its last decision (GLOBECOM: against the SRTT and N it
# last computed with).
WINDOW_IN_HAND_POLICIES = frozenset({"static", "tiny", "bloated", "bdp", "stanford", "globecom"})


def feed_problem(config: Config, link: LinkConfig) -> str | None:
    """Why `link` cannot be driven from the windows this config has the optimizer read: its
    policy needs every window and the feed thins its links. None when it can."""
    metrics = config.metrics
    thinned = metrics.optimizer_feed and link.policy in metrics.feed_policies
    if not thinned or link.policy in WINDOW_IN_HAND_POLICIES:
        return None
    return (
        f"link {link.id}: policy {link.policy!r} needs every window, but the optimizer reads "
        f"the optimizer feed ([metrics] optimizer_feed), which thins the windows of the "
        f"links of [metrics] feed_policies (only "
        f"{', '.join(sorted(WINDOW_IN_HAND_POLICIES))} may be thinned)"
    )
