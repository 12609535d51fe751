"""`p4bs stack` (the local Kafka broker, InfluxDB and Flink cluster) and `p4bs testbed` (the
emulated network around a Linux router)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from p4bs import paths
from p4bs.bus import client_settings
from p4bs.config import ConfigError, load_config
from p4bs_infra import kafka_acls
from p4bs_infra.services import StackError
from p4bs_infra.stack import Stack, StackSettings
from p4bs_infra.testbed import Aqm, Testbed, TestbedError, TestbedPlan
from p4bs_infra.traffic import Scenario, ShortFlows, TrafficRun, Voip


def cmd_stack_up(args: argparse.Namespace) -> int:
    try:
        settings = StackSettings.from_config(load_config(args.config), args.state_dir)
        overridable = (
            "kafka_port",
            "kafka_controller_port",
            "kafka_internal_port",
            "influx_port",
            "influx_rpc_port",
        )
        for name in (*overridable, "flink_taskmanagers", "kafka_brokers"):
            if getattr(args, name) is not None:
                setattr(settings, name, getattr(args, name))
        stack = Stack(settings)
        took = stack.up(timeout_s=args.timeout)
    except (ConfigError, StackError) as exc:
        print(f"p4bs stack up: {exc}", file=sys.stderr)
        return 1
    print(f"stack ready in {took:.1f} s (state, logs and pid files in {settings.state_dir})")
    if settings.kafka_brokers > 1:
        print(f"kafka bootstrap (list it whole in the config's [kafka]): {stack.bootstrap}")
    _print_health(stack)
    return 0


def _print_health(stack: Stack) -> bool:
    healthy = True
    for h in stack.health():
        state = "ready" if h.ready else ("running, not ready" if h.pid else "stopped")
        healthy &= h.ready
        print(f"  {h.name:<20} {state:<19} pid {h.pid or '-':<8} {h.where}")
    print(f"  {'topics':<20} {', '.join(sorted(stack.settings.topics.values()))}")
    return healthy


def cmd_stack_down(args: argparse.Namespace) -> int:
    try:
        stopped = Stack.from_state(args.state_dir).down()
    except StackError as exc:
        print(f"p4bs stack down: {exc}", file=sys.stderr)
        return 1
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    try:
        stack = Stack.from_state(args.state_dir)
    except StackError as exc:
        print(f"p4bs stack status: {exc}", file=sys.stderr)
        return 1
    return 0 if _print_health(stack) else 1


def cmd_stack_acls(args: argparse.Namespace) -> int:
    """Prints the ACLs of each component's user; with --apply, creates them, connected as
    the config's admin component."""
    try:
        config = load_config(args.config)
        kafka, group = config.kafka, config.optimizer.group
        print(kafka_acls.render(kafka, group), end="")
        if args.apply:
            admin = client_settings(kafka.for_component("admin"))
            print(f"applied {kafka_acls.apply(admin, kafka, group)} ACLs")
    except (ConfigError, LookupError, ValueError, KafkaException) as exc:
        print(f"p4bs stack acls: {exc}", file=sys.stderr)
        return 1
    return 0


def _testbed(args: argparse.Namespace, from_config: bool) -> Testbed:
    if from_config:
        plan = TestbedPlan.from_config(load_config(args.config), args.state_dir)
        if args.aqm:
            plan = dataclasses.replace(plan, aqm=Aqm(kind=args.aqm))
        return Testbed(plan)
    state = args.state_dir or paths.home() / ".run" / "testbed" / args.name
    return Testbed(TestbedPlan.load(state))


def cmd_testbed_up(args: argparse.Namespace) -> int:
    try:
        testbed = _testbed(args, from_config=True)
        took = testbed.up()
    except (ConfigError, TestbedError) as exc:
        print(f"p4bs testbed up: {exc}", file=sys.stderr)
        return 1
    p = testbed.plan
    print(f"testbed {p.name} up in {took:.1f} s (state in {p.state_dir})")
    print(f"  router {p.link_id}: {p.rate_bps / 1e6:g} Mbit/s, buffer {p.buffer_bytes} B")
    if p.aqm is not None:
        print(f"  bottleneck: the delay wire's {p.aqm.kind} queue on that buffer ({p.aqm})")
    print(
        f"  RTT {p.base_rtt_ns / 1e6:g} ms + per-flow extra up to {p.extra_delay_max_ns / 1e6:g} ms"
    )
    print(f"  namespaces: {', '.join(testbed.ns.values())}")
    print(
        f"  taps in {testbed.ns['tap']}: {p.tap_before} (before the router), {p.tap_after} (after)"
    )
    return 0


