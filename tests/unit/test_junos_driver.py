"""The Junos driver's numbers and payload: bytes to whole µs of line rate (rounded, at least 1)
and back, its edit-config validated against Junos's published class-of-service model (the XML
converted to RFC 7951 JSON by the model itself); and its commits against the agent's Junos
NETCONF server in-process (queues in memory): commit-configuration confirmed in minutes of the
router's confirm_window, confirmed, read back after the confirmation; a temporal outside the
router's temporal_range refused before sending; an edit or a commit refused, a failed
confirmation (1.0: hang up; 1.1: cancel-commit), a rollback before the confirmation, a session
lost between commit and confirm, each ending on the old configuration; another session's
confirm and cancel refused; the edit-configs on the wire valid on an empty and a populated
router."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import re
import socket
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree
from namespaces import own_network_namespace
from ncclient import manager
from ncclient.operations.rpc import RPCError
from netconf import error as ncerror
from yangcheck import Recorder, after_edit_config

from p4bs import paths
from p4bs.config import (
    ConfigError,
    JunosLinkConfig,
    RouterConfig,
    SecretRef,
    junos_defaults,
    parse_config,
)
from p4bs.units import bytes_for_duration
from p4bs.yang import yang_model
from p4bs_infra.agent.datastore import AgentError
from p4bs_infra.agent.junos import JunosDatastores, JunosMethods
from p4bs_infra.agent.netconf_server import serve
from p4bs_infra.pki import make_test_pki
from p4bs_infra.procs import wait_until
from p4bs_optimizer.drivers.base import DriverError, ErrorKind, Retry
from p4bs_optimizer.drivers.junos import (
    JunosDriver,
    bytes_in_force,
    commit_configuration,
    cos_config,
    temporal_us,
)

RATE = 100_000_000


@pytest.mark.parametrize(
    ("size", "rate", "us"),
    [
        (625_000, RATE, 50_000),  # 50 ms of 100 Mbit/s (the published example)
        (300_012, RATE, 24_001),  # 24000.96 µs
        (300_006, RATE, 24_000),  # 24000.48 µs
        (1, 16_000_000, 1),  # 0.5 µs: halves go up
        (3, 16_000_000, 2),  # 1.5 µs
        (1, 100_000_000_000, 1),  # 0.08 µs: never 0, which would be no buffer
        (2_500_000, 10_000_000_000, 2_000),  # 2 ms of 10 Gbit/s
    ],
)
def test_bytes_to_whole_microseconds(size: int, rate: int, us: int) -> None:
    assert temporal_us(size, rate) == us


def test_the_bytes_in_force_are_within_half_a_microsecond_of_line_rate() -> None:
    for size in (1514, 32_768, 99_999, 625_001, 2_500_000, 123_456_789):
        back = bytes_in_force(temporal_us(size, RATE), RATE)
        assert abs(back - size) <= RATE / 8 / 1e6 / 2 + 1, (size, back)
    assert bytes_in_force(50_000, RATE) == 625_000


def test_nonpositive_sizes_and_rates_are_refused() -> None:
    for size, rate in ((0, RATE), (-5, RATE), (1000, 0)):
        with pytest.raises(ValueError, match="positive"):
            temporal_us(size, rate)


@pytest.mark.parametrize(
    "link",
    [
        junos_defaults("eth1"),
        junos_defaults("et-0/0/0.0"),
        JunosLinkConfig("xe-1/2/3", "sched <&>", "map-1", "expedited-forwarding"),
    ],
)
def test_the_edit_config_is_valid_junos_class_of_service(link: JunosLinkConfig) -> None:
    model = yang_model("junos")
    raw = model.from_xml(etree.fromstring(cos_config(link, 24_001).encode()))
    model.validate(raw)
    cos = raw["junos-conf-root:configuration"]["junos-conf-class-of-service:class-of-service"]
    assert cos == {
        "schedulers": [{"name": link.scheduler, "buffer-size": {"temporal": "24001"}}],
        "scheduler-maps": [
            {
                "name": link.scheduler_map,
                "forwarding-class": [{"name": link.forwarding_class, "scheduler": link.scheduler}],
            }
        ],
        "interfaces": {
            "interface": [{"name": link.interface, "scheduler-map": link.scheduler_map}]
        },
    }


# ---- commits as Junos takes them: the driver against the agent's Junos NETCONF in-process ----
# The agent's NETCONF server (Junos dialect) runs in this process; its queues are kept in
# memory here (MemoryQueues), since changing tc FIFOs needs root and a network namespace
# (tests/testbed/test_junos.py runs the same commits against the real FIFOs).

USER, PASSWORD = "p4bs-test", "junos-secret"
AGENT_LOG = "p4bs_infra.agent.junos"
LINK_EQ = junos_defaults("eth1")
MAX_BYTES = 8_000_000  # the stand-in router's largest queue


class MemoryQueues:
    """One interface's queue 0 at RATE, its byte limit kept in memory, [1514, MAX_BYTES] B."""

    def __init__(self) -> None:
        self.interfaces = ["eth1"]
        self.bytes: dict[tuple[str, int], int] = {("eth1", 0): 125_000}

    def limits(self) -> dict[tuple[str, int], int]:
        return dict(self.bytes)

    def set_temporal(self, us: dict[tuple[str, int], int]) -> None:
        self.set_bytes({k: bytes_for_duration(v * 1000, RATE) for k, v in us.items()})

    def set_bytes(self, limits: dict[tuple[str, int], int]) -> None:
        for key, size in limits.items():
            if key not in self.bytes:
                raise AgentError(AgentError.NOT_FOUND, f"no queue q{key[1]} on {key[0]}")
            if not 1514 <= size <= MAX_BYTES:
                raise AgentError(AgentError.INVALID, f"{size} B is outside [1514, {MAX_BYTES}] B")
        self.bytes.update(limits)


