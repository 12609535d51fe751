"""The sequential part of the metrics job: one link's state from window to window.

Flink SQL reduces each link's raw records of one window to a `WindowSummary` (counts, sums,
the harmonic-mean ingredients, the flows seen, the flow events and decisions). `LinkState`
turns the summaries of consecutive windows into LinkMetrics records: SRTT, the sliding RTT
minimum, N, the EWMAs, f and the z-score change flag. It runs once per link and window, so
Python's per-call cost is paid per window, never per sample.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from p4bs.config import LinkConfig, MetricsConfig

# A change detector's deviation never counts as smaller than this (f is unitless, O(1)): a
# perfectly flat f has deviation 0, and any later move of f is then a change with a finite z.
Z_DEVIATION_FLOOR = 1e-9


@dataclass(frozen=True)
class WindowSummary:
    """One link's raw records of one window, as the SQL part of the job reduces them."""

    link_id: str
    window_start_ns: int
    window_end_ns: int
    rtt_samples: int
    rtt_flows: int
    rtt_inverse_sum: float  # sum over flows of samples / sum of RTTs (1 / the flow's mean)
    rtt_min_ns: int | None
    rtt_flow_keys: tuple[str, ...]  # flows with an RTT sample in the window
    packets: int
    bytes: int
    data_packets: int
    retransmissions: int
    queue_delay_samples: int
    queue_delay_sum_ns: int
    flow_events: tuple[tuple[int, str, str], ...]  # (ts_ns, start|end, flow key)
    decisions: tuple[tuple[int, int], ...]  # applied decisions: (ts_ns, buffer_bytes)


def flow_key(src_ip: str, src_port: int, dst_ip: str, dst_port: int, protocol: int) -> str:
    """The job's name of a flow in its data direction (the SQL builds the same string)."""
    return f"{src_ip}:{src_port}>{dst_ip}:{dst_port}/{protocol}"


@dataclass
class LinkState:
    """What a link carries from one window to the next."""

    srtt: float | None = None
    loss_ewma: float | None = None
    queue_delay_ewma: float | None = None
    rtt_minima: deque[tuple[int, int]] = field(default_factory=deque)  # (window end, min)
    long_flows: dict[str, int] = field(default_factory=dict)  # flow key -> last sign of life
    filtered_f: deque[float] = field(default_factory=deque)  # the detector's lag of f
    buffer_bytes: int | None = None
    buffer_since_ns: int = -1

    def update(self, w: WindowSummary, link: LinkConfig, m: MetricsConfig) -> dict[str, Any]:
        """Advances the state by one window and returns that window's LinkMetrics record."""
        rtt_hmean = w.rtt_flows / w.rtt_inverse_sum if w.rtt_flows else None
        if rtt_hmean is not None:
            self.srtt = _ewma(self.srtt, rtt_hmean, m.srtt_alpha)
        if w.rtt_min_ns is not None:
            while self.rtt_minima and self.rtt_minima[-1][1] >= w.rtt_min_ns:
                self.rtt_minima.pop()  # a later, smaller minimum outlives it
            self.rtt_minima.append((w.window_end_ns, w.rtt_min_ns))
        while self.rtt_minima and self.rtt_minima[0][0] <= w.window_end_ns - m.rtt_min_horizon_ns:
            self.rtt_minima.popleft()

        self._count_long_flows(w, m)

        loss = w.retransmissions / w.data_packets if w.data_packets else 0.0
        self.loss_ewma = _ewma(self.loss_ewma, loss, m.loss_alpha)
        delay = w.queue_delay_sum_ns / w.queue_delay_samples if w.queue_delay_samples else None
        if delay is not None:
            self.queue_delay_ewma = _ewma(self.queue_delay_ewma, delay, m.queue_delay_alpha)
        f = -(
            link.weight_loss * loss / link.max_loss
            + link.weight_delay * (delay or 0.0) / link.max_queue_delay_ns
        )
        zscore, change = self._detect_change(f, m)

        for ts_ns, buffer in w.decisions:
            if ts_ns >= self.buffer_since_ns:
                self.buffer_since_ns, self.buffer_bytes = ts_ns, buffer

        window_s = (w.window_end_ns - w.window_start_ns) / 1e9
        throughput = w.bytes * 8 / window_s
        return {
            "link_id": w.link_id,
            "window_start_ns": w.window_start_ns,
            "window_end_ns": w.window_end_ns,
            "rtt_samples": w.rtt_samples,
            "rtt_flows": w.rtt_flows,
            "rtt_hmean_ns": _ns(rtt_hmean),
            "srtt_ns": _ns(self.srtt),
            "rtt_min_ns": min((v for _, v in self.rtt_minima), default=None),
            "long_flows": len(self.long_flows),
            "data_packets": w.data_packets,
            "retransmissions": w.retransmissions,
            "loss_rate": loss,
            "loss_rate_ewma": self.loss_ewma,
            "queue_delay_samples": w.queue_delay_samples,
            "queue_delay_ns": _ns(delay),
            "queue_delay_ewma_ns": _ns(self.queue_delay_ewma),
            "throughput_bps": round(throughput),
            "utilisation": throughput / link.capacity_bps,
            "f": f,
            "zscore": zscore,
            "change": change,
            "buffer_bytes": self.buffer_bytes,
        }

    def _count_long_flows(self, w: WindowSummary, m: MetricsConfig) -> None:
        """N: flows enter on start and leave on end; an RTT sample is a sign of life, and a
        flow without one for the TTL has lost its end event."""
        for ts_ns, kind, key in sorted(w.flow_events):
            if kind == "start":
                self.long_flows.setdefault(key, ts_ns)
            else:
                self.long_flows.pop(key, None)
        for key in w.rtt_flow_keys:
            if key in self.long_flows:
                self.long_flows[key] = w.window_end_ns
        expired = w.window_end_ns - m.long_flow_ttl_ns
        for key in [k for k, seen in self.long_flows.items() if seen < expired]:
            del self.long_flows[key]

    def _detect_change(self, f: float, m: MetricsConfig) -> tuple[float, bool]:
        """Smoothed z-score (Brakel): f against the mean and deviation of the last `lag`
        filtered values; a change enters the filter damped by `influence`."""
        if len(self.filtered_f) < m.zscore_lag:
            self.filtered_f.append(f)
            return 0.0, False
        mean = math.fsum(self.filtered_f) / len(self.filtered_f)
        deviation = math.sqrt(
            math.fsum((x - mean) ** 2 for x in self.filtered_f) / len(self.filtered_f)
        )
        zscore = (f - mean) / max(deviation, Z_DEVIATION_FLOOR)
        change = abs(zscore) > m.zscore_threshold
        previous = self.filtered_f[-1]
        self.filtered_f.popleft()
        self.filtered_f.append(
            m.zscore_influence * f + (1 - m.zscore_influence) * previous if change else f
        )
        return zscore, change


def _ewma(previous: float | None, sample: float, alpha: float) -> float:
    """alpha * previous + (1 - alpha) * sample; the first sample starts it."""
    return sample if previous is None else alpha * previous + (1 - alpha) * sample


def _ns(value: float | None) -> int | None:
    return None if value is None else round(value)
