"""`p4bs status` on a deployment the test runs: the session's Kafka broker and InfluxDB, a
stand-in exporter producing each link's link_counters records, windows produced as the
metrics job would, a `p4bs optimizer run` process (dry run) owning the link, the InfluxDB
sink writing them, and a Linux tc router in a network namespace of the test's own (root).
All up: exit 0 and every part as the test set it up, in the JSON of the command run as an
operator runs it. Then with the optimizer stopped and InfluxDB's URL on a closed port: exit 1,
those two parts unhealthy naming what failed, the others still reported healthy. Kafka on a
closed port: the parts that need it say so, in bounded time. The links' owners from a state
changelog the test writes. Flink: the JobManager's REST port with nothing listening, and a
stand-in REST server answering as Flink's does."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from manylinks import Windows
from offsets import partition_offsets
from optimizerproc import optimizer
from replay import EMPTY_COUNTERS

from p4bs import paths
from p4bs.bus import RecordProducer, ensure_topics, read_partitions
from p4bs.config import Config, load_config
from p4bs_cli.main import main
from p4bs_infra.procs import free_port, wait_until
from p4bs_infra.stack import Stack
from p4bs_linux_tc.queues import QUEUE_CLASS_BASE
from p4bs_ops import status
from p4bs_ops.status import StatusOptions
from p4bs_optimizer.changelog import LinkState, to_record
from p4bs_schemas.codec import codec
from p4bs_schemas.registry import STREAMS
from p4bs_sinks.influx_sink import InfluxSink

IFACE = "st0"
BUFFER = 250_000  # the router's queue 0, in bytes
S = 1_000_000_000
P4BS = paths.home() / ".venv" / "bin" / "p4bs"
PARTS = ["kafka", "flink", "exporters", "optimizer", "routers", "influxdb"]


def run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


@pytest.fixture
def router_netns() -> Iterator[str]:
    """A network namespace holding the router's interface, its queues laid out as p4bs's
    routers have them (htb root, queue 0 a bfifo of BUFFER bytes under class 1:10)."""
    if os.geteuid() != 0:
        pytest.skip("the router is Linux tc in a network namespace of the test's own (root)")
    name = f"p4bs-st{uuid.uuid4().hex[:6]}"
    run("ip", "netns", "add", name)
    try:
        # A veth pair (this kernel has no dummy devices); the peer only carries it.
        run("ip", "-n", name, "link", "add", IFACE, "type", "veth", "peer", "name", f"{IFACE}p")
        run("ip", "-n", name, "link", "set", IFACE, "up")
        tc = ("tc", "-n", name)
        queue = f"1:{QUEUE_CLASS_BASE:x}"
        run(*tc, "qdisc", "add", "dev", IFACE, "root", "handle", "1:", "htb")
        run(*tc, "class", "add", "dev", IFACE, "parent", "1:", "classid", queue, "htb", "rate",
            "100mbit")  # fmt: skip
        run(*tc, "qdisc", "add", "dev", IFACE, "parent", queue, "handle", f"{QUEUE_CLASS_BASE:x}:",
            "bfifo", "limit", str(BUFFER))  # fmt: skip
        yield name
    finally:
        run("ip", "netns", "del", name)


def write_config(
    path: Path,
    stack: Stack,
    topics: dict[str, str],
    *,
    netns: str = "p4bs-none",
    group: str = "status-none",
    bootstrap: str | None = None,
    influx_url: str | None = None,
    flink: str = 'mode = "embedded"',
    interfaces: tuple[str, ...] = (IFACE,),
) -> Path:
    table = ", ".join(f'{s} = "{t}"' for s, t in topics.items())
    links = "".join(
        f"""
[[links]]
router = "r1"
interface = "{interface}"
switch = "model0"
capacity = "100Mbit"
taps = {{ before = "{interface}-in", after = "{interface}-out" }}
sla = {{ max_queue_delay = "10ms", max_loss = 0.01 }}
buffer = {{ min = "32KiB", max = "200ms", safe = "50ms" }}
policy = "static"
"""
        for interface in interfaces
    )
    path.write_text(
        f"""
[kafka]
bootstrap = "{bootstrap or stack.kafka.bootstrap}"
partitions = 2
topics = {{ {table} }}

[influxdb]
url = "{influx_url or stack.influxdb.url}"
database = "{stack.influxdb.database}"

[flink]
{flink}

[optimizer]
group = "{group}"

[[switches]]
name = "model0"
target = "model"

