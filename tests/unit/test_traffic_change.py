"""loss-delay-fit's traffic change detector (optimizer/p4bs_optimizer/policies/traffic_change.py)
on synthetic windows: a step of the traffic is a change, a move of the buffer is not (issue 39,
item 5: the metrics job's z-score missed a join of BBR flows and flagged the policy's own
moves)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest
from policylink import make_link, run, settled
from test_loss_delay_fit import LINK, power_law_link

from p4bs_optimizer.policies.base import Window
from p4bs_optimizer.policies.baselines import OptionReader
from p4bs_optimizer.policies.loss_delay_fit import LossDelayFitPolicy, mathis_loss
from p4bs_optimizer.policies.traffic_change import TrafficChangeDetector, TrafficChangeOptions

WINDOW_NS = 500_000_000
T0_NS = 1_700_000_000 * 10**9
DETECTOR_LINK = make_link(max_queue_delay_ns=50_000_000, policy="loss-delay-fit")
BUFFER = 1_250_000  # 100 ms of 100 Mbit/s
DEFAULTS = TrafficChangeOptions()
PERSISTENCE = DEFAULTS.persistence
# Windows in two of the smoothed signals' time constants: a step of a few times the
# threshold crosses it within them
SPAN = 2 * DEFAULTS.smoothing_ns // WINDOW_NS


def window(i: int, **values: Any) -> Window:
    """Window i of 30 Cubic flows at RTT_min 20 ms in a 100 ms buffer: loss 0.6%, a queue of
    60 ms (the values overridable)."""
    fields: dict[str, Any] = {
        "flows": 30,
        "rtt_min_ns": 20_000_000,
        "loss": 0.006,
        "delay_ns": 60_000_000,
        "buffer_bytes": BUFFER,
    }
    fields.update(values)
    start = T0_NS + i * WINDOW_NS
    return Window(
        link_id="r1:eth1",
        window_start_ns=start,
        window_end_ns=start + WINDOW_NS,
        rtt_samples=1000,
        rtt_flows=fields["flows"],
        rtt_hmean_ns=fields["rtt_min_ns"] + fields["delay_ns"],
        srtt_ns=fields["rtt_min_ns"] + fields["delay_ns"],
        rtt_min_ns=fields["rtt_min_ns"],
        long_flows=fields["flows"],
        data_packets=4000,
        retransmissions=round(fields["loss"] * 4000),
        loss_rate=fields["loss"],
        loss_rate_ewma=fields["loss"],
        queue_delay_samples=4000,
        queue_delay_ns=fields["delay_ns"],
        queue_delay_ewma_ns=fields["delay_ns"],
        throughput_bps=98_000_000,
        utilisation=0.98,
        f=-(0.5 * fields["loss"] / 0.01 + 0.5 * fields["delay_ns"] / 50_000_000),
        zscore=0.0,
        change=False,
        buffer_bytes=fields["buffer_bytes"],
    )


def detector(**options: Any) -> TrafficChangeDetector:
    reader = OptionReader("loss-delay-fit", options)
    parsed = TrafficChangeOptions.parse(reader)
    reader.finish()
    link = DETECTOR_LINK
    return TrafficChangeDetector(link, parsed, lambda rtt, n, b: mathis_loss(link, rtt, n, b))


def alarms(d: TrafficChangeDetector, windows: list[Window]) -> list[tuple[int, str]]:
    """(index, reason) of each window the detector signalled a change on."""
    out = []
    for i, w in enumerate(windows):
        reason = d.observe(w)
        if reason is not None:
            out.append((i, reason))
    return out


STEP_AT = 60  # 30 s in: after the holdoff (10 s) and the baseline (10 s)


@pytest.mark.parametrize(
    ("after", "named", "crossed"),
    [
        # the join of 8 flows of another CCA: N is not smoothed
        ({"flows": 38, "loss": 0.12}, "N 30 -> 38 (x1.27, 4 windows)", 0),
        ({"flows": 15}, "N 30 -> 15 (x0.50", 0),
        # RTT_min is a minimum over 10 s already: not smoothed; a rise counts at once
        ({"rtt_min_ns": 80_000_000}, "RTT_min 20.0 -> 80.0 ms (x4.00, 4 windows)", 0),
        # the mean weighed by exp(-age / 5 s) reaches 1.2% (x2) after 7 windows at 1.8%
        ({"loss": 0.018}, "loss 0.600% -> 1.364% (x2.27, 4 windows)", 6),
        # ... 30 ms (x0.5) after 10 windows at 10 ms
        ({"delay_ns": 10_000_000}, "queueing delay 60.0 -> 23.4 ms (x0.39, 4 windows)", 9),
        # Cubic flows replaced by as many that do not back off on loss (BBR in a small
        # buffer): the loss regime moves, and it is the CCA mix, not N
        (
            {"loss": 0.06},
            "; CCA mix: loss over loss-based flows' 4.8 -> 21.9 (x4.59, 3 windows)",
            1,
        ),
    ],
)
def test_a_step_of_the_traffic_is_detected_within_its_span_and_persistence(
    after: dict[str, Any], named: str, crossed: int
) -> None:
    """A step that moves one signal past its threshold: signalled on the `persistence`-th
    window past it (N and RTT_min at once; a smoothed signal once its mean, each window
    weighed by exp(-age / `smoothing_ns`), has crossed), the reason naming the signal, its
    factor and its windows."""
    windows = [window(i) for i in range(STEP_AT)]
    windows += [window(i, **after) for i in range(STEP_AT, STEP_AT + 60)]
    found = alarms(detector(), windows)
    assert [i for i, _ in found] == [STEP_AT + crossed + PERSISTENCE - 1], found
    assert named in found[0][1]
    assert crossed < SPAN


def test_a_step_below_its_threshold_or_shorter_than_the_persistence_is_not_a_change() -> None:
    windows = [window(i) for i in range(STEP_AT)]
    windows += [window(i, flows=33, loss=0.009) for i in range(STEP_AT, STEP_AT + 20)]
    windows += [window(i, flows=60) for i in range(STEP_AT + 20, STEP_AT + 20 + PERSISTENCE - 1)]
    windows += [window(i) for i in range(len(windows), 200)]
    assert alarms(detector(), windows) == []


def test_a_burst_of_short_flows_is_not_a_change_of_n() -> None:
    """Short flows have RTT samples but never become long: twice the flows with samples and
    the same long flows (a burst, whose best buffer did not move on `dyn-burst`) is no
    change; the long flows doubling is one."""
    windows = [window(i) for i in range(STEP_AT)]
    burst = windows + [replace(window(i), rtt_flows=60) for i in range(STEP_AT, STEP_AT + 60)]
    assert alarms(detector(), burst) == []
    joined = windows + [replace(window(i), long_flows=60) for i in range(STEP_AT, STEP_AT + 60)]
    [(_, reason)] = alarms(detector(), joined)
    assert "N 30 -> 60" in reason


def test_a_large_ratio_of_a_rate_near_zero_is_not_a_change() -> None:
    """Loss 0.02% -> 0.08% and a queue of 1 -> 4 ms (x4 each) move f's terms by less than
    a fifth of their SLA bounds (0.2% of p-hat 1%, 10 ms of d-hat 50 ms): below the floors,
    no change; the same factors on larger values are one."""
    small = [window(i, loss=0.0002, delay_ns=1_000_000) for i in range(STEP_AT)]
    small += [window(i, loss=0.0008, delay_ns=4_000_000) for i in range(STEP_AT, STEP_AT + 60)]
    assert alarms(detector(), small) == []
    large = [window(i, loss=0.002, delay_ns=10_000_000) for i in range(STEP_AT)]
    large += [window(i, loss=0.008, delay_ns=40_000_000) for i in range(STEP_AT, STEP_AT + 60)]
    [(_, reason)] = alarms(detector(), large)
    assert "loss 0.200% -> " in reason and "queueing delay 10.0 -> " in reason


def test_a_fall_of_rtt_min_counts_once_it_outlasts_one_low_sample() -> None:
    """One RTT sample too low holds the job's RTT_min down for its 10 s horizon (seen at
    11-12 ms on the 20 ms path of the committed surfaces): no change, neither while it lasts
    nor when it ends, also when it fell in the baseline. A fall that stays is one, 10 s on."""
    low = 11_500_000
    artefact = [window(i, rtt_min_ns=low if 70 <= i < 90 else 20_000_000) for i in range(160)]
    assert alarms(detector(), artefact) == []
    in_baseline = [window(i, rtt_min_ns=low if 25 <= i < 45 else 20_000_000) for i in range(160)]
    assert alarms(detector(), in_baseline) == []
    lasting = [window(i, rtt_min_ns=low if i >= STEP_AT else 20_000_000) for i in range(160)]
    found = alarms(detector(), lasting)
    assert [i for i, _ in found] == [STEP_AT + 20], found  # 10.5 s after the fall
    assert "RTT_min 20.0 -> 11.5 ms (x0.57, 21 windows)" in found[0][1]


def test_a_fall_of_the_loss_regime_alone_is_not_a_change() -> None:
    """The same flows losing less: BBR's 100 flows in 200 ms on the committed Fig. 11 surface,
    12% for 30 s, then 0-5%. Searching again there (offline, in every seed) took the policy
    from its settled top to buffers where BBR loses heavily: f -6.6 for -5.2. Flows leaving,
    the usual cause of less loss, show in N."""
    windows = [window(i, loss=0.12) for i in range(STEP_AT)]
    windows += [window(i, loss=0.01) for i in range(STEP_AT, STEP_AT + 60)]
    assert alarms(detector(), windows) == []


def buffer_move(i: int, moved_at: int) -> Window:
    """The same 30 flows; from `moved_at` the buffer is cut to 20 ms: the queue falls to
    12 ms, loss rises five-fold (Mathis: the windows shrink) and RTT_min with the queue
    (the standing queue is part of it), each a change of its signal's regime."""
    if i < moved_at:
        return window(i, rtt_min_ns=35_000_000)
    return window(i, buffer_bytes=250_000, delay_ns=12_000_000, loss=0.03, rtt_min_ns=22_000_000)


