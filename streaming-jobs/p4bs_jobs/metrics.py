"""The metrics job: raw data-plane records in, one LinkMetrics record per link and window out.

Everything runs on the JVM. One tumbling window per link runs over the union of the link
interval records (LinkCounters v3: an export interval's counters, flow events and RTT
samples in one record, so that one stream drives event time) and the links topic's LinkSpec
records (links as data, core/p4bs/links.py); a Java aggregate
(`IntervalSummary`, streaming-jobs/functions) sums a window's interval records: the counts,
the flow events and the RTT samples per flow (count, sum, minimum). A record covers
[ts_ns - interval_ns, ts_ns) and lands in the window of that interval (its event time is the
interval's last ns, ts_ns - 1, which windows of whole intervals hold with its start). The
links' window rows then go through a second Java aggregate (`LinkMetrics`) as an OVER
aggregate per link in window order: the sequential SRTT, RTT minimum, N, EWMAs, f, z-score
and SLA state of each link live in Flink's keyed state, so checkpoints cover them. SLA alerts
come out with their window. A LinkSpec record sets its link's capacity, weights and SLA
bounds (or removes it) from the window its ts_ns falls in, over the config's: a link is
added, changed or removed without restarting the job. Both topics are read as raw bytes and
decoded by Java functions that check each record and count and pass over a bad one (garbage,
a record cut short, NaN or a zero capacity): no bytes on either topic stop the job. Values
cross from SQL to Java as numbers, rows and arrays, never as text to split.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from pyflink.common import Configuration
from pyflink.table import StatementSet, StreamTableEnvironment, TableResult

from p4bs.bus import Cluster
from p4bs.config import Config, MetricsConfig
from p4bs_jobs.flink_env import kafka_table_ddl, stream_table_environment
from p4bs_schemas.registry import STREAMS, current_schema

# The interval records are read as raw bytes (Flink's avro format spent a quarter of the job
# boxing RTT samples): a Java function (streaming-jobs/functions) gives a record's event time,
# and a Java aggregate sums a window's records.
INTERVAL_TIME_CLASS = "io.p4bs.flink.IntervalTime"
INTERVAL_SUMMARY_CLASS = "io.p4bs.flink.IntervalSummary"
INTERVAL_COLUMN = "record"
# The links topic, raw too: a Java function checks a record whole for its event time (a bad
# one gets 0 and is dropped), and a Java aggregate gives a window's newest spec as a row.
LINK_SPEC_TIME_CLASS = "io.p4bs.flink.LinkSpecTime"
NEWEST_LINK_SPEC_CLASS = "io.p4bs.flink.NewestLinkSpec"
SPEC_COLUMN = "spec"
# The Java aggregate that carries each link's state from window to window, and the job
# parameter it reads the links and the metrics settings from.
LINK_METRICS_CLASS = "io.p4bs.flink.LinkMetrics"
LINK_METRICS_PARAMETER = "p4bs.link-metrics"


# The links topic's watermark trails its records by a day: a spec never moves the job's event
# time on, so a spec read ahead of the interval records (a spec takes effect `--lead` later
# than it is applied) cannot make them late if their source goes quiet for a moment. While
# the links source reads (until it has been idle for `metrics.source_idle_timeout`) the
# windows wait for it.
SPEC_WATERMARK_LAG = "INTERVAL '1' DAY"


def _rowtime(time_ms_sql: str, watermark_lag_sql: str) -> tuple[str, ...]:
    """An event-time column at ms precision (Flink's) from a ms expression, and its
    watermark. Windows are whole ms, so flooring to the ms keeps every record in its window."""
    return (
        f"rowtime AS TO_TIMESTAMP_LTZ({time_ms_sql}, 3)",
        f"WATERMARK FOR rowtime AS rowtime - {watermark_lag_sql}",
    )


def create_sources(
    env: StreamTableEnvironment,
    topics: Mapping[str, str],
    cluster: Cluster,
    metrics: MetricsConfig,
    source_options: Mapping[str, str],
    stop_offsets: Mapping[str, Mapping[int, int]] | None = None,
) -> None:
    """Kafka tables for the two input streams, raw bytes, with event time and watermarks; a
    stream named in `stop_offsets` is read up to those offsets (see `stop_at`). The links
    topic is read from its start whenever the job starts afresh (from a checkpoint, where it
    was): the keyed state that holds a link's settings is new then, and a compacted topic
    holds each link's newest spec only from its start. So a bad record on it would be read at
    every fresh start: LINK_SPEC_TIME checks every record, and one that fails gets time 0,
    counted and dropped like a bad interval record."""
    lag = f"INTERVAL '{metrics.max_out_of_orderness_ns // 1_000_000 / 1000:.3f}' SECOND"
    stop_offsets = stop_offsets or {}
    env.create_java_temporary_system_function("INTERVAL_TIME", INTERVAL_TIME_CLASS)
    env.create_java_temporary_system_function("LINK_SPEC_TIME", LINK_SPEC_TIME_CLASS)
    for table, stream, time_ms, raw_value, watermark_lag in (
        # An interval's record is stamped with the interval's last ns: in the same window as
        # its start (windows are whole intervals), and it moves event time to the interval's
        # end, so a window closes one interval sooner than with the start. A record that
        # does not decode is stamped 0 (counted, then dropped in `declare_link_windows`); so
        # is a links record that does not pass LINK_SPEC_TIME's checks.
        (
            "intervals_in",
            "link_counters",
            f"INTERVAL_TIME({INTERVAL_COLUMN})",
            INTERVAL_COLUMN,
            lag,
        ),
        (
            "links_in",
            "links",
            f"LINK_SPEC_TIME(link_id, {SPEC_COLUMN})",
            SPEC_COLUMN,
            SPEC_WATERMARK_LAG,
        ),
    ):
        startup = {"scan.startup.mode": "earliest-offset"} if stream == "links" else {}
        env.execute_sql(
            kafka_table_ddl(
                table,
                stream,
                topics[stream],
                cluster,
                raw_value=raw_value,
                extra_columns=_rowtime(time_ms, watermark_lag),
                options={**source_options, **startup, **stop_at(stop_offsets.get(stream))},
            )
        )


def declare_link_windows(env: StreamTableEnvironment, window_ns: int) -> None:
    """The view `per_link`: one row per link and window, its records reduced (the interval
    records' counts, flow events and RTT per flow; the newest link spec as a row, and whether
    the specs were all there was)."""
    size = f"INTERVAL '{window_ns // 1_000_000 / 1000:.3f}' SECOND"
    env.create_java_temporary_system_function("INTERVAL_SUMMARY", INTERVAL_SUMMARY_CLASS)
    env.create_java_temporary_system_function("NEWEST_LINK_SPEC", NEWEST_LINK_SPEC_CLASS)
    record, spec = INTERVAL_COLUMN, SPEC_COLUMN
    rows = f"""
        SELECT link_id, rowtime, {record}, CAST(NULL AS BYTES) AS {spec}
        FROM intervals_in WHERE rowtime > TO_TIMESTAMP_LTZ(0, 3)
        UNION ALL
        SELECT link_id, rowtime, CAST(NULL AS BYTES) AS {record}, {spec}
        FROM links_in WHERE rowtime > TO_TIMESTAMP_LTZ(0, 3)"""
    env.create_temporary_view("link_rows", env.sql_query(rows))
    per_link = f"""
        SELECT link_id, window_start, window_end, window_time,
               INTERVAL_SUMMARY({record}) AS w,
               NEWEST_LINK_SPEC(link_id, {spec}) AS link_spec,
               COUNT({spec}) = COUNT(*) AS specs_only
        FROM TABLE(TUMBLE(TABLE link_rows, DESCRIPTOR(rowtime), {size}))
        GROUP BY link_id, window_start, window_end, window_time"""
    env.create_temporary_view("per_link", env.sql_query(per_link))


def declare_link_metrics(env: StreamTableEnvironment, config: Config) -> None:
    """The view `link_metrics_rows`: per link and window, `LinkMetrics`'s output (the
    metrics and the SLA alerts the window raises or resolves) for the links the config or
    the links topic describe."""
    env.get_config().set(
        "pipeline.global-job-parameters",
        f"{LINK_METRICS_PARAMETER}:{link_metrics_parameter(config)}",
    )
    env.create_java_temporary_system_function("LINK_METRICS", LINK_METRICS_CLASS)
    # Window order per link is event-time order: each window's row reaches the aggregate
    # before the watermark that closed the window, so none is late.
    env.create_temporary_view(
        "link_metrics_rows",
        env.sql_query("""
            SELECT link_id, m.*
            FROM (
                SELECT link_id, LINK_METRICS(
                    link_id, window_start, window_end, w.samples, w.flows, w.inverse_sum,
                    w.min_ns, w.flow_keys, w.`bytes`, w.after_bytes, w.data_packets,
                    w.retransmissions, w.queue_delay_samples, w.queue_delay_sum_ns,
                    w.flow_events, link_spec, specs_only
                ) OVER (PARTITION BY link_id ORDER BY window_time
                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS m
                FROM per_link)
            WHERE m.known"""),
    )


def link_metrics_parameter(config: Config) -> str:
    """The config's links (with each one's policy) and the metrics and optimizer feed
    settings as `LinkMetrics` reads them (the links topic's records override a link's from
    their window on): base64 (a job parameter value must not hold ':' or ',') of
    tab-separated lines; floats in repr, which Java parses back to the same double; the
    feed's thinned policies joined by ',' (a policy name holds none)."""
    m = config.metrics
    settings = (
        m.srtt_alpha,
        m.loss_alpha,
        m.queue_delay_alpha,
        m.rtt_min_horizon_ns,
        m.long_flow_ttl_ns,
        m.zscore_lag,
        m.zscore_threshold,
        m.zscore_influence,
        m.sla_windows,
    )
    lines = [
        "\t".join(["metrics", *map(repr, settings)]),
        "\t".join(
            ["feed", repr(m.feed_deadband), repr(m.feed_heartbeat_ns), ",".join(m.feed_policies)]
        ),
    ]
    for link in config.links:
        values = (
            link.capacity_bps,
            link.weight_loss,
            link.weight_delay,
            link.max_loss,
            link.max_queue_delay_ns,
        )
        lines.append("\t".join(["link", link.id, *map(repr, values), link.policy]))
    return base64.b64encode("\n".join(lines).encode()).decode()


