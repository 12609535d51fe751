"""`p4bs testbed up|down|status`: the emulated network around one Linux "legacy router".

    senders ──eth0═rin── router ──<egress>═wl── [delay wire] ──wr═eth0── receivers
    (<name>-snd)          (<name>-rtr)           (<name>-wire)            (<name>-rcv)

The router forwards between `rin` and the link's interface (e.g. eth1), whose output is an htb
shaper at the link capacity feeding a bfifo whose byte limit is the router buffer. The delay
wire, beyond the router's output link, adds each flow's round-trip delay, half per direction:
like the path past a real router's output link, it is seen by taps on the router's links.
Taps for the data plane live in `<name>-tap`: `<before>` carries copies of what enters the
router (both directions, before any queue; clsact ingress mirrors on rin and the egress
interface) and `<after>` copies of what left it (data direction: mirrored at the wire's `wl`
ingress, i.e. after the bottleneck queue and before the delay; ACK direction: the clsact egress
hook on rin, which has no queue). Each copy arrives with the kernel's nanosecond receive
timestamp at the tap.
With an `Aqm` in the plan the wire is the bottleneck instead: it serves the data direction at
the link rate through RED or CoDel on a buffer of the plan's `buffer_bytes`, before the delay;
the router's htb runs well above line rate (no queue builds there), and the data direction's
"after" copy is what leaves the wire's queue (the wire sends it to the tap itself).
All addresses live only inside these namespaces.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from p4bs import paths
from p4bs.config import Config, FlowGroup, SecretRef
from p4bs_infra import procs
from p4bs_infra.pki import make_test_pki
from p4bs_linux_tc.queues import QUEUE_CLASS_BASE, htb_shaping

SENDER_NET = "10.201.1"
RECEIVER_NET = "10.201.2"
ROUTER_INGRESS = "rin"
HTB_ROOT, HTB_LINK_CLASS = "1:", "1:1"
# Queue q0 of the layout p4bs_linux_tc.queues describes: the router's default queue.
DEFAULT_QUEUE_CLASS = f"1:{QUEUE_CLASS_BASE:x}"
DEFAULT_QUEUE_QDISC = f"{QUEUE_CLASS_BASE:x}:"
NETCONF_PORT = 830
GNMI_PORT = 9339  # where a testbed driven over NETCONF serves gNMI
# The router's driver in the config -> the NETCONF dialect the testbed's agent speaks.
AGENT_DIALECTS = {"gnmi": "openconfig", "netconf-junos": "junos"}
MANAGEMENT = "mgmt0"
RPS_ALL_CPUS = format((1 << (os.cpu_count() or 1)) - 1, "x")
# The wire is the emulated propagation delay: it must not wait for a CPU behind the traffic it
# carries (2 cores shared with senders, receivers and recorders), or frames leave it late and
# in clumps. With the real-time class (it sleeps in ppoll between frames) 30 Cubic flows used
# 94-96% of the link with a BDP/sqrt(N) buffer, against 74-87% without it.
WIRE_SCHEDULING = ("chrt", "--fifo", "20")
# With an AQM the router's htb runs at this multiple of the link rate: the wire's queue is the
# bottleneck, and nothing may queue in front of it.
AQM_ROUTER_RATE_FACTOR = 10
# How often the wire samples its AQM queue: the router recorder's default (Scenario.qdisc_hz).
AQM_SAMPLE_HZ = 50


class TestbedError(RuntimeError):
    pass


@dataclass(frozen=True)
class Aqm:
    """Active queue management at the bottleneck, run by the delay wire (the kernel here has
    no RED or CoDel qdisc). Sources of the defaults: infra/README.md, "AQM mode".

    RED: Floyd and Jacobson 1993 with the gentle variant (Floyd 2000); the queue and the
    thresholds in bytes, a drop decision per packet whatever its size (packet mode, as Linux's
    sch_red). The thresholds are in ns of line rate, so they scale with the link: min_th
    2.5 ms, max_th = 3 min_th (Adaptive RED, Floyd, Gummadi and Shenker 2001: min_th =
    max(5 packets, target delay x C / 2) for a 5 ms target). `red_w_q` None: ARED's
    1 - exp(-1/C), C the link's packets per second of `red_mean_packet_bytes` (a one-second
    time constant).
    CoDel: RFC 8289's target 5 ms and interval 100 ms; no drop while the queue holds at most
    one MTU frame.
    """

    kind: Literal["red", "codel"]
    red_min_th_ns: int = 2_500_000
    red_max_th_ns: int = 7_500_000
    red_max_p: float = 0.1
    red_w_q: float | None = None
    red_mean_packet_bytes: int = 1500
    red_gentle: bool = True
    codel_target_ns: int = 5_000_000
    codel_interval_ns: int = 100_000_000
    codel_mtu_bytes: int = 1514

    def __post_init__(self) -> None:
        if self.kind not in ("red", "codel"):
            raise TestbedError(f"aqm kind must be red or codel, got {self.kind!r}")
        if not 0 < self.red_min_th_ns < self.red_max_th_ns:
            raise TestbedError(
                f"aqm red_min_th_ns ({self.red_min_th_ns}) must be > 0 and below "
                f"red_max_th_ns ({self.red_max_th_ns})"
            )
        if not 0 < self.red_max_p <= 1:
            raise TestbedError(f"aqm red_max_p must be in (0, 1], got {self.red_max_p}")
        if self.red_w_q is not None and not 0 < self.red_w_q < 1:
            raise TestbedError(f"aqm red_w_q must be in (0, 1), got {self.red_w_q}")
        if self.red_mean_packet_bytes <= 0 or self.codel_mtu_bytes <= 0:
            raise TestbedError("aqm red_mean_packet_bytes and codel_mtu_bytes must be > 0")
        if not 0 < self.codel_target_ns < self.codel_interval_ns:
            raise TestbedError(
                f"aqm codel_target_ns ({self.codel_target_ns}) must be > 0 and below "
                f"codel_interval_ns ({self.codel_interval_ns})"
            )

    def w_q(self, rate_bps: int) -> float:
        """RED's EWMA weight on a link of `rate_bps`."""
        if self.red_w_q is not None:
            return self.red_w_q
        packets_per_s = rate_bps / (8 * self.red_mean_packet_bytes)
        return -math.expm1(-1 / packets_per_s)

    def wire_args(self, rate_bps: int, limit_bytes: int, seed: int) -> list[str]:
        """The delay wire's flags for this AQM on a link of `rate_bps`, `limit_bytes` buffer."""

        # ARED's floor: min_th at least 5 packets (on slow links ms of line rate are few).
        min_th = max(5 * self.red_mean_packet_bytes, round(rate_bps * self.red_min_th_ns / 8e9))
        max_th = round(min_th * self.red_max_th_ns / self.red_min_th_ns)
        link = ["--rate-bps", str(rate_bps), "--limit-bytes", str(limit_bytes)]
        if self.kind == "red":
            return [
                "--aqm", "red", *link,
                "--aqm-seed", str(seed),
                "--red-min-th-bytes", str(min_th),
                "--red-max-th-bytes", str(max_th),
                "--red-max-p", repr(self.red_max_p),
                "--red-w-q", repr(self.w_q(rate_bps)),
                "--red-mean-packet-bytes", str(self.red_mean_packet_bytes),
                "--red-gentle", "true" if self.red_gentle else "false",
            ]  # fmt: skip
        return [
            "--aqm", "codel", *link,
            "--codel-target-ns", str(self.codel_target_ns),
            "--codel-interval-ns", str(self.codel_interval_ns),
            "--codel-mtu-bytes", str(self.codel_mtu_bytes),
        ]  # fmt: skip