def test_a_buffer_change_alone_is_not_a_change_of_the_traffic() -> None:
    """The policy's own move (loss x5, delay /5, RTT_min /1.6) is no change: the signals it
    moves start a new baseline after the holdoff. Without that restart (holdoff and baseline
    left as they were) the same windows signal a change, as the metrics job's z-score did."""
    windows = [buffer_move(i, 60) for i in range(200)]
    assert alarms(detector(), windows) == []
    # The same move with the baseline kept through it: the loss, delay and RTT_min shift.
    found = alarms(detector(), [replace(w, buffer_bytes=BUFFER) for w in windows])
    assert found and "loss 0.600% -> " in found[0][1]


def test_a_change_during_the_holdoff_after_a_buffer_move_is_still_seen_in_n() -> None:
    """N does not depend on the buffer: its baseline goes on through a buffer move, so flows
    joining right after the policy moved the buffer are still a change."""
    windows = [buffer_move(i, 60) for i in range(64)]
    windows += [replace(buffer_move(i, 60), long_flows=60, rtt_flows=60) for i in range(64, 120)]
    found = alarms(detector(), windows)
    assert [i for i, _ in found] == [64 + PERSISTENCE - 1] and "N 30 -> 60" in found[0][1]


def noisy(rng: random.Random, i: int) -> Window:
    """Steady traffic with noise: N 30 +-3 flows, RTT_min 20 ms +-5%, loss 0.6% times a
    log-normal factor of sigma 0.35 (a window at twice the median or half of it one time in
    21), the queue 60 ms +-30%."""
    return window(
        i,
        flows=30 + rng.randint(-3, 3),
        rtt_min_ns=round(20_000_000 * rng.uniform(0.95, 1.05)),
        loss=0.006 * rng.lognormvariate(0, 0.35),
        delay_ns=round(60_000_000 * rng.uniform(0.7, 1.3)),
    )


