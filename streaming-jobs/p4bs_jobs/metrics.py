"""The metrics job: raw data-plane records in, one LinkMetrics record per link and window out.

Per-sample work runs on the JVM. One tumbling window per link runs over the union of the
RTT batches, the link counters, the flow events and the applied buffer decisions; a Java
aggregate (`FlowRtts`, streaming-jobs/functions) reduces the window's RTT samples per flow
(count, sum, minimum). A batch or a counters record covers [ts_ns - interval_ns, ts_ns) and
lands in the window of that interval (its event time is the interval's last ns, ts_ns - 1,
which windows of whole intervals hold with its start). The links' window rows are then
gathered per group of links, and Python sees one row per group and window
(`LinkGroupFunction`): the sequential EWMA, SRTT, N, z-score and SLA state of each link
(`link_state.LinkState`, `sla.SlaState`), kept in Flink's keyed state so that checkpoints
cover it. SLA alerts come out with their window.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyflink.common import Configuration, Row, Types
from pyflink.datastream import KeyedProcessFunction, OutputTag, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor
from pyflink.table import StatementSet, StreamTableEnvironment, Table, TableResult

from p4bs.config import Config, LinkConfig, MetricsConfig
from p4bs_jobs.flink_env import kafka_table_ddl, stream_table_environment
from p4bs_jobs.link_state import LinkState, WindowSummary
from p4bs_jobs.sla import SlaState
from p4bs_schemas.registry import STREAMS, current_schema

# Links are grouped (by a hash of their id) for the Python stage; a group is the unit of
# keyed state and of parallelism there.
LINK_GROUPS = 64
FLOW_KEY_SQL = (
    "CONCAT(src_ip, ':', CAST(src_port AS STRING), '>', dst_ip, ':', "
    "CAST(dst_port AS STRING), '/', CAST(protocol AS STRING))"
)
# The Java aggregate (streaming-jobs/functions) that reduces a window's RTT batches per flow,
# and the batch columns it reads, with their types as it declares them.
FLOW_RTTS_CLASS = "io.p4bs.flink.FlowRtts"
RTT_BATCH_COLUMNS_SQL = {
    "flows": "ARRAY<ROW<src_ip STRING, dst_ip STRING, src_port INT, dst_port INT, protocol INT>>",
    "flow_index": "ARRAY<INT>",
    "rtt_ns": "ARRAY<BIGINT>",
}


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
    stop_offsets: Mapping[str, Mapping[int, int]] | None = None,
) -> None:
    """Kafka tables for the four input streams, with event time and watermarks; a stream
    named in `stop_offsets` is read up to those offsets (see `stop_at`)."""
    lag = metrics.max_out_of_orderness_ns
    stop_offsets = stop_offsets or {}
    for table, stream, time_ns in (
        # An interval's record is stamped with the interval's last ns: in the same window as
        # its start (windows are whole intervals), and it moves event time to the interval's
        # end, so a window closes one interval sooner than with the start.
        ("rtt_in", "rtt_samples", "ts_ns - 1"),
        ("counters_in", "link_counters", "ts_ns - 1"),
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
                options={**source_options, **stop_at(stop_offsets.get(stream))},
            )
        )


def window_summaries(env: StreamTableEnvironment, window_ns: int) -> Table:
    """One row per group of links and window: the group's `WindowSummary` fields, a row
    per link (`summaries_of`)."""
    size = f"INTERVAL '{window_ns // 1_000_000 / 1000:.3f}' SECOND"
    env.create_java_temporary_system_function("FLOW_RTTS", FLOW_RTTS_CLASS)
    rtt_columns = ", ".join(RTT_BATCH_COLUMNS_SQL)
    no_rtt = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in RTT_BATCH_COLUMNS_SQL.items())
    no_counts = (
        "CAST(NULL AS BIGINT) AS packets, CAST(NULL AS BIGINT) AS nbytes, "
        "CAST(NULL AS BIGINT) AS data_packets, CAST(NULL AS BIGINT) AS retransmissions, "
        "CAST(NULL AS BIGINT) AS qd_n, CAST(NULL AS BIGINT) AS qd_sum"
    )
    rows = f"""
        SELECT link_id, rowtime, {rtt_columns}, {no_counts},
               CAST(NULL AS STRING) AS event, CAST(NULL AS STRING) AS decision
        FROM rtt_in
        UNION ALL
        SELECT link_id, rowtime, {no_rtt}, packets, `bytes`, data_packets,
               retransmissions, queue_delay_samples, queue_delay_sum_ns,
               CAST(NULL AS STRING), CAST(NULL AS STRING)
        FROM counters_in
        UNION ALL
        SELECT link_id, rowtime, {no_rtt}, {no_counts},
               CONCAT(CAST(ts_ns AS STRING), ' ', kind, ' ', {FLOW_KEY_SQL}),
               CAST(NULL AS STRING)
        FROM events_in
        UNION ALL
        SELECT link_id, rowtime, {no_rtt}, {no_counts},
               CAST(NULL AS STRING),
               CONCAT(CAST(ts_ns AS STRING), ' ', CAST(buffer_bytes AS STRING))
        FROM decisions_in WHERE outcome = 'applied' AND queue = 0"""
    env.create_temporary_view("link_rows", env.sql_query(rows))
    per_link = f"""
        SELECT link_id, window_time, FLOW_RTTS({rtt_columns}) AS rtt,
               COALESCE(SUM(packets), 0) AS packets,
               COALESCE(SUM(nbytes), 0) AS `bytes`,
               COALESCE(SUM(data_packets), 0) AS data_packets,
               COALESCE(SUM(retransmissions), 0) AS retransmissions,
               COALESCE(SUM(qd_n), 0) AS queue_delay_samples,
               COALESCE(SUM(qd_sum), 0) AS queue_delay_sum_ns,
               LISTAGG(event, ',') AS flow_events,
               LISTAGG(decision, ',') AS decisions
        FROM TABLE(TUMBLE(TABLE link_rows, DESCRIPTOR(rowtime), {size}))
        GROUP BY link_id, window_start, window_end, window_time"""
    env.create_temporary_view("per_link", env.sql_query(per_link))
    # Python is called once per group of links and window, not once per link: its per-call
    # cost (the crossing and the keyed state) is then paid by many links at once.
    return env.sql_query(f"""
        SELECT MOD(HASH_CODE(link_id), {LINK_GROUPS}) AS link_group, window_start, window_end,
               ARRAY_AGG(ROW(link_id, rtt.samples, rtt.flows, rtt.inverse_sum, rtt.min_ns,
                             rtt.flow_keys, packets, `bytes`, data_packets, retransmissions,
                             queue_delay_samples, queue_delay_sum_ns, flow_events,
                             decisions)) AS links
        FROM TABLE(TUMBLE(TABLE per_link, DESCRIPTOR(window_time), {size}))
        GROUP BY MOD(HASH_CODE(link_id), {LINK_GROUPS}), window_start, window_end""")


_EPOCH = datetime(1970, 1, 1)


def _epoch_ns(moment: datetime) -> int:
    """A window bound as Flink hands it to Python (a naive UTC datetime, ms precision)."""
    since = moment - _EPOCH
    return (since.days * 86_400 + since.seconds) * 1_000_000_000 + since.microseconds * 1000


def _split(text: str | None) -> list[str]:
    return text.split(",") if text else []


def summaries_of(row: Row) -> Iterator[WindowSummary]:
    """The window summaries of one group of links (rows unpacked by position: a Row's
    attribute lookup costs more than the rest of the conversion)."""
    start, end = _epoch_ns(row.window_start), _epoch_ns(row.window_end)
    for link in row.links:
        (
            link_id,
            samples,
            flows,
            inverse_sum,
            rtt_min,
            flow_keys,
            packets,
            nbytes,
            data_packets,
            retransmissions,
            qd_samples,
            qd_sum,
            flow_events,
            decisions,
        ) = link
        events = []
        for item in _split(flow_events):
            ts, kind, key = item.split(" ")
            events.append((int(ts), kind, key))
        applied = []
        for item in _split(decisions):
            ts, buffer = item.split(" ")
            applied.append((int(ts), int(buffer)))
        yield WindowSummary(
            link_id=link_id,
            window_start_ns=start,
            window_end_ns=end,
            rtt_samples=samples,
            rtt_flows=flows,
            rtt_inverse_sum=inverse_sum,
            rtt_min_ns=rtt_min,
            rtt_flow_keys=tuple(_split(flow_keys)),
            packets=packets,
            bytes=nbytes,
            data_packets=data_packets,
            retransmissions=retransmissions,
            queue_delay_samples=qd_samples,
            queue_delay_sum_ns=qd_sum,
            flow_events=tuple(events),
            decisions=tuple(applied),
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


@dataclass
class _LinkStates:
    metrics: LinkState = field(default_factory=LinkState)
    sla: SlaState = field(default_factory=SlaState)


ALERTS = OutputTag("sla_alerts", _row_type("sla_alerts"))


class LinkGroupFunction(KeyedProcessFunction):  # type: ignore[misc]
    """Keyed by link group: one row in holds the window summaries of the group's links; out
    come a LinkMetrics row per link and, on the ALERTS side output, the SLA alerts they
    raise or resolve. The links' states are pickled into Flink's keyed state after every
    window (so checkpoints cover them) and kept in memory between windows; a restarted
    worker starts from what the checkpoint restored. Records of links the config does not
    describe are counted and dropped."""

    def __init__(self, links: Mapping[str, LinkConfig], metrics: MetricsConfig) -> None:
        self.links = dict(links)
        self.metrics = metrics

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor("link_states", Types.PICKLED_BYTE_ARRAY())
        )
        self.unknown_links = runtime_context.get_metrics_group().counter("unknown_links")
        self.groups: dict[int, dict[str, _LinkStates]] = {}

    def process_element(self, value: Row, ctx: KeyedProcessFunction.Context) -> Iterator[Any]:
        group = self.groups.get(value.link_group)
        if group is None:
            stored = self.state.value()
            group = self.groups[value.link_group] = pickle.loads(stored) if stored else {}
        for summary in summaries_of(value):
            link = self.links.get(summary.link_id)
            if link is None:
                self.unknown_links.inc()
                continue
            states = group.get(summary.link_id)
            if states is None:
                states = group[summary.link_id] = _LinkStates()
            record = states.metrics.update(summary, link, self.metrics)
            yield _row("link_metrics", record)
            for alert in states.sla.update(record, link, self.metrics.sla_windows):
                yield ALERTS, _row("sla_alerts", alert)
        self.state.update(pickle.dumps(group))


def build_metrics_job(
    env: StreamTableEnvironment,
    config: Config,
    topics: Mapping[str, str],
    *,
    source_options: Mapping[str, str],
    stop_offsets: Mapping[str, Mapping[int, int]] | None = None,
    transactional_id_prefix: str,
) -> StatementSet:
    """Declares the sources, the SQL, the keyed Python stages and the two sinks (link
    metrics, SLA alerts); returns the statements to execute as one Flink job."""
    env.get_config().set("table.local-time-zone", "UTC")
    bootstrap = config.kafka.bootstrap
    create_sources(env, topics, bootstrap, config.metrics, source_options, stop_offsets)
    for table, stream in (("metrics_out", "link_metrics"), ("alerts_out", "sla_alerts")):
        # Each sink's transactions need their own ids.
        options = exactly_once_sink_options(f"{transactional_id_prefix}.{stream}")
        env.execute_sql(kafka_table_ddl(table, stream, topics[stream], bootstrap, options=options))
    links = {link.id: link for link in config.links}
    metrics = (
        env.to_data_stream(window_summaries(env, config.flink.window_ns))
        .key_by(lambda row: row.link_group, key_type=Types.INT())
        .process(LinkGroupFunction(links, config.metrics), output_type=_row_type("link_metrics"))
    )
    alerts = metrics.get_side_output(ALERTS)
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
    # A window's rows wait in the Python stage's bundle for at most one window, and the
    # sources publish watermarks twice a window (Flink's defaults, 1 s and 200 ms, add up to
    # 1.2 s to when a window's record leaves; each watermark also flushes the window
    # aggregates' buffers, so more often costs throughput).
    window_ms = config.flink.window_ns // 1_000_000
    env.get_config().set("python.fn-execution.bundle.time", str(window_ms))
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
