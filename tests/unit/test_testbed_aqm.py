"""The testbed's AQM mode without a testbed (issue 39, deliverable 8): the `Aqm` parameters and
what they become on the delay wire's command line, the plan saved and loaded with its AQM, the
router's htb above line rate and the taps' "after" copy taken from the wire, and the run
summary's router figures read from the wire's queue samples (synthetic run folders).
The algorithms themselves are validated by the delay wire's Rust tests (cargo test)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from p4bs_infra import testbed as testbed_module
from p4bs_infra.testbed import Aqm, Testbed, TestbedPlan
from p4bs_infra.traffic import _copy_samples, summarise

RATE = 100_000_000


def flags(argv: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a command line (flags without a value are left out)."""
    return {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}


def test_red_defaults_for_a_100_mbit_link() -> None:
    args = flags(Aqm(kind="red").wire_args(RATE, 2_500_000, seed=3))
    assert args["--aqm"] == "red"
    assert (args["--rate-bps"], args["--limit-bytes"]) == (str(RATE), "2500000")
    # 2.5 ms and 7.5 ms of line rate: max_th = 3 min_th.
    assert (args["--red-min-th-bytes"], args["--red-max-th-bytes"]) == ("31250", "93750")
    assert float(args["--red-max-p"]) == 0.1
    # ARED's 1 - exp(-1/C), C = 100 Mbit/s of 1500-byte packets (8333/s): ~1.2e-4.
    assert math.isclose(float(args["--red-w-q"]), 1 - math.exp(-1 / (RATE / 12_000)))
    assert math.isclose(float(args["--red-w-q"]), 1.2e-4, rel_tol=1e-3)
    assert (args["--red-gentle"], args["--aqm-seed"]) == ("true", "3")
    # Thresholds follow the link: at 1 Gbit/s ten times the bytes.
    fast = flags(Aqm(kind="red").wire_args(10 * RATE, 1, seed=0))
    assert fast["--red-min-th-bytes"] == "312500"
    # ... down to ARED's floor of 5 packets, max_th still 3 min_th: at 10 Mbit/s 2.5 ms
    # would be 2 packets.
    slow = flags(Aqm(kind="red").wire_args(RATE // 10, 1, seed=0))
    assert (slow["--red-min-th-bytes"], slow["--red-max-th-bytes"]) == ("7500", "22500")


def test_codel_defaults_are_rfc_8289s() -> None:
    args = flags(Aqm(kind="codel").wire_args(RATE, 1_000_000, seed=0))
    assert args["--aqm"] == "codel"
    assert args["--codel-target-ns"] == "5000000"
    assert args["--codel-interval-ns"] == "100000000"
    assert args["--codel-mtu-bytes"] == "1514"
    assert not any(a.startswith("--red") for a in args)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"kind": "pie"}, "red or codel"),
        ({"red_min_th_ns": 8_000_000}, "red_min_th_ns"),
        ({"red_max_p": 1.5}, "red_max_p"),
        ({"red_w_q": 0.0}, "red_w_q"),
        ({"codel_target_ns": 100_000_000}, "codel_target_ns"),
    ],
)
def test_bad_parameters_are_refused_by_name(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(testbed_module.TestbedError, match=named):
        Aqm(**{"kind": "red", **changes})


def test_a_plan_keeps_its_aqm_through_save_and_load(
    unique_plan: Callable[..., TestbedPlan],
) -> None:
    plan = unique_plan(aqm=Aqm(kind="codel", codel_target_ns=2_000_000))
    plan.save()
    assert TestbedPlan.load(plan.state_dir) == plan
    plain = dataclasses.replace(plan, aqm=None)
    plain.save()
    assert TestbedPlan.load(plan.state_dir).aqm is None


def recorded_setup(monkeypatch: pytest.MonkeyPatch, plan: TestbedPlan) -> list[str]:
    """The tc commands the bottleneck and the taps would run, as text (none is run)."""
    commands: list[str] = []

    def record(argv: list[str], timeout_s: float = 30.0) -> str:
        commands.append(" ".join(argv))
        return ""

    monkeypatch.setattr(testbed_module, "run", record)
    built = Testbed(plan)
    built._bottleneck()
    built._taps()
    return commands


def test_with_an_aqm_the_wire_is_the_bottleneck(
    unique_plan: Callable[..., TestbedPlan], monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = unique_plan(buffer_bytes=2_500_000, delay_seed=4)
    aqm = dataclasses.replace(fifo, aqm=Aqm(kind="red"))
    fifo_tc, aqm_tc = recorded_setup(monkeypatch, fifo), recorded_setup(monkeypatch, aqm)
    link_rate = f"rate {fifo.rate_bps}bit"
    assert any(link_rate in c for c in fifo_tc)
    # The router's htb runs at 10 times the link rate: no queue builds in front of the wire.
    assert not any(link_rate in c for c in aqm_tc)
    assert any(f"rate {10 * fifo.rate_bps}bit" in c for c in aqm_tc)
    # The "after" copy of the data direction no longer comes from a mirror at the wire's
    # input (before its queue); the wire sends what leaves its queue to `ta` itself.
    wl_mirror = [c for c in fifo_tc if "dev wl ingress" in c and "mirred" in c]
    assert len(wl_mirror) == 1
    assert not [c for c in aqm_tc if "dev wl ingress" in c and "mirred" in c]
    argv = Testbed(aqm).wire_argv()
    args = flags(argv)
    assert args["--aqm"] == "red" and args["--limit-bytes"] == "2500000"
    assert args["--aqm-tap"] == "ta"
    assert args["--aqm-log"] == str(aqm.state_dir / "aqm.jsonl")
    assert args["--aqm-seed"] == "4"
    assert "--aqm" not in Testbed(fifo).wire_argv()


# ---- the run summary --------------------------------------------------------------------


def write_run(run_dir: Path, aqm_rows: list[dict[str, Any]] | None) -> None:
    """A run folder: 10 s of traffic from t = 100 s, steady from 102 s, router FIFO samples
    (empty: its htb runs above line rate) and, for an AQM run, the wire's queue samples."""
    s = 1_000_000_000
    run_dir.mkdir()
    timeline = {"traffic_start_ns": 100 * s, "steady_from_ns": 102 * s, "end_ns": 110 * s}
    (run_dir / "timeline.json").write_text(json.dumps(timeline))
    fifo = [
        {
            "ts_ns": 100 * s + k * s // 50,
            "handle": 0x10 << 16,
            "limit_bytes": 2_500_000,
            "backlog_bytes": 1514 if k == 300 else 0,
            "qlen": 0,
            "drops": 0,
            "sent_bytes": k * 250_000,
            "sent_packets": k * 165,
        }
        for k in range(501)
    ]
    (run_dir / "qdisc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fifo))
    if aqm_rows is not None:
        (run_dir / "aqm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in aqm_rows))


def aqm_samples() -> list[dict[str, Any]]:
    """The wire's queue at 50 Hz over the run: 99 Mbit/s sent, 60 kB queued, 2 AQM drops and
    1 overflow a second, each packet 4 ms in the queue."""
    s = 1_000_000_000
    rows = []
    for k in range(501):
        t = k / 50
        packets = round(t * 8_175)
        rows.append(
            {
                "ts_ns": 100 * s + k * s // 50,
                "handle": 0,
                "kind": "codel",
                "limit_bytes": 2_500_000,
                "backlog_bytes": 60_000,
                "qlen": 40,
                "drops": round(t * 3),
                "aqm_drops": round(t * 2),
                "overflow_drops": round(t * 3) - round(t * 2),
                "sent_bytes": round(t * 99_000_000 / 8),
                "sent_packets": packets,
                "sojourn_sum_ns": packets * 4_000_000,
                "codel_dropping": False,
            }
        )
    return rows


def test_an_aqm_runs_router_figures_describe_the_wires_queue(tmp_path: Path) -> None:
    write_run(tmp_path / "run", aqm_samples())
    router = summarise(tmp_path / "run", RATE)["router"]
    assert router["throughput_bps"] == pytest.approx(99_000_000, rel=1e-3)
    assert router["backlog_mean_bytes"] == 60_000
    assert router["queue_delay_mean_ns"] == pytest.approx(4_800_000)
    assert router["limit_bytes"] == [2_500_000]
    assert router["drops"] == 24  # 8 s after the warm-up, 3 a second
    assert router["aqm"]["kind"] == "codel"
    assert (router["aqm"]["aqm_drops"], router["aqm"]["overflow_drops"]) == (16, 8)
    assert router["aqm"]["sojourn_mean_ns"] == pytest.approx(4_000_000)
    assert set(router["queues"]) == {"aqm"}
    # The router's FIFO in front held at most a frame: nothing queued there.
    assert router["router_fifo"]["backlog_max_bytes"] == 1514
    assert router["router_fifo"]["drops"] == 0


def test_an_aqm_run_without_queue_samples_has_no_router_figures(tmp_path: Path) -> None:
    # Not the router FIFO's instead: that queue is not the bottleneck.
    write_run(tmp_path / "run", [])
    assert "router" not in summarise(tmp_path / "run", RATE)


def test_a_fifo_runs_router_figures_still_come_from_the_router(tmp_path: Path) -> None:
    write_run(tmp_path / "run", None)
    router = summarise(tmp_path / "run", RATE)["router"]
    assert router["throughput_bps"] == pytest.approx(100_000_000, rel=1e-3)
    assert "aqm" not in router
    assert set(router["queues"]) == {"10:"}


def test_a_run_takes_its_share_of_the_wires_log(tmp_path: Path) -> None:
    log = tmp_path / "aqm.jsonl"
    log.write_text("".join(json.dumps({"ts_ns": t}) + "\n" for t in range(0, 100, 10)))
    _copy_samples(log, tmp_path / "run.jsonl", 25, 60)
    rows = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [r["ts_ns"] for r in rows] == [30, 40, 50, 60]
