"""The metrics job on the recorded replay against an independent computation (replay.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyflink.table import EnvironmentSettings, TableEnvironment
from replay import assert_windows_match, config_for, consume, decisions, expected, produce, replay

from p4bs_infra.stack import Stack
from p4bs_jobs.flink_env import flink_configuration
from p4bs_jobs.metrics import FLOW_RTTS_CLASS, RTT_BATCH_COLUMNS_SQL, run_metrics_job


def test_every_window_matches_an_independent_computation(
    stack: Stack, topics: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    records = replay()
    config = config_for(repo, stack.kafka.bootstrap)
    made = decisions(min(r["ts_ns"] for r in records))
    want = expected(records, made, config)
    assert sum(e["long_flows"] > 0 for e in want) > 20  # the replay exercises every part
    assert any(e["retransmissions"] for e in want) and any(e["change"] for e in want)
    produce(stack.kafka.bootstrap, topics, records, made)

    conf = flink_configuration(
        checkpoint_interval_ns=1_000_000_000, checkpoint_dir=tmp_path / "checkpoints"
    )
    run_metrics_job(config, topics, conf, group_id="metrics-test", bounded=True).wait(300_000)

    assert_windows_match(consume(stack.kafka.bootstrap, topics, len(want), "reader"), want)


def _array(items: list[str], sql_type: str) -> str:
    return f"CAST(ARRAY[{', '.join(items)}] AS {sql_type})"


def test_the_per_flow_aggregate_skips_malformed_samples_and_goes_on() -> None:
    """Flink's avro format does not run the codec's layout checks: a batch whose sample
    names a flow the batch does not list loses that sample, and one whose columns differ in
    length is skipped whole; the rest of the window counts."""
    settings = EnvironmentSettings.new_instance().in_batch_mode()
    env = TableEnvironment.create(settings.with_configuration(flink_configuration()).build())
    env.create_java_temporary_system_function("FLOW_RTTS", FLOW_RTTS_CLASS)
    types = RTT_BATCH_COLUMNS_SQL
    flows = _array(
        [
            "ROW('10.0.1.2', '10.0.2.2', 40000, 5201, 6)",
            "ROW('10.0.1.3', '10.0.2.2', 40001, 5201, 6)",
        ],
        types["flows"],
    )
    batches = [
        (["0", "1", "0", "2", "-1"], ["10", "40", "30", "99", "99"]),  # the last two: no flow
        (["1", "1"], ["20"]),  # columns of different lengths
        (["1"], ["5"]),
    ]
    rows = " UNION ALL ".join(
        f"SELECT {flows} AS flows, {_array(index, types['flow_index'])} AS flow_index, "
        f"{_array(rtt, types['rtt_ns'])} AS rtt_ns"
        for index, rtt in batches
    )
    query = f"SELECT FLOW_RTTS(flows, flow_index, rtt_ns) FROM ({rows})"
    with env.sql_query(query).execute().collect() as results:
        ((rtt,),) = list(results)
    samples, flows_seen, inverse_sum, min_ns, flow_keys = rtt
    assert (samples, flows_seen, min_ns) == (4, 2, 5)
    assert inverse_sum == pytest.approx(2 / 40 + 2 / 45)  # per flow: samples / sum of RTTs
    assert flow_keys == "10.0.1.2:40000>10.0.2.2:5201/6,10.0.1.3:40001>10.0.2.2:5201/6"
