"""The `p4bs` command line: one entry point, a subcommand per part."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p4bs import dataplane, paths
from p4bs.closed_loop import ClosedLoopError
from p4bs.config import (
    POLICIES,
    Config,
    ConfigError,
    DataplaneConfig,
    SwitchConfig,
    load_config,
)
from p4bs_eval import cli as eval_cli
from p4bs_exporter import (
    ExporterError,
    ExporterStats,
    ModelTarget,
    SpecError,
    Target,
    run_spec,
)
from p4bs_exporter.model import choose_switch
from p4bs_exporter.tofino import TofinoTarget
from p4bs_infra.services import StackError
from p4bs_infra.stack import Stack, StackSettings
from p4bs_infra.testbed import Testbed, TestbedError, TestbedPlan
from p4bs_infra.traffic import Scenario, ShortFlows, TrafficRun, Voip
from p4bs_jobs import cli as jobs_cli
from p4bs_optimizer import cli as optimizer_cli


def _default_config() -> Path:
    return paths.home() / "config" / "testbed.toml"


def cmd_config_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"{args.file}: ok — {len(config.links)} link(s), {len(config.routers)} router(s), "
        f"{len(config.switches)} switch(es)"
    )
    for link in config.links:
        print(
            f"  {link.id}: {link.capacity_bps / 1e6:g} Mbit/s, policy {link.policy}, "
            f"buffer [{link.min_buffer_bytes}, {link.max_buffer_bytes}] B, "
            f"safe {link.safe_buffer_bytes} B"
        )
    return 0


def cmd_stack_up(args: argparse.Namespace) -> int:
    try:
        settings = StackSettings.from_config(load_config(args.config), args.state_dir)
        overridable = ("kafka_port", "kafka_controller_port", "influx_port", "influx_rpc_port")
        for name in (*overridable, "flink_taskmanagers"):
            if getattr(args, name) is not None:
                setattr(settings, name, getattr(args, name))
        stack = Stack(settings)
        took = stack.up(timeout_s=args.timeout)
    except (ConfigError, StackError) as exc:
        print(f"p4bs stack up: {exc}", file=sys.stderr)
        return 1
    print(f"stack ready in {took:.1f} s (state, logs and pid files in {settings.state_dir})")
    _print_health(stack)
    return 0


def _print_health(stack: Stack) -> bool:
    healthy = True
    for h in stack.health():
        state = "ready" if h.ready else ("running, not ready" if h.pid else "stopped")
        healthy &= h.ready
        print(f"  {h.name:<20} {state:<19} pid {h.pid or '-':<8} {h.where}")
    print(f"  {'topics':<20} {', '.join(stack.settings.topics)}")
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


def _testbed(args: argparse.Namespace, from_config: bool) -> Testbed:
    if from_config:
        return Testbed(TestbedPlan.from_config(load_config(args.config), args.state_dir))
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


def _analyze_spec(args: argparse.Namespace) -> dict[str, object]:
    if args.config is None:
        link_id = args.link or "capture"
        return dataplane.capture_spec(link_id, args.output_prefix, DataplaneConfig())
    config = load_config(args.config)
    try:
        chosen = config.link(args.link) if args.link else config.links[0]
    except KeyError:
        known = ", ".join(x.id for x in config.links)
        problem = f"--link: no link {args.link!r} (links: {known})"
        raise ConfigError(str(args.config), [problem]) from None
    prefixes = args.output_prefix or chosen.output_prefixes
    return dataplane.capture_spec(chosen.id, prefixes, config.dataplane)


def cmd_analyze(args: argparse.Namespace) -> int:
    binary = paths.built("p4bs-model")
    if not binary.exists():
        print(f"p4bs analyze: {binary} is missing: run `make setup`", file=sys.stderr)
        return 1
    try:
        spec = _analyze_spec(args)
    except ConfigError as exc:
        print(f"p4bs analyze: {exc}", file=sys.stderr)
        return 1
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="p4bs-spec-") as spec_file:
        json.dump(spec, spec_file)
        spec_file.flush()
        argv = [str(binary), "analyze", "--config", spec_file.name]
        argv += ["--pcap", f"{dataplane.BEFORE}={args.before}"]
        if args.after is not None:
            argv += ["--pcap", f"{dataplane.AFTER}={args.after}", "--queue-delay-samples"]
        if args.summary:
            argv.append("--summary")
        return subprocess.run(argv, check=False).returncode


def _pcap_arg(text: str) -> tuple[str, Path]:
    port, sep, file = text.partition("=")
    if not sep or not port or not file:
        raise argparse.ArgumentTypeError(f"must be PORT=FILE (before=x.pcap), got {text!r}")
    return port, Path(file)


def _exporter_line(s: ExporterStats) -> str:
    return (
        f"  {s.uptime_s:6.1f} s  {s.state:<8} {s.records_per_s:>12,.0f} records/s  "
        f"delivered {s.delivered:,}  in flight {s.in_flight:,}  dropped {s.dropped:,}"
    )


def _exporter_target(
    args: argparse.Namespace, config: Config, switch: SwitchConfig, stats_path: Path
) -> Target:
    """The switch's target: the model (live taps or captures) or a Tofino."""
    if switch.target == "tofino":
        model_only = [
            f"{flag}: only for a model switch; {switch.name} is a tofino"
            for flag, given in (
                ("--pcap", args.pcap),
                ("--pace", args.pace != "max"),
                ("--netns", args.netns),
                ("--link", args.link),
            )
            if given
        ]
        if model_only:
            raise ConfigError("p4bs exporter run", model_only)
        return TofinoTarget(config, switch.name, stats_path=stats_path)
    spec = run_spec(
        config,
        stats_path=stats_path,
        switch=switch.name,
        link=args.link,
        pcaps=args.pcap,
        pace=args.pace,
        netns=args.netns,
        flush_timeout_s=args.stop_timeout,
    )
    return ModelTarget(spec)


