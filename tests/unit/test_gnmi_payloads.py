"""The gNMI driver against the agent's gNMI server in this process, started from a router-shaped
configuration (interfaces only), with the tc queues held in memory (RouterQos minus the
kernel: the testbed tests drive the real one). Every Set the driver sends is recorded from the
real pygnmi client and validated with yangson against ../shared/yang/openconfig, merged into
the configuration the agent had just before: a first change on an empty QoS tree, a later
change on the populated one, classifier changes. Also: the agent refuses, whole, what the
schema refuses; the driver refuses keys pygnmi cannot carry and buffers outside uint64."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from pygnmi.client import gNMIclient
from pygnmi.create_gnmi_path import gnmi_path_generator
from pygnmi.spec.v080 import gnmi_pb2 as pb
from pygnmi.spec.v080 import gnmi_pb2_grpc as pb_grpc
from yangcheck import Recorder, after_gnmi_set, gnmi_elems

from conftest import ROUTER_PASSWORD, ROUTER_USER
from p4bs.config import RouterConfig, SecretRef
from p4bs.yang import yang_model
from p4bs_infra.agent.datastore import Queue, RouterQos, flatten
from p4bs_infra.agent.gnmi import Gnmi
from p4bs_infra.agent.openconfig import TOP
from p4bs_infra.pki import make_test_pki
from p4bs_optimizer.drivers.base import DriverError, ErrorKind
from p4bs_optimizer.drivers.gnmi import GnmiDriver, buffer_updates, gnmi_path

DEFAULT_LIMIT = 200_000


class MemoryQueues(RouterQos):
    """RouterQos's queues, buffers and terms in memory: what the kernel would hold."""

    def __init__(self, interfaces: list[str]) -> None:
        self.interfaces = interfaces
        self.max_buffer_bytes = 256 * 1024 * 1024
        self.state_file = None
        self.terms = {}
        self.limits = {(i, "q0"): DEFAULT_LIMIT for i in interfaces}
        self.calls: list[tuple[list[Any], list[Any]]] = []

    def queues(self) -> list[Queue]:
        return [
            Queue(i, 1, q, 0x10010 + int(q[1:]), 0, limit, 100_000_000, 0, 0, 0, 0)
            for (i, q), limit in sorted(self.limits.items())
        ]

    def set(self, updates: list[Any], deletes: list[Any]) -> None:
        self.calls.append((updates, deletes))
        for path in deletes:
            names = [name for name, _ in path]
            if names[-1] == "term":
                del self.terms[(path[2][1]["name"], int(path[4][1]["id"]))]
            else:
                del self.limits[(path[2][1]["interface-id"], path[5][1]["name"])]
        for path, value in updates:
            for leaf, scalar in flatten(path, value):
                names, keys = [n for n, _ in leaf], [k for _, k in leaf]
                if names[2] == "interface":
                    queue = (keys[2]["interface-id"], keys[5]["name"])
                    self.limits.setdefault(queue, DEFAULT_LIMIT)
                elif names[2] == "buffer-allocation-profile" and names[-1] == "dedicated-buffer":
                    self.limits[(keys[2]["name"], keys[4]["name"])] = int(scalar)
                elif names[2] == "classifier":
                    term = self.terms.setdefault((keys[2]["name"], int(keys[4]["id"])), {})
                    if names[-1] != "id":
                        term[names[-1]] = scalar


@dataclass
class Agent:
    kernel: MemoryQueues
    servicer: Gnmi
    router: RouterConfig

    def config(self) -> dict[str, Any]:
        """The agent's configuration as a gNMI Get of type CONFIG gives it."""
        return {TOP: self.servicer.qos.tree(config_only=True)}


@pytest.fixture
def agent(tmp_path: Path, router_credentials: tuple[str, str]) -> Iterator[Agent]:
    pki = make_test_pki(tmp_path / "pki", "127.0.0.1", 830)
    kernel = MemoryQueues(["eth1", "et-0/0/0"])
    servicer = Gnmi(kernel, ROUTER_USER, ROUTER_PASSWORD)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_gNMIServicer_to_server(servicer, server)
    pair = (pki["server-key.pem"].read_bytes(), pki["server.pem"].read_bytes())
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
    server.start()
    router = RouterConfig(
        name="in-process",
        driver="gnmi",
        address=f"127.0.0.1:{port}",
        username=SecretRef(env="P4BS_ROUTER_USER"),
        password=SecretRef(env="P4BS_ROUTER_PASSWORD"),
        ca_file=str(pki["ca.pem"]),
        timeout_ns=5_000_000_000,
        max_concurrent_changes=1,
    )
    yield Agent(kernel, servicer, router)
    server.stop(grace=None)