def build_metrics_job(
    env: StreamTableEnvironment,
    config: Config,
    topics: Mapping[str, str],
    *,
    source_options: Mapping[str, str],
    stop_offsets: Mapping[str, Mapping[int, int]] | None = None,
    transactional_id_prefix: str,
) -> StatementSet:
    """Declares the sources, the SQL and the sinks (link metrics, SLA alerts, and with
    [metrics] optimizer_feed the optimizer feed); returns the statements to execute as one
    Flink job (the planner shares the views between the sinks)."""
    env.get_config().set("table.local-time-zone", "UTC")
    create_sources(env, topics, config.kafka, config.metrics, source_options, stop_offsets)
    sinks = [("metrics_out", "link_metrics"), ("alerts_out", "sla_alerts")]
    if config.metrics.optimizer_feed:
        sinks.append(("feed_out", "optimizer_feed"))
    for table, stream in sinks:
        # Each sink's transactions need their own ids.
        options = exactly_once_sink_options(f"{transactional_id_prefix}.{stream}")
        env.execute_sql(
            kafka_table_ddl(table, stream, topics[stream], config.kafka, options=options)
        )
    declare_link_windows(env, config.flink.window_ns)
    declare_link_metrics(env, config)
    metrics_columns = ", ".join(
        f"`{f['name']}`" for f in current_schema(STREAMS["link_metrics"])["fields"]
    )
    alerts = " UNION ALL ".join(
        f"""SELECT link_id, window_end_ns, {kind}_alert_id, {kind}_alert, '{name}',
                   {kind}_value, {kind}_bound, {config.metrics.sla_windows}
            FROM link_metrics_rows WHERE {kind}_alert IS NOT NULL"""
        for kind, name in (("delay", "queue_delay"), ("loss", "loss"))
    )
    statements = env.create_statement_set()
    statements.add_insert_sql(
        f"INSERT INTO metrics_out SELECT {metrics_columns} FROM link_metrics_rows"
    )
    statements.add_insert_sql(f"INSERT INTO alerts_out {alerts}")
    if config.metrics.optimizer_feed:
        # The same records, keyed by link (the same partitions as link_metrics), of the
        # windows LinkMetrics marks for the feed (OptimizerFeed).
        statements.add_insert_sql(
            f"INSERT INTO feed_out SELECT {metrics_columns} FROM link_metrics_rows WHERE feed"
        )
    return statements