[[routers]]
name = "r1"
driver = "linux-tc"
address = "netns:{netns}"
timeout = "2s"
{links}"""
    )
    return path


class Exporter:
    """Each link's LinkCounters record every 100 ms while in the `with`, as an exporter
    produces them (the counters' values do not matter here)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.producer = RecordProducer(config.kafka.bootstrap, config.kafka.topics, "exporter")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="exporter")

    def _run(self) -> None:
        seq = 0
        while not self.stop.wait(0.1):
            for link in self.config.links:
                record = {**EMPTY_COUNTERS, "link_id": link.id, "ts_ns": time.time_ns()}
                self.producer.produce("link_counters", {**record, "seq": seq})
            seq += 1
            self.producer.flush(5)

    def __enter__(self) -> Exporter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)


@contextmanager
def influx_sink(config: Config) -> Iterator[InfluxSink]:
    sink = InfluxSink(config.influxdb, config.kafka.bootstrap, config.kafka.topics)
    stop = threading.Event()
    worker = threading.Thread(target=sink.run, args=(stop,), name="influx-sink")
    worker.start()
    try:
        yield sink
    finally:
        stop.set()
        worker.join(30)


def owners(config: Config) -> dict[str, tuple[str, int]]:
    """Each link's owner and epoch, as its newest state record says."""
    received, _ = read_partitions(
        config.kafka.bootstrap, "optimizer_state", config.kafka.topics, range(2), timeout_s=30
    )
    return {r.record["link_id"]: (r.record["owner"], r.record["epoch"]) for r in received}