@dataclass
class SenderGroup:
    name: str
    address: str
    flows: int
    cca: str
    start_ns: int
    rtt_ns: int | None


@dataclass
class TestbedPlan:
    """Everything `up` builds, derived from the config; saved so `down` needs no config."""

    __test__ = False  # not a pytest class, despite its name

    name: str
    state_dir: Path
    link_id: str
    egress: str
    tap_before: str
    tap_after: str
    rate_bps: int
    buffer_bytes: int
    base_rtt_ns: int
    extra_delay_max_ns: int
    groups: list[SenderGroup]
    router_address: str  # the agent's management address, inside the router namespace
    gnmi_port: int
    username: SecretRef
    password: SecretRef
    # The agent's NETCONF: "openconfig" (QoS on running) or "junos" (class-of-service with a
    # candidate and confirmed commits).
    netconf_dialect: str = "openconfig"
    # gNMI with mutual TLS: the agent requires a client certificate signed by the testbed's CA
    # (pki/client.pem is one).
    gnmi_mutual_tls: bool = False
    # With a seed, the delay wire gives the k-th flow to appear the seed's k-th extra delay,
    # whatever its ports: runs of the same traffic under one seed give each flow the same RTT.
    # None: the extra comes from the flow's 5-tuple (its ephemeral port), new every run.
    delay_seed: int | None = None
    # With an AQM the delay wire's queue (RED or CoDel on buffer_bytes, at rate_bps) is the
    # bottleneck, and the router's htb runs well above line rate. None: the router's bfifo.
    aqm: Aqm | None = None

    @property
    def namespaces(self) -> dict[str, str]:
        return {role: f"{self.name}-{role}" for role in ("snd", "wire", "rtr", "rcv", "tap")}

    @property
    def receiver(self) -> str:
        return f"{RECEIVER_NET}.2"

    @classmethod
    def from_config(cls, config: Config, state_dir: Path | None = None) -> TestbedPlan:
        if config.testbed is None:
            raise TestbedError("the config has no [testbed] section")
        tb = config.testbed
        link = config.link(tb.link)
        for tap in (link.tap_before, link.tap_after):
            if not isinstance(tap, str) or len(tap) > 15:
                raise TestbedError(
                    "the testbed taps each point on one interface carrying both directions "
                    f"(a name of <= 15 chars): {tap!r}"
                )
        if link.interface == ROUTER_INGRESS or len(link.interface) > 15:
            raise TestbedError(f"the router interface cannot be named {link.interface!r}")
        router = next(r for r in config.routers if r.name == link.router)
        if router.driver not in AGENT_DIALECTS or router.address is None:
            raise TestbedError(
                f"router {router.name}: the testbed's agent is driven over "
                f"{' or '.join(AGENT_DIALECTS)}"
            )
        if router.username is None or router.password is None:
            raise TestbedError(f"router {router.name}: credentials are required")
        host, _, port = router.address.rpartition(":")
        if router.driver != "gnmi" and int(port) != NETCONF_PORT:
            raise TestbedError(
                f"router {router.name}: the testbed's agent serves NETCONF on port {NETCONF_PORT}"
            )
        return cls(
            name=tb.name,
            state_dir=state_dir or paths.home() / ".run" / "testbed" / tb.name,
            link_id=link.id,
            egress=link.interface,
            tap_before=str(link.tap_before),
            tap_after=str(link.tap_after),
            rate_bps=link.capacity_bps,
            buffer_bytes=tb.buffer_bytes,
            base_rtt_ns=tb.base_rtt_ns,
            extra_delay_max_ns=tb.extra_delay_max_ns,
            groups=[sender_group(i, g) for i, g in enumerate(tb.groups)],
            router_address=_management_address(host),
            gnmi_port=int(port) if router.driver == "gnmi" else GNMI_PORT,
            username=router.username,
            password=router.password,
            netconf_dialect=AGENT_DIALECTS[router.driver],
        )

    @property
    def management_peer(self) -> str:
        """The address on this host's side of the management link."""
        return str(ipaddress.ip_address(self.router_address) - 1)

    def save(self) -> None:
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        (self.state_dir / "testbed.json").write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> TestbedPlan:
        try:
            data = json.loads((state_dir / "testbed.json").read_text())
        except OSError as exc:
            raise TestbedError(f"no testbed was built from {state_dir} ({exc.strerror})") from exc
        data["state_dir"] = Path(data["state_dir"])
        data["groups"] = [SenderGroup(**g) for g in data["groups"]]
        data["username"] = SecretRef(**data["username"])
        data["password"] = SecretRef(**data["password"])
        if data.get("aqm") is not None:
            data["aqm"] = Aqm(**data["aqm"])
        return cls(**data)