def _client(agent: Agent) -> gNMIclient:
    host, port = agent.router.address.split(":")
    return gNMIclient(
        target=(host, int(port)),
        username=ROUTER_USER,
        password=ROUTER_PASSWORD,
        path_cert=agent.router.ca_file,
    )


FLOWS = ["10.0.1.2:41000>10.0.2.2:5201/6", "10.0.1.2:41001>10.0.2.2:5201/6"]


def test_every_set_the_driver_sends_validates_from_an_empty_and_a_populated_tree(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(agent.config)

    async def scenario() -> list[int]:
        async with GnmiDriver(agent.router) as driver:
            return [
                await driver.set_buffer("eth1", 0, 321_000),  # first change: empty QoS tree
                await driver.set_buffer("eth1", 0, 400_000),  # later change: populated tree
                await driver.set_buffer("et-0/0/0", 0, 150_000),
                await driver.get_buffer("eth1", 0),
            ]

    async def classifiers() -> int:
        async with GnmiDriver(agent.router) as driver:
            await driver.set_classifier("eth1", {0: FLOWS[:1], 1: FLOWS[1:]})
            reported = await driver.set_buffer("eth1", 1, 120_000)
            await driver.set_classifier("eth1", {1: FLOWS})
            await driver.set_classifier("eth1", {})
            return reported

    with recorder.record(monkeypatch):
        assert asyncio.run(scenario()) == [321_000, 400_000, 150_000, 400_000]
        first, later = recorder.sets[0], recorder.sets[1]
        assert asyncio.run(classifiers()) == 120_000
    assert len(recorder.sets) == 7
    # The first Set on a tree with interfaces only (no queue, no profile), the later one on a
    # tree holding the first one's result.
    empty = first.config[TOP]
    assert set(empty) == {"interfaces"}
    assert "buffer-allocation-profiles" in later.config[TOP]
    for recorded in recorder.sets:
        after_gnmi_set(recorded.config, recorded.updates, recorded.deletes)
    assert agent.kernel.limits == {
        ("eth1", "q0"): 400_000,
        ("eth1", "q1"): 120_000,
        ("et-0/0/0", "q0"): 150_000,
    }
    assert agent.kernel.terms == {}  # the last classifier change removed every term
    yang_model("openconfig").validate(agent.config())
    print("first change:", json.dumps([(p, json.loads(v)) for p, v in first.updates]))
    print("later change:", json.dumps([(p, json.loads(v)) for p, v in later.updates]))


def test_the_classifier_reaches_the_kernel_through_its_binding(agent: Agent) -> None:
    async def scenario() -> None:
        async with GnmiDriver(agent.router) as driver:
            await driver.set_classifier("eth1", {0: FLOWS[:1], 1: FLOWS[1:]})

    asyncio.run(scenario())
    terms = agent.kernel.terms
    assert sorted(terms) == [("eth1", 1), ("eth1", 2)]
    assert terms[("eth1", 2)]["target-group"] == "q1"
    assert terms[("eth1", 2)]["source-port"] == 41_001
    assert ("eth1", "q1") in agent.kernel.limits


def test_a_profile_bound_to_nothing_changes_nothing_and_the_driver_says_so(
    agent: Agent,
) -> None:
    """What the old driver did (a profile's queue, named like the interface) is refused by the
    schema on a router-shaped tree; a valid profile left unbound reaches no queue; a binding
    the driver does not find in force fails the change."""
    profiles = "/qos/buffer-allocation-profiles/buffer-allocation-profile"
    old = f"{profiles}[name=eth1]/queues/queue[name=q0]"
    with _client(agent) as client, pytest.raises(Exception, match="instance-required"):
        client.set(
            update=[(old, json.dumps({"config": {"name": "q0", "dedicated-buffer": "300000"}}))],
            encoding="json_ietf",
        )
    unbound = [u for u in buffer_updates("eth1", 0, 300_000) if "interfaces" not in u[0]]
    with _client(agent) as client:
        client.set(update=unbound, encoding="json_ietf")
    assert agent.kernel.limits[("eth1", "q0")] == DEFAULT_LIMIT
    queue = f"{profiles}[name=p4bs-eth1]/queues/queue[name=q0]/state"
    state = agent.servicer.qos.get(gnmi_elems(queue))
    assert state[0][1]["dedicated-buffer"] == "300000"  # the profile's own state looks fine

    async def read() -> int:
        async with GnmiDriver(agent.router) as driver:
            return await driver.get_buffer("eth1", 0)

    with pytest.raises(DriverError) as err:
        asyncio.run(read())
    assert err.value.kind == ErrorKind.MISMATCH
    assert "no buffer-allocation-profile in force" in str(err.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b'"12a"', "RawTypeError"),
        (b'"1e3"', "RawTypeError"),
        (b'"-5"', "YangTypeError"),
        (b'""', "RawTypeError"),
        (b"300000", "RawTypeError"),  # a uint64 as a JSON number
        (b'"18446744073709551616"', "YangTypeError"),
        (b'" 12"', "not an unsigned integer"),
        ('"\uff11\uff12"'.encode(), "not an unsigned integer"),  # fullwidth digits
        ('"\u00b2"'.encode(), "RawTypeError"),  # a superscript 2: UNKNOWN before (int("²"))
    ],
)
def test_odd_digits_are_invalid_argument_and_nothing_is_applied(
    agent: Agent, value: bytes, message: str
) -> None:
    updates = buffer_updates("eth1", 0, 300_000)
    leaf = updates[1][0] + "/queues/queue[name=q0]/config/dedicated-buffer"
    before = agent.config()
    stub = _stub(agent)
    request = pb.SetRequest(
        update=[
            *(
                pb.Update(path=gnmi_path_generator(p), val=pb.TypedValue(json_ietf_val=v.encode()))
                for p, v in updates
            ),
            pb.Update(path=gnmi_path_generator(leaf), val=pb.TypedValue(json_ietf_val=value)),
        ]
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.Set(request, metadata=[("username", ROUTER_USER), ("password", ROUTER_PASSWORD)])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert message in str(err.value.details())
    assert agent.config() == before
    assert agent.kernel.limits[("eth1", "q0")] == DEFAULT_LIMIT


def test_module_prefixes_are_required_where_json_ietf_needs_them(agent: Agent) -> None:
    stub = _stub(agent)
    body = {"queues": {"queue": [{"name": "q1", "config": {"name": "q1"}}]}}
    for member, code in (("qos", grpc.StatusCode.INVALID_ARGUMENT), (TOP, None)):
        value = json.dumps({member: body}).encode()
        request = pb.SetRequest(
            update=[pb.Update(path=pb.Path(), val=pb.TypedValue(json_ietf_val=value))]
        )
        metadata = [("username", ROUTER_USER), ("password", ROUTER_PASSWORD)]
        if code is None:
            stub.Set(request, metadata=metadata)
        else:
            with pytest.raises(grpc.RpcError) as err:
                stub.Set(request, metadata=metadata)
            assert err.value.code() == code
            assert "no member 'qos'" in str(err.value.details())
    assert agent.config()[TOP]["queues"] == body["queues"]


@pytest.mark.parametrize("name", ["eth1]/x[name=y", "a\\b", "a=b", "*", ""])
def test_keys_pygnmi_cannot_carry_are_refused_before_sending(agent: Agent, name: str) -> None:
    async def scenario() -> int:
        async with GnmiDriver(agent.router) as driver:
            return await driver.set_buffer(name, 0, 300_000)

    with pytest.raises(DriverError) as err:
        asyncio.run(scenario())
    assert (err.value.kind, err.value.attempts) == (ErrorKind.REJECTED, 1)
    assert "cannot go into a gNMI path" in str(err.value)
    assert agent.kernel.calls == []


def test_buffers_outside_uint64_are_refused_before_sending(agent: Agent) -> None:
    async def scenario() -> int:
        async with GnmiDriver(agent.router) as driver:
            return await driver.set_buffer("eth1", 0, 2**64)

    with pytest.raises(DriverError) as err:
        asyncio.run(scenario())
    assert err.value.kind == ErrorKind.REJECTED
    assert "outside uint64" in str(err.value)
    assert agent.kernel.calls == []


def test_an_interface_name_with_slashes_goes_intact() -> None:
    path = gnmi_path(("interface", {"interface-id": "et-0/0/0"}))
    assert gnmi_elems(path) == [("interface", {"interface-id": "et-0/0/0"})]


def _stub(agent: Agent) -> Any:
    channel = grpc.secure_channel(
        agent.router.address,
        grpc.ssl_channel_credentials(Path(agent.router.ca_file or "").read_bytes()),
    )
    return pb_grpc.gNMIStub(channel)
