"""A broker that only takes TLS + SASL/SCRAM, started by `p4bs stack up` from a config that
says so: an authenticated client produces and consumes, clients without the CA, the
password or a certificate are refused (each refusal asserted by what the client was told),
the Rust exporter and the Flink metrics job reach it, and no file of the run holds a secret.

The secured stack (secured_stack.py, ~1 min to start) is shared with test_kafka_acls: the
session's plaintext one stays as fast as it was for every other test. The clients here log in
as the [kafka] user, the admin.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from pcapgen import write_taps
from secured_stack import PASSWORD_VAR, USER, Secured, client_kafka, example_with
from test_exporter import exporting, mixed_flows
from test_jobs_cli import jobs_run_bounded

from p4bs.bus import RecordProducer, ensure_topics, read_stream
from p4bs.config import Config, load_config
from p4bs_exporter import ExporterStats, ModelTarget, SpecError, run_spec
from p4bs_schemas.intervals import NO_COUNTS, IntervalAssembler
from p4bs_schemas.registry import STREAMS


@pytest.fixture
def secured_topics(secured: Secured) -> dict[str, str]:
    names = {s: f"sec-{uuid.uuid4().hex[:6]}.{s}" for s in STREAMS}
    ensure_topics(secured.client, names, partitions=1, replication_factor=1)
    return names


def test_the_stack_writes_what_clients_need_and_they_produce_and_consume(
    secured: Secured, secured_topics: dict[str, str]
) -> None:
    print(f"secured stack up in {secured.started_s:.1f} s")
    written = load_config(
        _write_client_config(secured, secured.folder / "client.toml", secured_topics)
    ).kafka
    assert written.security == "sasl_ssl"
    assert written.ca_file == str(secured.stack.kafka.ca_file)
    assert (written.username, written.password) == (
        secured.client.username,
        secured.client.password,
    )
    sample = {
        "ts_ns": 1_700_000_000_000_000_000,
        "src_ip": "10.0.1.2",
        "dst_ip": "10.0.2.2",
        "src_port": 40000,
        "dst_port": 5201,
        "protocol": 6,
        "rtt_ns": 20_000_000,
    }
    assembler = IntervalAssembler(interval_ns=100_000_000)
    assert assembler.add_sample("r1:eth1", sample) == []
    end = sample["ts_ns"] + 100_000_000
    (record,) = assembler.close("r1:eth1", end, 100_000_000, {**NO_COUNTS, "packets": 9})
    producer = RecordProducer(written, secured_topics)
    producer.produce("link_counters", record)
    assert producer.flush(30) == 0 and producer.stats.delivered == 1
    assert read_stream(written, "link_counters", secured_topics) == [record]


class _Refusal:
    """A client that tries to list the cluster's topics, keeping what it was told."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.errors: list[KafkaError] = []
        self.logs: list[str] = []
        logger = logging.getLogger(f"refused-{uuid.uuid4().hex[:6]}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_Collect(self.logs))
        admin = AdminClient({**settings, "error_cb": self.errors.append, "logger": logger})
        with pytest.raises(KafkaException) as refused:
            admin.list_topics(timeout=4)
        self.raised: KafkaError = refused.value.args[0]
        admin.poll(0.5)  # serves the error and log callbacks

    def told(self, code: int) -> list[str]:
        return [e.str() for e in self.errors if e.code() == code]


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def test_clients_without_the_ca_the_password_or_a_certificate_are_refused(
    secured: Secured,
) -> None:
    bootstrap = secured.stack.kafka.bootstrap
    ca = str(secured.stack.kafka.ca_file)
    scram = {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512"}

    # Plaintext: the broker closes the connection at the client's first request.
    plain = _Refusal({"bootstrap.servers": bootstrap})
    assert plain.raised.code() == KafkaError._TRANSPORT
    closed = [m for m in plain.logs if "closed by peer" in m and "APIVERSION_QUERY" in m]
    assert closed, plain.logs

    # TLS and SCRAM with a wrong password, and with a user that does not exist.
    for user, password in ((USER, secured.password + "x"), ("intruder", secured.password)):
        wrong = _Refusal(
            {"bootstrap.servers": bootstrap, **scram, "ssl.ca.location": ca}
            | {"sasl.username": user, "sasl.password": password}
        )
        told = wrong.told(KafkaError._AUTHENTICATION)
        assert told and all("invalid credentials" in t for t in told), wrong.errors

    # The right password, but a client that does not trust the stack's CA: the broker's
    # certificate is refused before any password is sent.
    untrusting = _Refusal(
        {"bootstrap.servers": bootstrap, **scram, "sasl.username": USER}
        | {"sasl.password": secured.password}
    )
    told = untrusting.told(KafkaError._SSL)
    assert told and all("certificate verify failed" in t for t in told), untrusting.errors

    # The broker's own listeners (controller, internal) take only the stack's certificate.
    settings = secured.stack.settings
    for port in (settings.kafka_controller_port, settings.kafka_internal_port):
        no_cert = _Refusal(
            {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "ssl"}
            | {"ssl.ca.location": ca}
        )
        told = no_cert.told(KafkaError._TRANSPORT)
        assert told and all("bad certificate" in t for t in told), no_cert.errors


def _write_client_config(secured: Secured, path: Path, topics: dict[str, str]) -> Path:
    """The example config with the [kafka] settings `stack up` wrote for its clients."""
    kafka = client_kafka(secured)
    # The [kafka] user's login only: the topics here are the test's own, outside the ACLs.
    del kafka["users"]
    # Long flows from 100 packets, as the exporter tests' captures have them.
    sections = {"kafka": kafka | {"topics": topics}, "dataplane": {"long_flow_threshold": 100}}
    path.write_text(example_with(sections))
    return path


@dataclass
class SecuredRun:
    config: Config
    spec: dict[str, Any]
    exporter: ExporterStats  # its final counters
    spec_text: str
    job: subprocess.CompletedProcess[str]
    metrics: list[dict[str, Any]]


@pytest.fixture(scope="module")
def secured_run(secured: Secured) -> SecuredRun:
    """The exporter on captures, then the metrics job to the end of its topics, both on the
    secured broker, with the parts' logs in the run folder."""
    run = secured.folder / "run"
    run.mkdir()
    topics = {s: f"run-{uuid.uuid4().hex[:6]}.{s}" for s in STREAMS}
    ensure_topics(secured.client, topics, partitions=1, replication_factor=1)
    config_path = _write_client_config(secured, run / "p4bs.toml", topics)
    config = load_config(config_path)
    before, after = write_taps(run, mixed_flows())
    spec = run_spec(
        config,
        stats_path=run / "exporter" / "stats.json",
        pcaps=[("before", before), ("after", after)],
    )
    with exporting(spec) as target:
        assert target.wait(90), target.log_tail()
        assert target.returncode == 0, target.log_tail()
        exporter = target.stats()
    spec_text = target.spec_path.read_text()

    # The embedded job's JVM logs into FLINK_LOG_DIR (by default PyFlink's own folder).
    env = {**os.environ, "FLINK_LOG_DIR": str(run / "flink-log")}
    job = jobs_run_bounded(config_path, "secured", run / "checkpoints", env)
    (run / "job.stdout").write_text(job.stdout)
    (run / "job.stderr").write_text(job.stderr)
    metrics = read_stream(config.kafka, "link_metrics", topics) if job.returncode == 0 else []
    return SecuredRun(config, spec, exporter, spec_text, job, metrics)


def test_the_exporter_and_the_metrics_job_reach_the_secured_broker(
    secured: Secured, secured_run: SecuredRun
) -> None:
    stats = secured_run.exporter
    assert stats.state == "done"
    assert stats.delivered == stats.produced_total > 30
    assert (stats.failed, stats.undelivered_at_exit) == (0, 0)
    # The spec names the credentials by reference; the binary read them itself.
    assert f'"env": "{PASSWORD_VAR}"' in secured_run.spec_text

    job = secured_run.job
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.rstrip().endswith("job finished")
    assert len(secured_run.metrics) > 10
    assert {m["link_id"] for m in secured_run.metrics} == {"r1:eth1"}

    # Without the password the exporter does not start: its check resolves the reference.
    spec = {**secured_run.spec, "stats": {"path": str(secured.folder / "unset" / "stats.json")}}
    os.environ.pop(PASSWORD_VAR)
    try:
        with pytest.raises(SpecError) as err:
            ModelTarget(spec).check()
    finally:
        os.environ[PASSWORD_VAR] = secured.password
    problems = "\n".join(err.value.problems)
    assert (
        f"kafka.secret_properties.sasl.password: environment variable ${PASSWORD_VAR}" in problems
    )


def test_no_file_of_the_run_holds_a_secret(secured: Secured, secured_run: SecuredRun) -> None:
    """Every file the stack, the exporter and the job wrote (logs, state, specs, stats,
    checkpoints), but the two that hand the broker its keystore password."""
    assert secured_run.job.returncode == 0  # the job ran, so its logs are there
    state = secured.stack.settings.state_dir
    keystore_holders = {
        state / "kafka" / "server.properties",
        secured.stack.kafka.tls_dir / "keystore-password",
    }
    for holder in keystore_holders:
        assert stat.S_IMODE(holder.stat().st_mode) == 0o600, holder
    files = [p for p in secured.folder.rglob("*") if p.is_file()]
    logs = {p.name for p in files if p.suffix == ".log"}
    assert {"kafka.log", "influxdb.log", "stats.log"} <= logs, logs
    assert any(name.startswith("flink-") for name in logs), logs
    found = []
    for path in files:
        data = path.read_bytes()
        for what, secret in secured.secrets().items():
            if secret.encode() in data and not (
                what == "keystore password" and path in keystore_holders
            ):
                found.append(f"{what} in {path}")
    assert found == []
    # The search finds what is there: the keystore password in its holders; the job's
    # log is the one with its Kafka clients' settings, the login among them hidden.
    keystore = secured.secrets()["keystore password"].encode()
    assert all(keystore in holder.read_bytes() for holder in keystore_holders)
    job_log = "".join(p.read_text() for p in files if p.name.startswith("flink-"))
    assert "sasl.jaas.config = [hidden]" in job_log and "security.protocol = SASL_SSL" in job_log
    # The SCRAM password is not even in the keystore's holders.
    assert all(secured.password.encode() not in p.read_bytes() for p in keystore_holders)
