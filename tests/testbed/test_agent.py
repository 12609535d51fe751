"""The router agent in a real testbed: gNMI (pygnmi and gnmi_cli, a client nobody here wrote)
and NETCONF (ncclient) read and change the router's buffer; bad requests change nothing.
gNMI serves a router-shaped OpenConfig configuration: a buffer reaches the kernel through the
profile p4bs-eth1 once it is bound to eth1's output (`_bind`, the gNMI driver's Set)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import grpc
import pexpect
import pytest
from lxml import etree
from ncclient import manager
from ncclient.operations.rpc import RPCError
from pygnmi.client import gNMIclient
from pygnmi.create_gnmi_path import gnmi_path_generator
from pygnmi.spec.v080 import gnmi_pb2 as pb
from pygnmi.spec.v080 import gnmi_pb2_grpc as pb_grpc

from conftest import ROUTER_PASSWORD, ROUTER_USER
from p4bs import paths
from p4bs.yang import yang_model
from p4bs_infra.procs import wait_until
from p4bs_infra.testbed import NETCONF_PORT, Testbed, in_ns, run
from p4bs_infra.traffic import Scenario, TrafficRun
from p4bs_optimizer.drivers.gnmi import (
    buffer_updates,
    classifier_updates,
    json_text,
    queue_declarations,
    uint64,
)

USER, PASSWORD = ROUTER_USER, ROUTER_PASSWORD
PROFILE = "/qos/buffer-allocation-profiles/buffer-allocation-profile[name=p4bs-eth1]"
BUFFER = f"{PROFILE}/queues/queue[name=q0]/config/dedicated-buffer"
TEMPORAL = f"{PROFILE}/queues/queue[name=q0]/config/dedicated-buffer-temporal"
OC_QOS = "http://openconfig.net/yang/qos"


def _u64(value: int) -> str:
    """A uint64 as pygnmi must be given it for JSON_IETF: the JSON string (RFC 7951)."""
    return json_text(uint64(value))


def _kernel_limit(testbed: Testbed) -> int:
    out = run(["tc", "-j", "-n", testbed.ns["rtr"], "qdisc", "show", "dev", testbed.plan.egress])
    (fifo,) = [q for q in json.loads(out) if q["kind"] == "bfifo"]
    return int(fifo["options"]["limit"])


def _gnmi(testbed: Testbed, password: str = PASSWORD) -> gNMIclient:
    return gNMIclient(
        target=(testbed.plan.router_address, testbed.plan.gnmi_port),
        username=USER,
        password=password,
        path_cert=str(testbed.pki / "ca.pem"),
    )


def _get_leaf(client: gNMIclient, path: str) -> Any:
    reply = client.get(path=[path], encoding="json_ietf")
    (notification,) = reply["notification"]
    (update,) = notification["update"]
    return update["val"]


def _bind(client: gNMIclient, size: int) -> None:
    """eth1 q0 at `size` bytes as the gNMI driver sets it: the queue, the profile p4bs-eth1
    and its binding to eth1's output, in one Set."""
    client.set(update=buffer_updates("eth1", 0, size), encoding="json_ietf")


def test_pygnmi_gets_and_sets_the_buffer_in_the_kernel(testbed: Testbed) -> None:
    with _gnmi(testbed) as client:
        _bind(client, testbed.plan.buffer_bytes)
        assert int(_get_leaf(client, BUFFER)) == testbed.plan.buffer_bytes == _kernel_limit(testbed)
        state = f"{PROFILE}/queues/queue[name=q0]/state"
        assert int(_get_leaf(client, f"{state}/dedicated-buffer-temporal")) == 200_000  # µs
        binding = "/qos/interfaces/interface[interface-id=eth1]/output/state"
        assert _get_leaf(client, binding) == {"buffer-allocation-profile": "p4bs-eth1"}
        client.set(update=[(BUFFER, _u64(300_000))], encoding="json_ietf")
        assert _kernel_limit(testbed) == 300_000
        client.set(update=[(TEMPORAL, _u64(50_000))], encoding="json_ietf")  # 50 ms
        assert _kernel_limit(testbed) == 625_000
        # The temporal value replaced the bytes in the configuration; state has both.
        assert int(_get_leaf(client, f"{state}/dedicated-buffer")) == 625_000
        caps = client.capabilities()
    assert any(m["name"] == "openconfig-qos" for m in caps["supported_models"])


