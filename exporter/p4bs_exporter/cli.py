"""`p4bs analyze` (the software data plane on captures) and `p4bs exporter run` (a switch's
records into Kafka)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p4bs import logs, paths
from p4bs.config import Config, ConfigError, DataplaneConfig, SwitchConfig, load_config
from p4bs.metrics_endpoint import MetricsEndpoint
from p4bs_exporter import dataplane_spec
from p4bs_exporter.model_target import ModelTarget, choose_switch, run_spec
from p4bs_exporter.target import ExporterError, ExporterStats, SpecError, Target
from p4bs_exporter.tofino import STREAM, TofinoTarget


def _analyze_spec(args: argparse.Namespace) -> dict[str, object]:
    if args.config is None:
        link_id = args.link or "capture"
        return dataplane_spec.capture_spec(link_id, args.output_prefix, DataplaneConfig())
    config = load_config(args.config)
    try:
        chosen = config.link(args.link) if args.link else config.links[0]
    except KeyError:
        known = ", ".join(x.id for x in config.links)
        problem = f"--link: no link {args.link!r} (links: {known})"
        raise ConfigError(str(args.config), [problem]) from None
    prefixes = args.output_prefix or chosen.output_prefixes
    return dataplane_spec.capture_spec(chosen.id, prefixes, config.dataplane)


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
        argv += ["--pcap", f"{dataplane_spec.BEFORE}={args.before}"]
        if args.after is not None:
            argv += ["--pcap", f"{dataplane_spec.AFTER}={args.after}", "--queue-delay-samples"]
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


def _serve_tofino_metrics(target: Target, switch: SwitchConfig) -> MetricsEndpoint | None:
    """A Tofino exporter's Prometheus endpoint, served by this process until the run ends
    (the model's binary serves its own, from the run spec); None when it serves none."""
    if not isinstance(target, TofinoTarget) or not switch.metrics_address:
        return None
    from p4bs_exporter.metrics import serve_exporter_metrics  # the Tofino host's dependency

    try:
        return serve_exporter_metrics(switch.metrics_address, target.stats, target.topics[STREAM])
    except OSError as exc:
        raise ExporterError(
            f"switches ({switch.name}) metrics_address {switch.metrics_address}: {exc}"
        ) from None


def cmd_exporter_run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config).for_kafka_component("exporter")
        switch = choose_switch(config, args.switch)
        default = paths.home() / ".run" / "exporter" / switch.name / "stats.json"
        stats_path = (args.stats or default).resolve()
        target = _exporter_target(args, config, switch, stats_path)
    except (ConfigError, SpecError) as exc:
        print(f"p4bs exporter run: {exc}", file=sys.stderr)
        return 2
    except ExporterError as exc:
        print(f"p4bs exporter run: {exc}", file=sys.stderr)
        return 1
    endpoint = None
    try:
        endpoint = _serve_tofino_metrics(target, switch)
        target.start()
        return _run_to_the_end(target, stats_path, args.stop_timeout)
    except SpecError as exc:  # what the run spec asks for that cannot be (e.g. a tap's name)
        print(f"p4bs exporter run: {exc}", file=sys.stderr)
        return 2
    except ExporterError as exc:
        print(f"p4bs exporter run: {exc}", file=sys.stderr)
        return 1
    finally:
        # The port goes with the run: a caller in the same process (a test, a second run)
        # may bind it again.
        if endpoint is not None:
            endpoint.stop()


def _run_to_the_end(target: Target, stats_path: Path, stop_timeout: float) -> int:
    """Waits for a started exporter (printing its progress) until it ends or is stopped,
    then reports; 0 when it finished its input."""
    where = f", log in {target.log_path}" if isinstance(target, ModelTarget) else ""
    logs.status_line(f"exporter ({target.name}) started: stats in {stats_path}{where}")
    # SIGTERM stops the exporter as Ctrl-C does: it finishes the pipeline and flushes Kafka.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    began = time.monotonic()
    try:
        while not target.wait(1.0):
            now = target.stats()
            logs.status_line(
                _exporter_line(now),
                records_per_s=now.records_per_s,
                delivered=now.delivered,
                in_flight=now.in_flight,
                dropped=now.dropped,
            )
        stats = target.stats()
    except KeyboardInterrupt:
        logs.status_line("stopping: finishing the pipeline and flushing Kafka")
        stats = target.stop(timeout_s=stop_timeout + 15)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not target.wait(0):
            target.stop(timeout_s=stop_timeout + 15)
    took = time.monotonic() - began
    produced = ", ".join(f"{k} {v:,}" for k, v in sorted(stats.produced.items()))
    logs.status_line(
        f"exporter {stats.state} after {took:.1f} s: produced {stats.produced_total:,} "
        f"({produced}; {stats.rtt_samples_produced:,} RTT samples in them), "
        f"delivered {stats.delivered:,}, failed {stats.failed:,}, "
        f"dropped {stats.dropped:,}, undelivered {stats.undelivered_at_exit or 0:,}"
    )
    if stats.active_s:
        logs.status_line(
            f"  {stats.delivered / stats.active_s:,.0f} records/s delivered on average"
        )
    for problem in stats.problems:
        logs.status_line(f"  problem: {problem}")
    if stats.state != "done":
        print("p4bs exporter run: failed", file=sys.stderr)
        if isinstance(target, ModelTarget):
            print(f"last lines of {target.log_path}:\n{target.log_tail()}", file=sys.stderr)
        elif stats.last_error:
            print(f"last error: {stats.last_error}", file=sys.stderr)
        return 1
    return 0


def _ipv4_prefix(text: str) -> str:
    try:
        return str(ipaddress.IPv4Network(text, strict=True))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any) -> None:
    analyze = sub.add_parser(
        "analyze",
        help="run the software data plane on captures; records as JSON lines",
        description="Runs the data-plane model (p4/SPEC.md) on a capture made before the "
        "router and, optionally, one made after it, and writes its records to stdout as JSON "
        "lines (kind: rtt_sample, long_flow, link_counters, queue_delay). Counters of what "
        "was skipped, and damaged input, are reported on stderr.",
    )
    analyze.add_argument("before", type=Path, help="capture (pcap, pcapng) before the router")
    analyze.add_argument("--after", type=Path, help="capture (pcap, pcapng) after the router")
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
    paths.add_config_option(run)
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
    logs.add_log_format_option(run)
    run.set_defaults(func=cmd_exporter_run)
