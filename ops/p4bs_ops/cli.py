"""`p4bs status`: the health of a whole deployment on one screen (or as JSON); exit status 0
when every part is healthy, 1 when one is not, 2 for a config or an option that is wrong.
`p4bs dashboard`: the deployment's web view (ops/README.md)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from p4bs import logs, paths
from p4bs.config import Config, ConfigError, SecretRef, load_config
from p4bs.metrics_endpoint import add_metrics_address_option, with_metrics_address
from p4bs.units import UnitError, parse_duration_ns
from p4bs_ops.status import (
    METRICS_GROUP,
    METRICS_JOB_MATCH,
    PARTS,
    StatusOptions,
    exit_code,
    render_text,
    run_status,
    to_json,
)


def _duration(text: str) -> int:
    """A positive command-line duration ("5s", "500ms") in ns."""
    try:
        value = parse_duration_ns(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _records(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of records, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PARTS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"parts are {', '.join(PARTS)} (comma separated), got {text!r}"
        )
    return names


def _config(args: argparse.Namespace, command: str) -> Config | None:
    """The config `--config` names, or None once its problems are printed; its Kafka
    clients log in as the dashboard's user (read only), as status and the dashboard do."""
    try:
        return load_config(args.config).for_kafka_component("dashboard")
    except ConfigError as exc:
        print(f"p4bs {command}: {exc}", file=sys.stderr)
        return None


def cmd_status(args: argparse.Namespace) -> int:
    config = _config(args, "status")
    if config is None:
        return 2
    if not getattr(args, "verbose", False):
        # The drivers log each failed router call; the status line says it once.
        logging.getLogger("p4bs_optimizer").setLevel(logging.CRITICAL)
    options = StatusOptions(
        timeout_ns=args.timeout,
        max_data_age_ns=args.max_data_age,
        max_checkpoint_age_ns=args.max_checkpoint_age,
        max_lag=args.max_lag,
        influx_interval_ns=args.influx_interval,
        metrics_group=args.metrics_group,
        flink_job=args.flink_job,
    )
    parts = [p for p in PARTS if p not in set(args.skip or [])]
    checked_at = time.time_ns()
    results = run_status(config, options, parts)
    if args.json:
        print(json.dumps(to_json(results, str(args.config), checked_at), indent=2))
    else:
        print(render_text(results, str(args.config), checked_at, details=not args.brief))
    return exit_code(results)


def cmd_dashboard(args: argparse.Namespace) -> int:
    # Here, not at the top: every `p4bs` command would import the web server otherwise.
    from p4bs_ops.dashboard.feed import Fleet
    from p4bs_ops.dashboard.server import ServeOptions, SetupError, serve

    config = _config(args, "dashboard")
    if config is None:
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("p4bs dashboard: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    token = None
    if args.token_env or args.token_file:
        # By reference, as the config's credentials: never a value on the command line.
        reference = SecretRef(env=args.token_env, file=args.token_file)
        try:
            token = reference.resolve()
        except LookupError as exc:
            print(f"p4bs dashboard: token: {exc}", file=sys.stderr)
            return 2
        if not token:
            print("p4bs dashboard: token: empty", file=sys.stderr)
            return 2
    options = ServeOptions(args.bind, args.port, token, args.tls_cert, args.tls_key)
    config = with_metrics_address(config, "dashboard.metrics_address", args.metrics_address)
    try:
        serve(Fleet(config), options, on_start=logs.status_line)
    except SetupError as exc:
        print(f"p4bs dashboard: {exc}", file=sys.stderr)
        return 2
    return 0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port number, got {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {value}")
    return value


def add_parser(sub: Any) -> None:
    _add_status(sub)
    _add_dashboard(sub)


def _add_dashboard(sub: Any) -> None:
    dashboard = sub.add_parser(
        "dashboard",
        help="the deployment's web view: fleet, links, searches, live from Kafka",
        description="Serves the dashboard: the fleet, each link's history (InfluxDB) and live "
        "records (Kafka), a P4BS link's Bayesian search. Only on this machine unless "
        "--bind says otherwise, which needs a token and TLS.",
    )
    paths.add_config_option(dashboard)
    dashboard.add_argument(
        "--bind", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    dashboard.add_argument("--port", type=_port, default=8050, help="default %(default)s")
    token = dashboard.add_mutually_exclusive_group()
    token.add_argument(
        "--token-env", metavar="VAR", help="the access token is in this environment variable"
    )
    token.add_argument("--token-file", metavar="PATH", help="the access token is in this file")
    dashboard.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate")
    dashboard.add_argument("--tls-key", type=Path, help="... and this private key")
    add_metrics_address_option(dashboard, "dashboard.metrics_address")
    logs.add_log_format_option(dashboard)
    dashboard.set_defaults(func=cmd_dashboard)


def _add_status(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="health of a whole deployment: Kafka, Flink, exporters, optimizer, routers, "
        "InfluxDB; exit 1 if a part is unhealthy",
        description=__doc__,
    )
    paths.add_config_option(status)
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    status.add_argument("--brief", action="store_true", help="one line per part, no details")
    status.add_argument(
        "--timeout", type=_duration, default=5_000_000_000, help="per check (default 5s)"
    )
    status.add_argument(
        "--max-data-age",
        type=_duration,
        default=5_000_000_000,
        help="a link whose newest link_counters record is older is flagged (default 5s)",
    )
    status.add_argument(
        "--max-checkpoint-age",
        type=_duration,
        help="the metrics job's last completed checkpoint may be this old (default: 10 "
        "[flink] checkpoint intervals, at least 30s)",
    )
    status.add_argument(
        "--max-lag",
        type=_records,
        help="records a consumer group may be behind on a topic (default: lag is reported only)",
    )
    status.add_argument(
        "--influx-interval",
        type=_duration,
        default=1_000_000_000,
        help="InfluxDB's write rate is measured over this long (default 1s)",
    )
    status.add_argument(
        "--metrics-group",
        default=METRICS_GROUP,
        help="the metrics job's Kafka group (`p4bs jobs run|submit --group`; default %(default)s)",
    )
    status.add_argument(
        "--flink-job",
        default=METRICS_JOB_MATCH,
        help="a part of the metrics job's name on the JobManager (default %(default)s: the "
        "job is named after its sink tables)",
    )
    status.add_argument(
        "--skip", type=_parts, metavar="PARTS", help=f"parts not to check: {', '.join(PARTS)}"
    )
    status.set_defaults(func=cmd_status)