def source_options(group_id: str, *, bounded: bool) -> dict[str, str]:
    """Reads from the group's committed offsets (the earliest without them); `bounded`
    stops at the offsets that were the latest when the job started (replays, tests)."""
    options = {
        "properties.group.id": group_id,
        "scan.startup.mode": "group-offsets",
        "properties.auto.offset.reset": "earliest",
    }
    if bounded:
        options["scan.bounded.mode"] = "latest-offset"
    return options


def stop_at(offsets: Mapping[int, int] | None) -> dict[str, str]:
    """Source options that end a bounded read of a topic at the given offset of each
    partition (every partition of the topic must be named), whether or not the records up
    to it have been written yet: a replay of an exact range of the log."""
    if not offsets:
        return {}
    return {
        "scan.bounded.mode": "specific-offsets",
        "scan.bounded.specific-offsets": ";".join(
            f"partition:{p},offset:{offset}" for p, offset in sorted(offsets.items())
        ),
    }


def exactly_once_sink_options(transactional_id_prefix: str) -> dict[str, str]:
    """Kafka transactions committed with each checkpoint: consumers that read committed
    data see every window once, even across a crash and a restart from a checkpoint."""
    return {
        "sink.delivery-guarantee": "exactly-once",
        "sink.transactional-id-prefix": transactional_id_prefix,
        "properties.transaction.timeout.ms": "600000",
    }


