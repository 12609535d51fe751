"""`p4bs status` without any service: the screen and the JSON of given results, exit codes,
a check that raises or hangs turned into an unhealthy part in bounded time, the command's
answers to a bad config or option, the embedded Flink message, and the consumer group names
and streams it assumes still being the parts' own."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import Consumer

from p4bs import paths
from p4bs.config import load_config
from p4bs.topic_range import Deadline
from p4bs_cli.main import main
from p4bs_jobs import cli as jobs_cli
from p4bs_ops import status
from p4bs_ops.status import PartStatus, StatusOptions, kafka_clients, runner
from p4bs_sinks import alerts, influx_sink

S = 1_000_000_000
MS = 1_000_000


def results() -> list[PartStatus]:
    return [
        PartStatus(
            "kafka",
            True,
            "1 of 1 brokers reachable, 7 topics; lag: p4bs-metrics 0",
            {"brokers": [{"id": 1, "address": "127.0.0.1:9092", "reachable": True}]},
            took_ns=12 * MS,
        ),
        PartStatus(
            "exporters",
            False,
            "1 of 2 links with no data in 5 s: r1:eth2 (2 min 5 s ago)",
            {
                "max_age_ns": 5 * S,
                "links": {
                    "r1:eth1": {"age_ns": 80 * MS, "stale": False, "partition": 0},
                    "r1:eth2": {"age_ns": 125 * S, "stale": True, "partition": 1},
                },
            },
            took_ns=40 * MS,
        ),
        PartStatus(
            "routers",
            True,
            "1 router answered: r1 244.1 KiB",
            {"routers": {"r1": {"buffer_bytes": 250_000, "drains_in_ns": 20 * MS}}},
        ),
    ]


def test_the_screen_has_a_line_per_part_aligned_with_its_details_in_human_units() -> None:
    text = status.render_text(results(), "deploy.toml", 1_800_000_000 * S)
    lines = text.splitlines()
    assert lines[0] == "p4bs status of deploy.toml at 2027-01-15T08:00:00Z"
    heads = [line for line in lines if line.startswith(("OK", "FAIL"))]
    expected = [["OK", "kafka"], ["FAIL", "exporters"], ["OK", "routers"]]
    assert [h.split()[:2] for h in heads] == expected
    # The summaries start in one column.
    columns = {h.index(s.summary) for h, s in zip(heads, results(), strict=True)}
    assert len(columns) == 1
    assert "[12 ms]" in heads[0] and "[40 ms]" in heads[1]
    # Details below their part, indented past the names, in human units.
    below = lines[lines.index(heads[1]) + 1 : lines.index(heads[2])]
    assert all(line.startswith(" " * 10) for line in below)
    assert any(line.strip() == "max age: 5 s" for line in below)
    assert any("r1:eth1: age 80 ms, stale no, partition 0" in line for line in below)
    assert any("r1:eth2: age 2 min 5 s, stale yes, partition 1" in line for line in below)
    assert any("r1: buffer 244.1 KiB, drains in 20 ms" in line for line in lines)
    assert any("id 1, address 127.0.0.1:9092, reachable yes" in line for line in lines)
    assert lines[-1] == "unhealthy: exporters (1 of 3 parts)"
    brief = status.render_text(results(), details=False).splitlines()
    assert len(brief) == 4 and brief[-1].startswith("unhealthy")


def test_all_healthy_says_so_and_exits_0_one_unhealthy_exits_1() -> None:
    healthy = [r for r in results() if r.healthy]
    assert status.exit_code(healthy) == 0
    assert status.render_text(healthy).splitlines()[-1] == "healthy: all 2 parts"
    assert status.exit_code(results()) == 1
    assert status.exit_code([]) == 0


def test_the_json_object_is_stable_and_keeps_the_systems_units() -> None:
    out = status.to_json(results(), "deploy.toml", 123)
    assert list(out) == ["healthy", "config", "checked_at_ns", "parts"]
    assert out["healthy"] is False and out["checked_at_ns"] == 123
    assert list(out["parts"]) == ["kafka", "exporters", "routers"]
    part = out["parts"]["exporters"]
    assert list(part) == ["healthy", "summary", "took_ns", "details"]
    assert part["details"]["links"]["r1:eth2"]["age_ns"] == 125 * S
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("age_ns", 850, "850 ns"),
        ("age_ns", 12_300, "12.3 µs"),
        ("age_ns", 80 * MS, "80 ms"),
        ("age_ns", 3_200 * MS, "3.2 s"),
        ("age_ns", 250 * S, "4 min 10 s"),
        ("age_ns", 7_500 * S, "2 h 5 min"),
        ("age_ns", 3 * 86_400 * S + 4 * 3_600 * S, "3 d 4 h"),
        ("buffer_bytes", 1000, "1000 B"),
        ("buffer_bytes", 262_144, "256 KiB"),
        ("capacity_bps", 100_000_000, "100 Mbit/s"),
        ("points_per_s", 1234.5, "1,234.5/s"),
        ("lag", 12_345, "12,345"),
        ("stale", True, "yes"),
        ("owner", None, "-"),
        ("partitions", [], "none"),
        ("partitions", [0, 3], "0, 3"),
    ],
)
def test_values_print_in_the_unit_their_key_names(key: str, value: object, text: str) -> None:
    assert status.format_value(key, value) == text


def test_a_check_that_raises_or_hangs_is_an_unhealthy_part_and_the_others_still_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    def fine(_config: object, _options: StatusOptions) -> PartStatus:
        return PartStatus("kafka", True, "fine")

    def broken(_config: object, _options: StatusOptions) -> PartStatus:
        raise RuntimeError("the client library fell over")

    def refused(_config: object, _options: StatusOptions) -> PartStatus:
        raise status.CheckFailed("http://127.0.0.1:1/ping: Connection refused", {"url": "x"})

    def hung(_config: object, _options: StatusOptions) -> PartStatus:
        release.wait(60)  # a client that ignores its timeout
        return PartStatus("routers", True, "too late")

    checks = {"kafka": fine, "flink": broken, "influxdb": refused, "routers": hung}
    monkeypatch.setattr(runner, "CHECKS", checks)
    monkeypatch.setattr(runner, "GRACE_NS", 100 * MS)
    options = StatusOptions(timeout_ns=200 * MS, influx_interval_ns=MS)
    config = load_config(paths.example_config())
    began = time.monotonic()
    try:
        got = status.run_status(config, options, ["routers", "influxdb", "flink", "kafka"])
    finally:
        release.set()
    assert time.monotonic() - began < 5
    by_name = {r.name: r for r in got}
    assert [r.name for r in got] == ["kafka", "flink", "routers", "influxdb"]  # PARTS order
    assert by_name["kafka"].healthy and by_name["kafka"].took_ns > 0
    assert not by_name["flink"].healthy
    assert by_name["flink"].summary == "check failed: RuntimeError: the client library fell over"
    assert by_name["influxdb"].summary == "http://127.0.0.1:1/ping: Connection refused"
    assert by_name["influxdb"].details == {"url": "x"}
    assert not by_name["routers"].healthy
    assert by_name["routers"].summary.startswith("no answer: the check was still waiting after")


def test_every_part_has_one_registered_check_and_only_parts_have_one() -> None:
    assert set(status.CHECKS) == set(status.PARTS)
    assert status.CHECKS["flink"] is status.flink.check_flink
    with pytest.raises(ValueError, match="no part 'telemetry'"):
        runner.part_check("telemetry")


def test_a_topic_the_cluster_lacks_fails_the_check_naming_it() -> None:
    """The shared range reader's TopicUnavailable is the check's own failure (its summary
    `topic NAME: missing`), not "check failed: TopicUnavailable: ..."."""

    class NoTopics:
        def list_topics(self, topic: str, timeout: float) -> Any:
            return SimpleNamespace(topics={})

    consumer = cast(Consumer, NoTopics())
    with pytest.raises(status.CheckFailed) as failed:
        kafka_clients.topic_watermarks(consumer, "t0.link_counters", Deadline(S))
    assert str(failed.value) == "topic t0.link_counters: missing"


def test_a_config_that_does_not_load_exits_2_naming_its_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[kafka]\nbootstrap = "no-port"\n')
    assert main(["status", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("p4bs status: ")
    assert "kafka.bootstrap: must be host:port" in err and "links: at least one" in err
    assert main(["status", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--timeout", "0s"],
        ["--timeout", "5 parsecs"],
        ["--max-lag", "-1"],
        ["--skip", "kafka,telemetry"],
    ],
)
def test_a_bad_option_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["status", *argv])
    assert exit_.value.code == 2
    assert "p4bs status: error: argument" in capsys.readouterr().err


def test_an_embedded_flink_job_is_reported_as_not_observable_and_how_to_run_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example config runs the job in the embedded mini cluster; only Flink is checked."""
    skip = "kafka,exporters,optimizer,routers,influxdb"
    config = str(paths.example_config())
    assert main(["status", "--config", config, "--skip", skip, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["healthy"] is True and list(out["parts"]) == ["flink"]
    flink = out["parts"]["flink"]
    assert flink["details"]["mode"] == "embedded"
    assert "not observable" in flink["summary"] and "p4bs-metrics" in flink["summary"]
    assert "`p4bs jobs submit`" in flink["details"]["to_watch_it"]
    assert main(["status", "--config", config, "--skip", skip]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^OK\s+flink\s+embedded mini cluster", text, re.M)
    assert text.splitlines()[-1] == "healthy: 1 part"


def test_the_groups_and_streams_it_looks_at_are_the_parts_own() -> None:
    """The names `p4bs status` assumes are the defaults the parts use."""
    sink = inspect.signature(influx_sink.InfluxSink).parameters["group"].default
    dispatcher = inspect.signature(alerts.AlertDispatcher).parameters["group"].default
    assert sink == status.INFLUX_SINK_GROUP
    assert dispatcher == status.ALERT_DISPATCHER_GROUP
    assert status.INFLUX_SINK_STREAMS == influx_sink.STREAMS
    parser = argparse.ArgumentParser()
    jobs_cli.add_parser(parser.add_subparsers())
    assert parser.parse_args(["jobs", "run"]).group == status.METRICS_GROUP
    # The metrics job reads these two streams and is named after its sink table.
    metrics = (paths.home() / "streaming-jobs" / "p4bs_jobs" / "metrics.py").read_text()
    assert '("metrics_out", "link_metrics")' in metrics
    assert '"intervals_in",\n            "link_counters"' in metrics
    assert '"links_in",\n            "links"' in metrics
    assert status.METRICS_STREAMS == ("link_counters", "links")
    config = load_config(paths.example_config())
    groups = status.group_streams(config, StatusOptions())
    assert groups[config.optimizer.group] == ("link_metrics",)
    # With the optimizer feed on, the optimizer's windows are the feed's (its service reads
    # the same stream: p4bs_optimizer.service.service).
    fed = dataclasses.replace(
        config, metrics=dataclasses.replace(config.metrics, optimizer_feed=True)
    )
    assert status.group_streams(fed, StatusOptions())[config.optimizer.group] == ("optimizer_feed",)
