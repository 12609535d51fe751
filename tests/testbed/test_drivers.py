"""Router drivers against the real router agent in a testbed: gNMI (read back by gnmi_cli, a
client nobody here wrote), NETCONF in bytes, Linux tc in the router's namespace (the Junos
driver against the agent's Junos mode: test_junos.py); and how they fail: by kind, retried
only when it may help, never leaving a half-applied change, within the router's concurrency
limit."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import paramiko
import pytest
from lxml import etree
from test_agent import (
    BUFFER,
    _gnmi,
    _gnmi_cli,
    _kernel_limit,
    _netconf,
    _openconfig,
    _proto_path,
)
from yangcheck import Recorder, after_edit_config, after_gnmi_set

from conftest import ROUTER_PASSWORD
from p4bs.config import RouterConfig, SecretRef
from p4bs.yang import yang_model
from p4bs_infra.pki import make_test_pki
from p4bs_infra.procs import free_port
from p4bs_infra.testbed import NETCONF_PORT, Testbed, TestbedPlan, run
from p4bs_optimizer.drivers import driver_for
from p4bs_optimizer.drivers.base import Attempt, DriverError, ErrorKind, RouterDriver
from p4bs_optimizer.drivers.gnmi import GnmiDriver
from p4bs_optimizer.drivers.netconf import (
    CANDIDATE,
    CONFIRMED_COMMIT_11,
    OC_QOS_NS,
    NetconfDriver,
    Session,
)

MAX_BUFFER_BYTES = 256 * 1024 * 1024  # the agent's default --max-buffer-bytes


@pytest.fixture(scope="module")
def known_hosts(testbed: Testbed) -> Path:
    """An OpenSSH known_hosts file with the agent's NETCONF host key."""
    key = paramiko.RSAKey.from_private_key_file(str(testbed.pki / "ssh-host-key"))
    hosts = paramiko.HostKeys()
    hosts.add(f"[{testbed.plan.router_address}]:{NETCONF_PORT}", key.get_name(), key)
    path = testbed.plan.state_dir / "known_hosts"
    hosts.save(str(path))
    return path


def _router(
    testbed: Testbed, known_hosts: Path, driver: str = "gnmi", **changes: Any
) -> RouterConfig:
    """The testbed's router as the optimizer's config names it, credentials by reference."""
    port = testbed.plan.gnmi_port if driver == "gnmi" else NETCONF_PORT
    fields: dict[str, Any] = {
        "name": f"{testbed.plan.name}-router",
        "driver": driver,
        "address": f"{testbed.plan.router_address}:{port}",
        "username": testbed.plan.username,
        "password": testbed.plan.password,
        "ca_file": str(testbed.pki / "ca.pem" if driver == "gnmi" else known_hosts),
        "timeout_ns": 5_000_000_000,
        "max_concurrent_changes": 1,
    }
    return RouterConfig(**(fields | changes))


def _driver(router: RouterConfig, **options: Any) -> RouterDriver:
    return driver_for(router, **options)


def _fails(driver: RouterDriver, call: Callable[[RouterDriver], Any]) -> tuple[DriverError, float]:
    """The DriverError `call` raises, and the seconds it took."""

    async def scenario() -> tuple[DriverError, float]:
        async with driver:
            began = time.monotonic()
            with pytest.raises(DriverError) as err:
                await call(driver)
            return err.value, time.monotonic() - began

    return asyncio.run(scenario())


def _gnmi_cli_value(testbed: Testbed, path: str) -> int:
    """The leaf's value in gnmi_cli's print of the router's GetResponse (a text proto)."""
    out = _gnmi_cli(testbed, "-get", "-proto", f"{_proto_path(path)} encoding: JSON_IETF")
    (value,) = re.findall(r"val:\s*\{\s*uint_val:\s*(\d+)\s*\}", out)
    return int(value)


def test_gnmi_driver_sets_and_gnmi_cli_reads_the_same_value(
    testbed: Testbed, known_hosts: Path
) -> None:
    async def scenario() -> tuple[int, int]:
        async with _driver(_router(testbed, known_hosts)) as driver:
            return await driver.set_buffer("eth1", 0, 321_000), await driver.get_buffer("eth1", 0)

    assert asyncio.run(scenario()) == (321_000, 321_000)
    assert _kernel_limit(testbed) == 321_000
    assert _gnmi_cli_value(testbed, BUFFER) == 321_000


