"""The buffer-sizing policies on synthetic metric windows whose answers are worked out here:
the baseline rules, GLOBECOM's SRTT/N triggers, Jenks separation, BSCL and ADT directions,
option validation and snapshot/restore."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from statistics import harmonic_mean
from typing import Any

import pytest

from p4bs.config import LinkConfig
from p4bs_optimizer.policies import POLICIES
from p4bs_optimizer.policies.base import Decision, Policy, PolicyOptionError, Window
from p4bs_optimizer.policies.baselines import (
    AdtPolicy,
    BdpPolicy,
    BloatedPolicy,
    BsclPolicy,
    StanfordPolicy,
    StaticPolicy,
    StepPolicy,
    TinyPolicy,
)
from p4bs_optimizer.policies.globecom import GlobecomPolicy
from p4bs_optimizer.policies.jenks import JenksPolicy

MS = 1_000_000  # ns
MBIT = 1_000_000  # bit/s
WINDOW_NS = 100 * MS
SECOND = 1000 * MS
T0 = 1_700_000_000 * 10**9


def make_link(
    *,
    capacity_bps: int = 100 * MBIT,
    min_buffer: int = 1_500,
    max_buffer: int = 2_500_000,
    safe_buffer: int = 250_000,
    max_loss: float = 0.01,
) -> LinkConfig:
    """A 100 Mbit/s link with a 200 ms maximum buffer unless told otherwise."""
    return LinkConfig(
        router="r1",
        interface="eth1",
        switch="s1",
        capacity_bps=capacity_bps,
        tap_before="tap-in",
        tap_after="tap-out",
        max_queue_delay_ns=10 * MS,
        max_loss=max_loss,
        weight_loss=0.5,
        weight_delay=0.5,
        min_buffer_bytes=min_buffer,
        max_buffer_bytes=max_buffer,
        safe_buffer_bytes=safe_buffer,
        policy="stanford",
        policy_options={},
    )


def window(index: int = 0, **fields: Any) -> Window:
    """Window `index` of 100 ms: SRTT 20 ms, N = 50, 95% utilisation, unless overridden."""
    values: dict[str, Any] = {
        "link_id": "r1:eth1",
        "window_start_ns": T0 + index * WINDOW_NS,
        "window_end_ns": T0 + (index + 1) * WINDOW_NS,
        "rtt_samples": 500,
        "rtt_flows": 50,
        "rtt_hmean_ns": 20 * MS,
        "srtt_ns": 20 * MS,
        "rtt_min_ns": 18 * MS,
        "long_flows": 50,
        "data_packets": 800,
        "retransmissions": 0,
        "loss_rate": 0.0,
        "loss_rate_ewma": 0.0,
        "queue_delay_samples": 800,
        "queue_delay_ns": 1 * MS,
        "queue_delay_ewma_ns": 1 * MS,
        "throughput_bps": 95 * MBIT,
        "utilisation": 0.95,
        "f": -0.1,
        "zscore": 0.0,
        "change": False,
        "buffer_bytes": 100_000,
    }
    values.update(fields)
    return Window(**values)


def test_a_window_from_a_record_is_the_one_its_fields_make_and_stays_frozen() -> None:
    """from_record fills the window's fields at once (not through the frozen __init__): the
    same window, equal and hashed alike, and as immutable; the record's fields a window
    does not take are left out. One read by the codec is not checked again."""
    made = window(3)
    record = {name: value for name, value in vars(made).items() if name != "buffer_bytes"}
    read = Window.from_record({**record, "offered_bps": 1, "offered_utilisation": 0.1}, 100_000)
    assert read == made and hash(read) == hash(made) and repr(read) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.srtt_ns = 1  # type: ignore[misc]
    with pytest.raises(KeyError):
        Window.from_record({k: v for k, v in record.items() if k != "srtt_ns"}, None)
    # A window is checked once: where its record was decoded (the codec), or by problem().
    bad = {**record, "f": math.nan}
    assert Window.from_record(bad, None).problem() == "window.f: nan is not a finite number"
    assert Window.from_record(record, 100_000, checked=True) == made
    assert Window.from_record(bad, None, checked=True).problem() is None


def without_rtt(index: int = 0) -> Window:
    """A window before any RTT sample: no SRTT, no flows."""
    return window(
        index,
        rtt_samples=0,
        rtt_flows=0,
        rtt_hmean_ns=None,
        srtt_ns=None,
        rtt_min_ns=None,
        long_flows=0,
    )


def buffers(decisions: list[Decision]) -> list[int]:
    return [d.buffer_bytes for d in decisions]


def restored(policy: Policy) -> Policy:
    """A fresh instance of the policy resumed from its snapshot, through JSON as persisted."""
    fresh = type(policy)(policy.link, policy.options)
    fresh.restore(json.loads(json.dumps(policy.snapshot())))
    return fresh


# --- the static formulas --------------------------------------------------------------------


def test_stanford_is_c_rtt_over_sqrt_n() -> None:
    policy = StanfordPolicy(make_link(), {})
    (decision,) = policy.decide(window(srtt_ns=20 * MS, long_flows=50))
    assert decision.buffer_bytes == round(100e6 * 0.020 / 8 / math.sqrt(50))  # 35355 B
    assert decision.queue == 0
    assert decision.flows == ()
    assert "√50" in decision.reason


def test_stanford_takes_fewer_than_one_long_flow_as_one() -> None:
    policy = StanfordPolicy(make_link(), {})
    assert buffers(policy.decide(window(long_flows=0))) == [round(100e6 * 0.020 / 8)]


def test_bdp_is_c_rtt() -> None:
    policy = BdpPolicy(make_link(), {})
    assert buffers(policy.decide(window(srtt_ns=20 * MS))) == [250_000]


@pytest.mark.parametrize("cls", [BdpPolicy, StanfordPolicy, BsclPolicy, GlobecomPolicy])
def test_no_decision_until_the_metrics_have_an_rtt(cls: type[Policy]) -> None:
    policy = cls(make_link(), {})
    assert all(policy.decide(without_rtt(i)) == [] for i in range(5))
    assert len(policy.decide(window(5))) == 1


def test_the_decision_is_clamped_to_the_link_bounds() -> None:
    link = make_link(min_buffer=10_000, max_buffer=2_500_000)
    # 100 Mbit/s * 20 ms / sqrt(10000) = 2500 B, under the minimum
    (low,) = StanfordPolicy(link, {}).decide(window(long_flows=10_000))
    assert low.buffer_bytes == 10_000
    assert "clamped" in low.reason
    # 100 Mbit/s * 500 ms = 6.25 MB, over the maximum
    (high,) = BdpPolicy(link, {}).decide(window(srtt_ns=500 * MS))
    assert high.buffer_bytes == 2_500_000


def test_a_target_within_the_tolerance_is_not_decided_again() -> None:
    policy = StanfordPolicy(make_link(), {})
    first = buffers(policy.decide(window(0, srtt_ns=20 * MS)))
    assert policy.decide(window(1, srtt_ns=20 * MS)) == []
    assert policy.decide(window(2, srtt_ns=20_800_000)) == []  # +4% < 5%
    moved = buffers(policy.decide(window(3, srtt_ns=22 * MS)))  # +10%
    assert first == [round(100e6 * 0.020 / 8 / math.sqrt(50))]
    assert moved == [round(100e6 * 0.022 / 8 / math.sqrt(50))]
    loose = StanfordPolicy(make_link(), {"tolerance": 0.2})
    loose.decide(window(0, srtt_ns=20 * MS))
    assert loose.decide(window(1, srtt_ns=22 * MS)) == []


def test_static_decides_its_buffer_once() -> None:
    default = StaticPolicy(make_link(safe_buffer=250_000), {})
    assert buffers(default.decide(without_rtt(0))) == [250_000]
    assert default.decide(window(1)) == []
    assert buffers(StaticPolicy(make_link(), {"buffer": "64KiB"}).decide(window())) == [65_536]


def test_step_moves_the_buffer_once_at_its_time_after_the_traffic_starts() -> None:
    step = StepPolicy(make_link(), {"buffer": 1_250_000, "at": "1s"})
    idle = window(0, data_packets=0)
    assert step.decide(idle) == []  # no traffic yet: the clock has not started
    # The traffic starts with window 1; `at` = 1 s = 10 windows of 100 ms: window 10 ends it.
    assert all(step.decide(window(i)) == [] for i in range(1, 10))
    resumed = restored(step)
    assert buffers(resumed.decide(window(10))) == [1_250_000]
    assert resumed.decide(window(11)) == []
    with pytest.raises(PolicyOptionError, match="'at'"):
        StepPolicy(make_link(), {"at": "later"})


def test_tiny_is_packets_times_packet_size() -> None:
    assert buffers(TinyPolicy(make_link(), {}).decide(without_rtt())) == [32 * 1500]
    tiny = TinyPolicy(make_link(), {"packets": 20, "packet_bytes": 1000})
    assert buffers(tiny.decide(window(0))) == [20_000]
    assert tiny.decide(window(1)) == []


def test_bloated_is_200_ms_of_line_rate() -> None:
    assert buffers(BloatedPolicy(make_link(), {}).decide(window())) == [2_500_000]
    shorter = BloatedPolicy(make_link(), {"delay_ns": "100ms"})
    assert buffers(shorter.decide(window())) == [1_250_000]


@pytest.mark.parametrize(
    ("cls", "options", "option"),
    [
        (StanfordPolicy, {"tolerence": 0.1}, "tolerence"),
        (BdpPolicy, {"tolerance": -0.1}, "tolerance"),
        (BdpPolicy, {"tolerance": True}, "tolerance"),
        (StaticPolicy, {"buffer": "lots"}, "buffer"),
        (StaticPolicy, {"buffer": 10_000_000}, "buffer"),
        (StaticPolicy, {"tolerance": 0.1}, "tolerance"),
        (TinyPolicy, {"packets": 0}, "packets"),
        (TinyPolicy, {"packets": 2.5}, "packets"),
        (BloatedPolicy, {"delay_ns": "soon"}, "delay_ns"),
        (BsclPolicy, {"target_loss": 0}, "target_loss"),
        (BsclPolicy, {"k": "0.87"}, "k"),
        (AdtPolicy, {"step": 1.0}, "step"),
        (AdtPolicy, {"target_utilisation": 1.5}, "target_utilisation"),
        (AdtPolicy, {"sample_period_ns": 0}, "sample_period_ns"),
        (GlobecomPolicy, {"gamma": 0}, "gamma"),
        (GlobecomPolicy, {"tolerance": 0.1}, "tolerance"),
        (JenksPolicy, {"queues": 0}, "queues"),
        (JenksPolicy, {"flow_ttl_ns": -1}, "flow_ttl_ns"),
    ],
)
def test_unknown_or_bad_options_are_refused_by_name(
    cls: type[Policy], options: dict[str, Any], option: str
) -> None:
    with pytest.raises(PolicyOptionError, match=f"'{option}'"):
        cls(make_link(), options)


# --- GLOBECOM --------------------------------------------------------------------------------


def stanford(srtt_ms: float, flows: int) -> int:
    return round(100e6 * srtt_ms / 1000 / 8 / math.sqrt(flows))


def test_globecom_recomputes_on_an_srtt_jump_beyond_gamma_and_on_an_n_change() -> None:
    policy = GlobecomPolicy(make_link(), {})  # gamma = 0.1
    assert buffers(policy.decide(window(0, srtt_ns=20 * MS))) == [stanford(20, 50)]
    assert policy.decide(window(1, srtt_ns=21 * MS)) == []  # 5% wobble
    # 9.5% from R_SRTT = 20 ms: the reference is kept, not dragged along by the wobble
    assert policy.decide(window(2, srtt_ns=21_900_000)) == []
    assert buffers(policy.decide(window(3, srtt_ns=22_100_000))) == [stanford(22.1, 50)]
    assert policy.decide(window(4, srtt_ns=23 * MS)) == []  # 4% from the new R_SRTT 22.1
    (decision,) = policy.decide(window(5, srtt_ns=23 * MS, long_flows=60))
    assert decision.buffer_bytes == stanford(23, 60)
    assert "N 50 → 60" in decision.reason
    assert policy.decide(window(6, srtt_ns=23 * MS, long_flows=60)) == []
    assert (policy.reference_srtt_ns, policy.reference_flows) == (23 * MS, 60)


def test_globecom_gamma_option_widens_the_band() -> None:
    policy = GlobecomPolicy(make_link(), {"gamma": 0.5})
    policy.decide(window(0, srtt_ns=20 * MS))
    assert policy.decide(window(1, srtt_ns=25 * MS)) == []  # 25% < 50%
    assert buffers(policy.decide(window(2, srtt_ns=31 * MS))) == [stanford(31, 50)]


def test_globecom_resumes_from_its_snapshot() -> None:
    policy = GlobecomPolicy(make_link(), {})
    policy.decide(window(0, srtt_ns=20 * MS))
    policy.decide(window(1, srtt_ns=22_100_000, long_flows=60))
    resumed = restored(policy)
    after = [window(2, srtt_ns=23 * MS, long_flows=60), window(3, srtt_ns=24_500_000)]
    expected = [policy.decide(w) for w in after]
    assert [resumed.decide(w) for w in after] == expected
    assert expected[0] == []  # within gamma of R_SRTT = 22.1 ms: the reference was restored
    assert buffers(expected[1]) == [stanford(24.5, 50)]
    assert GlobecomPolicy(make_link(), {}).decide(after[0]) != []  # no reference: decides


# --- BSCL ------------------------------------------------------------------------------------


def bscl(flows: int, target_loss: float, base_rtt_ms: float) -> int:
    """K*N/sqrt(p) packets of 1500 B minus C*T, K = 0.87, C = 100 Mbit/s."""
    return round(0.87 * flows / math.sqrt(target_loss) * 1500 - 100e6 * base_rtt_ms / 1000 / 8)


def test_bscl_is_the_loss_bound_buffer() -> None:
    policy = BsclPolicy(make_link(max_loss=0.01), {})
    # T = SRTT 30 ms - queueing delay 10 ms = 20 ms: 435 packets * 1500 B - 250 kB
    (decision,) = policy.decide(window(srtt_ns=30 * MS, queue_delay_ewma_ns=10 * MS))
    assert decision.buffer_bytes == bscl(50, 0.01, 20) == 402_500
    # without a queueing-delay measurement the minimum RTT stands in for T
    (fallback,) = BsclPolicy(make_link(), {}).decide(
        window(srtt_ns=30 * MS, queue_delay_ewma_ns=None, rtt_min_ns=18 * MS)
    )
    assert fallback.buffer_bytes == bscl(50, 0.01, 18)


def test_bscl_grows_with_flows_and_a_stricter_loss_target_and_shrinks_with_rtt() -> None:
    policy = BsclPolicy(make_link(max_loss=0.01), {})
    base = {"srtt_ns": 30 * MS, "queue_delay_ewma_ns": 10 * MS}
    steps = [
        policy.decide(window(0, long_flows=50, **base)),
        policy.decide(window(1, long_flows=100, **base)),
        policy.decide(window(2, long_flows=100, srtt_ns=60 * MS, queue_delay_ewma_ns=10 * MS)),
    ]
    assert [buffers(d) for d in steps] == [
        [bscl(50, 0.01, 20)],
        [bscl(100, 0.01, 20)],
        [bscl(100, 0.01, 50)],
    ]
    assert bscl(50, 0.01, 20) < bscl(100, 0.01, 20) and bscl(100, 0.01, 50) < bscl(100, 0.01, 20)
    strict = BsclPolicy(make_link(max_loss=0.01), {"target_loss": 0.001})
    assert buffers(strict.decide(window(**base))) == [bscl(50, 0.001, 20)]
    assert bscl(50, 0.001, 20) > bscl(50, 0.01, 20)


# --- ADT -------------------------------------------------------------------------------------


def adt_run(policy: AdtPolicy, count: int, utilisation: float) -> list[tuple[int, int]]:
    """(window index, buffer) of every decision over `count` 100 ms windows."""
    out = []
    for i in range(count):
        for decision in policy.decide(window(i, utilisation=utilisation, buffer_bytes=100_000)):
            out.append((i, decision.buffer_bytes))
    return out


def test_adt_grows_the_buffer_while_utilisation_is_below_target() -> None:
    # 0.9 < 0.98: q <- 1.01 q every 300 ms (3 windows) from the 100 kB in force; the first
    # step is decided, then again once q is more than 5% above it: 1.01^6 / 1.01 > 1.05
    decisions = adt_run(AdtPolicy(make_link(), {}), 18, utilisation=0.90)
    assert decisions == [(2, 101_000), (17, round(100_000 * 1.01**6))]


def test_adt_shrinks_the_buffer_while_utilisation_is_above_target() -> None:
    # 1.0 >= 0.98: q <- q / 1.01; going down it takes 7 steps to move 5% from the first
    decisions = adt_run(AdtPolicy(make_link(), {}), 21, utilisation=1.0)
    assert decisions == [(2, round(100_000 / 1.01)), (20, round(100_000 / 1.01**7))]


def test_adt_does_not_sample_windows_without_traffic() -> None:
    policy = AdtPolicy(make_link(), {})
    assert all(policy.decide(window(i, data_packets=0, utilisation=0.0)) == [] for i in range(30))


def test_adt_resumes_mid_period_from_its_snapshot() -> None:
    policy = AdtPolicy(make_link(), {})
    for i in range(7):  # two samples and one window of the third
        policy.decide(window(i, utilisation=0.9))
    resumed = restored(policy)
    after = [window(i, utilisation=0.9) for i in range(7, 20)]
    expected = [policy.decide(w) for w in after]
    assert [resumed.decide(w) for w in after] == expected
    assert buffers([d for ds in expected for d in ds]) == [round(100_000 * 1.01**6)]


# --- Jenks -----------------------------------------------------------------------------------

GROUPS_MS = (20, 50, 30, 100)  # the order the groups start in, as in GLOBECOM Test 3


def flow_key(group: int, index: int) -> str:
    return f"10.0.{group}.{index + 1}:{40_000 + index}>10.9.0.1:5201/6"


def jittered(rng: random.Random, per_group: int = 25) -> dict[str, int]:
    """25 flows per group, each at the group's RTT ± 1 ms."""
    return {
        flow_key(g, i): round((rtt_ms + rng.uniform(-1, 1)) * MS)
        for g, rtt_ms in enumerate(GROUPS_MS)
        for i in range(per_group)
    }


