"""`p4bs status`: one look at a whole deployment, from its config alone.

Each part of the deployment has a check, a function of the config and the options that
returns a `PartStatus` (its name, healthy or not, a summary line, a details dict):

- kafka: every broker and bootstrap address answers, the config's topics exist with a
  leader for each partition, and each consumer group the project uses (the metrics job's,
  the optimizer's, the InfluxDB sink's, the alert dispatcher's) with its lag per topic;
- flink: the metrics job's state and its last completed checkpoint's age (JobManager REST
  API), or, for the embedded mini cluster, that nothing outside `p4bs jobs run` can see it;
- exporters: the age of each link's newest `link_counters` record;
- optimizer: the members of the optimizer's group and the links each owns, from the newest
  `optimizer_state` record of each link (`owner`, `epoch`);
- routers: each router read through its driver (queue 0 of one of its links' interfaces);
- influxdb: `/ping`, the database, and the points written per second.

Every check is bounded by the options' timeout and its own failures become an unhealthy
result naming what failed (`runner.run_check`); the checks run side by side, each in a thread
of its own, so one stopped part never holds up or crashes the others. Times are ns and sizes
bytes inside, and in the JSON; `render_text` prints human units.

Modules: `runner` (the result, the options, the registry of checks, running them), one per
check (`kafka` with `groups` and `kafka_clients`, `flink`, `exporters`, `optimizer`,
`routers`, `influxdb`), `render` (screen, JSON).
"""

from __future__ import annotations

# Importing the check modules registers their checks in CHECKS.
from p4bs_ops.status import exporters, flink, influxdb, kafka, optimizer, routers
from p4bs_ops.status.groups import (
    ALERT_DISPATCHER_GROUP,
    ALERT_DISPATCHER_STREAMS,
    INFLUX_SINK_GROUP,
    INFLUX_SINK_STREAMS,
    METRICS_STREAMS,
    group_streams,
)
from p4bs_ops.status.render import format_value, render_text, to_json
from p4bs_ops.status.runner import (
    CHECKS,
    METRICS_GROUP,
    METRICS_JOB_MATCH,
    PARTS,
    CheckFailed,
    PartStatus,
    StatusOptions,
    exit_code,
    run_check,
    run_status,
)

__all__ = [
    "ALERT_DISPATCHER_GROUP",
    "ALERT_DISPATCHER_STREAMS",
    "CHECKS",
    "INFLUX_SINK_GROUP",
    "INFLUX_SINK_STREAMS",
    "METRICS_GROUP",
    "METRICS_JOB_MATCH",
    "METRICS_STREAMS",
    "PARTS",
    "CheckFailed",
    "PartStatus",
    "StatusOptions",
    "exit_code",
    "exporters",
    "flink",
    "format_value",
    "group_streams",
    "influxdb",
    "kafka",
    "optimizer",
    "render_text",
    "routers",
    "run_check",
    "run_status",
    "to_json",
]