def cmd_exporter_run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        switch = choose_switch(config, args.switch)
        default = paths.home() / ".run" / "exporter" / switch.name / "stats.json"
        stats_path = (args.stats or default).resolve()
        target = _exporter_target(args, config, switch, stats_path)
        target.start()
    except (ConfigError, SpecError) as exc:
        print(f"p4bs exporter run: {exc}", file=sys.stderr)
        return 2
    except ExporterError as exc:
        print(f"p4bs exporter run: {exc}", file=sys.stderr)
        return 1
    where = f", log in {target.log_path}" if isinstance(target, ModelTarget) else ""
    print(f"exporter ({target.name}) started: stats in {stats_path}{where}")
    # SIGTERM stops the exporter as Ctrl-C does: it finishes the pipeline and flushes Kafka.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    began = time.monotonic()
    try:
        while not target.wait(1.0):
            print(_exporter_line(target.stats()), flush=True)
        stats = target.stats()
    except KeyboardInterrupt:
        print("stopping: finishing the pipeline and flushing Kafka", flush=True)
        stats = target.stop(timeout_s=args.stop_timeout + 15)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not target.wait(0):
            target.stop(timeout_s=args.stop_timeout + 15)
    took = time.monotonic() - began
    produced = ", ".join(f"{k} {v:,}" for k, v in sorted(stats.produced.items()))
    print(
        f"exporter {stats.state} after {took:.1f} s: produced {stats.produced_total:,} "
        f"({produced}; {stats.rtt_samples_produced:,} RTT samples in the batches), "
        f"delivered {stats.delivered:,}, failed {stats.failed:,}, "
        f"dropped {stats.dropped:,}, undelivered {stats.undelivered_at_exit or 0:,}"
    )
    if stats.active_s:
        print(f"  {stats.delivered / stats.active_s:,.0f} records/s delivered on average")
    for problem in stats.problems:
        print(f"  problem: {problem}")
    if stats.state != "done":
        print("p4bs exporter run: failed", file=sys.stderr)
        if isinstance(target, ModelTarget):
            print(f"last lines of {target.log_path}:\n{target.log_tail()}", file=sys.stderr)
        elif stats.last_error:
            print(f"last error: {stats.last_error}", file=sys.stderr)
        return 1
    return 0


def _flow_groups(text: str) -> tuple[int, ...]:
    try:
        groups = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"flows per group, comma separated: {text!r}") from None
    if not groups or min(groups) < 1:
        raise argparse.ArgumentTypeError(f"each group needs at least one flow: {text!r}")
    return groups


def cmd_demo(args: argparse.Namespace) -> int:
    from p4bs.demo import DemoSettings, default_out, run_demo

    if args.every * (len(args.groups) - 1) >= args.duration:
        print("p4bs demo: the last group would join after the traffic ends", file=sys.stderr)
        return 2
    try:
        return run_demo(
            DemoSettings(
                config=args.config,
                out=args.out or default_out(),
                policy=args.policy,
                groups=args.groups,
                every_s=args.every,
                duration_s=args.duration,
                initial_buffer_ms=args.initial_buffer_ms,
            )
        )
    except (ConfigError, StackError, TestbedError, ClosedLoopError) as exc:
        print(f"p4bs demo: {exc}", file=sys.stderr)
        return 1


