"""The router agent playing a Junos router (NETCONF: candidate datastore, confirmed commit,
Junos class-of-service validated against Juniper's published YANG) and the Junos driver
against it: the temporal buffer reaches the router's FIFO through Junos's commit-configuration
confirmed in minutes, an unconfirmed commit rolls back when the agent's timer runs out or its
session ends, invalid edits are refused with rpc-errors, and every edit-config the driver sends
validates against the Junos model. (The failure paths of a change, 1.0 and 1.1, and sessions
acting on another's commit: tests/unit/test_junos_driver.py, in-process.)"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lxml import etree
from ncclient import manager
from ncclient.operations.rpc import RPCError
from test_agent import _kernel_limit, _netconf
from yangcheck import Recorder, after_edit_config

from p4bs import paths
from p4bs.config import RouterConfig, junos_defaults, load_config
from p4bs.units import bytes_for_duration
from p4bs.yang import yang_model
from p4bs_infra.procs import wait_until
from p4bs_infra.testbed import NETCONF_PORT, Testbed, TestbedPlan
from p4bs_optimizer.drivers import driver_for
from p4bs_optimizer.drivers.base import DriverError, ErrorKind, RouterDriver
from p4bs_optimizer.drivers.junos import JUNOS_COS_NS as JUNOS_COS
from p4bs_optimizer.drivers.junos import JUNOS_ROOT_NS as JUNOS_ROOT
from p4bs_optimizer.drivers.junos import JunosDriver, commit_configuration, cos_config

MAX_BUFFER_BYTES = 256 * 1024 * 1024  # the agent's default --max-buffer-bytes
LINK = junos_defaults("eth1")  # scheduler and scheduler-map p4bs-eth1, best-effort
JUNOS = ("junos-conf-root:configuration", "junos-conf-class-of-service:class-of-service")


@pytest.fixture(scope="module")
def testbed(unique_plan: Callable[..., TestbedPlan]) -> Iterator[Testbed]:
    """The example testbed, its agent speaking Junos over NETCONF."""
    built = Testbed(unique_plan(netconf_dialect="junos"))
    built.up()
    yield built
    built.down()


def _router(testbed: Testbed, **changes: Any) -> RouterConfig:
    fields: dict[str, Any] = {
        "name": f"{testbed.plan.name}-junos",
        "driver": "netconf-junos",
        "address": f"{testbed.plan.router_address}:{NETCONF_PORT}",
        "username": testbed.plan.username,
        "password": testbed.plan.password,
        "ca_file": str(testbed.pki / "known_hosts"),  # the agent's host key, checked
        "timeout_ns": 5_000_000_000,
        "max_concurrent_changes": 1,
    }
    return RouterConfig(**(fields | changes))


def _driver(testbed: Testbed, **options: Any) -> RouterDriver:
    """The driver as the optimizer makes it: from the router's config and its link's."""
    router = _router(testbed)
    link = dataclasses.replace(
        load_config(paths.example_config()).links[0], router=router.name, junos=LINK
    )
    driver = driver_for(router, links=[link], **options)
    assert isinstance(driver, JunosDriver)
    return driver


def _config(testbed: Testbed, source: str = "running") -> dict[str, Any]:
    """A datastore of the agent as RFC 7951 JSON (read over NETCONF, converted by the model)."""
    with _netconf(testbed) as nc:
        reply = nc.get_config(source=source)
    return yang_model("junos").from_xml(etree.fromstring(reply.data_xml.encode()))


def _temporal(config: dict[str, Any], scheduler: str = LINK.scheduler) -> str | None:
    schedulers = config.get(JUNOS[0], {}).get(JUNOS[1], {}).get("schedulers", [])
    found = [s["buffer-size"].get("temporal") for s in schedulers if s["name"] == scheduler]
    return found[0] if found else None


def _run(driver: RouterDriver, call: Callable[[RouterDriver], Any]) -> Any:
    async def scenario() -> Any:
        async with driver:
            return await call(driver)

    return asyncio.run(scenario())


def test_nothing_configured_yet_is_a_rejection(testbed: Testbed) -> None:
    with pytest.raises(DriverError) as err:
        _run(_driver(testbed), lambda d: d.get_buffer("eth1", 0))
    assert err.value.kind == ErrorKind.REJECTED
    assert "no buffer-size temporal in µs for scheduler p4bs-eth1" in str(err.value)


def test_junos_driver_sets_temporal_buffers_the_kernel_follows(
    testbed: Testbed, monkeypatch: pytest.MonkeyPatch
) -> None:
    rate = testbed.plan.rate_bps
    recorder = Recorder(lambda: _config(testbed, "candidate"))
    driver = _driver(testbed)

    async def scenario() -> list[int]:
        async with driver:
            exact = await driver.set_buffer("eth1", 0, 625_000)  # 50 ms of 100 Mbit/s
            assert _kernel_limit(testbed) == 625_000
            rounded = await driver.set_buffer("eth1", 0, 300_010)  # 24000.8 µs -> 24001
            return [exact, rounded, await driver.get_buffer("eth1", 0)]

    with recorder.record(monkeypatch):
        exact, rounded, read = asyncio.run(scenario())
    assert exact == 625_000
    # 24001 µs went over the wire; the router made bytes of them itself.
    assert rounded == read == _kernel_limit(testbed) == bytes_for_duration(24_001_000, rate)
    running = _config(testbed)
    assert _temporal(running) == "24001"
    yang_model("junos").validate(running)
    cos = running[JUNOS[0]][JUNOS[1]]
    assert cos["scheduler-maps"] == [
        {
            "name": "p4bs-eth1",
            "forwarding-class": [{"name": "best-effort", "scheduler": "p4bs-eth1"}],
        }
    ]
    assert cos["interfaces"] == {"interface": [{"name": "eth1", "scheduler-map": "p4bs-eth1"}]}
    # What went on the wire: candidate edits, each valid Junos merged into the candidate.
    assert [edit.target for edit in recorder.edits] == ["candidate", "candidate"]
    for edit in recorder.edits:
        after_edit_config("junos", edit.config, edit.payload)
    # Each change was Junos's commit-configuration confirmed for the router's confirm window
    # (10 min by default, not its 5 s RPC timeout), then confirmed and read back.
    log = testbed.agent_log.read_text()
    confirmed = "commit-configuration confirmed, confirm-timeout 10 min (600 s)"
    assert log.count(confirmed) >= 2
    assert log.count("commit confirmed by session") >= 2


def _edit(nc: manager.Manager, us: str, **names: str) -> None:
    link = dataclasses.replace(LINK, **names)
    # The driver writes only integers; a test may write any string the model allows.
    config = cos_config(link, 1).replace("<temporal>1</temporal>", f"<temporal>{us}</temporal>")
    nc.edit_config(target="candidate", config=config)


def test_an_unconfirmed_commit_rolls_back_when_the_agents_timer_expires(testbed: Testbed) -> None:
    _run(_driver(testbed), lambda d: d.set_buffer("eth1", 0, 250_000))  # 20000 µs in force
    assert _kernel_limit(testbed) == 250_000
    with _netconf(testbed) as nc, nc.locked("candidate"):
        _edit(nc, "40000")  # 500 kB
        committed = time.monotonic()
        nc.commit(confirmed=True, timeout="2")
        assert _kernel_limit(testbed) == 500_000
        assert _temporal(_config(testbed)) == "40000"
        # Not confirmed: the agent puts back the configuration and the FIFO by itself.
        assert wait_until(lambda: _kernel_limit(testbed) == 250_000, 15)
        took_s = time.monotonic() - committed
        assert _temporal(_config(testbed)) == "20000"
        assert _temporal(_config(testbed, "candidate")) == "20000"
        assert 2.0 <= took_s < 10.0, took_s
        with pytest.raises(RPCError, match=r"this router offers 1\.0"):  # as Junos: no cancel
            nc.cancel_commit()
    assert "confirmed commit rolled back (not confirmed in time)" in testbed.agent_log.read_text()


def test_a_session_that_ends_unconfirmed_is_rolled_back(testbed: Testbed) -> None:
    before = _kernel_limit(testbed)
    nc = _netconf(testbed)
    _edit(nc, "30000")  # no lock: the end of the session that committed is enough
    nc.dispatch(commit_configuration(10))  # Junos's RPC: 10 minutes
    assert _kernel_limit(testbed) == 375_000
    nc.close_session()
    assert wait_until(lambda: _kernel_limit(testbed) == before, 10)
    assert _temporal(_config(testbed)) == "20000"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (  # percent is 0..100: the YANG model refuses it
            "<schedulers><name>p4bs-eth1</name><buffer-size><percent>130</percent>"
            "</buffer-size></schedulers>",
            "buffer-size/percent",
        ),
        ("<schedulers><name>x</name><colour>red</colour></schedulers>", "colour"),
        (  # two cases of buffer_size_choice in one edit
            "<schedulers><name>x</name><buffer-size><percent>10</percent>"
            "<temporal>5</temporal></buffer-size></schedulers>",
            "member-not-allowed",
        ),
    ],
)
def test_invalid_edits_are_refused_and_leave_the_candidate(
    testbed: Testbed, edit: str, message: str
) -> None:
    before = _config(testbed, "candidate")
    config = (
        f'<config><configuration xmlns="{JUNOS_ROOT}"><class-of-service xmlns="{JUNOS_COS}">'
        f"{edit}</class-of-service></configuration></config>"
    )
    with _netconf(testbed) as nc:
        with pytest.raises(RPCError, match=message) as err:
            nc.edit_config(target="candidate", config=config)
        assert err.value.tag == "invalid-value"
    assert _config(testbed, "candidate") == before


def test_what_the_router_cannot_apply_is_refused_at_commit(testbed: Testbed) -> None:
    before = _kernel_limit(testbed)
    with _netconf(testbed) as nc, nc.locked("candidate"):
        with pytest.raises(RPCError, match="running"):
            nc.edit_config(target="running", config=cos_config(LINK, 1))
        _edit(nc, "50ms")  # valid YANG (a free string), not microseconds
        with pytest.raises(RPCError, match="a whole number of microseconds"):
            nc.commit()
        nc.discard_changes()
        _edit(nc, "1000", forwarding_class="assured-forwarding")  # q2: not on this router
        with pytest.raises(RPCError, match="q2"):
            nc.commit()
        nc.discard_changes()
    assert _kernel_limit(testbed) == before
    assert _temporal(_config(testbed)) == "20000"


def test_another_sessions_lock_keeps_the_candidate(testbed: Testbed) -> None:
    with _netconf(testbed) as holder, holder.locked("candidate"), _netconf(testbed) as other:
        with pytest.raises(RPCError, match="locked by session"):
            _edit(other, "1000")
        with pytest.raises(RPCError):
            other.lock("candidate")


def test_driver_refusals_change_nothing(testbed: Testbed) -> None:
    before = _kernel_limit(testbed)
    for queue, size, reason in (
        # 21 s of 100 Mbit/s: past the platform's temporal range, refused before sending
        (0, MAX_BUFFER_BYTES + 1_000_000, "outside this router's temporal_range [1, 200000] µs"),
        (9, 100_000, "q9"),
    ):
        with pytest.raises(DriverError) as err:
            _run(
                _driver(testbed, attempts=3), lambda d, q=queue, b=size: d.set_buffer("eth1", q, b)
            )
        assert (err.value.kind, err.value.attempts) == (ErrorKind.REJECTED, 1), err.value
        assert reason in str(err.value)
    assert _kernel_limit(testbed) == before
    assert _temporal(_config(testbed)) == "20000"
    assert _config(testbed, "candidate") == _config(testbed)  # discarded
    with pytest.raises(NotImplementedError, match="gnmi"):
        _run(_driver(testbed), lambda d: d.set_classifier("eth1", {1: ["10.0.0.1:1>10.0.0.2:2/6"]}))
