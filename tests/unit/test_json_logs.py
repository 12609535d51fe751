"""`--log-format json` (p4bs.logs): a service's log records and status lines as one JSON object
a line, with time, level, logger, service, message and the record's structured fields; the
text format as it was; the option on every long-running service's command."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime

import pytest
from test_link_controller import GUARDS, Link, run

from p4bs import logs
from p4bs_cli.main import build_parser
from p4bs_sinks import cli as sinks_cli

SERVICES = [
    ["optimizer", "run"],
    ["sinks", "influx"],
    ["sinks", "alerts"],
    ["dashboard"],
    ["exporter", "run"],
    ["jobs", "run"],
]


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    logs.configure(logs.TEXT)
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def a_stale_link_and_a_sink_run() -> None:
    """The optimizer's stale-metrics fallback (a warning with its link and buffer), then a
    sink's status lines (its counters, its stop)."""
    link = Link(GUARDS)

    async def scenario() -> None:
        await link.window(decide=200_000)
        await link.commit()
        link.clock.advance(GUARDS.stale_after_ns)
        link.controller.check_stale(link.clock.monotonic_ns())

    run(scenario)
    sinks_cli._run_until_stopped("influx sink", lambda stop: None, lambda: "written 7")


def test_json_lines_parse_and_carry_the_fields(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.JSON, service="p4bs optimizer run")
    a_stale_link_and_a_sink_run()
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in err.splitlines()]
    (stale,) = [r for r in records if r["level"] == "warning" and "link" in r]
    assert stale["logger"] == "p4bs_optimizer.service.controller"
    assert stale["service"] == "p4bs optimizer run"
    assert stale["link"] == "r1:eth1" and stale["message"].startswith("link r1:eth1: ")
    assert stale["buffer_bytes"] == Link(GUARDS).link.safe_buffer_bytes
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", stale["time"])
    seconds = datetime.fromisoformat(stale["time"][:19] + "+00:00").timestamp()
    assert stale["ts_ns"] // 10**9 == int(seconds)
    assert stale["ts_ns"] % 10**9 == int(stale["time"][20:29])
    lines = [json.loads(line) for line in out.splitlines()]
    # a counters line every 10 s while the sink runs (this one ends at once), then its stop
    assert lines[-1]["message"] == "influx sink stopped: written 7"
    assert {line["message"] for line in lines[:-1]} <= {"written 7"}
    assert {line["logger"] for line in lines} == {logs.STATUS_LOGGER}
    assert all(line["level"] == "info" and line["ts_ns"] > 0 for line in lines)


def test_text_is_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.TEXT)
    a_stale_link_and_a_sink_run()
    out, err = capsys.readouterr()
    assert out.endswith("influx sink stopped: written 7\n")
    assert set(out.splitlines()[:-1]) <= {"written 7"}
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING p4bs_optimizer.service.controller: "
        r"link r1:eth1: ",
        err,
        re.MULTILINE,
    ), err


def test_fields_json_cannot_hold_are_written_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logs.JSON)
    logs.status_line("odd", what={1, 2}, at=datetime(2026, 1, 1))
    line = json.loads(capsys.readouterr().out)
    assert line["what"] == "{1, 2}" and line["at"] == "2026-01-01 00:00:00"


@pytest.mark.parametrize("command", SERVICES, ids=" ".join)
def test_every_service_takes_the_option(command: list[str]) -> None:
    parser = build_parser(command[0])
    assert parser.parse_args(command).log_format == logs.TEXT
    assert parser.parse_args([*command, "--log-format", "json"]).log_format == logs.JSON