def _ipv4_prefix(text: str) -> str:
    try:
        return str(ipaddress.IPv4Network(text, strict=True))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p4bs", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="deployment config files")
    config_sub = config.add_subparsers(dest="action", required=True)
    check = config_sub.add_parser("check", help="validate a config file, listing every problem")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_config_check)

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
    up.add_argument("--config", type=Path, default=_default_config(), help="default: %(default)s")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    for flag in ("kafka-port", "kafka-controller-port", "influx-port", "influx-rpc-port"):
        up.add_argument(f"--{flag}", type=int, help="override the config's port")
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

    testbed = sub.add_parser("testbed", help="the emulated network around a Linux router")
    testbed_sub = testbed.add_subparsers(dest="action", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--state-dir", type=Path, help="default: .run/testbed/<name>")
    named = argparse.ArgumentParser(add_help=False, parents=[where])
    named.add_argument("--name", default="p4bs", help="the testbed's name (default: %(default)s)")
    up = testbed_sub.add_parser("up", parents=[where], help="build it from the config's [testbed]")
    up.add_argument("--config", type=Path, default=_default_config(), help="default: %(default)s")
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

    analyze = sub.add_parser(
        "analyze",
        help="run the software data plane on captures; records as JSON lines",
        description="Runs the data-plane model (p4/SPEC.md) on a capture made before the "
        "router and, optionally, one made after it, and writes its records to stdout as JSON "
        "lines (kind: rtt_sample, long_flow, link_counters, queue_delay). Counters of what "
        "was skipped, and damaged input, are reported on stderr.",
    )
    analyze.add_argument("before", type=Path, help="pcap captured before the router")
    analyze.add_argument("--after", type=Path, help="pcap captured after the router")
    analyze.add_argument(
        "--config", type=Path, help="deployment config: its [dataplane] settings and link"
    )
    analyze.add_argument("--link", help="link id (router:interface); default: the first link")
    analyze.add_argument(
        "--output-prefix",
        action="append",
        default=[],
        type=_ipv4_prefix,
        help="IPv4 prefix behind the output interface: packets towards it are the data "
        "direction (repeatable; default: the link's output_prefixes; with none, both "
        "directions are measured)",
    )
    analyze.add_argument("--summary", action="store_true", help="per-link totals instead")
    analyze.set_defaults(func=cmd_analyze)

    exporter = sub.add_parser("exporter", help="the data plane's records into Kafka")
    exporter_sub = exporter.add_subparsers(dest="action", required=True)
    run = exporter_sub.add_parser(
        "run",
        help="export one switch's records (live taps, or capture files)",
        description="Runs the exporter of one switch of the config until its input ends "
        "(--pcap) or it is stopped (Ctrl-C, SIGTERM), printing its counters once per second. "
        "Exit codes: 0 ok, 1 runtime failure, 2 bad config.",
    )
    run.add_argument("--config", type=Path, default=_default_config(), help="default: %(default)s")
    run.add_argument("--switch", help="the switch whose links to export (default: the first)")
    run.add_argument("--link", help="with --pcap: the captured link (default: the switch's first)")
    run.add_argument(
        "--pcap",
        action="append",
        default=[],
        type=_pcap_arg,
        metavar="PORT=FILE",
        help="read captures instead of the taps; PORT is before or after (repeatable)",
    )
    run.add_argument("--pace", choices=("max", "realtime"), default="max", help="with --pcap")
    run.add_argument("--stats", type=Path, help="stats file (default: .run/exporter/<switch>/)")
    run.add_argument("--netns", help="network namespace of the tap interfaces (live)")
    run.add_argument(
        "--stop-timeout", type=float, default=60.0, help="seconds to flush when stopped"
    )
    run.set_defaults(func=cmd_exporter_run)
    jobs_cli.add_parser(sub, _default_config())
    optimizer_cli.add_parser(sub, _default_config())
    eval_cli.add_parser(sub, _default_config())
    demo = sub.add_parser(
        "demo", help="the whole system on this machine, live, with a report; torn down after"
    )
    demo.add_argument("--config", type=Path, default=_default_config(), help="%(default)s")
    demo.add_argument("--policy", default="p4bs", choices=POLICIES, help="default: %(default)s")
    demo.add_argument(
        "--groups", type=_flow_groups, default=(10, 20, 20), help="Cubic flows per group (10,20,20)"
    )
    demo.add_argument("--every", type=float, default=60.0, help="s between groups (60)")
    demo.add_argument("--duration", type=float, default=180.0, help="s of traffic (180)")
    demo.add_argument(
        "--initial-buffer-ms", type=float, default=200.0, help="router buffer at start (200)"
    )
    demo.add_argument("--out", type=Path, help="default: .run/demo/<date-time>")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
