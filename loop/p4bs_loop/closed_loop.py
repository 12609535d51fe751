"""The whole loop on one machine, around a testbed that is up: the software data plane on the
testbed's taps (the exporter), the metrics job, and the optimizer driving the testbed's
router agent over gNMI; each part a process of its own, started by the project's commands and
stopped by PID; with an InfluxDB URL also the InfluxDB sink (metrics, alerts and decisions
into its history). Used by `p4bs demo` and by the closed-loop tests and evaluations.

The loop gets a config of its own (written to its folder): the base config's link and
testbed, with the running stack's broker, fresh topics, the testbed's management address
and CA, and the policy under test.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w
from confluent_kafka import KafkaException

from p4bs.bus import client_settings, ensure_topics
from p4bs.config import Config, FlowGroup, parse_config
from p4bs.topic_range import SECOND_NS, Deadline, reader, watermarks
from p4bs_exporter import ModelTarget, run_spec
from p4bs_infra.procs import free_ports, wait_until
from p4bs_infra.stack import Stack, StackSettings
from p4bs_infra.testbed import NETCONF_PORT, Testbed, TestbedPlan, sender_group
from p4bs_schemas.registry import STREAMS

# Settings the loop changes from the base config, measured on this 2-core machine. The
# testbed's traffic (a real-time delay wire, tens of TCP senders, two taps) takes most of the
# CPU: with 100 ms windows and RTT samples in 10 ms batches the metrics job fell behind by
# one window a second (30 s behind after 40 s of traffic); with 500 ms windows, the samples
# in 100 ms batches, a checkpoint a second and the loop's processes ahead of the traffic's
# (LOOP_NICENESS) it stayed 2 to 9 s behind with 20 flows and fell to 20-40 s behind with
# 50, so metrics count as stale only after 30 s. The batches were the retired [dataplane]
# rtt_batch_interval (10 ms by default, 100 ms here); the samples now travel in their export
# interval's LinkCounters record, and the loop keeps the base config's [dataplane]
# export_interval, 100 ms, so they still come every 100 ms. P4BS's long-flow threshold
# (2000 packets in 10 s) is for 10-100 Gbit/s links; at 100 Mbit/s fifty flows get 167
# packets/s each, so a flow is long here from 500 packets in 10 s. The loop's embedded
# metrics job measures one link, so its JVM only compiles with C1 (-XX:TieredStopAtLevel=1):
# the job's first window comes ~6 s sooner (26 -> 20 s from cold, measured) and still keeps
# up with a link's traffic (100 flows: the last window readable within 2 s of the traffic's
# end).
LOOP_SECTIONS: dict[str, dict[str, Any]] = {
    "flink": {
        "window": "500ms",
        "checkpoint_interval": "1s",
        "jvm_args": "-XX:TieredStopAtLevel=1",
    },
    "dataplane": {"long_flow_threshold": 500},
    # One fit process: a loop drives one link, so more would only load Ax again beside the
    # traffic's start on two cores.
    "optimizer": {"stale_after": "30s", "fit_processes": 1},
}


# The services with a Prometheus endpoint ([<section>] metrics_address).
METRICS_SECTIONS = ("optimizer", "sinks", "alerts", "dashboard")

# The loop's own processes run ahead of the traffic's senders and loggers (the processes they
# start inherit it), so that on two cores the measurements keep up with the traffic they
# measure.
LOOP_NICENESS = -10


def own_stack(config: Config, state_dir: Path) -> Stack:
    """A Kafka broker and InfluxDB of one's own, on free loopback ports (not yet up)."""
    return Stack(StackSettings.on_free_ports(state_dir, database=config.influxdb.database))