@dataclasses.dataclass
class Agent:
    stores: JunosDatastores
    queues: MemoryQueues
    port: int
    folder: Path

    def router(self, **changes: Any) -> RouterConfig:
        fields: dict[str, Any] = {
            "name": "mx-test",
            "driver": "netconf-junos",
            "address": f"127.0.0.1:{self.port}",
            "username": SecretRef(file=str(self.folder / "user")),
            "password": SecretRef(file=str(self.folder / "password")),
            "ca_file": str(self.folder / f"known_hosts-{self.port}"),
            "timeout_ns": 5_000_000_000,
            "max_concurrent_changes": 1,
        }
        return RouterConfig(**(fields | changes))

    def driver(self, **changes: Any) -> JunosDriver:
        return JunosDriver(
            self.router(**changes), links={"eth1": (LINK_EQ, RATE)}, retry=Retry(attempts=1)
        )

    def set_buffer(self, size: int, **changes: Any) -> int:
        async def scenario() -> int:
            async with self.driver(**changes) as driver:
                return await driver.set_buffer("eth1", 0, size)

        return asyncio.run(scenario())

    def session(self) -> tuple[manager.Manager, socket.socket]:
        """A NETCONF session of another client, and its socket (to hang up on)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        nc = manager.connect(
            host="127.0.0.1",
            port=self.port,
            sock=sock,
            username=USER,
            password=PASSWORD,
            hostkey_verify=False,
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
        )
        return nc, sock

    def temporal(self, source: str = "running") -> str | None:
        config = self.stores.running if source == "running" else self.stores.candidate
        cos = config.get(JUNOS[0], {}).get(JUNOS[1], {})
        schedulers = cos.get("schedulers", [])
        found = [s["buffer-size"]["temporal"] for s in schedulers if s["name"] == "p4bs-eth1"]
        return found[0] if found else None


JUNOS = ("junos-conf-root:configuration", "junos-conf-class-of-service:class-of-service")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("junos-pki")
    (folder / "user").write_text(USER)
    (folder / "password").write_text(PASSWORD)
    return make_test_pki(folder, "127.0.0.1", 0)


@contextlib.contextmanager
def agent(
    pki: dict[str, Path],
    methods: type[JunosMethods] = JunosMethods,
    confirmed_commit_11: bool = False,
    minute_s: float = 60.0,
) -> Iterator[Agent]:
    """The agent's Junos NETCONF server on a free port, in this process, in a network
    namespace of its own that the calling thread enters for the block (the server binds
    every address)."""
    queues = MemoryQueues()
    stores = JunosDatastores(queues, yang_model("junos"), minute_s)
    with own_network_namespace("p4bs-nc"):
        server = serve(
            methods(stores, confirmed_commit_11=confirmed_commit_11),
            0,
            str(pki["ssh-host-key"]),
            USER,
            PASSWORD,
        )
        folder = pki["known_hosts"].parent
        known = pki["known_hosts"].read_text()
        known = known.replace("[127.0.0.1]:0 ", f"[127.0.0.1]:{server.port} ")
        (folder / f"known_hosts-{server.port}").write_text(known)
        try:
            yield Agent(stores, queues, server.port, folder)
        finally:
            server.close()
            server.join()


def _agent_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == AGENT_LOG]


def _listening_ports(net: str) -> set[int]:
    """The TCP ports in LISTEN in the network namespace of `net` (/proc/<pid>/net)."""
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(net, table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def test_the_agent_listens_only_inside_the_tests_namespace(pki: dict[str, Path]) -> None:
    with agent(pki) as router:
        assert router.port in _listening_ports("/proc/thread-self/net")
        assert router.port not in _listening_ports("/proc/1/net")  # the machine's namespace


def test_the_agent_advertises_confirmed_commit_10_as_junos_does(pki: dict[str, Path]) -> None:
    for option, offered, not_offered in ((False, "1.0", "1.1"), (True, "1.1", "1.0")):
        with agent(pki, confirmed_commit_11=option) as router:
            nc, _ = router.session()
            with nc:
                capabilities = list(nc.server_capabilities)
                prefix = "urn:ietf:params:netconf:capability:confirmed-commit:"
                assert prefix + offered in capabilities
                assert prefix + not_offered not in capabilities
                if not option:  # 1.0 has no cancel-commit
                    with pytest.raises(RPCError, match=re.escape("this router offers 1.0")):
                        nc.cancel_commit()


def test_a_change_is_confirmed_in_minutes_and_read_back_after_the_confirmation(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    with agent(pki) as router:
        # 4.5 min -> 5 whole minutes; the RPC timeout (5 s) plays no part.
        done = router.set_buffer(625_000, confirm_window_ns=270_000_000_000)
        assert done == router.queues.bytes[("eth1", 0)] == 625_000
        assert router.temporal() == "50000"
    log = _agent_log(caplog)
    print("\n".join(log))  # the sequence as the agent sees it (the report quotes it)
    sequence = [line.split(": ", 1)[1] for line in log]
    assert sequence == [
        "lock candidate",
        "discard-changes",
        "edit-config: candidate changed",
        "commit-configuration confirmed, confirm-timeout 5 min (300 s): rolled back unless "
        "confirmed",
        "get-config running",  # the change is in running: confirm it
        "its commit confirmed by session 1",
        "commit-configuration applied",
        "get-config running",  # still in force after the confirmation: reported applied
        "unlock candidate",
    ]
    assert len({line.split(":", 1)[0] for line in log}) == 1  # all one session


@pytest.mark.parametrize(
    ("size", "changes", "message"),
    [
        # 16,000,000,000 µs of 100 Mbit/s: far past any platform
        (200_000_000_000, {}, "temporal 16000000000 µs at 100000000 bit/s, outside this "),
        (1_875_000, {"temporal_range_ns": (1_000, 100_000_000)}, "[1, 100000] µs"),
    ],
)
def test_temporal_outside_the_platform_range_is_refused_before_sending(
    pki: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    size: int,
    changes: dict[str, Any],
    message: str,
) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    with agent(pki) as router:
        with pytest.raises(DriverError) as err:
            router.set_buffer(size, **changes)
        assert err.value.kind == ErrorKind.REJECTED
        assert message in str(err.value) and "temporal_range" in str(err.value)
        assert router.queues.bytes[("eth1", 0)] == 125_000
        assert router.temporal() is None
    assert _agent_log(caplog) == []  # nothing reached the router


@pytest.mark.parametrize("confirmed_commit_11", [False, True])
@pytest.mark.parametrize(
    ("link", "refused"),
    [  # a name the Junos model refuses: the edit-config fails
        (dataclasses.replace(LINK_EQ, scheduler="s" * 65), "edit-config refused"),
        # a forwarding class this router has no queue for: the commit fails
        (dataclasses.replace(LINK_EQ, forwarding_class="assured-forwarding"), "refused: "),
    ],
)
def test_a_refused_edit_or_commit_leaves_the_old_configuration(
    pki: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    confirmed_commit_11: bool,
    link: JunosLinkConfig,
    refused: str,
) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    with agent(pki, confirmed_commit_11=confirmed_commit_11) as router:
        router.set_buffer(250_000)  # 20000 µs in force
        driver = JunosDriver(router.router(), links={"eth1": (link, RATE)}, retry=Retry(1))

        async def scenario() -> int:
            async with driver:
                return await driver.set_buffer("eth1", 0, 500_000)

        with pytest.raises(DriverError) as err:
            asyncio.run(scenario())
        assert err.value.kind == ErrorKind.REJECTED, err.value
        assert router.queues.bytes[("eth1", 0)] == 250_000
        assert router.temporal() == router.temporal("candidate") == "20000"
    assert any(refused in line for line in _agent_log(caplog))


def _refusing_confirmation(rpc_name: str) -> Any:
    """An agent method that fails the confirming commit (a plain commit while a confirmed one
    is pending), as a router's commit can fail; other calls go through."""

    def method(self: JunosMethods, session: Any, rpc: Any, *params: Any) -> Any:
        if not params and self.stores.pending_session() == session.session_id:
            raise ncerror.RPCServerError(
                rpc, "application", "operation-failed", message="commit failed (test router)"
            )
        return getattr(JunosMethods, rpc_name)(self, session, rpc, *params)

    return method