def test_noise_at_the_stated_level_gives_no_false_alarm_in_two_hours() -> None:
    """Two hours of steady noisy windows: no alarm. A single window past
    a threshold is common at this noise: taken a window at a time (`traffic_smoothing_ns` 0)
    with `traffic_persistence` 1 there are many alarms; the smoothing and the persistence
    hold them off."""
    rng = random.Random(39)
    windows = [noisy(rng, i) for i in range(14_400)]
    assert alarms(detector(), windows) == []
    assert len(alarms(detector(traffic_persistence=1, traffic_smoothing_ns=0), windows)) > 20


def test_its_state_survives_a_snapshot_and_a_malformed_one_is_refused_with_a_reason() -> None:
    windows = [window(i) for i in range(STEP_AT)] + [
        window(i, flows=60) for i in range(STEP_AT, STEP_AT + 10)
    ]
    original = detector()
    for w in windows[: STEP_AT + 1]:  # the baseline set, one window of the step seen
        assert original.observe(w) is None
    resumed = detector()
    assert resumed.restore(json.loads(json.dumps(original.snapshot()))) is None
    rest = windows[STEP_AT + 1 :]
    assert alarms(resumed, rest) == alarms(original, rest) != []
    good = original.snapshot()
    bad_states: list[Any] = [
        [],
        {},
        {**good, "started": "yes"},
        {**good, "baselines": {"flows": good["baselines"]["flows"]}},
        {**good, "baselines": {**good["baselines"], "loss": {"reference": 0.1}}},
        {
            **good,
            "baselines": {**good["baselines"], "loss": {**good["baselines"]["loss"], "streak": -1}},
        },
        {
            **good,
            "baselines": {
                **good["baselines"],
                "delay": {**good["baselines"]["delay"], "smooth_total": "x"},
            },
        },
    ]
    for bad in bad_states:
        fresh = detector()
        fresh.observe(window(0))
        reason = fresh.restore(bad)
        assert reason, bad
        assert fresh.snapshot() == detector().snapshot()  # left as new