def _netconf_logins(testbed: Testbed) -> int:
    return testbed.agent_log.read_text().count("Auth granted (password)")


def test_netconf_driver_sets_and_reads_back(testbed: Testbed, known_hosts: Path) -> None:
    logins = _netconf_logins(testbed)

    async def scenario() -> list[int]:
        async with _driver(_router(testbed, known_hosts, "netconf")) as driver:
            first = await driver.set_buffer("eth1", 0, 410_000)
            second = await driver.set_buffer("eth1", 0, 420_000)
            return [first, second, await driver.get_buffer("eth1", 0)]

    assert asyncio.run(scenario()) == [410_000, 420_000, 420_000]
    assert _kernel_limit(testbed) == 420_000
    assert _netconf_logins(testbed) == logins + 1  # one session carried all three calls


def _remove_q1(testbed: Testbed) -> None:
    """Removes queue q1 (and the classifier terms that need it) if a test made it."""
    qdiscs = run(["tc", "-n", testbed.ns["rtr"], "qdisc", "show", "dev", "eth1"])
    if "bfifo 11:" in qdiscs:
        with _gnmi(testbed) as client:
            client.set(
                delete=[
                    "/qos/interfaces/interface[interface-id=eth1]/output/queues/queue[name=q1]"
                ],
                encoding="json_ietf",
            )