class RefusesConfirmation(JunosMethods):
    rpc_commit = _refusing_confirmation("rpc_commit")
    rpc_commit_configuration = _refusing_confirmation("rpc_commit_configuration")


@pytest.mark.parametrize(
    ("confirmed_commit_11", "how"),
    [
        (False, "session {}, which made it, ended"),  # 1.0: the driver hangs up
        (True, "cancel-commit from session {}"),
    ],
)
def test_a_failed_confirmation_rolls_back_both_ways(
    pki: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    confirmed_commit_11: bool,
    how: str,
) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    with agent(pki, RefusesConfirmation, confirmed_commit_11) as router:
        with pytest.raises(DriverError, match="commit failed"):
            router.set_buffer(500_000)
        # The router is back on its old configuration: at once (1.1) or when the hung-up
        # session ends (1.0), never at the confirm window's end (10 min).
        assert wait_until(lambda: router.queues.bytes[("eth1", 0)] == 125_000, 10)
        assert router.temporal() is None and router.temporal("candidate") is None
    log = _agent_log(caplog)
    session = log[0].split()[1].rstrip(":")
    assert f"session {session}: confirmed commit rolled back ({how.format(session)})" in log


class ConfirmsLate(JunosMethods):
    """A router whose confirming commit arrives only after its confirm timer fired."""

    def rpc_commit_configuration(self, session: Any, rpc: Any, *params: Any) -> Any:
        if not params:
            assert wait_until(lambda: self.stores.pending_session() is None, 30, 0.02)
        return super().rpc_commit_configuration(session, rpc, *params)

    def rpc_commit(self, session: Any, rpc: Any, *params: Any) -> Any:
        if not params:
            assert wait_until(lambda: self.stores.pending_session() is None, 30, 0.02)
        return super().rpc_commit(session, rpc, *params)


