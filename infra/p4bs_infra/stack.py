"""`p4bs stack up|down|status`: the local Kafka + InfluxDB that every other part talks to.

The ports and names come from the deployment config (kafka.bootstrap, influxdb.url, topics),
overridable on the command line; what was started is remembered in `<state>/stack.json` so
`down` and `status` need no arguments. Flink needs nothing here by default: jobs run in
PyFlink's embedded MiniCluster; with `flink.mode = "remote"` (or --flink-taskmanagers) the
stack also runs a standalone Flink cluster from PyFlink's distribution: a JobManager at
`flink.jobmanager` and its TaskManagers.

With `kafka.security = "sasl_ssl"` the broker serves its clients over TLS with a SASL/SCRAM
login: the stack makes a CA and the broker's certificate, creates the config's users with the
config's passwords ([kafka]'s, and each of [kafka.users.<component>], resolved from their
references, kept nowhere), and writes the [kafka] settings its clients need to
`<state>/kafka/client.toml`. Its brokers then run KRaft's StandardAuthorizer, denying what no
ACL allows: the brokers themselves (their certificate) and the admin component's user are
super users, and every other component's user gets the ACLs `p4bs stack acls` prints
(p4bs_infra.kafka_acls), derived from the config's topics and optimizer group.

With `--kafka-brokers N` (N >= 2) Kafka is a KRaft cluster of N nodes on consecutive ports,
whose topics (the internal ones too) have 3 replicas (at most N) of which 2 must hold a
record before it is acknowledged: one node may fail, or be killed, without a record lost.
Clients list every node in their bootstrap (`Stack.bootstrap`).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from p4bs.bus import Cluster, ensure_topics
from p4bs.config import Config, InfluxConfig, KafkaConfig, SecretRef
from p4bs.config.model import KafkaUser, OptimizerConfig
from p4bs_infra import kafka_acls, procs
from p4bs_infra.services import (
    CLUSTER_REPLICAS,
    LOOPBACK,
    FlinkJobManager,
    FlinkTaskManager,
    Health,
    InfluxDB,
    KafkaBroker,
    KafkaSecurity,
    Service,
    StackError,
    wait_ready,
)

STATE_FILE = "stack.json"


@dataclass
class StackSettings:
    state_dir: Path
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    # "sasl_ssl": TLS + SASL/SCRAM for clients, as the config's [kafka] says; the broker's
    # own listener (mutual TLS) is on the internal port.
    kafka_security: str = "plaintext"
    kafka_sasl_mechanism: str = "SCRAM-SHA-512"
    kafka_internal_port: int = 9094
    kafka_username: SecretRef | None = None
    kafka_password: SecretRef | None = None
    # component -> its own SCRAM login ([kafka.users.<component>]); each gets its ACLs.
    kafka_users: dict[str, KafkaUser] = field(default_factory=dict)
    optimizer_group: str = OptimizerConfig.group  # the ACLs name it
    # Kafka nodes (broker and controller each). Node i > 1 takes the ports of node 1 plus
    # 3·(i - 1): client, controller and internal ports in steps of three.
    kafka_brokers: int = 1
    influx_port: int = 8086
    influx_rpc_port: int = 8088
    topics: dict[str, str] = field(default_factory=dict)  # stream -> topic
    partitions: int = 4
    replication_factor: int = 1
    database: str = "p4bs"
    retention_ns: int = 0
    retention_1s_ns: int = InfluxConfig.retention_1s_ns
    retention_1m_ns: int = InfluxConfig.retention_1m_ns
    events_retention_ns: int = InfluxConfig.events_retention_ns
    # A standalone Flink cluster (JobManager + this many TaskManagers) for `p4bs jobs
    # submit`; 0: none, jobs run in PyFlink's embedded MiniCluster.
    flink_taskmanagers: int = 0
    flink_rest_port: int = 8081
    flink_rpc_port: int = 6123
    # Flink's own Prometheus reporter on the cluster's processes, one port each from this
    # port or range ("9470-9479"); "": off ([flink] metrics_ports).
    flink_metrics_ports: str = ""

    @classmethod
    def on_free_ports(cls, state_dir: Path, **settings: Any) -> StackSettings:
        """`settings` on ports free on the loopback right now (every Kafka node's three,
        InfluxDB's two, Flink's two): a stack of one's own beside others (tests, runs)."""
        influx, rpc, rest, flink_rpc = procs.free_ports(4)
        nodes = settings.get("kafka_brokers", 1)
        base = procs.free_port_block(3 * nodes, avoid=(influx, rpc, rest, flink_rpc))
        return cls(
            state_dir=state_dir,
            kafka_port=base,
            kafka_controller_port=base + 1,
            kafka_internal_port=base + 2,
            influx_port=influx,
            influx_rpc_port=rpc,
            flink_rest_port=rest,
            flink_rpc_port=flink_rpc,
            **settings,
        )

    @classmethod
    def from_config(cls, config: Config, state_dir: Path) -> StackSettings:
        """Ports from the config's endpoints, which must be on this machine's loopback."""
        first = config.kafka.bootstrap.split(",")[0].strip()  # a cluster's first node
        host, _, kafka_port = first.rpartition(":")
        influx = urllib.parse.urlsplit(config.influxdb.url)
        for what, h in (("kafka.bootstrap", host), ("influxdb.url", influx.hostname)):
            if h not in (LOOPBACK, "localhost"):
                raise StackError(f"the local stack binds to {LOOPBACK}; {what} names {h}")
        flink_host, _, flink_port = config.flink.jobmanager.rpartition(":")
        remote = config.flink.mode == "remote"
        if remote and flink_host not in (LOOPBACK, "localhost"):
            raise StackError(
                f"the local stack binds to {LOOPBACK}; flink.jobmanager names {flink_host}"
            )
        return cls(
            state_dir=state_dir,
            flink_taskmanagers=2 if remote else 0,
            flink_rest_port=int(flink_port),
            flink_rpc_port=int(flink_port) + 42,
            flink_metrics_ports=config.flink.metrics_ports,
            kafka_port=int(kafka_port),
            kafka_controller_port=int(kafka_port) + 1,
            kafka_security=config.kafka.security,
            kafka_sasl_mechanism=config.kafka.sasl_mechanism,
            kafka_internal_port=int(kafka_port) + 2,
            kafka_username=config.kafka.username,
            kafka_password=config.kafka.password,
            kafka_users=dict(config.kafka.users),
            optimizer_group=config.optimizer.group,
            influx_port=influx.port or 8086,
            influx_rpc_port=(influx.port or 8086) + 2,
            topics=dict(config.kafka.topics),
            partitions=config.kafka.partitions,
            replication_factor=config.kafka.replication_factor,
            database=config.influxdb.database,
            retention_ns=config.influxdb.retention_ns,
            retention_1s_ns=config.influxdb.retention_1s_ns,
            retention_1m_ns=config.influxdb.retention_1m_ns,
            events_retention_ns=config.influxdb.events_retention_ns,
        )