def cmd_testbed_down(args: argparse.Namespace) -> int:
    try:
        removed = _testbed(args, from_config=False).down()
    except TestbedError as exc:
        print(f"p4bs testbed down: {exc}", file=sys.stderr)
        return 1
    print("removed: " + (", ".join(removed) if removed else "nothing was up"))
    return 0


def cmd_testbed_status(args: argparse.Namespace) -> int:
    try:
        status = _testbed(args, from_config=False).status()
    except TestbedError as exc:
        print(f"p4bs testbed status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2))
    namespaces = status["namespaces"]
    assert isinstance(namespaces, dict)
    return 0 if all(namespaces.values()) and status["delay_wire_pid"] else 1


def cmd_testbed_run(args: argparse.Namespace) -> int:
    try:
        testbed = _testbed(args, from_config=False)
        scenario = Scenario(
            duration_s=args.duration,
            warmup_s=args.warmup,
            short_flows=ShortFlows(rate_per_s=args.short_flows) if args.short_flows else None,
            voip=Voip() if args.voip else None,
        )
        summary = TrafficRun(testbed, args.out, scenario).run()
    except TestbedError as exc:
        print(f"p4bs testbed run: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def add_parser(sub: Any) -> None:
    stack = sub.add_parser("stack", help="the local Kafka broker and InfluxDB")
    stack_sub = stack.add_subparsers(dest="action", required=True)
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument(
        "--state-dir",
        type=Path,
        default=paths.default_state_dir(),
        help="where pid files, logs and data live (default: %(default)s)",
    )
    up = stack_sub.add_parser("up", parents=[state], help="start and wait until ready")
    paths.add_config_option(up)
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    for flag in (
        "kafka-port",
        "kafka-controller-port",
        "kafka-internal-port",
        "influx-port",
        "influx-rpc-port",
    ):
        up.add_argument(f"--{flag}", type=int, help="override the config's port")
    up.add_argument(
        "--kafka-brokers",
        type=int,
        help="run Kafka as a KRaft cluster of this many nodes on consecutive ports (node i: "
        "the first's ports + 3(i-1)); topics get 3 replicas, 2 in sync (default: 1 node)",
    )
    up.add_argument(
        "--flink-taskmanagers",
        type=int,
        help="also run a standalone Flink cluster with this many TaskManagers "
        "(default: 2 when flink.mode is remote, else none)",
    )
    up.set_defaults(func=cmd_stack_up)
    down = stack_sub.add_parser("down", parents=[state], help="stop what `up` started")
    down.set_defaults(func=cmd_stack_down)
    status = stack_sub.add_parser("status", parents=[state], help="health; exit 1 if unhealthy")
    status.set_defaults(func=cmd_stack_status)
    acls = stack_sub.add_parser(
        "acls", help="the Kafka ACLs of each component's user ([kafka.users]); --apply sets them"
    )
    paths.add_config_option(acls)
    acls.add_argument(
        "--apply", action="store_true", help="create them, as the config's admin component"
    )
    acls.set_defaults(func=cmd_stack_acls)

    testbed = sub.add_parser("testbed", help="the emulated network around a Linux router")
    testbed_sub = testbed.add_subparsers(dest="action", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--state-dir", type=Path, help="default: .run/testbed/<name>")
    named = argparse.ArgumentParser(add_help=False, parents=[where])
    named.add_argument("--name", default="p4bs", help="the testbed's name (default: %(default)s)")
    up = testbed_sub.add_parser("up", parents=[where], help="build it from the config's [testbed]")
    paths.add_config_option(up)
    up.add_argument(
        "--aqm",
        choices=("red", "codel"),
        help="the bottleneck is the delay wire's RED or CoDel queue (defaults: infra/README.md)",
    )
    up.set_defaults(func=cmd_testbed_up)
    down = testbed_sub.add_parser("down", parents=[named], help="remove namespaces and processes")
    down.set_defaults(func=cmd_testbed_down)
    status = testbed_sub.add_parser("status", parents=[named], help="namespaces, wire, queue")
    status.set_defaults(func=cmd_testbed_status)
    run = testbed_sub.add_parser("run", parents=[named], help="run traffic, record ground truth")
    run.add_argument("--duration", type=float, default=30.0, help="seconds (default: %(default)s)")
    run.add_argument("--warmup", type=float, default=10.0, help="seconds left out of the summary")
    run.add_argument("--short-flows", type=float, metavar="PER_S", help="Poisson short flows")
    run.add_argument("--voip", action="store_true", help="add a VoIP-like UDP stream")
    run.add_argument("--out", type=Path, required=True, help="run directory (must be new)")
    run.set_defaults(func=cmd_testbed_run)