def test_gnmi_driver_payloads_are_valid_openconfig(
    testbed: Testbed, known_hosts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Set the gNMI driver sends (a buffer; rules that make queue q1; q1's buffer; the
    rules removed), merged into the agent's configuration as it was just before, validates
    against openconfig-qos 2.2.0, its JSON_IETF bytes as they went."""
    sender, receiver = testbed.plan.groups[0].address, testbed.plan.receiver
    flows = [f"{sender}:{41_000 + i}>{receiver}:5201/6" for i in range(2)]
    recorder = Recorder(lambda: _openconfig(testbed))

    async def scenario() -> None:
        async with _driver(_router(testbed, known_hosts)) as driver:
            await driver.set_buffer("eth1", 0, 321_000)
            await driver.set_classifier("eth1", {0: flows[:1], 1: flows[1:]})
            assert await driver.set_buffer("eth1", 1, 150_000) == 150_000
            await driver.set_classifier("eth1", {})

    try:
        with recorder.record(monkeypatch):
            asyncio.run(scenario())
    finally:
        _remove_q1(testbed)
    assert len(recorder.sets) == 4
    for recorded in recorder.sets:
        after_gnmi_set(recorded.config, recorded.updates, recorded.deletes)
    # One Set: the queue, the profile p4bs-eth1 with the uint64 as RFC 7951 writes it (a JSON
    # string) and its binding to eth1's output.
    sent = {path: json.loads(value) for path, value in recorder.sets[0].updates}
    profile = sent["/qos/buffer-allocation-profiles/buffer-allocation-profile[name=p4bs-eth1]"]
    (queue,) = profile["queues"]["queue"]
    assert queue["config"] == {"name": "q0", "dedicated-buffer": "321000"}
    interface = sent["/qos/interfaces/interface[interface-id=eth1]"]
    assert interface["output"]["config"] == {"buffer-allocation-profile": "p4bs-eth1"}
    yang_model("openconfig").validate(_openconfig(testbed))


def test_netconf_driver_payload_is_valid_openconfig(
    testbed: Testbed, known_hosts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(lambda: _netconf_config(testbed))

    async def scenario() -> int:
        async with _driver(_router(testbed, known_hosts, "netconf")) as driver:
            return await driver.set_buffer("eth1", 0, 430_000)

    with recorder.record(monkeypatch):
        assert asyncio.run(scenario()) == 430_000
    (edit,) = recorder.edits
    assert edit.target == "running"
    after = after_edit_config("openconfig", edit.config, edit.payload)
    profile = after["openconfig-qos:qos"]["buffer-allocation-profiles"]
    (queue,) = profile["buffer-allocation-profile"][0]["queues"]["queue"]
    assert queue["config"]["dedicated-buffer"] == "430000"


def _netconf_config(testbed: Testbed) -> dict[str, Any]:
    """NETCONF's running configuration (the OpenConfig dialect keeps p4bs's own shape, a
    profile named like the interface; gNMI's is a router's) as RFC 7951 JSON."""
    with _netconf(testbed) as nc:
        reply = nc.get_config(source="running")
    return yang_model("openconfig").from_xml(etree.fromstring(reply.data_xml.encode()))


def test_linux_tc_driver_in_the_router_namespace(testbed: Testbed, known_hosts: Path) -> None:
    router = _router(testbed, known_hosts, "linux-tc", address=f"netns:{testbed.ns['rtr']}")

    async def scenario() -> list[int]:
        async with _driver(router) as driver:
            return [await driver.set_buffer("eth1", 0, 123_456), await driver.get_buffer("eth1", 0)]

    assert asyncio.run(scenario()) == [123_456, 123_456]
    assert _kernel_limit(testbed) == 123_456
    # Only the driver's threads entered the router's namespace; this one still sees the host.
    assert socket.if_nametoindex(f"{testbed.plan.name}-m") > 0

    err, _ = _fails(_driver(router), lambda d: d.set_buffer("eth1", 0, 100))
    assert (err.kind, err.attempts) == (ErrorKind.REJECTED, 1)
    assert "outside [1514" in str(err)
    err, _ = _fails(_driver(router), lambda d: d.set_buffer("eth1", 3, 100_000))
    assert (err.kind, err.attempts) == (ErrorKind.REJECTED, 1)
    assert _kernel_limit(testbed) == 123_456
    gone = _router(testbed, known_hosts, "linux-tc", address="netns:p4bs-no-such-namespace")
    err, _ = _fails(
        _driver(gone, attempts=2, backoff_ns=10_000_000), lambda d: d.get_buffer("eth1", 0)
    )
    assert (err.kind, err.attempts) == (ErrorKind.UNREACHABLE, 2)


@pytest.mark.parametrize("driver", ["gnmi", "netconf"])
def test_unreachable_router_is_retried_with_backoff_then_reported(
    testbed: Testbed, known_hosts: Path, driver: str
) -> None:
    # NETCONF: known_hosts has no key for this address, and the host key is looked up
    # before connecting; ~/.ssh/known_hosts is looked at only once a router answers.
    ca_file = None if driver == "netconf" else str(testbed.pki / "ca.pem")
    address = f"127.0.0.1:{free_port()}"
    router = _router(testbed, known_hosts, driver, address=address, ca_file=ca_file)
    err, took_s = _fails(
        _driver(router, attempts=3, backoff_ns=100_000_000),
        lambda d: d.set_buffer("eth1", 0, 200_000),
    )
    assert (err.kind, err.attempts, err.router) == (ErrorKind.UNREACHABLE, 3, router.name)
    assert f"router {router.name}: unreachable" in str(err)
    assert 0.3 <= took_s < 3.0  # the backoffs (0.1 s, 0.2 s), and refusals are immediate


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("driver", ["gnmi", "netconf"])
def test_router_that_does_not_answer_times_out(
    testbed: Testbed, known_hosts: Path, driver: str, silent_port: int
) -> None:
    router = _router(
        testbed,
        known_hosts,
        driver,
        address=f"127.0.0.1:{silent_port}",
        ca_file=None if driver == "netconf" else str(testbed.pki / "ca.pem"),
        timeout_ns=300_000_000,
    )
    err, took_s = _fails(
        _driver(router, attempts=2, backoff_ns=50_000_000),
        lambda d: d.set_buffer("eth1", 0, 200_000),
    )
    assert (err.kind, err.attempts) == (ErrorKind.TIMEOUT, 2)
    assert "no answer within 0.3 s" in str(err)
    # Two timeouts and a backoff; cutting each attempt's connection ends its thread at once.
    assert 0.65 <= took_s < 2.0


@pytest.mark.parametrize("driver", ["gnmi", "netconf"])
def test_wrong_password_is_an_auth_error_not_retried_nor_logged(
    testbed: Testbed,
    known_hosts: Path,
    driver: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    secret = tmp_path / "password"
    secret.write_text("wrong-password-123\n")
    before = _kernel_limit(testbed)
    router = _router(testbed, known_hosts, driver, password=SecretRef(file=str(secret)))
    err, _ = _fails(_driver(router, attempts=3), lambda d: d.set_buffer("eth1", 0, 200_000))
    assert (err.kind, err.attempts) == (ErrorKind.AUTH, 1)
    assert _kernel_limit(testbed) == before
    unset = _router(testbed, known_hosts, driver, password=SecretRef(env="P4BS_TEST_UNSET_X"))
    err_unset, _ = _fails(_driver(unset), lambda d: d.get_buffer("eth1", 0))
    assert err_unset.kind == ErrorKind.AUTH
    assert "$P4BS_TEST_UNSET_X is not set" in str(err_unset)
    for text in (str(err), str(err_unset), caplog.text):
        assert "wrong-password-123" not in text and ROUTER_PASSWORD not in text


@pytest.fixture
def mtls_testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """A testbed whose agent requires gNMI clients to present a certificate of its CA."""
    built = Testbed(unique_plan(gnmi_mutual_tls=True))
    built.up()
    yield built
    built.down()


def test_gnmi_mutual_tls_refuses_clients_without_the_cas_certificate(
    mtls_testbed: Testbed, tmp_path: Path
) -> None:
    testbed = mtls_testbed
    before = _kernel_limit(testbed)
    unused = testbed.pki / "known_hosts"
    other = make_test_pki(tmp_path / "other", testbed.plan.router_address, NETCONF_PORT)
    for client in (
        {},  # no certificate
        {"client_cert": str(other["client.pem"]), "client_key": str(other["client-key.pem"])},
    ):
        refused = _router(testbed, unused, **client)
        err, _ = _fails(_driver(refused, attempts=1), lambda d: d.set_buffer("eth1", 0, 200_000))
        # TLS 1.3 checks the client's certificate after the client's side of the handshake:
        # the router closes the connection, which the client cannot tell from a lost one.
        assert err.kind == ErrorKind.UNREACHABLE, err
    assert _kernel_limit(testbed) == before
    known = _router(
        testbed,
        unused,
        client_cert=str(testbed.pki / "client.pem"),
        client_key=str(testbed.pki / "client-key.pem"),
    )

    async def scenario() -> int:
        async with _driver(known) as driver:
            return await driver.set_buffer("eth1", 0, 200_000)

    assert asyncio.run(scenario()) == 200_000
    assert _kernel_limit(testbed) == 200_000
    assert "client certificates required" in testbed.agent_log.read_text()


def test_netconf_refuses_a_router_with_another_host_key(
    testbed: Testbed, known_hosts: Path, tmp_path: Path
) -> None:
    impostor = paramiko.RSAKey.generate(2048)
    hosts = paramiko.HostKeys()
    hosts.add(f"[{testbed.plan.router_address}]:{NETCONF_PORT}", impostor.get_name(), impostor)
    hosts.save(str(tmp_path / "known_hosts"))
    router = _router(testbed, known_hosts, "netconf", ca_file=str(tmp_path / "known_hosts"))
    err, _ = _fails(_driver(router), lambda d: d.get_buffer("eth1", 0))
    assert (err.kind, err.attempts) == (ErrorKind.AUTH, 1)


@pytest.mark.parametrize("driver", ["gnmi", "netconf"])
def test_rejected_values_are_not_retried_and_change_nothing(
    testbed: Testbed, known_hosts: Path, driver: str
) -> None:
    before = _kernel_limit(testbed)
    router = _router(testbed, known_hosts, driver)
    # q16: more queues than the router has (gNMI would make a q9 it lacks; NETCONF would not).
    for queue, size, reason in (
        (0, MAX_BUFFER_BYTES + 1_000_000, "outside [1514"),
        (16, 100_000, "q16"),
    ):
        refused = _driver(router, attempts=3)
        err, _ = _fails(refused, lambda d, q=queue, b=size: d.set_buffer("eth1", q, b))
        assert (err.kind, err.attempts) == (ErrorKind.REJECTED, 1), err
        assert reason in str(err)
        assert _kernel_limit(testbed) == before


class CountingGnmiDriver(GnmiDriver):
    """The gNMI driver, counting its calls in flight; the first two wait for each other, so
    the test fails (the barrier breaks) unless two calls really can run at once."""

    def __init__(self, router: RouterConfig) -> None:
        super().__init__(router)
        self.lock = threading.Lock()
        self.calls = self.in_flight = self.most_in_flight = 0
        self.first_two = threading.Barrier(2, timeout=10)

    def _set_buffer(self, attempt: Attempt, interface: str, queue: int, buffer_bytes: int) -> int:
        with self.lock:
            self.calls += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            first = self.calls <= 2
        try:
            if first:
                self.first_two.wait()
            return super()._set_buffer(attempt, interface, queue, buffer_bytes)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_concurrent_changes_stay_within_the_routers_limit(
    testbed: Testbed, known_hosts: Path
) -> None:
    driver = CountingGnmiDriver(_router(testbed, known_hosts, max_concurrent_changes=2))

    async def scenario() -> list[int]:
        async with driver:
            # One value for all: concurrent changes of one queue to different values would
            # each read back whichever landed last.
            return list(
                await asyncio.gather(*(driver.set_buffer("eth1", 0, 333_000) for _ in range(8)))
            )

    assert asyncio.run(scenario()) == [333_000] * 8
    assert driver.calls == 8
    assert driver.most_in_flight == 2


def _filters(testbed: Testbed) -> list[str]:
    out = run(["tc", "-n", testbed.ns["rtr"], "filter", "show", "dev", testbed.plan.egress])
    return re.findall(r"flowid (\S+)", out)


def test_gnmi_classifier_rules_replace_the_interfaces_terms(
    testbed: Testbed, known_hosts: Path
) -> None:
    sender, receiver = testbed.plan.groups[0].address, testbed.plan.receiver
    flows = [f"{sender}:{40_000 + i}>{receiver}:5201/6" for i in range(3)]

    async def scenario(rules: Mapping[int, list[str]]) -> None:
        async with _driver(_router(testbed, known_hosts)) as driver:
            await driver.set_classifier("eth1", rules)

    try:
        asyncio.run(scenario({0: flows[:1], 1: flows[1:]}))
        assert sorted(_filters(testbed)) == ["1:10", "1:11", "1:11"]
        with _gnmi(testbed) as client:
            reply = client.get(
                path=["/qos/classifiers/classifier[name=p4bs-eth1]"], encoding="json_ietf"
            )
        terms = reply["notification"][0]["update"][0]["val"]["terms"]["term"]
        by_port = {
            int(t["conditions"]["transport"]["config"]["source-port"]): t["actions"]["config"][
                "target-group"
            ]
            for t in terms
        }
        assert by_port == {40_000: "q0", 40_001: "q1", 40_002: "q1"}
        asyncio.run(scenario({1: flows[2:]}))  # the old terms go, q1 stays
        assert _filters(testbed) == ["1:11"]
        asyncio.run(scenario({}))
        assert _filters(testbed) == []
    finally:
        _remove_q1(testbed)  # which the first rules created


def test_classifier_rules_where_drivers_cannot_and_bad_flow_keys(
    testbed: Testbed, known_hosts: Path
) -> None:
    async def scenario() -> None:
        for driver, changes in (
            ("netconf", {}),
            ("linux-tc", {"address": "netns:x"}),
        ):
            async with _driver(_router(testbed, known_hosts, driver, **changes)) as d:
                with pytest.raises(NotImplementedError, match="gnmi"):
                    await d.set_classifier("eth1", {1: ["10.0.0.1:1>10.0.0.2:2/6"]})
        async with _driver(_router(testbed, known_hosts)) as d:
            with pytest.raises(ValueError, match="not a flow key"):
                await d.set_classifier("eth1", {1: ["10.0.0.1:1-10.0.0.2:2"]})

    asyncio.run(scenario())


# ---- commit confirmed: the agent has no candidate datastore, so a scripted NETCONF peer ------
class ConfirmingRouter:
    """A NETCONF manager's side of a router with :candidate and :confirmed-commit:1.1, holding
    one queue's buffer; `coerce` changes what a commit puts in force (a router that rounds)."""

    def __init__(self, running: int, coerce: Callable[[int], int] = lambda v: v) -> None:
        self.server_capabilities = {CANDIDATE, CONFIRMED_COMMIT_11}
        self.connected = True
        self.running = running
        self.coerce = coerce
        self.candidate: int | None = None
        self.before_confirmed: int | None = None
        self.log: list[str] = []

    def locked(self, target: str) -> Any:
        router = self

        class Lock:
            def __enter__(self) -> None:
                router.log.append(f"lock {target}")

            def __exit__(self, *_: object) -> None:
                router.log.append(f"unlock {target}")

        return Lock()

    def discard_changes(self) -> None:
        self.log.append("discard-changes")
        self.candidate = None

    def edit_config(self, target: str, config: str) -> None:
        self.log.append(f"edit-config {target}")
        self.candidate = int(re.findall(r"<dedicated-buffer>(\d+)<", config)[0])

    def commit(self, confirmed: bool = False, timeout: str | None = None) -> None:
        if confirmed:
            self.log.append(f"commit confirmed {timeout}")
            assert self.candidate is not None
            self.before_confirmed, self.running = self.running, self.coerce(self.candidate)
        else:
            self.log.append("commit")
            self.before_confirmed = None

    def cancel_commit(self) -> None:
        self.log.append("cancel-commit")
        assert self.before_confirmed is not None
        self.running, self.before_confirmed = self.before_confirmed, None

    def get(self, filter: tuple[str, str]) -> Any:
        xml = (
            f'<data><qos xmlns="{OC_QOS_NS}"><buffer-allocation-profiles>'
            "<buffer-allocation-profile><name>eth1</name><queues><queue><name>q0</name><state>"
            f"<dedicated-buffer>{self.running}</dedicated-buffer></state></queue></queues>"
            "</buffer-allocation-profile></buffer-allocation-profiles></qos></data>"
        )
        return type("Reply", (), {"xml": xml})()

    def close_session(self) -> None:
        self.connected = False