def _openconfig(testbed: Testbed) -> dict[str, Any]:
    """The agent's configuration (gNMI Get, type CONFIG) as an RFC 7951 document."""
    with _gnmi(testbed) as client:
        reply = client.get(path=["/qos"], datatype="config", encoding="json_ietf")
    return {"openconfig-qos:qos": reply["notification"][0]["update"][0]["val"]}


def test_the_agents_configuration_is_valid_openconfig(testbed: Testbed) -> None:
    """As gNMI and NETCONF serve it, the whole tree, against openconfig-qos 2.2.0."""
    with _gnmi(testbed) as client:
        _bind(client, 400_000)
    config = _openconfig(testbed)
    yang_model("openconfig").validate(config)
    with _netconf(testbed) as nc:
        reply = nc.get_config(source="running")
    served = yang_model("openconfig").from_xml(etree.fromstring(reply.data_xml.encode()))
    yang_model("openconfig").validate(served)
    # NETCONF's OpenConfig dialect keeps p4bs's own shape (a profile named like the interface);
    # both show the buffer in force.
    profiles = "buffer-allocation-profiles"
    (profile,) = served["openconfig-qos:qos"][profiles]["buffer-allocation-profile"]
    assert profile["queues"]["queue"][0]["config"]["dedicated-buffer"] == "400000"


def _gnmi_cli(testbed: Testbed, *args: str) -> str:
    """gnmi_cli prompts for the username and password on its terminal, like for a person."""
    cli = pexpect.spawn(
        str(paths.tool("gnmi_cli")),
        [
            "-address",
            f"{testbed.plan.router_address}:{testbed.plan.gnmi_port}",
            "-ca_crt",
            str(testbed.pki / "ca.pem"),
            "-with_user_pass",
            "-timeout",
            "10s",
            *args,
        ],
        encoding="utf-8",
        timeout=30,
    )
    cli.expect("username:")
    cli.sendline(USER)
    cli.expect("password:")
    cli.sendline(PASSWORD)
    cli.expect(pexpect.EOF)
    cli.close()
    assert cli.exitstatus == 0, cli.before
    return str(cli.before)


def _proto_path(path: str) -> str:
    elems = []
    for part in path.strip("/").split("/"):
        name, _, key = part.partition("[")
        keys = ""
        if key:
            k, v = key.rstrip("]").split("=")
            keys = f' key: <key: "{k}" value: "{v}">'
        elems.append(f'elem: <name: "{name}"{keys}>')
    return "path: <" + " ".join(elems) + ">"


def test_gnmi_cli_gets_and_sets_the_buffer(testbed: Testbed) -> None:
    _set_buffer(testbed, 350_000)
    out = _gnmi_cli(testbed, "-get", "-proto", f"{_proto_path(BUFFER)} encoding: JSON_IETF")
    assert str(_kernel_limit(testbed)) in out
    _gnmi_cli(testbed, "-set", "-proto", f"update: <{_proto_path(BUFFER)} val: <uint_val: 444444>>")
    assert _kernel_limit(testbed) == 444_444
    out = _gnmi_cli(testbed, "-capabilities")
    assert "openconfig-qos" in out


INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("update", "code", "message"),
    [
        # q9 is not declared under /qos/queues: the profile's queue is a dangling leafref.
        (
            [(f"{PROFILE}/queues/queue[name=q9]/config/dedicated-buffer", 100_000)],
            INVALID,
            "instance-required",
        ),
        (
            [("/qos/buffer-allocation-profiles/buffer-allocation-profile[name=eth1]", b"{}")],
            INVALID,
            "instance-required",  # the old driver's profile: its name is no profile's
        ),
        ([("/qos/nonsense/leaf", 1)], INVALID, "no member 'nonsense'"),
        ([(BUFFER, 10)], INVALID, "outside [1514"),
        ([(BUFFER, "lots")], INVALID, "RawTypeError"),
        # Odd digits: refused by the schema as INVALID_ARGUMENT (int("²") was UNKNOWN).
        ([(BUFFER, "12a")], INVALID, "RawTypeError"),
        ([(BUFFER, "1e3")], INVALID, "RawTypeError"),
        ([(BUFFER, "-5")], INVALID, "YangTypeError"),
        ([(BUFFER, "")], INVALID, "RawTypeError"),
        ([(BUFFER, "\u00b2")], INVALID, "RawTypeError"),
        ([(BUFFER, " 300000")], INVALID, "not an unsigned integer"),
        # JSON_IETF as it goes on the wire: a uint64 as a JSON number, a string unquoted.
        ([(BUFFER, b"300000")], INVALID, "RawTypeError"),
        ([(f"{PROFILE}/queues/queue[name=q0]/config/name", b"q0")], INVALID, "does not parse"),
        ([(BUFFER, 500_000), (TEMPORAL, 1)], INVALID, "conflict"),
        (
            [(BUFFER, 500_000), (f"{PROFILE}/queues/queue[name=q0]/state/dedicated-buffer", 7)],
            INVALID,
            "state",
        ),
        # At the root, JSON_IETF names the module: {"qos": ...} is refused, as a router would.
        (
            [("", b'{"qos": {"queues": {"queue": [{"name": "q3", "config": {"name": "q3"}}]}}}')],
            INVALID,
            "no member 'qos'",
        ),
    ],
)
def test_invalid_gnmi_sets_fail_and_change_nothing(
    testbed: Testbed, update: list[tuple[str, Any]], code: grpc.StatusCode, message: str
) -> None:
    with _gnmi(testbed) as client:
        _bind(client, 450_000)
    before = _kernel_limit(testbed), _openconfig(testbed)
    channel = grpc.secure_channel(
        f"{testbed.plan.router_address}:{testbed.plan.gnmi_port}",
        grpc.ssl_channel_credentials((testbed.pki / "ca.pem").read_bytes()),
    )

    def typed(value: Any) -> pb.TypedValue:
        if isinstance(value, int):
            return pb.TypedValue(uint_val=value)
        if isinstance(value, bytes):  # JSON text exactly as given
            return pb.TypedValue(json_ietf_val=value)
        return pb.TypedValue(json_ietf_val=json.dumps(value).encode())

    request = pb.SetRequest(
        update=[pb.Update(path=gnmi_path_generator(p), val=typed(v)) for p, v in update]
    )
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.gNMIStub(channel).Set(
            request, metadata=[("username", USER), ("password", PASSWORD)]
        )
    assert err.value.code() == code, err.value.details()
    assert message in str(err.value.details())
    assert (_kernel_limit(testbed), _openconfig(testbed)) == before


def test_bad_credentials_and_deletes_are_refused(testbed: Testbed) -> None:
    _set_buffer(testbed, 460_000)
    before = _kernel_limit(testbed)
    with (
        pytest.raises(Exception, match=r"UNAUTHENTICATED|bad username"),
        _gnmi(testbed, password="wrong") as client,
    ):
        client.set(update=[(BUFFER, _u64(100_000))], encoding="json_ietf")
    with _gnmi(testbed) as client, pytest.raises(Exception, match="instance-required"):
        # The queue p4bs-eth1's entry and eth1's output queue refer to.
        client.set(delete=["/qos/queues/queue[name=q0]"], encoding="json_ietf")
    assert _kernel_limit(testbed) == before
    agent_log = (testbed.agent_log).read_text()
    assert PASSWORD not in agent_log and "wrong" not in agent_log


def test_subscribe_sample_and_on_change(testbed: Testbed) -> None:
    _set_buffer(testbed, 500_000)
    state = "/qos/interfaces/interface[interface-id=eth1]/output/queues/queue[name=q0]/state"
    with _gnmi(testbed) as client:
        samples = client.subscribe2(
            subscribe={
                "subscription": [
                    {
                        "path": f"{state}/transmit-pkts",
                        "mode": "sample",
                        "sample_interval": 200_000_000,
                    }
                ],
                "mode": "stream",
                "encoding": "json_ietf",
            }
        )
        # pygnmi hands the initial values up to the sync as one update, then each sample.
        seen = [samples.get_update(timeout=10) for _ in range(3)]
        samples.close()
        assert all(s["update"]["update"] for s in seen)
        stamps = [s["update"]["timestamp"] for s in seen]
        assert stamps == sorted(stamps) and stamps[2] - stamps[1] >= 100_000_000
        changes = client.subscribe2(
            subscribe={
                "subscription": [{"path": BUFFER, "mode": "on_change"}],
                "mode": "stream",
                "encoding": "json_ietf",
            }
        )
        initial = changes.get_update(timeout=10)
        assert int(initial["update"]["update"][0]["val"]) == _kernel_limit(testbed)
        threading.Timer(0.3, lambda: _set_buffer(testbed, 777_000)).start()
        changed = changes.get_update(timeout=10)
        changes.close()
    values = [u["val"] for u in changed["update"]["update"]]
    assert int(values[0]) == 777_000


