"""How the metrics job names a flow (its SQL builds the same string, `metrics.FLOW_KEY_SQL`)."""

from __future__ import annotations


def flow_key(src_ip: str, src_port: int, dst_ip: str, dst_port: int, protocol: int) -> str:
    """A flow's key in its data direction: `src:sport>dst:dport/protocol`."""
    return f"{src_ip}:{src_port}>{dst_ip}:{dst_port}/{protocol}"