def group_keys(group: int) -> set[str]:
    return {flow_key(group, i) for i in range(25)}


def observe(policy: JenksPolicy, ts_ns: int, rtts: dict[str, int]) -> None:
    """The flows report `rtts` 1 s before `ts_ns` and at `ts_ns`: old enough to classify."""
    policy.observe_flows(ts_ns - SECOND, rtts)
    policy.observe_flows(ts_ns, rtts)


def test_jenks_separates_four_rtt_groups_into_queues_by_rtt() -> None:
    rng = random.Random(4)
    policy = JenksPolicy(make_link(), {})
    assert policy.decide(window(0)) == []  # no flows observed yet
    rtts = jittered(rng)
    observe(policy, T0 + WINDOW_NS, rtts)
    decisions = policy.decide(window(0))
    assert [d.queue for d in decisions] == [0, 1, 2, 3]
    # queue order is RTT order: 20, 30, 50, 100 ms = groups 0, 2, 1, 3
    assert [set(d.flows) for d in decisions] == [group_keys(g) for g in (0, 2, 1, 3)]
    assert policy.gvf is not None and policy.gvf > 0.999
    assert all(f"GVF {policy.gvf:.4f}" in d.reason for d in decisions)
    for decision in decisions:
        # C/4 * RTT_q / sqrt(25), RTT_q the harmonic mean of the queue's flows
        rtt_q = harmonic_mean([rtts[key] for key in decision.flows])
        assert decision.buffer_bytes == round(100e6 / 4 * rtt_q / 8e9 / math.sqrt(25))
    assert decisions[0].buffer_bytes == pytest.approx(12_500, rel=0.05)  # 20 ms
    assert decisions[3].buffer_bytes == pytest.approx(62_500, rel=0.05)  # 100 ms


