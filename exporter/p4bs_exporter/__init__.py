"""The exporter: a data plane's records into Kafka, behind one interface for every target.

`Target` is what a target provides, `ExporterStats` its counters (the stats file's fields);
`ModelTarget` supervises the Rust `p4bs-exporter` for the software data plane and
`run_spec` builds its spec from the deployment config. A `tofino` target (bfrt_grpc) will
implement the same `Target` (exporter/README.md says what it must provide).
"""

from p4bs_exporter.model_target import ModelTarget, run_spec
from p4bs_exporter.target import (
    EXPORTED_STREAMS,
    ExporterError,
    ExporterStats,
    SpecError,
    Target,
)

__all__ = [
    "EXPORTED_STREAMS",
    "ExporterError",
    "ExporterStats",
    "ModelTarget",
    "SpecError",
    "Target",
    "run_spec",
]
