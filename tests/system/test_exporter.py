"""The model exporter through the real broker: one LinkCounters record per link and interval
(counters, long-flow events, RTT samples; parts when the samples are many), the same bytes as
`IntervalAssembler` and the Python codec make of the model's records, every record exactly once
and in order per link (through a broker restart), bad input reported."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from offsets import partition_offsets
from pcapgen import FlowPlan, write_taps

from p4bs import paths
from p4bs.bus import RecordConsumer
from p4bs.config import Config, load_config
from p4bs_cli.main import main
from p4bs_exporter import EXPORTED_STREAMS, ExporterStats, ModelTarget, SpecError, run_spec
from p4bs_infra import procs
from p4bs_infra.stack import Stack
from p4bs_schemas.codec import codec
from p4bs_schemas.intervals import (
    COUNT_FIELDS,
    EVENT_FIELDS,
    FLOW_FIELDS,
    IntervalAssembler,
    events_of,
    samples_of,
)

T0 = 1_700_000_000 * 10**9  # the captures' first second
MS = 1_000_000
STREAM = "link_counters"
SCHEMA = codec("LinkCounters")
# The fields of the model's JSON lines (`p4bs-model analyze`), by kind, `link_id` aside.
MODEL_FIELDS = {
    "rtt_sample": {"ts_ns", *FLOW_FIELDS, "rtt_ns"},
    "long_flow": set(EVENT_FIELDS),
    "link_counters": {"ts_ns", "interval_ns", "seq", *COUNT_FIELDS},
}


def write_config(directory: Path, bootstrap: str, topics: dict[str, str]) -> Path:
    """The example config on the test's broker and topics, long flows from 100 packets."""
    text = (paths.example_config()).read_text()
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    text = re.sub(
        r"^bootstrap = .*$",
        f'bootstrap = "{bootstrap}"\ntopics = {{ {table} }}',
        text,
        count=1,
        flags=re.M,
    )
    text = re.sub(
        r"^long_flow_threshold = .*$", "long_flow_threshold = 100", text, count=1, flags=re.M
    )
    path = directory / "config.toml"
    path.write_text(text)
    return path


@pytest.fixture
def config(stack: Stack, topics: dict[str, str], tmp_path: Path) -> Config:
    return load_config(write_config(tmp_path, stack.kafka.bootstrap, topics))


def flow(i: int, start_ms: int, segments: int, gap_ms: float, fin: bool = True) -> FlowPlan:
    return FlowPlan(
        src=f"10.201.1.{10 + i}",
        dst="10.201.2.2",
        sport=40000 + i,
        dport=5201,
        start_ns=T0 + start_ms * MS,
        segments=segments,
        gap_ns=int(gap_ms * MS),
        rtt_ns=(20 + 3 * i) * MS,
        fin=fin,
    )


def mixed_flows() -> list[FlowPlan]:
    """Long flows ending by FIN and by idle timeout, a short one, and one that keeps the
    capture going past the idle timeout (2 s)."""
    return [
        flow(0, 0, 400, 2),
        flow(1, 100, 300, 2, fin=False),
        flow(2, 200, 50, 3),
        flow(3, 0, 175, 20),
    ]


@contextmanager
def exporting(spec: dict[str, Any]) -> Iterator[ModelTarget]:
    """A started exporter, stopped (SIGTERM, then SIGKILL, by its pid) whatever happens."""
    target = ModelTarget(spec)
    target.start()
    try:
        yield target
    finally:
        target.stop(timeout_s=15)