class Stack:
    def __init__(self, settings: StackSettings) -> None:
        s = self.settings = settings
        security = None
        if s.kafka_security == "sasl_ssl":
            admin = s.kafka_users.get("admin")
            security = KafkaSecurity(
                s.kafka_sasl_mechanism,
                s.kafka_internal_port,
                s.kafka_username if admin is None else admin.username,
            )
        if s.kafka_brokers < 1:
            raise StackError(f"kafka_brokers must be at least 1, not {s.kafka_brokers}")
        ports = [
            (s.kafka_port + 3 * i, s.kafka_controller_port + 3 * i, s.kafka_internal_port + 3 * i)
            for i in range(s.kafka_brokers)
        ]
        voters = ",".join(f"{i + 1}@{LOOPBACK}:{c}" for i, (_, c, _) in enumerate(ports))
        self.brokers = [
            KafkaBroker(
                s.state_dir,
                port,
                controller,
                security=None if security is None else replace(security, internal_port=internal),
                node_id=i + 1,
                voters=voters,
                cluster_size=s.kafka_brokers,
            )
            for i, (port, controller, internal) in enumerate(ports)
        ]
        self.kafka = self.brokers[0]  # the stack's admin connection goes to it
        self.influxdb = InfluxDB(
            s.state_dir,
            s.influx_port,
            s.influx_rpc_port,
            InfluxConfig(
                database=s.database,
                retention_ns=s.retention_ns,
                retention_1s_ns=s.retention_1s_ns,
                retention_1m_ns=s.retention_1m_ns,
                events_retention_ns=s.events_retention_ns,
            ),
        )
        self.services: list[Service] = [*self.brokers, self.influxdb]
        if s.flink_taskmanagers:
            rest, rpc, metrics = s.flink_rest_port, s.flink_rpc_port, s.flink_metrics_ports
            self.flink = FlinkJobManager(s.state_dir, rest, rpc, metrics)
            self.services.append(self.flink)
            for i in range(s.flink_taskmanagers):
                self.services.append(FlinkTaskManager(s.state_dir, rest, rpc, i, metrics))

    @classmethod
    def from_state(cls, state_dir: Path) -> Stack:
        """The stack as `up` last recorded it in `state_dir`."""
        try:
            saved = json.loads((state_dir / STATE_FILE).read_text())
        except OSError as exc:
            raise StackError(f"no stack was started in {state_dir} ({exc.strerror})") from exc
        saved["state_dir"] = Path(saved["state_dir"])
        if isinstance(saved.get("topics"), list):  # recorded before topics were by stream
            saved["topics"] = {topic: topic for topic in saved["topics"]}
        for name in ("kafka_username", "kafka_password"):
            if saved.get(name) is not None:
                saved[name] = SecretRef(**saved[name])
        saved["kafka_users"] = {
            component: KafkaUser(SecretRef(**user["username"]), SecretRef(**user["password"]))
            for component, user in saved.get("kafka_users", {}).items()
        }
        return cls(StackSettings(**saved))

    @property
    def client(self) -> Cluster:
        """How this stack's Kafka clients connect: the bootstrap of a plaintext broker, or
        the [kafka] settings of a secured one (its CA, the users' credential references,
        the topics)."""
        s = self.settings
        if self.kafka.ca_file is None:
            return self.bootstrap
        return KafkaConfig(
            bootstrap=self.bootstrap,
            topics=dict(s.topics),
            security="sasl_ssl",
            sasl_mechanism=s.kafka_sasl_mechanism,
            ca_file=str(self.kafka.ca_file),
            username=s.kafka_username,
            password=s.kafka_password,
            users=dict(s.kafka_users),
        )

    def client_for(self, component: str) -> Cluster:
        """How `component`'s clients connect: as its own user on a secured broker."""
        client = self.client
        return client if isinstance(client, str) else client.for_component(component)

    def _add_kafka_users(self) -> None:
        """The SCRAM users the config names ([kafka]'s and each component's), their ACLs,
        and the settings their clients need."""
        client = self.client
        assert isinstance(client, KafkaConfig)
        if client.username is None or client.password is None:
            raise StackError("a sasl_ssl broker needs kafka.username and kafka.password")
        logins = [(client.username, client.password)]
        logins += [(user.username, user.password) for user in client.users.values()]
        try:
            resolved = {username.resolve(): password.resolve() for username, password in logins}
        except LookupError as exc:
            raise StackError(f"kafka credentials: {exc}") from exc
        for username, password in resolved.items():
            self.kafka.add_scram_user(username, password)
        # Over the internal listener, as the brokers' own (super) principal.
        kafka_acls.apply(self.kafka.admin_settings(), client, self.settings.optimizer_group)

        def ref(secret: SecretRef) -> dict[str, str]:
            return {k: v for k, v in asdict(secret).items() if v is not None}

        section: dict[str, object] = {
            "bootstrap": client.bootstrap,
            "security": client.security,
            "sasl_mechanism": client.sasl_mechanism,
            "ca_file": client.ca_file,
            "username": ref(client.username),
            "password": ref(client.password),
        }
        if client.users:
            section["users"] = {
                component: {"username": ref(user.username), "password": ref(user.password)}
                for component, user in client.users.items()
            }
        self.client_file.write_text(
            "# What a p4bs config's [kafka] needs to reach this stack's broker.\n"
            + tomli_w.dumps({"kafka": section})
        )

    @property
    def bootstrap(self) -> str:
        """Every broker's client address: a client still reaches the cluster when one is
        down."""
        return ",".join(broker.bootstrap for broker in self.brokers)

    def _check_ports_free(self) -> None:
        s = self.settings
        kafka = [
            (f"{broker.name}{what}", port)
            for broker in self.brokers
            for what, port in (
                ("", broker.port),
                (" controller", broker.controller_port),
                *(
                    ((" internal", broker.security.internal_port),)
                    if broker.security is not None
                    else ()
                ),
            )
        ]
        for name, port in (
            *kafka,
            ("influxdb", s.influx_port),
            ("influxdb rpc", s.influx_rpc_port),
            *(
                (("flink rest", s.flink_rest_port), ("flink rpc", s.flink_rpc_port))
                if s.flink_taskmanagers
                else ()
            ),
        ):
            if procs.port_open(LOOPBACK, port):
                raise StackError(f"{name} port {port} on {LOOPBACK} is already in use")

    def up(self, timeout_s: float = 60.0, progress: Callable[[str], None] = print) -> float:
        """Starts what is not running, waits for readiness, creates topics and the database.

        Returns the seconds it took. On failure stops whatever it started and raises.
        """
        began = time.monotonic()
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True)
        if all(svc.pid is None for svc in self.services):
            self._check_ports_free()
        saved = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()}
        (s.state_dir / STATE_FILE).write_text(json.dumps(saved, indent=2) + "\n")
        try:
            for svc in self.services:
                svc.start()
            deadline = began + timeout_s
            for svc in self.services:
                wait_ready(svc, deadline - time.monotonic())
                progress(f"{svc.name} ready after {time.monotonic() - began:.1f} s")
            if self.kafka.security is not None:
                self._add_kafka_users()
                progress(f"kafka clients: TLS + {s.kafka_sasl_mechanism}, see {self.client_file}")
            replicas = s.replication_factor
            if s.kafka_brokers > 1:  # a cluster is for surviving a node's failure
                replicas = max(replicas, min(CLUSTER_REPLICAS, s.kafka_brokers))
            created = ensure_topics(self.client_for("admin"), s.topics, s.partitions, replicas)
            if created:
                progress(
                    f"created {len(created)} topics with {s.partitions} partitions of "
                    f"{replicas} replicas each"
                )
            self.influxdb.create_database()
        except BaseException:
            self.down()
            raise
        return time.monotonic() - began

    @property
    def client_file(self) -> Path:
        """Where a secured stack writes its clients' [kafka] settings."""
        return self.kafka.dir / "client.toml"

    def down(self) -> list[str]:
        """Stops exactly the processes this stack started; returns their names. The Kafka
        nodes go last and together: the last of a cluster stopped alone has no quorum left
        for its controlled shutdown and waited for its SIGKILL, 20 s later."""
        others = [svc for svc in reversed(self.services) if svc not in self.brokers]
        stopped = [svc.name for svc in others if svc.stop()]
        brokers = list(reversed(self.brokers))
        stopped_pidfiles = procs.stop_together([broker.pidfile for broker in brokers])
        return stopped + [b.name for b in brokers if b.pidfile in stopped_pidfiles]

    def health(self) -> list[Health]:
        return [svc.health() for svc in self.services]
