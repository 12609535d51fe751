"""A link that plays the metrics job for a policy under test: synthetic LinkMetrics windows
whose f, loss and queueing delay follow functions of the buffer in force (no Kafka, no
router), and the loop that feeds them to a policy and applies its decisions."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from p4bs.config import LinkConfig
from p4bs_optimizer.policies.base import Decision, Policy, Window

WINDOW_NS = 100_000_000
T0_NS = 1_700_000_000 * 10**9
CAPACITY_BPS = 100_000_000
RTT_NS = 20_000_000
BDP_BYTES = CAPACITY_BPS * RTT_NS // 8_000_000_000  # 250 kB
PACKETS_PER_WINDOW = 1000


def make_link(**overrides: object) -> LinkConfig:
    """A 100 Mbit/s link with d_hat = 200 ms (C * d_hat = 2.5 MB)."""
    fields: dict[str, object] = {
        "router": "r1",
        "interface": "eth1",
        "switch": "s1",
        "capacity_bps": CAPACITY_BPS,
        "tap_before": "tap0",
        "tap_after": "tap1",
        "max_queue_delay_ns": 200_000_000,
        "max_loss": 0.01,
        "weight_loss": 0.5,
        "weight_delay": 0.5,
        "min_buffer_bytes": 10_000,
        "max_buffer_bytes": 5_000_000,
        "safe_buffer_bytes": 2_500_000,
        "policy": "p4bs",
        "policy_options": {},
    }
    fields.update(overrides)
    return LinkConfig(**fields)  # type: ignore[arg-type]


@dataclass
class FakeLink:
    """Plays the metrics job for one link: a 100 ms window at a time, whose f and loss depend
    on the buffer in force. A decided buffer comes into force `lag` windows after the
    decision (the windows in between still say the old buffer); for the first `transient_ns`
    after that, f is off by `transient_f`, as while the queue adapts."""

    f_of: Callable[[int], float]
    loss_of: Callable[[int], float]
    delay_of: Callable[[int], float] = lambda buffer: 1_000_000.0  # ns
    buffer: int = 5_000_000
    noise: float = 0.0  # standard deviation of a window's f around f_of
    seed: int = 0
    lag: int = 3
    transient_ns: int = 0
    transient_f: float = 0.0
    srtt_ns: int = RTT_NS
    rtt_min_ns: int = RTT_NS
    flows: int = 16
    utilisation: float = 1.0
    index: int = 0
    since_ns: int = T0_NS
    pending: list[tuple[int, int]] = field(default_factory=list)  # (due window, buffer)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def window(self, change: bool = False) -> Window:
        start = T0_NS + self.index * WINDOW_NS
        for due, buffer in [p for p in self.pending if p[0] <= self.index]:
            self.pending.remove((due, buffer))
            self.buffer, self.since_ns = buffer, start
        f = self.f_of(self.buffer) + self.rng.gauss(0.0, self.noise)
        if start < self.since_ns + self.transient_ns:
            f += self.transient_f
        retransmissions = round(self.loss_of(self.buffer) * PACKETS_PER_WINDOW)
        self.index += 1
        return Window(
            link_id="r1:eth1",
            window_start_ns=start,
            window_end_ns=start + WINDOW_NS,
            rtt_samples=100,
            rtt_flows=self.flows,
            rtt_hmean_ns=self.srtt_ns,
            srtt_ns=self.srtt_ns,
            rtt_min_ns=self.rtt_min_ns,
            long_flows=self.flows,
            data_packets=PACKETS_PER_WINDOW,
            retransmissions=retransmissions,
            loss_rate=retransmissions / PACKETS_PER_WINDOW,
            loss_rate_ewma=retransmissions / PACKETS_PER_WINDOW,
            queue_delay_samples=100,
            queue_delay_ns=round(self.delay_of(self.buffer)),
            queue_delay_ewma_ns=round(self.delay_of(self.buffer)),
            throughput_bps=CAPACITY_BPS,
            utilisation=self.utilisation,
            f=f,
            zscore=20.0 if change else 0.0,
            change=change,
            buffer_bytes=self.buffer,
        )

    def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            self.pending.append((self.index + self.lag, decision.buffer_bytes))


def run(
    policy: Policy, link: FakeLink, until: Callable[[list[Decision]], bool], limit: int
) -> list[Decision]:
    """Feeds windows to the policy and applies its decisions until `until(decisions)`."""
    decisions: list[Decision] = []
    for _ in range(limit):
        new = policy.decide(link.window())
        link.apply(new)
        decisions += new
        if new and until(decisions):
            return decisions
    raise AssertionError(f"not done after {limit} windows: {[d.phase for d in decisions]}")


def settled(decisions: list[Decision]) -> bool:
    return decisions[-1].phase == "settled"
