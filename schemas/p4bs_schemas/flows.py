"""How a flow is named across streams: the metrics job writes these keys into LinkMetrics
(its SQL builds the same string, `p4bs_jobs.metrics.FLOW_KEY_SQL`) and the optimizer reads them."""

from __future__ import annotations


def flow_key(src_ip: str, src_port: int, dst_ip: str, dst_port: int, protocol: int) -> str:
    """A flow's key in its data direction: `src:sport>dst:dport/protocol`."""
    return f"{src_ip}:{src_port}>{dst_ip}:{dst_port}/{protocol}"
