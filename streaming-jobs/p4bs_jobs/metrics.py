"""The metrics job: raw data-plane records in, one LinkMetrics record per link and window out.

Per-sample work is Flink SQL on the JVM. The RTT batches are unnested and reduced per flow
and window (count, sum, minimum), the flows then per link and window, in one tumbling
window over the union of those flow rows with the link counters, the flow events and the
applied buffer decisions. Each record lands in the window of its *interval start*: a batch
or a counters record covers [ts_ns - interval_ns, ts_ns). Python then sees one row per
link and window (`link_state.LinkState`): the sequential EWMA, SRTT, N and z-score state,
kept in Flink's keyed state so that checkpoints cover it. The SLA stage (`sla.SlaState`)
follows on the metrics stream in the same job, so alerts come out with their window.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pyflink.common import Configuration, Row, Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor
from pyflink.table import StatementSet, StreamTableEnvironment, Table, TableResult

from p4bs.config import Config, LinkConfig, MetricsConfig
from p4bs_jobs.flink_env import kafka_table_ddl, stream_table_environment
from p4bs_jobs.link_state import LinkState, WindowSummary
from p4bs_jobs.sla import SlaState
from p4bs_schemas.registry import STREAMS, current_schema

T = TypeVar("T")

FLOW_KEY_SQL = (
    "CONCAT(src_ip, ':', CAST(src_port AS STRING), '>', dst_ip, ':', "
    "CAST(dst_port AS STRING), '/', CAST(protocol AS STRING))"
)
SAMPLE_FIELDS = "s_ts_ns, src_ip, dst_ip, src_port, dst_port, protocol, rtt_ns"


def _rowtime(column_ns: str, out_of_orderness_ns: int) -> tuple[str, ...]:
    """An event-time column at ms precision (Flink's) from a ns column, and its watermark.
    Windows are whole ms, so flooring to the ms keeps every record in its window."""
    seconds = f"{out_of_orderness_ns // 1_000_000 / 1000:.3f}"
    return (
        f"rowtime AS TO_TIMESTAMP_LTZ(CAST(({column_ns}) / 1000000 AS BIGINT), 3)",
        f"WATERMARK FOR rowtime AS rowtime - INTERVAL '{seconds}' SECOND",
    )


def create_sources(
    env: StreamTableEnvironment,
    topics: Mapping[str, str],
    bootstrap: str,
    metrics: MetricsConfig,
    source_options: Mapping[str, str],
) -> None:
    """Kafka tables for the four input streams, with event time and watermarks."""
    lag = metrics.max_out_of_orderness_ns
    for table, stream, time_ns in (
        ("rtt_in", "rtt_samples", "ts_ns - interval_ns"),
        ("counters_in", "link_counters", "ts_ns - interval_ns"),
        ("events_in", "flow_events", "ts_ns"),
        ("decisions_in", "buffer_decisions", "ts_ns"),
    ):
        env.execute_sql(
            kafka_table_ddl(
                table,
                stream,
                topics[stream],
                bootstrap,
                extra_columns=_rowtime(time_ns, lag),
                options=source_options,
            )
        )


def window_summaries(env: StreamTableEnvironment, window_ns: int) -> Table:
    """One row per link and window with everything `WindowSummary` holds."""
    size = f"INTERVAL '{window_ns // 1_000_000 / 1000:.3f}' SECOND"
    rtt_flat = f"""
        SELECT link_id, rowtime, src_ip, dst_ip, src_port, dst_port, protocol, rtt_ns
        FROM rtt_in CROSS JOIN UNNEST(samples) AS s({SAMPLE_FIELDS})"""
    env.create_temporary_view("rtt_flat", env.sql_query(rtt_flat))
    per_flow = f"""
        SELECT link_id, window_time AS rowtime, {FLOW_KEY_SQL} AS flow,
               COUNT(*) AS n, SUM(rtt_ns) AS total, MIN(rtt_ns) AS lo
        FROM TABLE(TUMBLE(TABLE rtt_flat, DESCRIPTOR(rowtime), {size}))
        GROUP BY link_id, window_start, window_end, window_time,
                 src_ip, src_port, dst_ip, dst_port, protocol"""
    env.create_temporary_view("rtt_per_flow", env.sql_query(per_flow))
    nothing = (
        "CAST(NULL AS BIGINT) AS n, CAST(NULL AS DOUBLE) AS inverse, CAST(NULL AS BIGINT) AS lo, "
        "CAST(NULL AS STRING) AS flow"
    )
    no_counts = (
        "CAST(NULL AS BIGINT) AS packets, CAST(NULL AS BIGINT) AS nbytes, "
        "CAST(NULL AS BIGINT) AS data_packets, CAST(NULL AS BIGINT) AS retransmissions, "
        "CAST(NULL AS BIGINT) AS qd_n, CAST(NULL AS BIGINT) AS qd_sum"
    )
    rows = f"""
        SELECT link_id, rowtime, n, CAST(n AS DOUBLE) / total AS inverse, lo, flow,
               {no_counts}, CAST(NULL AS STRING) AS event, CAST(NULL AS STRING) AS decision
        FROM rtt_per_flow
        UNION ALL
        SELECT link_id, rowtime, {nothing}, packets, `bytes`, data_packets, retransmissions,
               queue_delay_samples, queue_delay_sum_ns,
               CAST(NULL AS STRING), CAST(NULL AS STRING)
        FROM counters_in
        UNION ALL
        SELECT link_id, rowtime, {nothing}, {no_counts},
               CONCAT(CAST(ts_ns AS STRING), ' ', kind, ' ', {FLOW_KEY_SQL}),
               CAST(NULL AS STRING)
        FROM events_in
        UNION ALL
        SELECT link_id, rowtime, {nothing}, {no_counts},
               CAST(NULL AS STRING),
               CONCAT(CAST(ts_ns AS STRING), ' ', CAST(buffer_bytes AS STRING))
        FROM decisions_in WHERE outcome = 'applied' AND queue = 0"""
    env.create_temporary_view("link_rows", env.sql_query(rows))
    return env.sql_query(f"""
        SELECT link_id, window_start, window_end,
               COALESCE(SUM(n), 0) AS rtt_samples,
               CAST(COUNT(flow) AS INT) AS rtt_flows,
               COALESCE(SUM(inverse), 0.0) AS rtt_inverse_sum,
               MIN(lo) AS rtt_min_ns,
               LISTAGG(flow, ',') AS rtt_flow_keys,
               COALESCE(SUM(packets), 0) AS packets,
               COALESCE(SUM(nbytes), 0) AS `bytes`,
               COALESCE(SUM(data_packets), 0) AS data_packets,
               COALESCE(SUM(retransmissions), 0) AS retransmissions,
               COALESCE(SUM(qd_n), 0) AS queue_delay_samples,
               COALESCE(SUM(qd_sum), 0) AS queue_delay_sum_ns,
               LISTAGG(event, ',') AS flow_events,
               LISTAGG(decision, ',') AS decisions
        FROM TABLE(TUMBLE(TABLE link_rows, DESCRIPTOR(rowtime), {size}))
        GROUP BY link_id, window_start, window_end""")


_EPOCH = datetime(1970, 1, 1)


def _epoch_ns(moment: datetime) -> int:
    """A window bound as Flink hands it to Python (a naive UTC datetime, ms precision)."""
    since = moment - _EPOCH
    return (since.days * 86_400 + since.seconds) * 1_000_000_000 + since.microseconds * 1000


def _split(text: str | None) -> list[str]:
    return text.split(",") if text else []


def summary_of(row: Row) -> WindowSummary:
    events = []
    for item in _split(row.flow_events):
        ts, kind, key = item.split(" ")
        events.append((int(ts), kind, key))
    decisions = []
    for item in _split(row.decisions):
        ts, buffer = item.split(" ")
        decisions.append((int(ts), int(buffer)))
    return WindowSummary(
        link_id=row.link_id,
        window_start_ns=_epoch_ns(row.window_start),
        window_end_ns=_epoch_ns(row.window_end),
        rtt_samples=row.rtt_samples,
        rtt_flows=row.rtt_flows,
        rtt_inverse_sum=row.rtt_inverse_sum,
        rtt_min_ns=row.rtt_min_ns,
        rtt_flow_keys=tuple(_split(row.rtt_flow_keys)),
        packets=row.packets,
        bytes=row.bytes,
        data_packets=row.data_packets,
        retransmissions=row.retransmissions,
        queue_delay_samples=row.queue_delay_samples,
        queue_delay_sum_ns=row.queue_delay_sum_ns,
        flow_events=tuple(events),
        decisions=tuple(decisions),
    )


_FLINK_TYPES = {
    "string": Types.STRING,
    "long": Types.LONG,
    "int": Types.INT,
    "double": Types.DOUBLE,
    "boolean": Types.BOOLEAN,
}


def _row_type(stream: str) -> Any:
    """The Flink row type of a stream's records (Avro field order and types)."""
    fields = current_schema(STREAMS[stream])["fields"]
    names = [f["name"] for f in fields]
    types = []
    for f in fields:
        avro = f["type"][1] if isinstance(f["type"], list) else f["type"]
        types.append(_FLINK_TYPES[avro]())
    return Types.ROW_NAMED(names, types)


def _row(stream: str, record: dict[str, Any]) -> Row:
    return Row(*(record[f["name"]] for f in current_schema(STREAMS[stream])["fields"]))


class _PerLinkFunction(KeyedProcessFunction):  # type: ignore[misc]
    """Keyed by link, with the link's state pickled in Flink's keyed state (so checkpoints
    cover it); records of links the config does not describe are counted and dropped."""

    def __init__(self, links: Mapping[str, LinkConfig], metrics: MetricsConfig) -> None:
        self.links = dict(links)
        self.metrics = metrics

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor("link_state", Types.PICKLED_BYTE_ARRAY())
        )
        self.unknown_links = runtime_context.get_metrics_group().counter("unknown_links")

    def _load(self, new: type[T]) -> T:
        stored = self.state.value()
        return pickle.loads(stored) if stored is not None else new()


