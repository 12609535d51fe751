"""A simulated link for optimizer tests: LinkMetrics windows, one per 100 ms of wall clock,
whose queueing delay, loss and f follow the buffer the real router holds (read from the
kernel every window), so the optimizer's decisions change what it measures next.

The model: the bottleneck's queue sits full (long flows fill any buffer), so the queueing
delay is buffer / capacity; losses fall off exponentially with the buffer,
p = p0 * exp(-buffer / loss_scale_bytes). f = -(w1 * p / p_hat + w2 * d / d_hat) with the
link's weights and SLA bounds, as the metrics job computes it, plus Gaussian noise of
standard deviation `f_noise` per window (seeded). `base_rtt_ns` may be changed while the
link runs (a path change): the next window has the new SRTT.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from p4bs.bus import RecordProducer
from p4bs.config import LinkConfig

WINDOW_NS = 100_000_000


@dataclass
class LinkModel:
    base_rtt_ns: int = 20_000_000
    long_flows: int = 50
    p0: float = 0.05
    loss_scale_bytes: float = 60_000.0
    f_noise: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def f(self, link: LinkConfig, buffer: int) -> float:
        """f without noise at `buffer` bytes, as the metrics job computes it."""
        delay_ns = int(buffer * 8e9 / link.capacity_bps)
        loss = self.p0 * math.exp(-buffer / self.loss_scale_bytes)
        return -sum(link.f_terms(loss, delay_ns))

    def window(self, link: LinkConfig, buffer: int, end_ns: int) -> dict[str, object]:
        delay_ns = int(buffer * 8e9 / link.capacity_bps)
        loss = self.p0 * math.exp(-buffer / self.loss_scale_bytes)
        f = self.f(link, buffer) + (self.rng.gauss(0.0, self.f_noise) if self.f_noise else 0.0)
        rtt = self.base_rtt_ns + delay_ns
        data_packets = 833  # 100 Mbit/s of 1500 B packets for 100 ms
        return {
            "link_id": link.id,
            "window_start_ns": end_ns - WINDOW_NS,
            "window_end_ns": end_ns,
            "rtt_samples": 400,
            "rtt_flows": self.long_flows,
            "rtt_hmean_ns": rtt,
            "srtt_ns": rtt,
            "rtt_min_ns": self.base_rtt_ns,
            "long_flows": self.long_flows,
            "data_packets": data_packets,
            "retransmissions": round(loss * data_packets),
            "loss_rate": loss,
            "loss_rate_ewma": loss,
            "queue_delay_samples": 400,
            "queue_delay_ns": delay_ns,
            "queue_delay_ewma_ns": delay_ns,
            "throughput_bps": link.capacity_bps,
            "utilisation": 1.0,
            "f": f,
            "zscore": 0.0,
            "change": False,
        }


class SimulatedLink:
    """Produces the link's windows in a thread until `stop`; `paused` holds them back (the
    metrics going stale). `router_buffer` reads the buffer in force from the router;
    `on_sent`, if given, is called with each window once it is delivered to Kafka."""

    def __init__(
        self,
        link: LinkConfig,
        producer: RecordProducer,
        router_buffer: Callable[[], int],
        model: LinkModel | None = None,
        on_sent: Callable[[dict[str, object]], None] | None = None,
    ) -> None:
        self.link = link
        self.producer = producer
        self.router_buffer = router_buffer
        self.model = model or LinkModel()
        self.on_sent = on_sent
        self.windows = 0
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"simlink-{link.id}")

    def __enter__(self) -> SimulatedLink:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.producer.flush(10)

    def _run(self) -> None:
        end_ns = (time.time_ns() // WINDOW_NS + 1) * WINDOW_NS
        while not self._stop.is_set():
            # Windows come out when they end, as the metrics job's do.
            self._stop.wait(max(0.0, (end_ns - time.time_ns()) / 1e9))
            if not self.paused.is_set():
                record = self.model.window(self.link, self.router_buffer(), end_ns)
                self.producer.produce("link_metrics", record)
                self.producer.flush(5)
                self.windows += 1
                if self.on_sent is not None:
                    self.on_sent(record)
            end_ns += WINDOW_NS
