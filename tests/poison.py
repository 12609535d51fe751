"""Records as a stranger writes them, for the tests that poison the loop's topics: Avro from
any writer (Flink, another client), with none of the p4bs codec's range checks, and a
LinkMetrics window whose f the test picks (NaN, say)."""

from __future__ import annotations

import io
from typing import Any

from fastavro import parse_schema, schemaless_writer

from p4bs_schemas.registry import current_schema


def raw_avro(name: str, record: dict[str, Any]) -> bytes:
    """`record` in the current schema `name`, as any Avro writer writes it."""
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(current_schema(name)), record)
    return out.getvalue()


def metrics_window(link_id: str, end_ns: int, f: float) -> dict[str, Any]:
    """A half-second LinkMetrics window of a busy, loss-free link with performance `f`."""
    return {
        "link_id": link_id, "window_start_ns": end_ns - 500_000_000, "window_end_ns": end_ns,
        "rtt_samples": 10, "rtt_flows": 2, "rtt_hmean_ns": 20_000_000, "srtt_ns": 20_000_000,
        "rtt_min_ns": 19_000_000, "long_flows": 2, "data_packets": 100, "retransmissions": 0,
        "loss_rate": 0.0, "loss_rate_ewma": 0.0, "queue_delay_samples": 10,
        "queue_delay_ns": 1_000_000, "queue_delay_ewma_ns": 1_000_000,
        "throughput_bps": 90_000_000, "utilisation": 0.9, "offered_bps": 90_000_000,
        "offered_utilisation": 0.9, "f": f, "zscore": 0.0, "change": False,
    }  # fmt: skip
