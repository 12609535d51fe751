"""`python -m p4bs_infra.agent`: the router agent, run inside the router's namespace.

Credentials come from environment variables named on the command line (never from argv).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from pygnmi.spec.v080 import gnmi_pb2_grpc as pb_grpc

from p4bs import logs
from p4bs.yang import YangError, YangModel
from p4bs_infra.agent import netconf_server
from p4bs_infra.agent.datastore import AgentError, RouterQos
from p4bs_infra.agent.gnmi import Gnmi
from p4bs_infra.agent.junos import JunosDatastores, JunosMethods, KernelQueues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="p4bs_infra.agent", description=__doc__)
    parser.add_argument("--interface", action="append", required=True, help="managed interface")
    parser.add_argument("--max-buffer-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--gnmi", default="0.0.0.0:9339", help="address:port for gNMI")
    parser.add_argument("--netconf-port", type=int, default=830)
    parser.add_argument(
        "--netconf-dialect",
        choices=("openconfig", "junos"),
        default="openconfig",
        help="NETCONF serves OpenConfig QoS on running, or Junos class-of-service with a "
        "candidate and confirmed commits (validated against Junos's YANG: shared/yang)",
    )
    parser.add_argument(
        "--confirmed-commit-1.1",
        dest="confirmed_commit_11",
        action="store_true",
        help="junos dialect: advertise :confirmed-commit:1.1 (with cancel-commit) instead of "
        "1.0, which Junos advertises",
    )
    parser.add_argument(
        "--confirm-minute-s",
        type=float,
        default=60.0,
        help="junos dialect, FOR TESTS ONLY: seconds a <commit-configuration> confirm-timeout "
        "minute lasts (default 60), so that a test sees a rollback without waiting minutes",
    )
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument(
        "--tls-client-ca",
        help="require gNMI clients to present a certificate this CA signed (mutual TLS)",
    )
    parser.add_argument("--ssh-host-key", required=True)
    parser.add_argument("--state-file", type=Path, help="where classifier terms are kept")
    parser.add_argument("--username-env", default="P4BS_ROUTER_USER")
    parser.add_argument("--password-env", default="P4BS_ROUTER_PASSWORD")
    logs.add_log_format_option(parser)
    args = parser.parse_args(argv)
    if args.confirm_minute_s <= 0:
        parser.error(f"--confirm-minute-s must be positive, got {args.confirm_minute_s}")
    logs.configure(args.log_format, service="p4bs router agent")
    log = logging.getLogger("p4bs_infra.agent")
    username = os.environ.get(args.username_env)
    password = os.environ.get(args.password_env)
    if not username or not password:
        log.error(
            "set $%s and $%s: the agent serves no one without credentials",
            args.username_env,
            args.password_env,
        )
        return 2
    try:
        qos = RouterQos(args.interface, args.max_buffer_bytes, args.state_file)
        methods = (
            JunosMethods(
                JunosDatastores(KernelQueues(qos), YangModel("junos"), args.confirm_minute_s),
                confirmed_commit_11=args.confirmed_commit_11,
            )
            if args.netconf_dialect == "junos"
            else netconf_server.QosMethods(qos)
        )
    except (AgentError, YangError) as err:
        log.error("%s", err)
        return 2

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_gNMIServicer_to_server(Gnmi(qos, username, password), server)
    with open(args.tls_key, "rb") as key, open(args.tls_cert, "rb") as cert:
        pair = (key.read(), cert.read())
    if args.tls_client_ca:
        with open(args.tls_client_ca, "rb") as ca:
            credentials = grpc.ssl_server_credentials(
                [pair], root_certificates=ca.read(), require_client_auth=True
            )
    else:
        credentials = grpc.ssl_server_credentials([pair])
    server.add_secure_port(args.gnmi, credentials)
    server.start()
    netconf = netconf_server.serve(
        methods, args.netconf_port, args.ssh_host_key, username, password
    )
    log.info(
        "serving gNMI on %s (TLS%s) and NETCONF (%s) on port %d for %s",
        args.gnmi,
        ", client certificates required" if args.tls_client_ca else "",
        args.netconf_dialect,
        args.netconf_port,
        ", ".join(args.interface),
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    netconf.close()
    server.stop(grace=2).wait()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