def test_a_rollback_before_the_confirmation_is_a_failure(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    with agent(pki, ConfirmsLate, minute_s=1.5) as router:
        with pytest.raises(DriverError) as err:
            router.set_buffer(500_000, confirm_window_ns=60_000_000_000)
        assert err.value.kind == ErrorKind.MISMATCH
        assert "rolled back before its confirmation" in str(err.value)
        assert router.queues.bytes[("eth1", 0)] == 125_000 and router.temporal() is None
    assert any("rolled back (not confirmed in time)" in line for line in _agent_log(caplog))


def _edit_and_commit_confirmed(nc: manager.Manager, us: int, minutes: int) -> None:
    nc.edit_config(target="candidate", config=cos_config(LINK_EQ, us))
    nc.dispatch(commit_configuration(minutes))


def test_a_session_lost_between_commit_and_confirm_is_rolled_back(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    with agent(pki) as router:
        nc, sock = router.session()
        _edit_and_commit_confirmed(nc, 40_000, 10)  # no lock: Junos needs none
        assert router.queues.bytes[("eth1", 0)] == 500_000
        sock.shutdown(socket.SHUT_RDWR)  # the client is gone, no close-session
        assert wait_until(lambda: router.queues.bytes[("eth1", 0)] == 125_000, 10)
        assert router.temporal() is None
    assert any("which made it, ended" in line for line in _agent_log(caplog))


def test_an_unconfirmed_commit_configuration_rolls_back_after_its_minutes(
    pki: dict[str, Path],
) -> None:
    with agent(pki, minute_s=0.5) as router:
        nc, _ = router.session()
        with nc:
            committed = time.monotonic()
            _edit_and_commit_confirmed(nc, 40_000, 2)  # 2 "minutes" of 0.5 s
            assert router.queues.bytes[("eth1", 0)] == 500_000
            assert wait_until(lambda: router.queues.bytes[("eth1", 0)] == 125_000, 10, 0.02)
            assert time.monotonic() - committed >= 1.0
            assert router.temporal() is None


def test_another_sessions_confirm_and_cancel_are_refused(pki: dict[str, Path]) -> None:
    with agent(pki, confirmed_commit_11=True) as router:
        owner, _ = router.session()
        other, _ = router.session()
        with owner, other:
            _edit_and_commit_confirmed(owner, 40_000, 10)
            for call in (
                lambda: other.dispatch(commit_configuration(None)),
                other.commit,
                other.cancel_commit,
            ):
                with pytest.raises(RPCError, match="session") as err:
                    call()
                assert err.value.tag == "in-use"
            assert router.stores.pending_session() is not None  # still pending, still owner's
            owner.dispatch(commit_configuration(None))
            assert router.stores.pending_session() is None
        assert router.queues.bytes[("eth1", 0)] == 500_000 and router.temporal() == "40000"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (600_000_000_000, (1_000, 200_000_000))),
        (
            {"confirm_window": "5min", "temporal_range": ["1us", "100ms"]},
            (300_000_000_000, (1_000, 100_000_000)),
        ),
        ({"confirm_window": "70000min"}, "routers[0].confirm_window: must be 1s..65535min"),
        ({"temporal_range": ["2ms", "1ms"]}, "routers[0].temporal_range: must be whole µs"),
        ({"temporal_range": ["1.5us", "1ms"]}, "routers[0].temporal_range: must be whole µs"),
    ],
)
def test_confirm_window_and_temporal_range_in_the_config(
    fields: dict[str, Any], expected: Any
) -> None:
    data = tomllib.loads(paths.example_config().read_text())
    data["routers"][0] |= {"driver": "netconf-junos", "address": "192.0.2.1:830"} | fields
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            parse_config(data)
        return
    router = parse_config(data).routers[0]
    assert (router.confirm_window_ns, router.temporal_range_ns) == expected