def test_loss_delay_fit_restarts_its_search_when_flows_join_its_settled_link() -> None:
    """Settled, the policy keeps its buffer through a minute of the same traffic (its own
    moves were no change; nor is the metrics job's flag, which is not this detector's), and
    searches again when N doubles, the reason saying so."""
    policy = LossDelayFitPolicy(LINK, {})
    link = power_law_link()
    run(policy, link, settled, limit=2000)
    for _ in range(600):
        new = policy.decide(link.window(change=True))
        assert new == []
    link.flows = 48
    decisions = run(policy, link, lambda d: True, limit=200)
    assert decisions[0].phase == "search"
    assert "change detected (N 24 -> 48 (x2.00" in decisions[0].reason


def test_a_policys_malformed_detector_state_is_refused_with_a_reason() -> None:
    policy = LossDelayFitPolicy(LINK, {})
    run(policy, power_law_link(), settled, limit=2000)
    state = json.loads(json.dumps(policy.snapshot()))
    state["traffic_change"]["baselines"]["rtt_min"]["streak"] = "two"
    fresh = LossDelayFitPolicy(LINK, {})
    reason = fresh.restore(state)
    assert reason is not None and "traffic_change.rtt_min.streak" in reason
    assert fresh.snapshot() == LossDelayFitPolicy(LINK, {}).snapshot()


def test_the_options_are_read_and_a_bad_one_named() -> None:
    policy = LossDelayFitPolicy(LINK, {"traffic_persistence": 6, "traffic_flows_ratio": 1.5})
    assert policy.detector is not None
    assert (policy.detector.options.persistence, policy.detector.options.flows_ratio) == (6, 1.5)
    assert LossDelayFitPolicy(LINK, {"zscore_change": True}).detector is None
    with pytest.raises(ValueError, match="traffic_loss_ratio"):
        LossDelayFitPolicy(LINK, {"traffic_loss_ratio": 1.0})