class ScriptedNetconfDriver(NetconfDriver):
    def __init__(self, router: RouterConfig, peer: ConfirmingRouter) -> None:
        super().__init__(router)
        self.peer = peer
        self.sockets: list[socket.socket] = []

    def _connect(self, attempt: Attempt) -> Session:
        self.sockets.append(socket.socket())
        return Session(self.peer, self.sockets[-1])


def test_netconf_uses_confirmed_commit_and_cancels_it_on_a_wrong_read_back(
    router_credentials: tuple[str, str],
) -> None:
    router = RouterConfig(
        name="scripted",
        driver="netconf",
        address="192.0.2.1:830",
        username=SecretRef(env="P4BS_ROUTER_USER"),
        password=SecretRef(env="P4BS_ROUTER_PASSWORD"),
        ca_file=None,
        timeout_ns=2_500_000_000,
        max_concurrent_changes=1,
        confirm_window_ns=90_500_000_000,  # the confirm-timeout goes in whole seconds, up
    )
    good = ConfirmingRouter(running=100_000)
    driver = ScriptedNetconfDriver(router, good)
    assert asyncio.run(_set(driver, 200_000)) == 200_000
    for sock in driver.sockets:
        sock.close()
    assert good.log == [
        "lock candidate",
        "discard-changes",
        "edit-config candidate",
        "commit confirmed 91",
        "commit",
        "unlock candidate",
    ]
    rounding = ConfirmingRouter(running=100_000, coerce=lambda v: v // 1000 * 1000)
    driver = ScriptedNetconfDriver(router, rounding)
    err, _ = _fails(driver, lambda d: d.set_buffer("eth1", 0, 200_500))
    for sock in driver.sockets:
        sock.close()
    assert (err.kind, err.attempts) == (ErrorKind.MISMATCH, 1)
    assert "cancelled" in str(err)
    assert "commit" not in rounding.log  # never confirmed
    assert rounding.log[-2:] == ["cancel-commit", "unlock candidate"]
    assert rounding.running == 100_000


async def _set(driver: RouterDriver, size: int) -> int:
    async with driver:
        return await driver.set_buffer("eth1", 0, size)