def test_the_edit_configs_on_the_wire_validate_on_an_empty_and_a_populated_router(
    pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's own class-of-service, which the driver's edits merge beside.
    operator = {
        JUNOS[0]: {
            JUNOS[1]: {
                "schedulers": [{"name": "operator-nc", "buffer-size": {"percent": 5}}],
                "scheduler-maps": [
                    {
                        "name": "operator-map",
                        "forwarding-class": [
                            {"name": "network-control", "scheduler": "operator-nc"}
                        ],
                    }
                ],
            }
        }
    }
    for start in ({}, operator):
        with agent(pki) as router:
            router.stores.running = copy.deepcopy(start)
            router.stores.candidate = copy.deepcopy(start)
            recorder = Recorder(lambda r=router: copy.deepcopy(r.stores.candidate))
            with recorder.record(monkeypatch):
                router.set_buffer(625_000)  # the first change: p4bs's names created
                router.set_buffer(300_010)  # a later change: the temporal updated
            assert [edit.target for edit in recorder.edits] == ["candidate", "candidate"]
            for edit in recorder.edits:
                after_edit_config("junos", edit.config, edit.payload)
            yang_model("junos").validate(router.stores.running)
            cos = router.stores.running[JUNOS[0]][JUNOS[1]]
            assert router.temporal() == "24001"
            assert {s["name"] for s in cos["schedulers"]} == (
                {"p4bs-eth1", "operator-nc"} if start else {"p4bs-eth1"}
            )
