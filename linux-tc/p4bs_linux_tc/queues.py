"""How p4bs lays out a Linux router's output queues, for everything that builds, serves or
changes them (the testbed, the router agent, the linux-tc driver).

Each managed interface has an htb root `1:`; queue k is htb class `1:<QUEUE_CLASS_BASE + k>`
feeding a bfifo with handle `<QUEUE_CLASS_BASE + k>:`, whose byte limit is the queue's buffer.
"""

from __future__ import annotations

QUEUE_CLASS_BASE = 0x10
MTU_FRAME = 1514
MIN_BUFFER_BYTES = MTU_FRAME  # one full frame: a smaller FIFO could never hold a packet
HTB_BURST_NS = 5_000_000


def htb_shaping(rate_bps: int, ceil_bps: int) -> str:
    """tc arguments of an htb class guaranteed `rate_bps`, borrowing up to `ceil_bps`.

    Its bucket holds HTB_BURST_NS of the ceiling: a shaper woken late by a busy CPU catches up
    instead of losing the link's capacity (tc's default burst is a few frames; measured here,
    a full 200 ms queue then drained at 69% of the link).
    """
    burst = max(ceil_bps * HTB_BURST_NS // 8_000_000_000, 4 * MTU_FRAME)
    return (
        f"htb rate {rate_bps}bit ceil {ceil_bps}bit burst {burst} cburst {burst} "
        f"quantum {MTU_FRAME}"
    )