def test_jenks_classifies_a_flow_once_it_is_a_second_old() -> None:
    policy = JenksPolicy(make_link(), {})
    policy.observe_flows(T0, {"a:1>b:2/6": 20 * MS})
    policy.observe_flows(T0 + SECOND - 1, {"a:1>b:2/6": 20 * MS, "c:3>d:4/6": 80 * MS})
    assert policy.decide(window(9)) == []  # a's RTTs span 1 s minus 1 ns
    policy.observe_flows(T0 + SECOND, {"a:1>b:2/6": 20 * MS, "c:3>d:4/6": 80 * MS})
    decisions = policy.decide(window(10))
    assert [d.flows for d in decisions] == [("a:1>b:2/6",), (), (), ()]


def test_jenks_reruns_only_when_the_groups_change() -> None:
    rng = random.Random(5)
    policy = JenksPolicy(make_link(), {})
    observe(policy, T0 + WINDOW_NS, jittered(rng))
    assert len(policy.decide(window(0))) == 4
    for i in range(1, 4):  # new jitter, same groups
        policy.observe_flows(T0 + (i + 1) * WINDOW_NS, jittered(rng))
        assert policy.decide(window(i)) == []
    # One interval of a 20 ms flow at 210 ms (its samples all held back by a loss) is above
    # the lowest of its last five: nothing moves.
    outlier = flow_key(0, 3)
    policy.observe_flows(T0 + 5 * WINDOW_NS, jittered(rng) | {outlier: 210 * MS})
    assert policy.decide(window(4)) == []
    # Its path now takes 100 ms: once four of its last five intervals are high (the outlier
    # and three at 100 ms), the flow moves to the last queue.
    for i in range(5, 7):
        policy.observe_flows(T0 + (i + 1) * WINDOW_NS, jittered(rng) | {outlier: 100 * MS})
        assert policy.decide(window(i)) == []
    policy.observe_flows(T0 + 8 * WINDOW_NS, jittered(rng) | {outlier: 100 * MS})
    decisions = policy.decide(window(7))
    assert outlier in decisions[3].flows and outlier not in decisions[0].flows
    assert len(decisions[0].flows) == 24 and len(decisions[3].flows) == 26