def status_json(config: Path, *extra: str) -> tuple[int, dict[str, Any], float]:
    """`p4bs status --json` as an operator runs it: exit code, the JSON, seconds taken."""
    began = time.monotonic()
    done = subprocess.run(
        [str(P4BS), "status", "--config", str(config), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    assert done.stderr == "", done.stderr  # no traceback, no client library's log lines
    return done.returncode, json.loads(done.stdout), took


def test_a_running_deployment_is_healthy_and_a_stopped_part_is_named(
    stack: Stack,
    topics: dict[str, str],
    router_netns: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = f"status-{uuid.uuid4().hex[:6]}"
    path = write_config(tmp_path / "p4bs.toml", stack, topics, netns=router_netns, group=group)
    config = load_config(path)
    link = config.links[0].id
    instance = f"{group}-a"
    log = tmp_path / "optimizer.log"
    with (
        Exporter(config),
        Windows(config.kafka.bootstrap, topics, config.links, 500_000, 2),
        influx_sink(config) as sink,
        optimizer(path, "--dry-run", "--instance", instance, log=log) as process,
    ):
        assert wait_until(lambda: owners(config).get(link, ("", 0))[0] == instance, 90), (
            log.read_text()
        )
        assert wait_until(lambda: sink.stats.written > 0, 60)

        # (a) Everything up: exit 0, each part as the test made it.
        code, out, took = status_json(path)
        print(json.dumps(out, indent=2))
        print(f"p4bs status took {took:.1f} s")
        assert code == 0, out
        assert out["healthy"] is True and list(out["parts"]) == PARTS
        assert out["config"] == str(path)
        parts = out["parts"]
        kafka = parts["kafka"]["details"]
        assert [(b["address"], b["reachable"]) for b in kafka["brokers"]] == [
            (stack.kafka.bootstrap, True)
        ]
        assert all("error" not in t for t in kafka["topics"].values())
        optimizer_lag = kafka["groups"][group]
        assert optimizer_lag["committed"] is True and optimizer_lag["members"] == 1
        assert optimizer_lag["lag"][topics["link_metrics"]]["committed_partitions"] >= 1
        assert kafka["groups"]["p4bs-metrics"]["committed"] is False  # no job runs here
        assert "p4bs-metrics no offsets" in parts["kafka"]["summary"]
        # The sink's group: its offsets are committed every 5 s (auto commit), if yet.
        assert topics["link_metrics"] in kafka["groups"]["p4bs-influx-sink"]["lag"]

        assert parts["flink"]["details"]["mode"] == "embedded"
        assert "not observable" in parts["flink"]["summary"]

        exporters = parts["exporters"]["details"]["links"]
        assert list(exporters) == [link]
        assert exporters[link]["stale"] is False and exporters[link]["age_ns"] < 5 * S

        opt = parts["optimizer"]["details"]
        assert [i["partitions"] for i in opt["instances"]] == [[0, 1]]  # its consumer's own
        assert opt["links"][link]["owner"] == instance
        assert opt["links"][link]["epoch"] >= 1
        assert opt["links"][link]["held_by"] == opt["instances"][0]["member"]
        assert opt["unowned"] == []
        assert f"owners: {instance} 1 link" in parts["optimizer"]["summary"]

        router = parts["routers"]["details"]["routers"]["r1"]
        assert router["reachable"] is True and router["buffer_bytes"] == BUFFER
        assert router["drains_in_ns"] == 20_000_000  # 250 kB at 100 Mbit/s

        influx = parts["influxdb"]["details"]
        assert influx["database_exists"] is True and influx["version"]
        assert influx["points_per_s"] > 0  # the sink writes the windows as they come

        # The same on the screen: a line per part.
        capsys.readouterr()
        assert main(["status", "--config", str(path)]) == 0
        with capsys.disabled():
            print(text := capsys.readouterr().out)
        screen = [line for line in text.splitlines() if not line.startswith(" ")]
        assert [line.split()[:2] for line in screen[1:-1]] == [["OK", p] for p in PARTS]
        assert screen[-1] == "healthy: all 6 parts"

        # (b) The optimizer stopped (it leaves its group) and InfluxDB's URL on a closed
        # port: exit 1, both named, the other parts still reported.
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        closed = f"http://127.0.0.1:{free_port()}"
        broken = write_config(
            tmp_path / "broken.toml",
            stack,
            topics,
            netns=router_netns,
            group=group,
            influx_url=closed,
        )
        code, out, took = status_json(broken)
        print(json.dumps(out, indent=2))
        assert code == 1
        parts = out["parts"]
        assert out["healthy"] is False and list(parts) == PARTS
        assert {p for p in PARTS if not parts[p]["healthy"]} == {"optimizer", "influxdb"}
        assert parts["influxdb"]["summary"] == f"{closed}/ping: Connection refused"
        assert parts["optimizer"]["summary"] == f"no instance in group {group}"
        # What the group's last owner wrote is still shown.
        assert parts["optimizer"]["details"]["links"][link]["owner"] == instance
        assert parts["optimizer"]["details"]["links"][link]["held_by"] is None
        assert took < 30

        capsys.readouterr()
        assert main(["status", "--config", str(broken)]) == 1
        screen = capsys.readouterr().out
        with capsys.disabled():
            print(screen)
        assert screen.splitlines()[-1] == "unhealthy: optimizer, influxdb (2 of 6 parts)"
        assert f"FAIL  influxdb   {closed}/ping: Connection refused" in screen


def test_kafka_on_a_closed_port_is_named_by_the_parts_that_need_it_in_bounded_time(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    """No broker: Kafka, the exporters' data and the optimizer's group cannot be seen; each
    says why, and InfluxDB is still checked. The router's namespace does not exist."""
    bootstrap = f"127.0.0.1:{free_port()}"
    path = write_config(tmp_path / "p4bs.toml", stack, topics, bootstrap=bootstrap)
    code, out, took = status_json(path, "--timeout", "2s")
    print(json.dumps(out, indent=2), f"\ntook {took:.1f} s")
    assert code == 1
    parts = out["parts"]
    for name in ("kafka", "exporters", "optimizer"):
        assert not parts[name]["healthy"]
        summary = parts[name]["summary"]
        assert summary.startswith(f"Kafka at {bootstrap}: no broker answered: "), summary
        assert "Connection refused" in summary, summary
    assert parts["influxdb"]["healthy"] and parts["flink"]["healthy"]
    assert not parts["routers"]["healthy"]
    assert parts["routers"]["summary"] == "r1: unreachable: no network namespace 'p4bs-none'"
    assert took < 2 + 1 + 2 + 5  # the timeout, InfluxDB's interval, the grace, start-up


def test_each_links_newest_record_found_however_old_stale_ones_named(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    """Link A's records keep coming; B's last one is two minutes old, with a thousand of A's
    after it (found by reading further back than the last 5 s); C never had one (the topic
    read to its start); D is not in the config."""
    path = write_config(tmp_path / "p4bs.toml", stack, topics, interfaces=("a", "b", "c"))
    config = load_config(path)
    schema = codec(STREAMS["link_counters"])
    producer = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    now_ms = time.time_ns() // 1_000_000

    def produce(link: str, at_ms: int) -> None:
        record = {**EMPTY_COUNTERS, "link_id": link, "ts_ns": at_ms * 1_000_000}
        value = schema.encode(record)
        producer.produce(topics["link_counters"], value, link, timestamp=at_ms)

    produce("r1:b", now_ms - 120_000)
    for i in range(1000):
        produce("r1:a", now_ms - 1000 + i)  # the last second
    produce("r1:d", now_ms - 2000)
    assert producer.flush(30) == 0
    result = status.run_check("exporters", config, StatusOptions(timeout_ns=10 * S))
    print(result)
    assert not result.healthy
    links = result.details["links"]
    assert links["r1:a"]["stale"] is False and links["r1:a"]["age_ns"] < 5 * S
    assert links["r1:b"]["stale"] is True and 120 * S <= links["r1:b"]["age_ns"] < 130 * S
    assert links["r1:c"] == {"age_ns": None, "stale": True}
    assert list(result.details["not_in_config"]) == ["r1:d"]
    assert result.summary.startswith("2 of 3 links with no data in 5 s: r1:b (2 min ")
    assert result.summary.endswith("ago), r1:c (no record in the topic)")


def test_each_links_owner_is_its_newest_state_record_a_malformed_one_passed_over(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    """The optimizer's check reads the state changelog as the optimizer restores it: link A's
    second record (owner b, epoch 3) over its first, a record that is no state passed over,
    a link the config does not have named. No instance in the group: unhealthy, naming that
    and link B, which has no record."""
    config = load_config(write_config(tmp_path / "p4bs.toml", stack, topics, interfaces=("a", "b")))
    producer = RecordProducer(stack.kafka.bootstrap, topics, "states")
    for link, owner, epoch in (("r1:a", "inst-a", 1), ("r1:a", "inst-b", 3), ("r9:x", "inst-a", 1)):
        state = LinkState("static", epoch=epoch)
        producer.produce("optimizer_state", to_record(link, state, owner, time.time_ns()))
    assert producer.flush(30) == 0
    raw = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    raw.produce(topics["optimizer_state"], b"not a state record", b"r1:a")
    assert raw.flush(30) == 0

    result = status.run_check("optimizer", config, StatusOptions(timeout_ns=10 * S))
    print(result)
    assert not result.healthy
    links = result.details["links"]
    assert links["r1:a"]["owner"] == "inst-b" and links["r1:a"]["epoch"] == 3
    assert links["r1:a"]["held_by"] is None
    assert links["r1:b"] == {"owner": None}
    assert result.details["unowned"] == ["r1:b"]
    assert result.details["not_in_config"] == ["r9:x"]
    assert "note" not in result.details  # the changelog was read to its end
    group = config.optimizer.group
    assert result.summary == f"no instance in group {group}; links with no owner: r1:b"


def test_a_groups_lag_is_the_committed_end_minus_its_offsets_and_may_have_a_limit(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    """Five records; the metrics job's group (named by --metrics-group) committed 2: three
    behind. Over --max-lag 1 that makes Kafka unhealthy, naming the group and the topic.
    The group's offsets on another deployment's topic (a Kafka shared by two) count for
    nothing here."""
    config = load_config(write_config(tmp_path / "p4bs.toml", stack, topics))
    topic = topics["link_counters"]
    other = {stream: f"other-{uuid.uuid4().hex[:6]}.{stream}" for stream in STREAMS}
    ensure_topics(stack.kafka.bootstrap, other, partitions=1, replication_factor=1)
    for to in (topics, other):
        producer = RecordProducer(stack.kafka.bootstrap, to)
        for i in range(5):
            producer.produce("link_counters", {**EMPTY_COUNTERS, "link_id": "r1:x", "ts_ns": i})
        assert producer.flush(30) == 0
    (partition,) = [p for p in range(2) if stored(stack, topic, p)]
    group = f"status-lag-{uuid.uuid4().hex[:6]}"
    committer = Consumer({"bootstrap.servers": stack.kafka.bootstrap, "group.id": group})

    def committed() -> bool:
        try:  # the group's coordinator may still be loading on a fresh broker
            committer.commit(
                offsets=[
                    TopicPartition(topic, partition, 2),
                    TopicPartition(other["link_counters"], 0, 0),
                ],
                asynchronous=False,
            )
        except KafkaException as exc:
            loading = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
            if not exc.args[0].retriable() and exc.args[0].code() not in loading:
                raise
            return False
        return True

    try:
        assert wait_until(committed, 30)
    finally:
        committer.close()

    result = status.run_check("kafka", config, StatusOptions(metrics_group=group))
    assert result.healthy, result
    lag = result.details["groups"][group]["lag"]
    assert lag == {
        topic: {"lag": 3, "committed_partitions": 1, "partitions": 2},
        topics["links"]: {"committed_partitions": 0, "partitions": 2},
    }
    assert f"{group} 3," in result.summary

    result = status.run_check("kafka", config, StatusOptions(metrics_group=group, max_lag=1))
    assert not result.healthy
    assert result.summary == f"group {group}: 3 records behind on {topic} (over 1)"


def stored(stack: Stack, topic: str, partition: int) -> int:
    low, high = partition_offsets(stack.kafka.bootstrap, topic)[partition]
    return high - low


def test_flink_with_nothing_on_the_rest_port_is_unhealthy_naming_the_url(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    flink = f'mode = "remote"\njobmanager = "127.0.0.1:{port}"'
    config = load_config(write_config(tmp_path / "p4bs.toml", stack, topics, flink=flink))
    result = status.run_check("flink", config, StatusOptions(timeout_ns=2 * S))
    assert not result.healthy
    assert result.summary == f"JobManager http://127.0.0.1:{port}/jobs/overview: Connection refused"
    assert result.details == {"mode": "remote", "jobmanager": f"http://127.0.0.1:{port}"}


class FlinkRest(http.server.BaseHTTPRequestHandler):
    """A stand-in for a JobManager's REST API (the fields `p4bs status` reads, as Flink's
    /jobs/overview and /jobs/:jobid/checkpoints give them): `jobs` and `checkpoints` are
    set by the test."""

    jobs: ClassVar[list[dict[str, Any]]] = []
    checkpoints: ClassVar[dict[str, dict[str, Any]]] = {}

    def do_GET(self) -> None:
        if self.path == "/jobs/overview":
            body: Any = {"jobs": self.jobs}
        elif self.path.startswith("/jobs/") and self.path.endswith("/checkpoints"):
            body = self.checkpoints.get(self.path.split("/")[2])
        else:
            body = None
        if body is None:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


def test_flink_job_state_and_checkpoint_age_from_the_rest_api(
    stack: Stack, topics: dict[str, str], tmp_path: Path
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlinkRest)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        flink = f'mode = "remote"\njobmanager = "127.0.0.1:{port}"'
        config = load_config(write_config(tmp_path / "p4bs.toml", stack, topics, flink=flink))
        options = StatusOptions(timeout_ns=2 * S)
        now_ms = time.time_ns() // 1_000_000
        name = (
            "insert-into_default_catalog.default_database.metrics_out,"
            "default_catalog.default_database.alerts_out"
        )
        old = {"jid": "0ld", "name": name, "state": "CANCELED", "start-time": now_ms - 900_000}
        job = {"jid": "a5e0", "name": name, "state": "RUNNING", "start-time": now_ms - 60_000}
        job["duration"] = 60_000
        FlinkRest.jobs = [old, job, {"jid": "x", "name": "other", "state": "RUNNING"}]
        latest = {"id": 118, "status": "COMPLETED", "latest_ack_timestamp": now_ms - 1_500}
        FlinkRest.checkpoints = {
            "a5e0": {
                "counts": {"completed": 118, "failed": 0, "in_progress": 1},
                "latest": {"completed": latest, "failed": None, "restored": None},
            }
        }
        result = status.run_check("flink", config, options)
        assert result.healthy, result
        assert result.summary.startswith("metrics job a5e0 RUNNING, last checkpoint 1.")
        assert result.details["last_checkpoint"]["id"] == 118
        assert 1_500_000_000 <= result.details["last_checkpoint"]["age_ns"] < 10 * S

        latest["latest_ack_timestamp"] = now_ms - 45_000  # limit: 30 s (10 intervals at least)
        result = status.run_check("flink", config, options)
        assert not result.healthy
        assert "its last checkpoint (118) is 4" in result.summary
        assert "(limit 30 s)" in result.summary

        job["state"] = "FAILING"
        result = status.run_check("flink", config, options)
        assert not result.healthy and result.summary == "metrics job a5e0 is FAILING"

        FlinkRest.jobs = [{"jid": "x", "name": "other", "state": "RUNNING"}]
        result = status.run_check("flink", config, options)
        assert not result.healthy
        assert result.summary.startswith("no metrics job (name containing 'metrics_out') on")
        assert result.details["jobs"] == ["other"]
    finally:
        server.shutdown()
        server.server_close()