def own_testbed_plan(
    config: Config,
    state_dir: Path,
    prefix: str,
    groups: list[FlowGroup],
    buffer_ms: float,
    delay_seed: int | None = None,
) -> TestbedPlan:
    """The config's testbed with these flow groups and an initial buffer of `buffer_ms` of
    line rate, under a name and a management /30 of its own (beside any other testbed); with
    `delay_seed`, its delay wire gives the flows their extra delays in a seeded order."""
    block = random.randrange(16_384)
    plan = TestbedPlan.from_config(config, state_dir)
    return dataclasses.replace(
        plan,
        name=f"{prefix}{uuid.uuid4().hex[:3]}",
        router_address=f"10.205.{block // 64}.{block % 64 * 4 + 2}",
        groups=[sender_group(i, group) for i, group in enumerate(groups)],
        buffer_bytes=round(plan.rate_bps / 8 * buffer_ms / 1000),
        delay_seed=delay_seed,
    )


class ClosedLoopError(RuntimeError):
    """A part of the loop did not start; the message names it and where its log is."""


def loop_config_data(
    base: Mapping[str, Any],
    testbed: Testbed,
    *,
    bootstrap: str,
    topics: Mapping[str, str],
    policy: str,
    policy_options: Mapping[str, Any],
    influx_url: str | None = None,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
    link_settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The base config's raw data (as tomllib reads it) made into the loop's: the testbed's
    link and router, on this broker and these topics, with `policy`; `sections` (e.g.
    {"flink": {"window": "500ms"}}) override settings of the config's tables, after
    LOOP_SECTIONS; `link_settings` (e.g. {"sla": {...}}) replace fields of the link's entry."""
    data = copy.deepcopy(dict(base))
    for overrides in (LOOP_SECTIONS, sections or {}):
        for table, settings in overrides.items():
            data[table] = {**data.get(table, {}), **settings}
    data["kafka"] = {**data.get("kafka", {}), "bootstrap": bootstrap, "topics": dict(topics)}
    if influx_url:
        data["influxdb"] = {**data.get("influxdb", {}), "url": influx_url}
    plan = testbed.plan
    link = next(x for x in data["links"] if f"{x['router']}:{x['interface']}" == plan.link_id)
    link.update(copy.deepcopy(dict(link_settings or {})))
    link["policy"] = policy
    link["policy_options"] = dict(policy_options)
    router = next(r for r in data["routers"] if r["name"] == link["router"])
    if plan.netconf_dialect == "junos":  # the agent plays a Junos router
        router["driver"] = "netconf-junos"
        router["address"] = f"{plan.router_address}:{NETCONF_PORT}"
        router["ca_file"] = str(testbed.pki / "known_hosts")
    else:
        router["address"] = f"{plan.router_address}:{plan.gnmi_port}"
        router["ca_file"] = str(testbed.pki / "ca.pem")
    data["optimizer"] = {
        **data.get("optimizer", {}),
        "group": f"optimizer-{uuid.uuid4().hex[:8]}",
    }
    return data


class ClosedLoop:
    """Exporter, metrics job and optimizer for one testbed; `start` waits until link metrics
    come out, `stop` stops what was started (also after a failed start). With `jobmanager`
    the metrics job is submitted to that standalone Flink cluster instead of running in a
    process of its own; `optimizers` instances share the links (one consumer group).
    `kill` and `restart` take a part down (SIGKILL) and up again, for chaos runs."""

    def __init__(
        self,
        base: Mapping[str, Any],
        testbed: Testbed,
        work_dir: Path,
        *,
        bootstrap: str,
        policy: str,
        policy_options: Mapping[str, Any] | None = None,
        influx_url: str | None = None,
        sections: Mapping[str, Mapping[str, Any]] | None = None,
        link_settings: Mapping[str, Any] | None = None,
        jobmanager: str | None = None,
        optimizers: int = 1,
    ) -> None:
        self.testbed = testbed
        self.work_dir = work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        run = f"loop-{uuid.uuid4().hex[:6]}"
        self.topics = {stream: f"{run}.{stream}" for stream in STREAMS}
        data = loop_config_data(
            base,
            testbed,
            bootstrap=bootstrap,
            topics=self.topics,
            policy=policy,
            policy_options=policy_options or {},
            influx_url=influx_url,
            sections=sections,
            link_settings=link_settings,
        )
        if jobmanager is not None:
            data["flink"] = {**data["flink"], "mode": "remote", "jobmanager": jobmanager}
        # Each service's Prometheus endpoint on a free port of its own (other loops, or a
        # deployment's services, may hold the defaults on this host), unless `sections` names
        # one.
        ports = free_ports(len(METRICS_SECTIONS) + optimizers + 1)
        for table in METRICS_SECTIONS:
            if "metrics_address" not in (sections or {}).get(table, {}):
                address = f"127.0.0.1:{ports.pop()}"
                data[table] = {**data.get(table, {}), "metrics_address": address}
        self.config: Config = parse_config(data, "closed loop")
        self.config_path = work_dir / "config.toml"
        self.config_path.write_text(tomli_w.dumps(data))
        self.influx = influx_url is not None
        self.remote = jobmanager is not None
        self.optimizers = [
            "optimizer" if optimizers == 1 else f"optimizer-{i}" for i in range(optimizers)
        ]
        # Where each process serves its metrics: the first optimizer the config's address,
        # the others one each (`--metrics-address`); the exporter a free port of its own
        # (its run spec's), not its switch's default.
        self.metrics_addresses = {
            "influx-sink": self.config.sinks.metrics_address,
            "exporter": f"127.0.0.1:{ports.pop()}",
        }
        for i, name in enumerate(self.optimizers):
            address = self.config.optimizer.metrics_address if i == 0 else ""
            self.metrics_addresses[name] = address or f"127.0.0.1:{ports.pop()}"
        self.exporter: ModelTarget | None = None
        self.exporter_spec: dict[str, Any] | None = None
        self.job_id: str | None = None  # the submitted metrics job's (remote)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, tuple[str, ...]] = {}

    def _cli(self, name: str, *args: str) -> None:
        """Starts `p4bs ARGS` with this loop's config; its output goes to NAME.log."""
        argv = [sys.executable, "-m", "p4bs_cli", *args, "--config", str(self.config_path)]
        with (self.work_dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes[name] = proc
        self.commands[name] = args
        os.setpriority(os.PRIO_PROCESS, proc.pid, LOOP_NICENESS)

    def kill(self, name: str) -> None:
        """SIGKILL to a part ("exporter", or a process's name) and what it started."""
        if name == "exporter":
            assert self.exporter is not None and self.exporter.pid is not None
            os.kill(self.exporter.pid, signal.SIGKILL)
            self.exporter.wait(30)
            return
        proc = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def restart(self, name: str) -> None:
        """Starts a part `kill` took down, as it was started."""
        if name == "exporter":
            self._start_exporter()
        else:
            self._cli(name, *self.commands[name])

    def _start_exporter(self) -> None:
        if self.exporter_spec is None:
            self.exporter_spec = run_spec(
                self.config,
                stats_path=self.work_dir / "exporter-stats.json",
                netns=self.testbed.ns["tap"],
                metrics_address=self.metrics_addresses["exporter"],
            )
        self.exporter = ModelTarget(self.exporter_spec)
        self.exporter.start()
        assert self.exporter.pid is not None
        os.setpriority(os.PRIO_PROCESS, self.exporter.pid, LOOP_NICENESS)

    def _submit_metrics_job(self, group: str) -> None:
        """Submits the metrics job to the standalone cluster; its id is kept to cancel it."""
        argv = ["jobs", "submit", "--group", group, "--checkpoints"]
        argv += [str(self.work_dir / "checkpoints"), "--config", str(self.config_path)]
        done = subprocess.run(
            [sys.executable, "-m", "p4bs_cli", *argv],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        (self.work_dir / "metrics-job.log").write_text(done.stdout + done.stderr)
        submitted = re.search(r"submitted job ([0-9a-f]{32})", done.stdout)
        if done.returncode != 0 or submitted is None:
            output = (done.stdout + done.stderr)[-2000:]
            raise ClosedLoopError(f"the metrics job was not submitted: {output}")
        self.job_id = submitted[1]

    def _cancel_metrics_job(self) -> None:
        rest = f"http://{self.config.flink.jobmanager}/jobs/{self.job_id}?mode=cancel"
        with contextlib.suppress(OSError):
            urllib.request.urlopen(urllib.request.Request(rest, method="PATCH"), timeout=10)

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.work_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(
        self,
        *,
        optimizer: bool = True,
        timeout_s: float = 240.0,
        progress: Callable[[str], None] = print,
    ) -> None:
        """Starts the parts, then waits until the first link metrics come out (the metrics
        job takes tens of seconds from cold)."""
        config = self.config
        ensure_topics(
            config.kafka,
            self.topics,
            config.kafka.partitions,
            config.kafka.replication_factor,
        )
        began = time.monotonic()
        try:
            self._start_exporter()
            progress(f"data plane model on the taps in {self.testbed.ns['tap']}")
            group = f"metrics-{uuid.uuid4().hex[:6]}"
            if self.remote:
                self._submit_metrics_job(group)
                progress(f"metrics job {self.job_id} on {config.flink.jobmanager}")
            else:
                checkpoints = str(self.work_dir / "checkpoints")
                self._cli(
                    "metrics-job", "jobs", "run", "--group", group, "--checkpoints", checkpoints
                )
                progress("metrics job starting (PyFlink MiniCluster)")
            if self.influx:
                self._cli("influx-sink", "sinks", "influx")
                progress(f"InfluxDB sink into {config.influxdb.url}/{config.influxdb.database}")
            if optimizer:
                self.start_optimizer()
            if not wait_until(self._metrics_flowing, timeout_s, interval_s=1.0):
                raise ClosedLoopError(
                    f"no link metrics after {timeout_s:.0f} s; metrics job log "
                    f"{self.work_dir / 'metrics-job.log'}:\n{self.log_tail('metrics-job')}"
                )
            progress(f"link metrics flowing after {time.monotonic() - began:.0f} s")
        except BaseException:
            self.stop()
            raise

    def start_optimizer(self) -> None:
        for name in self.optimizers:
            metrics = ("--metrics-address", self.metrics_addresses[name])
            self._cli(name, "optimizer", "run", "--report-every", "5", "--instance", name, *metrics)

    def _metrics_flowing(self) -> bool:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise ClosedLoopError(f"{name} exited: {self.log_tail(name)}")
        if self.exporter is not None and self.exporter.wait(0):
            # A capture on live taps runs until stopped: an exporter that ended has failed
            # (e.g. its metrics port taken), and no window will come.
            raise ClosedLoopError(f"the exporter exited: {self.exporter.log_tail()}")
        consumer = reader(client_settings(self.config.kafka), "loop-watch")
        try:
            topic = self.topics["link_metrics"]
            partitions = range(self.config.kafka.partitions)
            marks = watermarks(consumer, topic, Deadline(5 * SECOND_NS), partitions)
            return any(high > 0 for _, high in marks.values())
        except KafkaException:  # the topics are new: their leaders not elected within 5 s
            return False
        finally:
            consumer.close()

    def stop(self) -> None:
        """Stops the optimizer first (no decision after the loop is gone), then the metrics
        job, then the InfluxDB sink (which writes what it has read), then the rest."""
        for name in (*self.optimizers, "metrics-job", "influx-sink"):
            if name == "metrics-job" and self.job_id is not None:
                self._cancel_metrics_job()
            proc = self.processes.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGINT if name == "metrics-job" else signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for proc in self.processes.values():
            # What a part started in its session (PyFlink's JVM and Python workers) goes too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.exporter is not None:
            self.exporter.stop()