def test_jenks_passes_over_one_interval_read_below_the_path() -> None:
    """A late tap timestamp makes one interval's lowest sample too short (a 20 ms path read
    15.6 ms in CI): the queue's buffer does not follow it down and back."""
    rng = random.Random(8)
    policy = JenksPolicy(make_link(), {})
    observe(policy, T0 + WINDOW_NS, jittered(rng))
    assert len(policy.decide(window(0))) == 4
    early = {flow_key(0, i): 14 * MS for i in range(25)}  # the whole 20 ms group, 30% low
    policy.observe_flows(T0 + 2 * WINDOW_NS, jittered(rng) | early)
    assert policy.decide(window(1)) == []
    policy.observe_flows(T0 + 3 * WINDOW_NS, jittered(rng) | early)
    assert buffers(policy.decide(window(2)))[0] == round(100e6 / 4 * 0.014 / 8 / 5)


def test_jenks_decides_again_when_a_queues_buffer_moves_beyond_the_tolerance() -> None:
    policy = JenksPolicy(make_link(), {"tolerance": 0.1, "rtt_history": 1})
    flows = {"a:1>b:2/6": 20 * MS, "c:3>d:4/6": 80 * MS}
    observe(policy, T0, flows)
    assert buffers(policy.decide(window(0)))[:2] == [125_000, 500_000]
    policy.observe_flows(T0 + WINDOW_NS, flows | {"c:3>d:4/6": 87 * MS})  # +8.75%
    assert policy.decide(window(1)) == []
    policy.observe_flows(T0 + 2 * WINDOW_NS, flows | {"c:3>d:4/6": 90 * MS})  # +12.5%
    assert buffers(policy.decide(window(2)))[:2] == [125_000, 562_500]