def _management_address(host: str) -> str:
    """The router's side of a /30 management link: the second address of its block."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise TestbedError(f"the router's address must be an IPv4 address, got {host!r}") from None
    if int(address) % 4 != 2:
        raise TestbedError(
            f"router address {host} must be the second host of a /30 (x.x.x.4k+2): the "
            "testbed links it to this host's x.x.x.4k+1"
        )
    return str(address)


def sender_group(index: int, group: FlowGroup) -> SenderGroup:
    if index >= 200:
        raise TestbedError("at most 200 sender groups")
    return SenderGroup(
        group.name,
        f"{SENDER_NET}.{10 + index}",
        group.flows,
        group.cca,
        group.start_ns,
        group.rtt_ns,
    )


def run(argv: Sequence[str], timeout_s: float = 30.0) -> str:
    """Runs a setup command; raises TestbedError with its own message when it fails."""
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if result.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


class Testbed:
    __test__ = False  # not a pytest class, despite its name

    def __init__(self, plan: TestbedPlan) -> None:
        self.plan = plan
        self.ns = plan.namespaces
        self.wire_pidfile = plan.state_dir / "delay-wire.pid"
        self.wire_stats = plan.state_dir / "delay-wire.json"
        self.wire_log = plan.state_dir / "delay-wire.log"
        # The wire's AQM queue, sampled AQM_SAMPLE_HZ times a second (JSON lines, appended).
        self.aqm_log = plan.state_dir / "aqm.jsonl"
        self.agent_pidfile = plan.state_dir / "agent.pid"
        self.agent_log = plan.state_dir / "agent.log"
        self.pki = plan.state_dir / "pki"

    # ---- building -----------------------------------------------------------------------
    def up(self, timeout_s: float = 30.0) -> float:
        """Builds the topology and starts the delay wire; returns the seconds it took.

        On failure tears down whatever it built and raises TestbedError.
        """
        began = time.monotonic()
        self._check_prerequisites()
        existing = set(self._existing_namespaces())
        if existing & set(self.ns.values()):
            raise TestbedError(
                f"namespaces {sorted(existing & set(self.ns.values()))} exist already: "
                f"run `p4bs testbed down` first"
            )
        self.plan.state_dir.mkdir(parents=True, exist_ok=True)
        self.plan.save()
        try:
            self._namespaces()
            self._links()
            self._keep_flows_in_order()
            self._addresses()
            self._bottleneck()
            self._taps()
            self._management()
            self._start_wire(began + timeout_s)
            self._start_agent(began + timeout_s)
            self._wait_connected(began + timeout_s)
        except BaseException:
            self.down()
            raise
        return time.monotonic() - began

    def _check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise TestbedError("the testbed needs root (network namespaces, tc)")
        if not paths.built("delay-wire").exists():
            raise TestbedError(f"{paths.built('delay-wire')} is missing: run `make setup`")
        for tool in ("ip", "tc", "ethtool", "ss", "ping", "chrt"):
            if shutil.which(tool) is None:
                raise TestbedError(f"{tool} is not installed: run `make setup`")

    @staticmethod
    def _existing_namespaces() -> list[str]:
        return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line]

    def _namespaces(self) -> None:
        for role, ns in self.ns.items():
            run(["ip", "netns", "add", ns])
            sysctls = {
                "net.ipv6.conf.all.disable_ipv6": "1",
                "net.ipv6.conf.default.disable_ipv6": "1",
            }
            if role == "rtr":
                sysctls["net.ipv4.ip_forward"] = "1"
            if role in ("snd", "rcv"):
                # Room for 200 ms of 100 Mbit/s and more; no cached ssthresh between flows.
                sysctls |= {
                    "net.ipv4.tcp_rmem": "4096 131072 67108864",
                    "net.ipv4.tcp_wmem": "4096 65536 67108864",
                    "net.ipv4.tcp_no_metrics_save": "1",
                }
            run(in_ns(ns, "sysctl", "-q", "-w", *(f"{k}={v}" for k, v in sysctls.items())))
            self._ip(role, "link set lo up")

    def _ip(self, role: str, command: str) -> None:
        run(["ip", "-n", self.ns[role], *command.split()])

    def _tc(self, role: str, command: str) -> None:
        run(["tc", "-n", self.ns[role], *command.split()])

    def _veth(self, role_a: str, name_a: str, role_b: str, name_b: str) -> None:
        ns_a, ns_b = self.ns[role_a], self.ns[role_b]
        veth = f"ip link add name {name_a} netns {ns_a} type veth peer name {name_b} netns {ns_b}"
        run(veth.split())
        for role, name in ((role_a, name_a), (role_b, name_b)):
            # Real frames on the wire: no offloads merging packets into 64 KB, and checksums
            # filled in by the sender (the delay wire forwards frames as they are).
            run(in_ns(self.ns[role], *f"ethtool -K {name} tx off tso off gso off gro off".split()))
            self._ip(role, f"link set {name} up")

    def _keep_flows_in_order(self) -> None:
        """A veth queues each frame on the backlog of the CPU that sent it, so a flow sent
        from two CPUs (a sender's ACK-clocked and paced sends run in softirqs anywhere) comes
        out reordered, which a real link never does. RPS on the two hops that forward the
        data direction picks the CPU by flow hash instead."""
        for role, name in (("rtr", ROUTER_INGRESS), ("wire", "wl")):
            rps = f"/sys/class/net/{name}/queues/rx-0/rps_cpus"
            run(in_ns(self.ns[role], "sh", "-c", f"echo {RPS_ALL_CPUS} > {rps}"))

    def _links(self) -> None:
        p = self.plan
        self._veth("snd", "eth0", "rtr", ROUTER_INGRESS)
        self._veth("rtr", p.egress, "wire", "wl")
        self._veth("wire", "wr", "rcv", "eth0")
        self._veth("rtr", "tb", "tap", p.tap_before)
        self._veth("rtr", "ta", "tap", "af-rev")
        self._veth("wire", "ta", "tap", "af-fwd")
        self._veth("tap", p.tap_after, "tap", "af-in")

    def _addresses(self) -> None:
        p = self.plan
        self._ip("snd", f"addr add {SENDER_NET}.2/24 dev eth0")
        for g in p.groups:
            self._ip("snd", f"addr add {g.address}/24 dev eth0")
        self._ip("rtr", f"addr add {SENDER_NET}.1/24 dev {ROUTER_INGRESS}")
        self._ip("rtr", f"addr add {RECEIVER_NET}.1/24 dev {p.egress}")
        self._ip("rcv", f"addr add {p.receiver}/24 dev eth0")
        self._ip("snd", f"route add default via {SENDER_NET}.1")
        self._ip("rcv", f"route add default via {RECEIVER_NET}.1")

    def _bottleneck(self) -> None:
        """htb at the link rate over one default queue: a bfifo holding `buffer_bytes`. With
        an AQM the htb runs well above line rate and the wire's queue is the bottleneck."""
        dev, rate = self.plan.egress, self.plan.rate_bps
        if self.plan.aqm is not None:
            rate *= AQM_ROUTER_RATE_FACTOR
        shaping = htb_shaping(rate, rate)
        self._tc(
            "rtr", f"qdisc add dev {dev} root handle {HTB_ROOT} htb default {QUEUE_CLASS_BASE:x}"
        )
        self._tc("rtr", f"class add dev {dev} parent {HTB_ROOT} classid {HTB_LINK_CLASS} {shaping}")
        self._tc(
            "rtr",
            f"class add dev {dev} parent {HTB_LINK_CLASS} classid {DEFAULT_QUEUE_CLASS} {shaping}",
        )
        self._tc(
            "rtr",
            f"qdisc add dev {dev} parent {DEFAULT_QUEUE_CLASS} handle {DEFAULT_QUEUE_QDISC} "
            f"bfifo limit {self.plan.buffer_bytes}",
        )

    def _mirror(self, role: str, dev: str, hook: str, target: str, action: str = "mirror") -> None:
        self._tc(
            role,
            f"filter add dev {dev} {hook} protocol all prio 1 u32 match u32 0 0 "
            f"action mirred egress {action} dev {target}",
        )

    def _taps(self) -> None:
        p = self.plan
        for role, dev in (
            ("rtr", ROUTER_INGRESS),
            ("rtr", p.egress),
            ("wire", "wl"),
            ("tap", "af-fwd"),
            ("tap", "af-rev"),
        ):
            self._tc(role, f"qdisc add dev {dev} clsact")
        self._mirror("rtr", ROUTER_INGRESS, "ingress", "tb")  # before: data direction
        self._mirror("rtr", p.egress, "ingress", "tb")  # before: ACK direction
        self._mirror("rtr", ROUTER_INGRESS, "egress", "ta")  # after: ACKs (no queue there)
        if p.aqm is None:
            self._mirror("wire", "wl", "ingress", "ta")  # after: data, past the queue
        # With an AQM the wire sends what leaves its queue to `ta` itself (_start_wire).
        for dev in ("af-fwd", "af-rev"):  # both after-copies arrive on one tap interface
            self._mirror("tap", dev, "ingress", "af-in", action="redirect")

    def _management(self) -> None:
        """A /30 between this host and the router: how operators reach its agent."""
        p = self.plan
        host_side = f"{p.name}-m"
        veth = (
            f"ip link add name {host_side} type veth peer name {MANAGEMENT} netns {self.ns['rtr']}"
        )
        run(veth.split())
        run(["ip", "addr", "add", f"{p.management_peer}/30", "dev", host_side])
        run(["ip", "link", "set", host_side, "up"])
        self._ip("rtr", f"addr add {p.router_address}/30 dev {MANAGEMENT}")
        self._ip("rtr", f"link set {MANAGEMENT} up")

    def restart_agent(self, timeout_s: float = 60.0) -> None:
        """Starts the router agent again after it died (chaos runs kill it), as `up` did.
        In CI's chaos run, beside three brokers, two TaskManagers and the traffic, it served
        33 s after its restart (it validates with yangson since issue 38): 60 s to do so."""
        self._start_agent(time.monotonic() + timeout_s)

    def _start_agent(self, deadline: float) -> None:
        """The router agent in the router namespace, credentials passed by environment."""
        p = self.plan
        try:
            env = {
                "P4BS_ROUTER_USER": p.username.resolve(),
                "P4BS_ROUTER_PASSWORD": p.password.resolve(),
            }
        except LookupError as exc:
            raise TestbedError(f"router agent credentials: {exc}") from exc
        pki = make_test_pki(self.pki, p.router_address, NETCONF_PORT)
        argv = [
            sys.executable,
            "-m",
            "p4bs_infra.agent",
            "--interface",
            p.egress,
            "--gnmi",
            f"{p.router_address}:{p.gnmi_port}",
            "--netconf-port",
            str(NETCONF_PORT),
            "--netconf-dialect",
            p.netconf_dialect,
            "--tls-cert",
            str(pki["server.pem"]),
            "--tls-key",
            str(pki["server-key.pem"]),
            "--ssh-host-key",
            str(pki["ssh-host-key"]),
            "--state-file",
            str(p.state_dir / "agent-terms.json"),
        ]
        if p.gnmi_mutual_tls:
            argv += ["--tls-client-ca", str(pki["ca.pem"])]
        procs.start_detached(in_ns(self.ns["rtr"], *argv), self.agent_pidfile, self.agent_log, env)

        def serving() -> bool:
            if procs.running_pid(self.agent_pidfile) is None:
                raise TestbedError(f"the router agent exited: {procs.log_tail(self.agent_log)}")
            return procs.port_open(p.router_address, p.gnmi_port) and procs.port_open(
                p.router_address, NETCONF_PORT
            )

        if not procs.wait_until(serving, max(0.0, deadline - time.monotonic())):
            raise TestbedError(f"the router agent is not serving: {procs.log_tail(self.agent_log)}")

    def wire_argv(self) -> list[str]:
        """The delay wire's command line (run in the wire namespace, real-time class)."""
        p = self.plan
        argv = [
            *WIRE_SCHEDULING,
            str(paths.built("delay-wire")),
            "--left",
            "wl",
            "--right",
            "wr",
            "--delay-ns",
            str(p.base_rtt_ns),
            "--extra-max-ns",
            str(p.extra_delay_max_ns),
            "--stats",
            str(self.wire_stats),
            "--stats-interval-ms",
            "500",
        ]
        if p.delay_seed is not None:
            argv += ["--seed", str(p.delay_seed)]
        if p.aqm is not None:
            argv += p.aqm.wire_args(p.rate_bps, p.buffer_bytes, seed=p.delay_seed or 0)
            argv += ["--aqm-tap", "ta", "--aqm-log", str(self.aqm_log)]
            argv += ["--aqm-sample-hz", str(AQM_SAMPLE_HZ)]
        for g in p.groups:
            if g.rtt_ns is not None:
                argv += ["--group", f"{g.address}/32={g.rtt_ns}"]
        return argv

    def _start_wire(self, deadline: float) -> None:
        self.wire_stats.unlink(missing_ok=True)
        self.aqm_log.unlink(missing_ok=True)
        procs.start_detached(
            in_ns(self.ns["wire"], *self.wire_argv()), self.wire_pidfile, self.wire_log
        )

        def started() -> bool:
            if procs.running_pid(self.wire_pidfile) is None:
                raise TestbedError(f"delay-wire exited: {procs.log_tail(self.wire_log)}")
            return self.wire_stats.exists()

        if not procs.wait_until(started, max(0.0, deadline - time.monotonic())):
            raise TestbedError(f"delay-wire did not start: {procs.log_tail(self.wire_log)}")

    def _wait_connected(self, deadline: float) -> None:
        def reachable() -> bool:
            ping = in_ns(self.ns["snd"], "ping", "-c", "1", "-W", "1", "-q", self.plan.receiver)
            return subprocess.run(ping, capture_output=True, check=False).returncode == 0

        if not procs.wait_until(reachable, max(0.0, deadline - time.monotonic()), 0.05):
            raise TestbedError("senders cannot reach the receivers through the router")

    # ---- tearing down -------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stops every process in the testbed's namespaces and deletes them; returns them."""
        procs.stop(self.agent_pidfile)
        procs.stop(self.wire_pidfile)
        # The host's end of the management link: deleted now, not whenever the kernel
        # gets round to cleaning up the router's namespace.
        subprocess.run(
            ["ip", "link", "del", f"{self.plan.name}-m"], capture_output=True, check=False
        )
        removed = []
        existing = set(self._existing_namespaces())
        for ns in self.ns.values():
            if ns not in existing:
                continue
            self._kill_processes_in(ns)
            run(["ip", "netns", "del", ns])
            removed.append(ns)
        return removed

    @staticmethod
    def _kill_processes_in(ns: str) -> None:
        """Whatever still runs in our namespace was started by us: TERM, then KILL."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [int(p) for p in run(["ip", "netns", "pids", ns]).split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if not pids or procs.wait_until(
                lambda: not run(["ip", "netns", "pids", ns]).strip(), 5
            ):
                return

    # ---- looking at it ------------------------------------------------------------------
    def wire_report(self) -> dict[str, object]:
        """The delay wire's own counters: frames, drops, lateness percentiles per direction."""
        try:
            report: dict[str, object] = json.loads(self.wire_stats.read_text())
        except (OSError, ValueError):
            return {}
        return report

    def status(self) -> dict[str, object]:
        existing = set(self._existing_namespaces())
        qdisc = ""
        if self.ns["rtr"] in existing:
            qdisc = run(
                ["tc", "-n", self.ns["rtr"], "-s", "qdisc", "show", "dev", self.plan.egress]
            )
        return {
            "namespaces": {ns: ns in existing for ns in self.ns.values()},
            "delay_wire_pid": procs.running_pid(self.wire_pidfile),
            "agent_pid": procs.running_pid(self.agent_pidfile),
            "agent": f"gNMI {self.plan.router_address}:{self.plan.gnmi_port} (TLS, CA "
            f"{self.pki / 'ca.pem'}), NETCONF ({self.plan.netconf_dialect}) "
            f"{self.plan.router_address}:{NETCONF_PORT} (host key in "
            f"{self.pki / 'known_hosts'})",
            "wire": self.wire_report(),
            "qdisc": qdisc,
        }