def _set_buffer(testbed: Testbed, size: int) -> None:
    with _gnmi(testbed) as client:
        _bind(client, size)


def _netconf(testbed: Testbed, password: str = PASSWORD) -> manager.Manager:
    return manager.connect(
        host=testbed.plan.router_address,
        port=NETCONF_PORT,
        username=USER,
        password=password,
        hostkey_verify=False,
        look_for_keys=False,
        allow_agent=False,
        timeout=20,
    )


def _edit(size: str, queue: str = "q0") -> str:
    return (
        f'<config><qos xmlns="{OC_QOS}"><buffer-allocation-profiles><buffer-allocation-profile>'
        f"<name>eth1</name><queues><queue><name>{queue}</name><config>"
        f"<dedicated-buffer>{size}</dedicated-buffer></config></queue></queues>"
        f"</buffer-allocation-profile></buffer-allocation-profiles></qos></config>"
    )


def test_ncclient_reads_and_edits_the_buffer(testbed: Testbed) -> None:
    with _netconf(testbed) as nc:
        reply = nc.get_config(
            source="running",
            filter=("subtree", f'<qos xmlns="{OC_QOS}"><buffer-allocation-profiles/></qos>'),
        )
        assert f"<dedicated-buffer>{_kernel_limit(testbed)}</dedicated-buffer>" in reply.xml
        assert "current-queue-len" not in reply.xml  # config only
        nc.edit_config(target="running", config=_edit("555000"))
        assert _kernel_limit(testbed) == 555_000
        state = nc.get(filter=("subtree", f'<qos xmlns="{OC_QOS}"><interfaces/></qos>'))
        assert "<transmit-pkts>" in state.xml
        for bad, message in (("5", "outside"), ("many", "unsigned integer")):
            with pytest.raises(RPCError, match=message):
                nc.edit_config(target="running", config=_edit(bad))
        with pytest.raises(RPCError, match="no queue 'q7'"):
            nc.edit_config(target="running", config=_edit("100000", queue="q7"))
    assert _kernel_limit(testbed) == 555_000


def test_netconf_refuses_bad_credentials(testbed: Testbed) -> None:
    with pytest.raises(Exception, match=r"[Aa]uthentication"):
        _netconf(testbed, password="wrong")


def test_buffer_changes_under_load_keep_flows_and_queue(testbed: Testbed, tmp_path: Path) -> None:
    """Set while 10 Cubic flows run: no flow resets, the FIFO is changed, not replaced."""
    _set_buffer(testbed, testbed.plan.buffer_bytes)
    run_dir = tmp_path / "load"
    result: dict[str, Any] = {}
    traffic = threading.Thread(
        target=lambda: result.update(
            TrafficRun(testbed, run_dir, Scenario(duration_s=16)).run(progress=lambda _: None)
        )
    )
    traffic.start()
    changes = []
    try:

        def queue_filled() -> bool:
            lines = (
                (run_dir / "qdisc.jsonl").read_text().splitlines()
                if (run_dir / "qdisc.jsonl").exists()
                else []
            )
            return bool(lines) and json.loads(lines[-1])["backlog_bytes"] > 500_000

        assert wait_until(queue_filled, 12)
        for size in (1_800_000, 2_200_000):
            _set_buffer(testbed, size)
            changes.append(size)
            assert _kernel_limit(testbed) == size
    finally:
        traffic.join(timeout=60)
    qdisc = [json.loads(line) for line in (run_dir / "qdisc.jsonl").read_text().splitlines()]
    sent = [q["sent_bytes"] for q in qdisc]
    assert sent == sorted(sent), "counters restarted: the FIFO was replaced"
    assert {q["handle"] for q in qdisc} == {0x100000}
    assert {q["limit_bytes"] for q in qdisc} >= set(changes)
    after_change = [q for q in qdisc if q["limit_bytes"] == changes[0]]
    assert after_change[0]["backlog_bytes"] > 0  # the queue was not flushed
    connected, ended = map(json.loads, next(run_dir.glob("bulk-*-client.jsonl")).open())
    assert "error" not in connected and "error" not in ended
    flows = [json.loads(line) for line in next(run_dir.glob("bulk-*[0-9].jsonl")).open()]
    assert len(flows) == 10 and all(f["bytes"] > 0 for f in flows)