def test_jenks_forgets_flows_not_seen_for_the_ttl() -> None:
    rng = random.Random(6)
    policy = JenksPolicy(make_link(), {"flow_ttl_ns": "1s"})
    observe(policy, T0 + WINDOW_NS, jittered(rng))
    policy.decide(window(0))
    # 1.5 s later only the 20, 50 and 30 ms groups are still reporting RTTs
    still = {k: v for k, v in jittered(rng).items() if k not in group_keys(3)}
    policy.observe_flows(T0 + 15 * WINDOW_NS, still)
    decisions = policy.decide(window(14))
    assert len(decisions) == 4
    assert set().union(*(d.flows for d in decisions)) == set(still)
    # three groups in three queues, none split by its jitter, and the fourth queue empty
    groups = [{key.split(".")[2] for key in d.flows} for d in decisions]
    assert groups == [{"0"}, {"2"}, {"1"}, set()]
    assert policy.decide(window(15)) == []
    for i in range(16, 26):  # new jitter every interval: the groups hold
        policy.observe_flows(
            T0 + (i + 1) * WINDOW_NS, {k: v for k, v in jittered(rng).items() if k in still}
        )
        assert policy.decide(window(i)) == []


def test_jenks_uses_fewer_classes_with_fewer_distinct_flows() -> None:
    policy = JenksPolicy(make_link(), {})
    observe(policy, T0, {"a:1>b:2/6": 20 * MS, "c:3>d:4/6": 80 * MS})
    decisions = policy.decide(window(0))
    assert [d.flows for d in decisions] == [("a:1>b:2/6",), ("c:3>d:4/6",), (), ()]
    # each of the two occupied queues gets C/2 with its single flow: C/2 * RTT
    assert buffers(decisions) == [125_000, 500_000, 1_500, 1_500]
    assert policy.gvf == 1.0


