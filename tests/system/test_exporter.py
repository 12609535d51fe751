"""The model exporter through the real broker: the same bytes as the Python codec, every record
exactly once and in order per link (through a broker restart), bad input reported."""

from __future__ import annotations

import json
import re
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
from p4bs_schemas.registry import STREAMS, current_schema
from p4bs_schemas.rtt_batch import FLOW_FIELDS, RttBatcher, samples_of

T0 = 1_700_000_000 * 10**9  # the captures' first second
MS = 1_000_000
# The model's JSON line kinds and the streams they go to.
KIND_STREAM = {"rtt_sample": "rtt_samples", "long_flow": "flow_events"}
KIND_STREAM["link_counters"] = "link_counters"


def write_config(directory: Path, bootstrap: str, topics: dict[str, str]) -> Path:
    """The example config on the test's broker and topics, long flows from 100 packets."""
    text = (paths.default_config()).read_text()
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


def model_records(spec: dict[str, Any], directory: Path) -> dict[str, list[dict[str, Any]]]:
    """What `p4bs-model analyze` emits on the spec's pcaps, per stream, as schema records: its
    RTT samples in batches as the spec's batching makes them."""
    pipeline = directory / "pipeline.json"
    pipeline.write_text(json.dumps(spec["pipeline"]))
    argv = [str(paths.built("p4bs-model")), "analyze", "--config", str(pipeline)]
    for port, file in spec["source"]["pcap"]:
        argv += ["--pcap", f"{port}={file}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
    records: dict[str, list[dict[str, Any]]] = {s: [] for s in EXPORTED_STREAMS}
    for line in out.splitlines():
        data = json.loads(line)
        stream = KIND_STREAM[data.pop("kind")]
        if "event" in data:
            data["kind"] = data.pop("event")
        if stream == "rtt_samples":  # a sample: its link, time, flow and RTT
            fields = ["link_id", "ts_ns", *FLOW_FIELDS, "rtt_ns"]
        else:
            fields = [f["name"] for f in current_schema(STREAMS[stream])["fields"]]
        assert sorted(data) == sorted(fields), f"{stream}: {sorted(data)}"
        records[stream].append({f: data[f] for f in fields})
    batcher = RttBatcher(**spec["rtt_batch"])
    flat = records["rtt_samples"]
    records["rtt_samples"] = [b for r in flat for b in batcher.add(r.pop("link_id"), r)]
    records["rtt_samples"] += batcher.close()
    return records


def samples(batches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [sample for batch in batches for sample in samples_of(batch)]


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
    spec["rtt_batch"]["max_samples"] = 7  # busy intervals split over several batches
    expected = model_records(spec, tmp_path)
    assert len(samples(expected["rtt_samples"])) == 400 + 300 + 50 + 175
    sizes = [len(b["rtt_ns"]) for b in expected["rtt_samples"]]
    assert max(sizes) == 7 and min(sizes) < 7
    # Batches with several flows, some of them with several samples.
    assert any(1 < len(b["flows"]) < len(b["rtt_ns"]) for b in expected["rtt_samples"])
    events = [(r["kind"], r["reason"]) for r in expected["flow_events"]]
    assert sorted(set(events)) == [("end", "fin"), ("end", "idle_timeout"), ("start", "threshold")]
    assert len(expected["link_counters"]) > 30

    with exporting(spec) as target:
        assert target.wait(60), target.log_tail()
        assert target.returncode == 0, target.log_tail()
        stats = target.stats()
    assert stats.state == "done"
    assert stats.produced == {s: len(expected[s]) for s in EXPORTED_STREAMS}
    assert stats.delivered == stats.produced_total
    assert (stats.failed, stats.dropped, stats.invalid, stats.in_flight) == (0, 0, 0, 0)
    assert stats.undelivered_at_exit == 0 and stats.problems == []
    assert stats.pipeline["rtt_samples"] == stats.rtt_samples_produced == 925
    assert stats.frames == stats.pipeline["packets"] > 0

    bootstrap = stack.kafka.bootstrap
    for stream in EXPORTED_STREAMS:
        schema = codec(STREAMS[stream])
        topic = spec["streams"][stream]["topic"]
        want = expected[stream]
        got = consume_raw(bootstrap, topic, len(want))
        assert stored(bootstrap, topic) == len(want)
        assert [m.key() for m in got] == [r["link_id"].encode() for r in want]
        assert [m.headers() for m in got] == [schema.headers] * len(want)
        # Byte for byte what the Python producer would have sent, in the model's order.
        assert [m.value() for m in got] == [schema.encode(r) for r in want], stream
        assert [schema.decode(m.value(), m.headers()) for m in got] == want


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
    expected = model_records(spec, tmp_path)
    total = sum(len(v) for v in expected.values())
    assert len(samples(expected["rtt_samples"])) == 12_000
    assert len(expected["link_counters"]) >= 119

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
    for stream in EXPORTED_STREAMS:  # nothing stored twice
        assert stored(bootstrap, spec["streams"][stream]["topic"]) == len(expected[stream])

    reader = RecordConsumer(
        bootstrap,
        f"test-restart-{uuid.uuid4().hex[:6]}",
        EXPORTED_STREAMS,
        {s: spec["streams"][s]["topic"] for s in EXPORTED_STREAMS},
    )
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in EXPORTED_STREAMS}
    received = 0

    def drain() -> bool:
        nonlocal received
        r = reader.poll(0.5)
        if r is not None:
            assert r.key == r.record["link_id"]
            got[r.stream].append(r.record)
            received += 1
        return received >= total

    try:
        assert procs.wait_until(drain, 120, interval_s=0), f"{received} of {total}"
    finally:
        reader.close()
    assert reader.stats.malformed == 0
    for stream in EXPORTED_STREAMS:
        # One link: one partition per topic, so arrival order is the link's order.
        assert by_link(got[stream]) == by_link(expected[stream]), stream
    for link, counters in by_link(got["link_counters"]).items():
        assert [c["seq"] for c in counters] == list(range(len(counters))), link
    keys = [(r["ts_ns"], r["src_ip"], r["src_port"]) for r in samples(got["rtt_samples"])]
    assert len(set(keys)) == len(keys) == 12_000


def test_a_spec_with_problems_is_refused_with_every_problem(config: Config, tmp_path: Path) -> None:
    spec = run_spec(config, stats_path=tmp_path / "stats.json", pcaps=[("before", tmp_path)])
    spec["source"]["pcap"].append(["sideways", "x.pcap"])
    spec["source"]["pace"] = "ludicrous"
    spec["streams"]["rtt_samples"]["fields"].append(["extra", "long"])
    spec["kafka"]["bootstrap"] = ""
    spec["stats"]["interval_s"] = 0
    spec["pipeline"]["rtt"]["slots_log2"] = 40
    with pytest.raises(SpecError) as err:
        ModelTarget(spec).check()
    problems = "\n".join(err.value.problems)
    for expected in (
        'source.pcap[1]: no port "sideways"',
        "source.pace: must be",
        "streams.rtt_samples.fields: the schema's fields",
        "kafka.bootstrap: must be a non-empty string",
        "stats.interval_s: must be a positive number",
        "pipeline: rtt.slots_log2",
    ):
        assert expected in problems
    assert len(err.value.problems) == 6, problems

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
    assert 0 < len(samples(expected["rtt_samples"])) < 925
    with exporting(spec) as target:
        assert target.wait(60), target.log_tail()
        assert target.returncode == 0, target.log_tail()
        stats = target.stats()
    assert stats.produced == {s: len(expected[s]) for s in EXPORTED_STREAMS}
    assert stats.delivered == stats.produced_total
    assert len(stats.problems) == 1
    assert str(after) in stats.problems[0] and "file ends inside record" in stats.problems[0]
    topic = spec["streams"]["rtt_samples"]["topic"]
    got = consume_raw(stack.kafka.bootstrap, topic, len(expected["rtt_samples"]))
    schema = codec("RttSampleBatch")
    assert [schema.decode(m.value(), m.headers()) for m in got] == expected["rtt_samples"]


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
            final = target.stop(timeout_s=30)
            assert target.returncode == 0, target.log_tail()
    assert final.state == "done"
    assert final.pipeline["rtt_samples"] == final.rtt_samples_produced == 100
    assert final.produced["link_counters"] > 0 and final.kernel_drops == 0
    assert final.delivered == final.produced_total and final.dropped == 0
    topic = spec["streams"]["rtt_samples"]["topic"]
    batches = final.produced["rtt_samples"]
    got = consume_raw(stack.kafka.bootstrap, topic, batches)
    schema = codec("RttSampleBatch")
    records = samples([schema.decode(m.value(), m.headers()) for m in got])
    assert len(got) == stored(stack.kafka.bootstrap, topic) == batches
    assert len(records) == 100
    assert {(r["src_ip"], r["link_id"]) for r in records} == {
        ("10.201.1.10", link.id),
        ("10.201.1.11", link.id),
    }
    rtts = sorted(r["rtt_ns"] for r in records)
    assert rtts[0] > 0 and rtts[-1] < 200 * MS, rtts  # the injector paces loosely


def test_cli_runs_a_tofino_switch_through_the_same_interface(
    stack: Stack, topics: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tofino switch gets the tofino target: without the SDE's client it says so (exit 1);
    the model's source flags are refused for it (exit 2)."""
    path = write_config(tmp_path, stack.kafka.bootstrap, topics)
    tofino = 'target = "tofino"\naddress = "127.0.0.1:1"'
    text = path.read_text().replace('target = "model"', tofino)
    text = re.sub(r"^taps = .*$", "taps = { before = 1, after = 2 }", text, count=1, flags=re.M)
    path.write_text(text)
    run = ["exporter", "run", "--config", str(path), "--stats", str(tmp_path / "stats.json")]
    assert main([*run, "--pcap", "before=x.pcap", "--netns", "ns"]) == 2
    err = capsys.readouterr().err
    assert "--pcap: only for a model switch" in err and "--netns: only for a model" in err
    assert main(run) == 1
    assert "bfrt_grpc" in capsys.readouterr().err