class LinkMetricsFunction(_PerLinkFunction):
    """One window summary in, one LinkMetrics row out."""

    def process_element(self, value: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        link = self.links.get(value.link_id)
        if link is None:
            self.unknown_links.inc()
            return
        state = self._load(LinkState)
        record = state.update(summary_of(value), link, self.metrics)
        self.state.update(pickle.dumps(state))
        yield _row("link_metrics", record)


class SlaFunction(_PerLinkFunction):
    """One LinkMetrics row in, the SLA alerts it raises or resolves out."""

    def process_element(self, value: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Row]:
        link = self.links[value.link_id]  # LinkMetricsFunction passed only known links
        state = self._load(SlaState)
        alerts = state.update(value.as_dict(), link, self.metrics.sla_windows)
        self.state.update(pickle.dumps(state))
        for alert in alerts:
            yield _row("sla_alerts", alert)


def build_metrics_job(
    env: StreamTableEnvironment,
    config: Config,
    topics: Mapping[str, str],
    *,
    source_options: Mapping[str, str],
    transactional_id_prefix: str,
) -> StatementSet:
    """Declares the sources, the SQL, the keyed Python stages and the two sinks (link
    metrics, SLA alerts); returns the statements to execute as one Flink job."""
    env.get_config().set("table.local-time-zone", "UTC")
    bootstrap = config.kafka.bootstrap
    create_sources(env, topics, bootstrap, config.metrics, source_options)
    for table, stream in (("metrics_out", "link_metrics"), ("alerts_out", "sla_alerts")):
        # Each sink's transactions need their own ids.
        options = exactly_once_sink_options(f"{transactional_id_prefix}.{stream}")
        env.execute_sql(kafka_table_ddl(table, stream, topics[stream], bootstrap, options=options))
    links = {f"{link.router}:{link.interface}": link for link in config.links}
    metrics = (
        env.to_data_stream(window_summaries(env, config.flink.window_ns))
        .key_by(lambda row: row.link_id, key_type=Types.STRING())
        .process(LinkMetricsFunction(links, config.metrics), output_type=_row_type("link_metrics"))
    )
    alerts = metrics.key_by(lambda row: row.link_id, key_type=Types.STRING()).process(
        SlaFunction(links, config.metrics), output_type=_row_type("sla_alerts")
    )
    statements = env.create_statement_set()
    statements.add_insert("metrics_out", env.from_data_stream(metrics))
    statements.add_insert("alerts_out", env.from_data_stream(alerts))
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
) -> TableResult:
    """Submits the metrics job (embedded or remote, as `conf` says) and returns at once;
    `.wait()` on the result blocks until a bounded job has read everything."""
    env = stream_table_environment(conf)
    if not bounded:
        # A live topic (or partition) without records must not hold event time back forever.
        idle_ms = config.metrics.source_idle_timeout_ns // 1_000_000
        env.get_config().set("table.exec.source.idle-timeout", f"{idle_ms} ms")
    statements = build_metrics_job(
        env,
        config,
        topics,
        source_options=source_options(group_id, bounded=bounded),
        transactional_id_prefix=group_id,
    )
    return statements.execute()