def test_jenks_resumes_from_its_snapshot() -> None:
    rng = random.Random(7)
    policy = JenksPolicy(make_link(), {"rtt_history": 1})
    observe(policy, T0 + WINDOW_NS, jittered(rng))
    policy.decide(window(0))
    resumed = restored(policy)
    assert isinstance(resumed, JenksPolicy)
    same_groups, moved = jittered(rng), jittered(rng) | {flow_key(1, 0): 100 * MS}
    expected = []
    for target in (policy, resumed):
        target.observe_flows(T0 + 2 * WINDOW_NS, same_groups)
        first = target.decide(window(1))
        target.observe_flows(T0 + 3 * WINDOW_NS, moved)
        expected.append((first, target.decide(window(2))))
    assert expected[0] == expected[1]
    assert expected[0][0] == [] and len(expected[0][1]) == 4


# --- odd windows and saved states (issue 38: one record halted control) ----------------------


def _every_policy() -> list[Policy]:
    return [cls(make_link(), {}) for cls in POLICIES.values()]


@pytest.mark.parametrize(
    "odd",
    [
        {"f": math.nan},
        {"loss_rate": math.nan, "loss_rate_ewma": math.inf},
        {"srtt_ns": -20 * MS, "rtt_hmean_ns": -20 * MS},
        {"utilisation": math.inf, "f": -math.inf},
        {"long_flows": -1},
    ],
)
def test_no_policy_decides_on_or_raises_at_a_window_no_link_can_give(odd: dict[str, Any]) -> None:
    """The codec refuses such windows; a policy given one anyway (the second line of
    defence) passes it over, and decides on the next good window as if it had not come."""
    for policy, twin in zip(_every_policy(), _every_policy(), strict=True):
        assert policy.decide(window(0, **odd)) == [], policy.name
        assert policy.snapshot() == twin.snapshot(), policy.name
        assert policy.decide(window(1)) == twin.decide(window(1)), policy.name


