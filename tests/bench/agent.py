"""Benchmark: how long a buffer change takes through the router agent, and what it costs.

    .venv/bin/python tests/bench/agent.py [SETS]

Builds a testbed, then times SETS buffer changes each way, in the same run:
  - gNMI Set through pygnmi over TLS (the driver's Set: queue, profile and its binding),
    end to end;
  - NETCONF edit-config through ncclient over SSH, end to end;
  - the reference: the `tc qdisc change` command an operator would type.
Prints p50/p99 per way, the gNMI/tc ratio, and the agent's CPU time per Set.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ncclient import manager
from pygnmi.client import gNMIclient

from p4bs import paths
from p4bs.config import load_config
from p4bs_infra import procs
from p4bs_infra.testbed import NETCONF_PORT, Testbed, TestbedPlan, run
from p4bs_optimizer.drivers.gnmi import buffer_updates

OC_QOS = "http://openconfig.net/yang/qos"


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"


def timed(action: Callable[[int], None], sets: int) -> list[float]:
    times = []
    for i in range(sets):
        began = time.perf_counter()
        action(100_000 + (i % 50) * 1000)
        times.append(time.perf_counter() - began)
    return times


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    sets = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    os.environ.setdefault("P4BS_ROUTER_USER", "bench")
    os.environ.setdefault("P4BS_ROUTER_PASSWORD", "bench-password")
    user, password = os.environ["P4BS_ROUTER_USER"], os.environ["P4BS_ROUTER_PASSWORD"]
    with tempfile.TemporaryDirectory() as tmp:
        plan = TestbedPlan.from_config(load_config(paths.example_config()))
        plan = TestbedPlan(**{**plan.__dict__, "name": "bagent", "state_dir": Path(tmp) / "tb"})
        testbed = Testbed(plan)
        took = testbed.up()
        print(f"testbed with agent up in {took:.2f} s")
        try:
            pid = procs.running_pid(testbed.agent_pidfile)
            assert pid is not None
            with gNMIclient(
                target=(plan.router_address, plan.gnmi_port),
                username=user,
                password=password,
                path_cert=str(testbed.pki / "ca.pem"),
            ) as gnmi:
                cpu0 = cpu_seconds(pid)
                gnmi_times = timed(
                    lambda size: gnmi.set(
                        update=buffer_updates(plan.egress, 0, size), encoding="json_ietf"
                    ),
                    sets,
                )
                cpu_per_set = (cpu_seconds(pid) - cpu0) / sets
            with manager.connect(
                host=plan.router_address,
                port=NETCONF_PORT,
                username=user,
                password=password,
                hostkey_verify=False,
                look_for_keys=False,
                allow_agent=False,
            ) as nc:

                def edit(size: int) -> None:
                    nc.edit_config(
                        target="running",
                        config=(
                            f'<config><qos xmlns="{OC_QOS}"><buffer-allocation-profiles>'
                            "<buffer-allocation-profile><name>eth1</name><queues><queue><name>q0"
                            f"</name><config><dedicated-buffer>{size}</dedicated-buffer></config>"
                            "</queue></queues></buffer-allocation-profile>"
                            "</buffer-allocation-profiles></qos></config>"
                        ),
                    )

                netconf_times = timed(edit, sets)
            tc_times = timed(
                lambda size: run(
                    [
                        "tc",
                        "-n",
                        testbed.ns["rtr"],
                        "qdisc",
                        "change",
                        "dev",
                        plan.egress,
                        "parent",
                        "1:10",
                        "handle",
                        "10:",
                        "bfifo",
                        "limit",
                        str(size),
                    ]
                ),
                sets,
            )
        finally:
            testbed.down()
    print(f"gNMI Set (pygnmi, TLS):        {percentiles(gnmi_times)}")
    print(f"NETCONF edit-config (ncclient): {percentiles(netconf_times)}")
    print(f"reference `tc qdisc change`:    {percentiles(tc_times)}")
    ratio = statistics.median(gnmi_times) / statistics.median(tc_times)
    print(f"gNMI/tc median ratio {ratio:.2f}; agent CPU per gNMI Set {cpu_per_set * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
