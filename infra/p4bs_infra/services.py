"""The local stack's servers: Kafka (KRaft; one node, or a cluster of several) and InfluxDB 1.8.

Each is a plain background process bound to 127.0.0.1 with its config, data, log and pid
file under one state folder. The broker serves its clients in plaintext, or over TLS with a
SASL/SCRAM login (`KafkaSecurity`). A `Service` knows how to start itself, tell when it is ready,
report its health and stop exactly the process it started. A standalone Flink cluster joins
the stack as one more Service (streaming-jobs' remote mode talks to its REST port).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from p4bs import paths, retention
from p4bs.config import InfluxConfig, SecretRef
from p4bs.influx import InfluxClient, InfluxError, Series
from p4bs_infra import procs
from p4bs_infra.pki import server_pki

LOOPBACK = "127.0.0.1"


class StackError(RuntimeError):
    """A server that could not be set up or did not become ready, with what it said."""


@dataclass
class Health:
    name: str
    pid: int | None
    ready: bool
    where: str
    detail: str = ""


class Service(Protocol):
    name: str

    @property
    def pid(self) -> int | None: ...
    def start(self) -> None: ...
    def ready(self) -> bool: ...
    def stop(self) -> bool: ...
    def health(self) -> Health: ...
    def failure(self, what: str) -> StackError: ...


def wait_ready(svc: Service, timeout_s: float) -> None:
    """Returns once `svc` is ready; raises its failure if it exits or is not ready in time."""

    def ready_or_dead() -> bool:
        if svc.pid is None:
            raise svc.failure("exited during start-up")
        return svc.ready()

    if not procs.wait_until(ready_or_dead, max(0.0, timeout_s), 0.2):
        raise svc.failure("was not ready in time")


class _Process:
    """What both servers share: a folder with a pid file and a log."""

    name = ""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / self.name
        self.pidfile = self.dir / f"{self.name}.pid"
        self.logfile = self.dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return procs.running_pid(self.pidfile)

    def stop(self) -> bool:
        return procs.stop(self.pidfile)

    def ready(self) -> bool:
        raise NotImplementedError

    @property
    def where(self) -> str:
        """Where it serves, for health reports."""
        raise NotImplementedError

    def health(self) -> Health:
        pid = self.pid
        return Health(self.name, pid, pid is not None and self.ready(), self.where)

    def _need(self, binary: Path, how: str) -> None:
        if not binary.exists():
            raise StackError(f"{self.name}: {binary} is missing; {how}")

    def failure(self, what: str) -> StackError:
        return StackError(
            f"{self.name} {what}; last lines of {self.logfile}:\n{procs.log_tail(self.logfile)}"
        )


@dataclass(frozen=True)
class KafkaSecurity:
    """A broker whose clients connect over TLS and log in with SASL/SCRAM (`mechanism`).

    The broker's own connections (to its controller, and between brokers) and the stack's
    admin connection use mutual TLS with the broker's certificate on two more listeners
    (controller port, `internal_port`): they need no password, and a client without a
    certificate from the stack's CA cannot use them. SCRAM does not serve a KRaft
    controller listener (its credentials live in the metadata the controller serves).

    The brokers authorize every request (KRaft's StandardAuthorizer): what no ACL allows is
    denied, but to the super users, the brokers' own certificate and `admin`, the SCRAM
    user that creates topics and sets ACLs.
    """

    mechanism: str
    internal_port: int
    admin: SecretRef | None = None


# The brokers' principal on their mutual-TLS listeners: their certificate's subject (Kafka's
# default SSL principal is the whole distinguished name; pki.server_pki makes it CN=<name>).
BROKER_NAME = "localhost"
BROKER_PRINCIPAL = f"User:CN={BROKER_NAME}"


# Replicas of every topic in a cluster of several brokers, and how many must have a record
# before it is acknowledged (with acks=all): one broker may fail without losing any.
CLUSTER_REPLICAS = 3
CLUSTER_MIN_IN_SYNC = 2


class KafkaBroker(_Process):
    """Apache Kafka in KRaft mode: one process that is both broker and controller, alone or
    one node of a cluster (`node_id` of `voters`, the controllers' `id@host:port` list).
    The nodes of a cluster share the state folder's cluster id and TLS material."""

    name = "kafka"

    def __init__(
        self,
        state_dir: Path,
        port: int,
        controller_port: int,
        heap: str = "1g",
        security: KafkaSecurity | None = None,
        node_id: int = 1,
        voters: str | None = None,
        cluster_size: int = 1,
    ) -> None:
        if node_id > 1:
            self.name = f"kafka-{node_id}"
        super().__init__(state_dir)
        self.port = port
        self.controller_port = controller_port
        self.heap = heap
        self.security = security
        self.node_id = node_id
        self.voters = voters or f"{node_id}@{LOOPBACK}:{controller_port}"
        self.cluster_size = cluster_size
        self.bootstrap = f"{LOOPBACK}:{port}"
        self.tls_dir = state_dir / "kafka" / "tls"
        self._cluster_id_file = state_dir / "kafka-cluster-id"

    @property
    def ca_file(self) -> Path | None:
        """The CA that signed a secured broker's certificate, for its clients to trust."""
        return None if self.security is None else self.tls_dir / "ca.pem"

    @property
    def _keystore(self) -> Path:
        return self.tls_dir / "server.p12"

    def _keystore_password(self) -> str:
        """The password of the broker's keystore, made with the keystore."""
        path = self.tls_dir / "keystore-password"
        if not path.exists():
            self.tls_dir.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(secrets.token_urlsafe(24))
        return path.read_text()

    def _make_pki(self) -> None:
        """The CA and the broker's keystore, once: a restarted broker keeps them, so its
        clients' trust in the CA stays valid."""
        if not self._keystore.exists():
            password = self._keystore_password()
            server_pki(self.tls_dir, "p4bs stack CA", BROKER_NAME, [LOOPBACK], 365, password)

    def admin_settings(self) -> dict[str, Any]:
        """librdkafka settings of the stack's own admin connection (readiness, SCRAM users):
        a plaintext broker's bootstrap, or a secured broker's internal listener with the
        broker's certificate."""
        if self.security is None:
            return {"bootstrap.servers": self.bootstrap}
        return {
            "bootstrap.servers": f"{LOOPBACK}:{self.security.internal_port}",
            "security.protocol": "ssl",
            "ssl.ca.location": str(self.ca_file),
            "ssl.keystore.location": str(self._keystore),
            "ssl.keystore.password": self._keystore_password(),
        }

    def add_scram_user(self, username: str, password: str, timeout_s: float = 30.0) -> None:
        """Creates or updates the SCRAM credential clients log in with (KRaft keeps it in the
        cluster's metadata, salted and hashed)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        assert self.security is not None
        mechanism = ScramMechanism[self.security.mechanism.replace("-", "_")]
        # 8192: above SCRAM-SHA-512's minimum (4096) as Kafka's own tools default to.
        upsert = UserScramCredentialUpsertion(
            username, ScramCredentialInfo(mechanism, 8192), password.encode()
        )
        admin = AdminClient(self.admin_settings())
        futures = admin.alter_user_scram_credentials([upsert], request_timeout=timeout_s)
        try:
            futures[username].result(timeout_s)
        except KafkaException as exc:
            raise StackError(f"kafka: SCRAM credential for {username!r}: {exc}") from exc

    @property
    def where(self) -> str:
        return self.bootstrap

    def _java(self) -> list[str]:
        jars = paths.jars_dir("kafka")
        self._need(jars / "kafka_2.13-4.3.1.jar", "run `make setup`")
        java = shutil.which("java")
        if java is None:
            raise StackError("kafka: no java on PATH; run `make setup`")
        return [
            java,
            f"-Xmx{self.heap}",
            "-Xms256m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
            "-cp",
            f"{jars}/*",
        ]

    def _listeners(self) -> dict[str, str]:
        """Listener settings: one plaintext listener for everything, or (secured) SASL_SSL
        for clients and mutual TLS for the controller and the internal listener."""
        controller = f"CONTROLLER://{LOOPBACK}:{self.controller_port}"
        if self.security is None:
            return {
                "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},{controller}",
                "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
            }
        mechanism = self.security.mechanism
        super_users = [BROKER_PRINCIPAL]
        if self.security.admin is not None:
            try:
                super_users.append(f"User:{self.security.admin.resolve()}")
            except LookupError as exc:
                raise StackError(f"{self.name}: the admin's kafka username: {exc}") from exc
        clients = f"SASL_SSL://{LOOPBACK}:{self.port}"
        internal = f"INTERNAL://{LOOPBACK}:{self.security.internal_port}"
        password = self._keystore_password()
        scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "listeners": f"{clients},{controller},{internal}",
            "advertised.listeners": f"{clients},{internal}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL,INTERNAL:SSL",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.enabled.mechanisms": mechanism,
            f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config": scram_login,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self._keystore),
            "ssl.keystore.password": password,
            "ssl.key.password": password,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "listener.name.controller.ssl.client.auth": "required",
            "listener.name.internal.ssl.client.auth": "required",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(super_users),
        }

    def _write_config(self) -> Path:
        data = self.dir / "data"
        # Internal topics cannot have more replicas than brokers.
        replicas = str(min(CLUSTER_REPLICAS, self.cluster_size))
        in_sync = str(min(CLUSTER_MIN_IN_SYNC, self.cluster_size))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "controller.listener.names": "CONTROLLER",
            **self._listeners(),
            "log.dirs": str(data),
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "group.initial.rebalance.delay.ms": "0",
            # A transaction left open by a process that died holds up read-committed readers
            # of its partitions until aborted; look for timed-out ones every second (the
            # default is 10 s), so an optimizer's links are taken over within seconds.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "auto.create.topics.enable": "false",
            "num.partitions": "4",
        }
        config = self.dir / "server.properties"
        config.touch(mode=0o600)  # a secured broker's holds its keystore password
        config.chmod(0o600)
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.dir / "log4j2.properties").write_text(
            "rootLogger.level = WARN\n"
            "rootLogger.appenderRef.out.ref = out\n"
            "appender.out.type = Console\n"
            "appender.out.name = out\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "logger.kafka.name = kafka\n"
            "logger.kafka.level = WARN\n"
            "logger.apache.name = org.apache.kafka\n"
            "logger.apache.level = WARN\n"
        )
        return config

    def start(self) -> None:
        if self.pid is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        java = self._java()
        if self.security is not None:
            self._make_pki()
        config = self._write_config()
        if not (self.dir / "data" / "meta.properties").exists():
            # KRaft needs its log folder formatted once with the cluster's id.
            cluster_id = self._cluster_id()
            # `--cluster-id=`: an id may start with "-", which would read as an option.
            tool = [*java, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}"]
            formatted = procs.run_logged([*tool, "-c", str(config)], self.logfile)
            if not formatted:
                raise self.failure("storage format failed")
        procs.start_detached([*java, "kafka.Kafka", str(config)], self.pidfile, self.logfile)

    def _cluster_id(self) -> str:
        """The cluster's id (22 chars, base64url), made by its first node to start."""
        if not self._cluster_id_file.exists():
            made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            self._cluster_id_file.write_text(made)
        return self._cluster_id_file.read_text().strip()

    def ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        if not procs.port_open(LOOPBACK, self.port):
            return False
        try:
            metadata = AdminClient(self.admin_settings()).list_topics(timeout=2)
        except Exception:
            return False
        return len(metadata.brokers) > 0


class InfluxDB(_Process):
    """InfluxDB 1.8 (built by `make setup` with go install), HTTP API with Flux enabled."""

    name = "influxdb"

    def __init__(self, state_dir: Path, port: int, rpc_port: int, settings: InfluxConfig) -> None:
        super().__init__(state_dir)
        self.port = port
        self.rpc_port = rpc_port
        self.settings = settings  # the database and how long it keeps what
        self.database = settings.database
        self.url = f"http://{LOOPBACK}:{port}"
        # The stack's own server, which asks for no login.
        self.client = InfluxClient(replace(settings, url=self.url, username=None, password=None))

    @property
    def where(self) -> str:
        return self.url

    def _write_config(self) -> Path:
        config = self.dir / "influxd.conf"
        config.write_text(
            f"""reporting-disabled = true
bind-address = "{LOOPBACK}:{self.rpc_port}"
[meta]
  dir = "{self.dir / "meta"}"
[data]
  dir = "{self.dir / "data"}"
  wal-dir = "{self.dir / "wal"}"
  query-log-enabled = false
[http]
  enabled = true
  bind-address = "{LOOPBACK}:{self.port}"
  flux-enabled = true
  log-enabled = false
[monitor]
  store-enabled = false
"""
        )
        return config

    def start(self) -> None:
        if self.pid is not None:
            return
        binary = paths.tool("influxd")
        self._need(binary, "run `make setup` (it builds influxd 1.8.10 with go install)")
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        procs.start_detached([str(binary), "-config", str(config)], self.pidfile, self.logfile)

    def ready(self) -> bool:
        try:
            self.client.ping(timeout_s=2)
        except InfluxError:
            return False
        return True

    def query(self, statement: str) -> list[Series]:
        """Runs an InfluxQL statement; raises StackError with InfluxDB's own message on error."""
        try:
            return self.client.query(statement)
        except InfluxError as exc:
            raise StackError(f"influxdb: {exc}") from exc

    def create_database(self) -> None:
        """The database, its retention policies and the continuous queries that downsample
        the windows (p4bs/retention.py); settings changed since an earlier start are applied."""
        db, raw_ns = self.database, self.settings.retention_ns
        hour = 3_600_000_000_000
        if raw_ns:
            duration = f"{raw_ns // 1_000_000_000}s"
            # A shard group must not outlast the retention: InfluxDB's own defaults by range.
            shard = "1h" if raw_ns < 48 * hour else "1d"
        else:
            duration, shard = "INF", "7d"
        self.query(f'CREATE DATABASE "{db}"')
        self.query(
            f'ALTER RETENTION POLICY "{retention.RAW}" ON "{db}" '
            f"DURATION {duration} SHARD DURATION {shard} DEFAULT"
        )
        for policy, keep in retention.retention_policies(self.settings):
            try:
                self.query(
                    f'CREATE RETENTION POLICY "{policy}" ON "{db}" DURATION {keep} REPLICATION 1'
                )
            except StackError:  # it exists, with another duration
                self.query(f'ALTER RETENTION POLICY "{policy}" ON "{db}" DURATION {keep}')
        for rollup in retention.ROLLUPS:
            name, statement = retention.continuous_query(db, rollup)
            self.query(f'DROP CONTINUOUS QUERY "{name}" ON "{db}"')
            self.query(statement)


def flink_home() -> Path:
    """The Flink distribution PyFlink bundles (bin/, lib/, opt/)."""
    import pyflink

    return Path(pyflink.__file__).resolve().parent


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


PROMETHEUS_REPORTER = "org.apache.flink.metrics.prometheus.PrometheusReporterFactory"


def flink_prometheus_reporter(ports: str) -> dict[str, Any]:
    """The `metrics` section of a Flink config that switches on Flink's own Prometheus
    reporter on `ports` ("9470", or a range "9470-9479": the JobManager and each TaskManager
    take the next one free). Its jar comes with the distribution PyFlink installs
    (plugins/metrics-prometheus/flink-metrics-prometheus-<the same version>.jar), loaded as a
    plugin: nothing to fetch. The reporter binds every interface (it has no host option):
    infra/README.md says how to keep it to this machine."""
    return {"reporter": {"prom": {"factory": {"class": PROMETHEUS_REPORTER}, "port": ports}}}


class _FlinkProcess(_Process):
    """A JobManager or TaskManager of a standalone Flink cluster, run in the foreground of
    its own process from PyFlink's distribution, with this cluster's config folder."""

    script = ""

    def __init__(
        self, state_dir: Path, rest_port: int, rpc_port: int, metrics_ports: str = ""
    ) -> None:
        super().__init__(state_dir)
        self.rest_port = rest_port
        self.rpc_port = rpc_port
        self.metrics_ports = metrics_ports  # Flink's Prometheus reporter's; "": off
        self.rest = f"http://{LOOPBACK}:{rest_port}"
        self.conf_dir = state_dir / "flink-conf"
        self.lib_dir = state_dir / "flink-lib"

    def _write_config(self) -> None:
        """One config for the whole cluster: the distribution's (JVM options among it) with
        loopback only, 2 slots per TaskManager and the project's Python for Python workers."""
        import yaml

        config = yaml.safe_load((flink_home() / "conf" / "config.yaml").read_text())
        ours = {
            "jobmanager": {
                "bind-host": LOOPBACK,
                "rpc": {"address": LOOPBACK, "port": self.rpc_port},
                "memory": {"process": {"size": "1024m"}},
            },
            "taskmanager": {"bind-host": LOOPBACK, "host": LOOPBACK, "numberOfTaskSlots": 2},
            "rest": {"address": LOOPBACK, "bind-address": LOOPBACK, "port": self.rest_port},
            "python": {"executable": str(paths.home() / ".venv" / "bin" / "python")},
            # A TaskManager that is killed is noticed at once (its connections close) and its
            # job restarts from the last checkpoint on the other one; one that hangs, in 30 s
            # (default 50 s). Shorter timed out TaskManagers that were only slow (infra/README).
            "heartbeat": {"interval": 2000, "timeout": 30000},
        }
        if self.metrics_ports:
            ours["metrics"] = flink_prometheus_reporter(self.metrics_ports)
        _merge(config, ours)
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "config.yaml").write_text(yaml.safe_dump(config))
        # The distribution's console logging: a foreground process logs to its log file.
        shutil.copy(flink_home() / "conf" / "log4j-console.properties", self.conf_dir)
        # The distribution's lib/ plus flink-python from opt/, which Python jobs need on the
        # cluster's classpath; links, so the installed distribution stays as it is.
        self.lib_dir.mkdir(exist_ok=True)
        home = flink_home()
        for jar in [*(home / "lib").glob("*.jar"), *(home / "opt").glob("flink-python-*.jar")]:
            link = self.lib_dir / jar.name
            if not link.exists():
                link.symlink_to(jar)

    def start(self) -> None:
        if self.pid is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        script = flink_home() / "bin" / self.script
        self._need(script, "run `make setup` (PyFlink brings the Flink distribution)")
        env = {
            "FLINK_CONF_DIR": str(self.conf_dir),
            "FLINK_LIB_DIR": str(self.lib_dir),
            "FLINK_LOG_DIR": str(self.dir),
        }
        argv = ["bash", str(script), "start-foreground", *self._options()]
        procs.start_detached(argv, self.pidfile, self.logfile, env)

    def _options(self) -> list[str]:
        return []

    def _overview(self) -> dict[str, int] | None:
        try:
            with urllib.request.urlopen(f"{self.rest}/overview", timeout=2) as reply:
                overview: dict[str, int] = json.loads(reply.read())
                return overview
        except (urllib.error.URLError, OSError, ValueError):
            return None


class FlinkJobManager(_FlinkProcess):
    name = "flink-jobmanager"
    script = "jobmanager.sh"

    @property
    def where(self) -> str:
        return self.rest

    def ready(self) -> bool:
        return self._overview() is not None


class FlinkTaskManager(_FlinkProcess):
    script = "taskmanager.sh"

    def __init__(
        self, state_dir: Path, rest_port: int, rpc_port: int, index: int, metrics_ports: str = ""
    ) -> None:
        self.name = f"flink-taskmanager-{index}"
        super().__init__(state_dir, rest_port, rpc_port, metrics_ports)
        self.index = index

    @property
    def where(self) -> str:
        return f"via {self.rest}"

    def _options(self) -> list[str]:
        # A stable id, so the REST API says which of ours runs what.
        return [f"-Dtaskmanager.resource-id={self.name}"]

    def ready(self) -> bool:
        """Registered at the JobManager (TaskManagers start one after another)."""
        overview = self._overview()
        return overview is not None and overview.get("taskmanagers", 0) > self.index