def test_a_target_that_is_not_a_number_is_clamped_to_the_safe_buffer() -> None:
    policy = StanfordPolicy(make_link(safe_buffer=123_456), {})
    assert [policy.clamp(x) for x in (math.nan, math.inf, -math.inf)] == [123_456] * 3


@pytest.mark.parametrize(
    "saved",
    [
        {},
        [],
        "p4bs",
        None,
        {"phase": "optimise", "step": None, "cap_bytes": math.nan},
        {"decided": 1},  # a buffer below the link's min
        {"decided": 10**12},  # above its max
        {"decided": "lots"},
        {"phase": "settled", "step": {"buffer_bytes": -5}},
        {"flows": {"k": [1, 2]}},
        {"buffers": [10**12]},
        {"decided": math.inf},
    ],
)
def test_a_malformed_saved_state_never_raises_and_leaves_the_policy_as_new(saved: Any) -> None:
    """`restore` of anything that is not the policy's own snapshot (for its link) leaves the
    policy from scratch and says why; it never raises (restore({}) raised for P4BS). A
    snapshot some policies read as their fresh state ({} for a baseline) may resume."""
    for policy, fresh in zip(_every_policy(), _every_policy(), strict=True):
        reason = policy.restore(saved)
        assert policy.snapshot() == fresh.snapshot(), (policy.name, saved)
        if policy.name in ("p4bs", "loss-delay-fit") or not isinstance(saved, dict):
            assert isinstance(reason, str) and reason, (policy.name, saved)
        assert policy.decide(window(1)) == fresh.decide(window(1)), policy.name


def test_every_policy_resumes_from_its_own_snapshot() -> None:
    for policy in _every_policy():
        policy.decide(window(0))
        policy.decide(window(1))
        resumed = type(policy)(policy.link, policy.options)
        assert resumed.restore(json.loads(json.dumps(policy.snapshot()))) is None, policy.name
        assert resumed.snapshot() == policy.snapshot(), policy.name