def model_records(spec: dict[str, Any], directory: Path) -> list[dict[str, Any]]:
    """The records `IntervalAssembler` makes of what `p4bs-model analyze` emits on the spec's
    pcaps, fed in the model's order (samples, events, each link's counters closing its
    interval, then whatever is still open)."""
    pipeline = directory / "pipeline.json"
    pipeline.write_text(json.dumps(spec["pipeline"]))
    argv = [str(paths.built("p4bs-model")), "analyze", "--config", str(pipeline)]
    for port, file in spec["source"]["pcap"]:
        argv += ["--pcap", f"{port}={file}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
    assembler = IntervalAssembler(
        spec["pipeline"]["export"]["interval_ns"], spec["max_rtt_samples_per_record"]
    )
    records = []
    for line in out.splitlines():
        data = json.loads(line)
        kind, link = data.pop("kind"), data.pop("link_id")
        if "event" in data:
            data["kind"] = data.pop("event")
        assert set(data) == MODEL_FIELDS[kind], f"{kind}: {sorted(data)}"
        if kind == "rtt_sample":
            records += assembler.add_sample(link, data)
        elif kind == "long_flow":
            assembler.add_event(link, data)
        else:
            counts = {f: data[f] for f in COUNT_FIELDS}
            records += assembler.close(link, data["ts_ns"], data["interval_ns"], counts)
    return records + assembler.close_all()


def samples(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [sample for record in records for sample in samples_of(record)]


def events(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for record in records for event in events_of(record)]


def by_link(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    links: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        links[r["link_id"]].append(r)
    return dict(links)


def consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-exporter-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def consume_raw(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0) -> list[Message]:
    """The first `count` messages of `topic` in partition order (fewer on timeout)."""
    c = consumer(bootstrap)
    partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])  # no group join
    got: list[Message] = []

    def more() -> bool:
        for msg in c.consume(num_messages=10_000, timeout=0.5):
            assert msg.error() is None, msg.error()
            got.append(msg)
        return len(got) >= count

    try:
        procs.wait_until(more, timeout_s, interval_s=0)
    finally:
        c.close()
    return got


def stored(bootstrap: str, topic: str) -> int:
    """Records the broker holds in `topic`: offsets are dense (no transactions), so this
    counts duplicates too."""
    return sum(high - low for low, high in partition_offsets(bootstrap, topic).values())


def test_records_are_the_python_codecs_bytes_in_the_models_order(
    config: Config, stack: Stack, tmp_path: Path
) -> None:
    before, after = write_taps(tmp_path, mixed_flows())
    spec = run_spec(
        config,
        stats_path=tmp_path / "stats.json",
        pcaps=[("before", before), ("after", after)],
        stats_interval_s=0.2,
    )
    spec["max_rtt_samples_per_record"] = 7  # busy intervals come in several records
    expected = model_records(spec, tmp_path)
    assert len(samples(expected)) == 400 + 300 + 50 + 175
    sizes = [len(r["rtt_ns"]) for r in expected]
    assert max(sizes) == 7 and min(sizes) < 7
    # Parts before their interval's complete record, which has the counts.
    parts = [r for r in expected if not r["complete"]]
    assert parts and all(len(r["rtt_ns"]) == 7 and r["packets"] == 0 for r in parts)
    assert any(r["complete"] and r["part"] > 0 and r["packets"] > 0 for r in expected)
    # Records with several flows, some of them with several samples.
    assert any(1 < len(r["flows"]) < len(r["rtt_ns"]) for r in expected)
    changes = [(e["kind"], e["reason"]) for e in events(expected)]
    assert sorted(set(changes)) == [("end", "fin"), ("end", "idle_timeout"), ("start", "threshold")]
    assert sum(r["complete"] for r in expected) > 30
    assert [r["seq"] for r in expected] == list(range(len(expected)))

    with exporting(spec) as target:
        assert target.wait(60), target.log_tail()
        assert target.returncode == 0, target.log_tail()
        stats = target.stats()
    assert stats.state == "done"
    assert stats.produced == {STREAM: len(expected)} and stats.produced_total == len(expected)
    assert stats.delivered == stats.produced_total
    assert (stats.failed, stats.dropped, stats.invalid, stats.in_flight) == (0, 0, 0, 0)
    assert stats.undelivered_at_exit == 0 and stats.problems == []
    assert stats.pipeline["rtt_samples"] == stats.rtt_samples_produced == 925
    assert stats.frames == stats.pipeline["packets"] > 0

    bootstrap = stack.kafka.bootstrap
    topic = spec["streams"][STREAM]["topic"]
    got = consume_raw(bootstrap, topic, len(expected))
    assert stored(bootstrap, topic) == len(expected)
    assert [m.key() for m in got] == [r["link_id"].encode() for r in expected]
    assert [m.headers() for m in got] == [SCHEMA.headers] * len(expected)
    # Byte for byte what the Python producer would have sent, in the model's order.
    assert [m.value() for m in got] == [SCHEMA.encode(r) for r in expected]
    assert [SCHEMA.decode(m.value(), m.headers()) for m in got] == expected


def test_every_record_once_and_in_order_through_a_broker_restart(
    config: Config, stack: Stack, tmp_path: Path
) -> None:
    # About 12 s of traffic replayed at its own pace: 4 long flows, a segment each per 4 ms.
    plans = [flow(i, 0, 3000, 4) for i in range(4)]
    before, after = write_taps(tmp_path, plans)
    spec = run_spec(
        config,
        stats_path=tmp_path / "stats.json",
        pcaps=[("before", before), ("after", after)],
        pace="realtime",
        stats_interval_s=0.1,
        flush_timeout_s=180,
    )
    # 100 samples an interval in parts of 7: ~150 records/s, whose order within an interval
    # matters too (parts, then the complete record).
    spec["max_rtt_samples_per_record"] = 7
    expected = model_records(spec, tmp_path)
    total = len(expected)
    assert len(samples(expected)) == 12_000
    assert sum(r["complete"] for r in expected) >= 119
    assert sum(not r["complete"] for r in expected) > 1000

    def stats() -> ExporterStats:
        return target.stats()

    try:
        with exporting(spec) as target:
            assert procs.wait_until(lambda: stats().delivered > 300, 30), target.log_tail()
            assert stack.kafka.stop()  # by the pid the stack recorded
            down_at = stats().delivered
            # Records pile up in the producer while the broker is away.
            assert procs.wait_until(lambda: stats().in_flight > 200, 30), stats()
            assert not stats().finished
            stack.kafka.start()
            assert procs.wait_until(stack.kafka.ready, 90, 0.2), "the broker did not come back"
            assert target.wait(240), target.log_tail()
            final = target.stats()
            assert target.returncode == 0, target.log_tail()
    finally:
        if stack.kafka.pid is None:  # leave the session's broker running for later tests
            stack.kafka.start()
            procs.wait_until(stack.kafka.ready, 90, 0.2)
    assert final.state == "done"
    assert final.delivered == final.produced_total == total > down_at
    assert (final.failed, final.dropped, final.undelivered_at_exit) == (0, 0, 0)

    bootstrap = stack.kafka.bootstrap
    assert stored(bootstrap, spec["streams"][STREAM]["topic"]) == total  # nothing stored twice

    reader = RecordConsumer(
        bootstrap,
        f"test-restart-{uuid.uuid4().hex[:6]}",
        EXPORTED_STREAMS,
        {s: spec["streams"][s]["topic"] for s in EXPORTED_STREAMS},
    )
    got: list[dict[str, Any]] = []

    def drain() -> bool:
        r = reader.poll(0.5)
        if r is not None:
            assert r.key == r.record["link_id"] and r.stream == STREAM
            got.append(r.record)
        return len(got) >= total

    try:
        assert procs.wait_until(drain, 120, interval_s=0), f"{len(got)} of {total}"
    finally:
        reader.close()
    assert reader.stats.malformed == 0
    # A link's records share a partition, so arrival order is the link's order.
    assert by_link(got) == by_link(expected)
    for link, records in by_link(got).items():
        assert [r["seq"] for r in records] == list(range(len(records))), link
    keys = [(r["ts_ns"], r["src_ip"], r["src_port"]) for r in samples(got)]
    assert len(set(keys)) == len(keys) == 12_000


def test_a_spec_with_problems_is_refused_with_every_problem(config: Config, tmp_path: Path) -> None:
    spec = run_spec(config, stats_path=tmp_path / "stats.json", pcaps=[("before", tmp_path)])
    spec["source"]["pcap"].append(["sideways", "x.pcap"])
    spec["source"]["pace"] = "ludicrous"
    spec["streams"][STREAM]["fields"].append(["extra", "long"])
    spec["max_rtt_samples_per_record"] = 0
    spec["kafka"]["bootstrap"] = ""
    spec["stats"]["interval_s"] = 0
    spec["pipeline"]["rtt"]["slots_log2"] = 40
    with pytest.raises(SpecError) as err:
        ModelTarget(spec).check()
    problems = "\n".join(err.value.problems)
    for expected in (
        'source.pcap[1]: no port "sideways"',
        "source.pace: must be",
        "streams.link_counters.fields: the schema's fields",
        "spec.max_rtt_samples_per_record: must be an integer in [1, 16384], got 0",
        "kafka.bootstrap: must be a non-empty string",
        "stats.interval_s: must be a positive number",
        "pipeline: rtt.slots_log2",
    ):
        assert expected in problems
    assert len(err.value.problems) == 7, problems

    binary = str(paths.built("p4bs-exporter"))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{ not json")
    result = subprocess.run([binary, "--spec", str(garbage)], capture_output=True, text=True)
    assert result.returncode == 2 and "not JSON" in result.stderr
    result = subprocess.run([binary, "--bogus"], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr


def test_cli_exit_codes(
    stack: Stack, topics: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, stack.kafka.bootstrap, topics)
    before, after = write_taps(tmp_path, [flow(0, 0, 200, 2)])
    stats = tmp_path / "cli" / "stats.json"
    run = ["exporter", "run", "--config", str(path), "--stats", str(stats)]
    assert main([*run, "--pcap", f"before={before}", "--pcap", f"after={after}"]) == 0
    out = capsys.readouterr().out
    assert "exporter done" in out and "200 RTT samples" in out
    assert ExporterStats.read(stats) == ExporterStats.read(stats)  # a whole file, readable

    assert main([*run, "--pcap", f"sideways={before}"]) == 2
    assert 'no port "sideways"' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main([*run, "--pcap", "before"])  # not PORT=FILE: argparse's own exit
    assert exit_.value.code == 2
    assert "must be PORT=FILE" in capsys.readouterr().err
    assert main([*run, "--switch", "nope"]) == 2
    assert "no switch 'nope'" in capsys.readouterr().err

    # An unreadable capture: a runtime failure naming the file.
    assert main([*run, "--pcap", f"before={tmp_path / 'missing.pcap'}"]) == 1
    captured = capsys.readouterr()
    assert "missing.pcap: No such file or directory" in captured.out + captured.err
    failed = ExporterStats.read(stats)
    assert failed is not None and failed.state == "failed"
    assert "missing.pcap" in failed.problems[0]


def test_a_truncated_capture_exports_what_came_before_the_damage(
    config: Config, stack: Stack, tmp_path: Path
) -> None:
    before, after = write_taps(tmp_path, mixed_flows())
    data = after.read_bytes()
    after.write_bytes(data[: len(data) // 2 + 7])  # ends inside a record
    spec = run_spec(
        config, stats_path=tmp_path / "stats.json", pcaps=[("before", before), ("after", after)]
    )
    expected = model_records(spec, tmp_path)
    assert 0 < len(samples(expected)) < 925
    with exporting(spec) as target:
        assert target.wait(60), target.log_tail()
        assert target.returncode == 0, target.log_tail()
        stats = target.stats()
    assert stats.produced == {STREAM: len(expected)}
    assert stats.delivered == stats.produced_total
    assert len(stats.problems) == 1
    assert str(after) in stats.problems[0] and "file ends inside record" in stats.problems[0]
    topic = spec["streams"][STREAM]["topic"]
    got = consume_raw(stack.kafka.bootstrap, topic, len(expected))
    assert [SCHEMA.decode(m.value(), m.headers()) for m in got] == expected


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def tap_namespace(config: Config) -> Iterator[tuple[str, dict[str, str]]]:
    """A network namespace of our own holding the link's tap interfaces, each a veth whose
    peer (inj-*) injects frames; yields its name and tap -> injector interface."""
    name = f"p4bs-x{uuid.uuid4().hex[:6]}"
    link = config.links[0]
    peers = {str(link.tap_before): "inj-before", str(link.tap_after): "inj-after"}
    ip("netns", "add", name)
    try:
        for tap, peer in peers.items():
            ip("-n", name, "link", "add", tap, "type", "veth", "peer", "name", peer)
            ip("-n", name, "link", "set", tap, "up")
            ip("-n", name, "link", "set", peer, "up")
        yield name, peers
    finally:
        ip("netns", "del", name)


def test_live_capture_in_a_namespace_exports_until_sigterm(
    config: Config, stack: Stack, tmp_path: Path
) -> None:
    """Taps in a namespace, Kafka in this one: frames injected on the taps come out as
    records; SIGTERM finishes the pipeline and flushes everything."""
    before, after = write_taps(tmp_path, [flow(0, 0, 60, 5), flow(1, 2, 40, 5)])
    with tap_namespace(config) as (netns, peers):
        link = config.links[0]
        spec = run_spec(config, stats_path=tmp_path / "stats.json", netns=netns)
        assert spec["source"] == {"live": True, "netns": netns}
        assert [p["port"] for p in spec["pipeline"]["ports"]] == list(peers)
        with exporting(spec) as target:
            assert procs.wait_until(lambda: target.stats().state == "running", 30)
            files = {before: peers[str(link.tap_before)], after: peers[str(link.tap_after)]}
            pcapgen = Path(__file__).resolve().parents[1] / "pcapgen.py"
            argv = [str(paths.home() / ".venv" / "bin" / "python"), str(pcapgen)]
            argv += [f"{f}={i}" for f, i in files.items()]
            subprocess.run(["ip", "netns", "exec", netns, *argv], check=True, timeout=60)
            assert procs.wait_until(lambda: target.stats().pipeline["rtt_samples"] >= 100, 30)
            # The intervals end on the wall clock while the taps are quiet: their records go
            # before the exporter is stopped.
            assert procs.wait_until(lambda: target.stats().rtt_samples_produced == 100, 10)
            final = target.stop(timeout_s=30)
            assert target.returncode == 0, target.log_tail()
    assert final.state == "done"
    assert final.pipeline["rtt_samples"] == final.rtt_samples_produced == 100
    assert final.kernel_drops == 0 and final.invalid == 0
    assert final.delivered == final.produced_total and final.dropped == 0
    topic = spec["streams"][STREAM]["topic"]
    produced = final.produced[STREAM]
    got = consume_raw(stack.kafka.bootstrap, topic, produced)
    assert len(got) == stored(stack.kafka.bootstrap, topic) == produced
    records = [SCHEMA.decode(m.value(), m.headers()) for m in got]
    for link_id, of_link in by_link(records).items():
        assert [r["seq"] for r in of_link] == list(range(len(of_link))), link_id
    assert sum(r["packets"] for r in records) >= 100  # the counters, in the same records
    flat = samples(records)
    assert len(flat) == 100
    assert {(r["src_ip"], r["link_id"]) for r in flat} == {
        ("10.201.1.10", link.id),
        ("10.201.1.11", link.id),
    }
    rtts = sorted(r["rtt_ns"] for r in flat)
    assert rtts[0] > 0 and rtts[-1] < 200 * MS, rtts  # the injector paces loosely


def test_cli_runs_a_tofino_switch_through_the_same_interface(
    stack: Stack, topics: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tofino switch gets the tofino target: without the SDE's client it says so (exit 1);
    the model's source flags are refused for it (exit 2)."""
    path = write_config(tmp_path, stack.kafka.bootstrap, topics)
    (metrics_port,) = procs.free_ports(1)
    tofino = (
        f'target = "tofino"\naddress = "127.0.0.1:1"\nmetrics_address = "127.0.0.1:{metrics_port}"'
    )
    text = path.read_text().replace('target = "model"', tofino)
    text = re.sub(r"^taps = .*$", "taps = { before = 1, after = 2 }", text, count=1, flags=re.M)
    path.write_text(text)
    run = ["exporter", "run", "--config", str(path), "--stats", str(tmp_path / "stats.json")]
    assert main([*run, "--pcap", "before=x.pcap", "--netns", "ns"]) == 2
    err = capsys.readouterr().err
    assert "--pcap: only for a model switch" in err and "--netns: only for a model" in err
    assert main(run) == 1
    assert "bfrt_grpc" in capsys.readouterr().err
    # The failed run's metrics endpoint went with it (a leaked one held the port for every
    # later exporter in this process): the port binds again.
    with socket.socket() as again:
        again.bind(("127.0.0.1", metrics_port))