def run_metrics_job(
    config: Config,
    topics: Mapping[str, str],
    conf: Configuration,
    *,
    group_id: str = "p4bs-metrics",
    bounded: bool = False,
    stop_offsets: Mapping[str, Mapping[int, int]] | None = None,
) -> TableResult:
    """Submits the metrics job (embedded or remote, as `conf` says) and returns at once;
    `.wait()` on the result blocks until a bounded job has read everything. A bounded job
    reads each stream up to the offsets that were the latest when it started, or, for the
    streams in `stop_offsets` (stream -> partition -> offset), up to those."""
    if stop_offsets and not bounded:
        raise ValueError("stop offsets end a bounded run; the job is unbounded")
    env = stream_table_environment(conf)
    # The sources publish watermarks twice a window (Flink's default, 200 ms, would hold a
    # 100 ms window's record up to 200 ms longer; each watermark also flushes the window
    # aggregates' buffers, so more often costs throughput).
    window_ms = config.flink.window_ns // 1_000_000
    env.get_config().set("pipeline.auto-watermark-interval", f"{max(window_ms // 2, 1)} ms")
    if not bounded:
        # A live topic (or partition) without records must not hold event time back forever.
        idle_ms = config.metrics.source_idle_timeout_ns // 1_000_000
        env.get_config().set("table.exec.source.idle-timeout", f"{idle_ms} ms")
    statements = build_metrics_job(
        env,
        config,
        topics,
        source_options=source_options(group_id, bounded=bounded),
        stop_offsets=stop_offsets,
        transactional_id_prefix=group_id,
    )
    return statements.execute()