def _queue_packets(testbed: Testbed, queue: str) -> int:
    out = run(
        ["tc", "-j", "-s", "-n", testbed.ns["rtr"], "qdisc", "show", "dev", testbed.plan.egress]
    )
    handle = f"{0x10 + int(queue[1:]):x}:"
    (fifo,) = [q for q in json.loads(out) if q["kind"] == "bfifo" and q["handle"] == handle]
    return int(fifo["packets"])


def test_queues_and_classifier_terms_steer_flows(testbed: Testbed) -> None:
    """A second queue and a term of the classifier bound to eth1's output sending one sender
    address into it, then both removed."""
    group = testbed.plan.groups[0].address
    queue_path = "/qos/interfaces/interface[interface-id=eth1]/output/queues/queue[name=q1]"
    term_path = "/qos/classifiers/classifier[name=p4bs-eth1]/terms/term[id=5]"
    term = {
        "config": {"id": "5"},
        "conditions": {"ipv4": {"config": {"source-address": f"{group}/32"}}},
        "actions": {"config": {"target-group": "q1"}},
    }
    q1_buffer = f"{PROFILE}/queues/queue[name=q1]/config/dedicated-buffer"
    with _gnmi(testbed) as client:
        _bind(client, testbed.plan.buffer_bytes)
        with pytest.raises(Exception, match="instance-required"):  # no forwarding group q1
            client.set(
                update=[*classifier_updates("eth1"), (term_path, term)], encoding="json_ietf"
            )
        client.set(
            update=[
                *classifier_updates("eth1"),
                *queue_declarations("eth1", 1),
                *buffer_updates("eth1", 1, 120_000),
                (term_path, json_text(term)),
            ],
            encoding="json_ietf",
        )
        assert int(_get_leaf(client, q1_buffer)) == 120_000
        yang_model("openconfig").validate(_openconfig(testbed))  # with q1 and the term
        # Two queues share the link: q1 is guaranteed 50 Mbit/s, so 120 kB is 19.2 ms.
        temporal = f"{PROFILE}/queues/queue[name=q1]/state/dedicated-buffer-temporal"
        assert int(_get_leaf(client, temporal)) == 19_200
        before = _queue_packets(testbed, "q1"), _queue_packets(testbed, "q0")
        run(
            in_ns(
                testbed.ns["snd"],
                "ping",
                "-c",
                "5",
                "-i",
                "0.05",
                "-I",
                group,
                testbed.plan.receiver,
            )
        )
        run(in_ns(testbed.ns["snd"], "ping", "-c", "5", "-i", "0.05", testbed.plan.receiver))
        after = _queue_packets(testbed, "q1"), _queue_packets(testbed, "q0")
        assert after[0] - before[0] == 5  # the group's echo requests, through q1
        assert after[1] - before[1] >= 5  # the rest, through q0
        with pytest.raises(Exception, match="the default queue stays"):
            client.set(
                delete=[
                    "/qos/interfaces/interface[interface-id=eth1]/output/queues/queue[name=q0]"
                ],
                encoding="json_ietf",
            )
        client.set(delete=[term_path, queue_path], encoding="json_ietf")
        classifiers = client.get(path=["/qos/classifiers"], encoding="json_ietf")
    assert "target-group" not in json.dumps(classifiers)
    qdiscs = run(["tc", "-n", testbed.ns["rtr"], "qdisc", "show", "dev", testbed.plan.egress])
    assert "bfifo 11:" not in qdiscs
    filters = run(["tc", "-n", testbed.ns["rtr"], "filter", "show", "dev", testbed.plan.egress])
    assert "flowid" not in filters
