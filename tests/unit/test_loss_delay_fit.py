"""The loss-delay-fit policy (optimizer/p4bs_optimizer/policies/loss_delay_fit.py) on
synthetic windows (tests/policylink.py) whose loss and queueing delay are powers of the
buffer, so that the optimum of f is known."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace

import pytest
from policylink import BDP_BYTES, CAPACITY_BPS, RTT_NS, WINDOW_NS, FakeLink, make_link, run, settled

from p4bs_optimizer.policies.base import PolicyOptionError
from p4bs_optimizer.policies.loss_delay_fit import LossDelayFitPolicy, PowerLaw, first_guess_bytes

D_HAT_NS = 50_000_000
LINK = make_link(max_queue_delay_ns=D_HAT_NS, policy="loss-delay-fit")
BYTES_PER_NS = CAPACITY_BPS / 8e9


def loss_of(buffer: int) -> float:
    """2% at the BDP, falling as B^-1.2."""
    return 0.02 * (BDP_BYTES / buffer) ** 1.2


def delay_of(buffer: int) -> float:
    """A full queue: B / C, ns."""
    return buffer / BYTES_PER_NS


def f_of(buffer: int) -> float:
    return -(0.5 * loss_of(buffer) / 0.01 + 0.5 * delay_of(buffer) / D_HAT_NS)


def optimum() -> int:
    grid = [round(10_000 * 1.001**i) for i in range(6000)]
    return max((b for b in grid if b <= 5_000_000), key=f_of)


def power_law_link(**overrides: object) -> FakeLink:
    fields: dict[str, object] = {
        "f_of": f_of,
        "loss_of": loss_of,
        "delay_of": delay_of,
        "noise": 0.002,
        # 24 flows lose about what Mathis et al. predict for loss-based flows at the first
        # guess (2.7 times): not enough to take them for loss-insensitive ones.
        "flows": 24,
    }
    fields.update(overrides)
    return FakeLink(**fields)  # type: ignore[arg-type]


def test_a_power_law_fit_recovers_the_exponent_and_clamps_it() -> None:
    xs = [1e4, 3e4, 1e5]
    law = PowerLaw.fit(xs, [3 * x**-1.3 for x in xs], (-4, 0))
    assert law.exponent == pytest.approx(-1.3) and law.scale == pytest.approx(3)
    assert PowerLaw.fit(xs, [x**-6 for x in xs], (-4, 0)).exponent == -4


def test_the_first_guess_is_the_optimum_of_its_model() -> None:
    """N flows with windows (C RTT + B) / N, p = 1.5 / W^2, a full queue: the guess is the
    buffer that maximises that f, found here by brute force (100 flows, RTT 20 ms)."""
    mss, flows, rtt_s = 1448, 100, 0.02
    capacity = CAPACITY_BPS / 8

    def model_f(buffer: float) -> float:
        window = (capacity * rtt_s + buffer) / flows / mss
        return -(0.5 * 1.5 / window**2 / 0.01 + 0.5 * buffer / capacity / (D_HAT_NS / 1e9))

    best = max((1_000 * i for i in range(1, 5000)), key=model_f)
    guess = first_guess_bytes(LINK, 20_000_000, flows)
    assert guess == pytest.approx(best, abs=1_000)
    assert 1_250_000 < guess < 1_400_000  # ~106 ms of 100 Mbit/s


def test_it_settles_within_close_enough_of_the_optimum_in_few_steps() -> None:
    """From its first guess (24 flows) it measures, fits and settles within 15% of where f
    peaks, whose f is then within 1% of the best."""
    policy = LossDelayFitPolicy(LINK, {})
    link = power_law_link()
    decisions = run(policy, link, settled, limit=2000)
    steps = [d for d in decisions if d.phase == "search"]
    assert [d.trial for d in steps] == list(range(1, len(steps) + 1)) and len(steps) <= 6
    best = optimum()
    buffer = decisions[-1].buffer_bytes
    assert abs(math.log(buffer / best)) <= math.log(1.15), (buffer, best, decisions)
    assert buffer in {d.buffer_bytes for d in steps}  # a measured buffer, not a prediction
    assert f_of(buffer) >= f_of(best) * 1.01
    fitted = re.search(r"loss ~ B\^(-[0-9.]+)", decisions[-1].reason)
    assert fitted and float(fitted.group(1)) == pytest.approx(-1.2, abs=0.03)
    assert "delay ~ B^1.00" in decisions[-1].reason
    assert not any("probes the top" in d.reason for d in decisions)


def test_a_fit_that_rises_towards_a_buffer_measured_lower_is_overruled() -> None:
    """Loss and delay are the power laws above (their f peaks at ~560 kB), but the f the
    windows measure peaks at 400 kB, as noise can make it: after steps at ~360 and ~540 kB
    the fit still rises towards 540 kB, measured lower; the search settles on the best
    measured buffer instead of following the fit."""

    def peaked_at_400_kb(buffer: int) -> float:
        return -(buffer / 400_000 + 400_000 / buffer)

    policy = LossDelayFitPolicy(LINK, {})
    decisions = run(policy, power_law_link(f_of=peaked_at_400_kb), settled, limit=2000)
    *steps, last = decisions
    assert [d.trial for d in steps] == [1, 2] and steps[0].buffer_bytes < steps[1].buffer_bytes
    assert (last.phase, last.buffer_bytes) == ("settled", steps[0].buffer_bytes)
    assert "the fit disagrees with the measurements" in last.reason


def test_no_step_is_taken_where_the_fit_promises_little() -> None:
    """60 flows: the first guess is 870 kB, the second step 470 kB. The fit then puts the
    optimum at ~565 kB, its f 2.4% above the fit's at 470 kB: by default a third step; with
    `min_gain` 5% none, the search settling on the better measured buffer (whose f is 2%
    below the true optimum's)."""
    plain = run(LossDelayFitPolicy(LINK, {}), power_law_link(flows=60), settled, 2000)
    assert [d.trial for d in plain if d.phase == "search"] == [1, 2, 3]
    link = power_law_link(flows=60)
    decisions = run(LossDelayFitPolicy(LINK, {"min_gain": 0.05}), link, settled, 2000)
    *steps, last = decisions
    assert [d.trial for d in steps] == [1, 2]
    better = max((d.buffer_bytes for d in steps), key=f_of)
    assert (last.phase, last.buffer_bytes) == ("settled", better)
    assert "promises less than 5%" in last.reason


def test_an_optimum_between_two_buffers_measured_alike_is_settled_on_unmeasured() -> None:
    """The 60 flows above: the fitted optimum (~565 kB) lies between the steps at 470 and
    870 kB. Their f differ by more than the default 5%, so a third step measures it; with
    `flat_fraction` 50% they count as alike, and the search settles there at once: f being
    unimodal, it is at least the lower of the two there."""
    link = power_law_link(flows=60)
    decisions = run(LossDelayFitPolicy(LINK, {"flat_fraction": 0.5}), link, settled, 2000)
    *steps, last = decisions
    assert [d.trial for d in steps] == [1, 2]
    low, high = sorted(d.buffer_bytes for d in steps)
    assert last.phase == "settled" and low < last.buffer_bytes < high
    assert f_of(last.buffer_bytes) > max(f_of(low), f_of(high))
    assert "measured alike" in last.reason
    strict = run(
        LossDelayFitPolicy(LINK, {"flat_fraction": 0}), power_law_link(flows=60), settled, 2000
    )
    assert [d.trial for d in strict if d.phase == "search"] == [1, 2, 3]


def test_a_step_whose_f_is_good_enough_settles_the_search() -> None:
    """f a twentieth of the power-law link's: -0.20 at the buffer in force (5 MB), -0.05 at
    the first guess (870 kB for 60 flows), so the search settles on its first step, where
    with `good_enough` 0 it measures two more."""
    slight = power_law_link(flows=60, f_of=lambda b: f_of(b) / 20)
    *steps, last = run(LossDelayFitPolicy(LINK, {}), slight, settled, 2000)
    assert [d.trial for d in steps] == [1]
    assert (last.phase, last.buffer_bytes) == ("settled", steps[0].buffer_bytes)
    assert f_of(last.buffer_bytes) / 20 >= -0.1 and "good_enough" in last.reason
    picky = run(
        LossDelayFitPolicy(LINK, {"good_enough": 0}),
        power_law_link(flows=60, f_of=lambda b: f_of(b) / 20),
        settled,
        2000,
    )
    assert [d.trial for d in picky if d.phase == "search"] == [1, 2, 3]


STANDING_NS = 60_000_000  # the queue BBR-like flows keep of their own


def bbr_loss(buffer: int) -> float:
    """BBR-like: 15% loss in any buffer below its standing queue (with a margin), none above."""
    return 0.15 if buffer < STANDING_NS * BYTES_PER_NS * 1.2 else 0.0


def standing(buffer: int) -> float:
    """A full queue up to the standing one, which it never grows past."""
    return min(buffer / BYTES_PER_NS, STANDING_NS)


def bbr_f(delay_of: Callable[[int], float]) -> Callable[[int], float]:
    return lambda buffer: -(0.5 * bbr_loss(buffer) / 0.01 + 0.5 * delay_of(buffer) / D_HAT_NS)


def test_flows_that_do_not_fill_the_buffer_in_force_are_left_there() -> None:
    """Step 0 measures the buffer in force (5 MB, 400 ms) without changing it: a queue of
    60 ms, 15% of it, means the flows keep their own standing queue; a smaller buffer could
    only add loss. The search settles there, without a trial elsewhere."""

    policy = LossDelayFitPolicy(LINK, {})
    link = FakeLink(f_of=bbr_f(standing), loss_of=bbr_loss, delay_of=standing)
    decisions = run(policy, link, settled, limit=2000)
    assert [(d.phase, d.buffer_bytes) for d in decisions] == [("settled", 5_000_000)]
    assert "step 0: at 5000000 B" in decisions[0].reason
    assert "a mean queue of 15% of the buffer: the flows do not fill it" in decisions[0].reason


def test_flows_that_come_to_fill_the_buffer_left_to_them_get_a_search() -> None:
    """Few loss-based flows fill a large buffer slowly (3 Reno flows take tens of seconds to
    fill 200 ms at 100 Mbit/s): step 0 sees a queue of 20% of the 5 MB in force and settles
    there, watching; once the queue fills half the buffer, a search begins, the watched
    windows its step 0 (not measured again, while the full buffer costs), and ends on a
    buffer far below it, better than the one left in force."""
    policy = LossDelayFitPolicy(LINK, {})
    link = power_law_link(buffer=5_000_000)
    growing = {"ns": 0.0}

    def filling(buffer: int) -> float:
        """The queue grows by 1% of the buffer a window until full: B / C at most."""
        growing["ns"] = min(growing["ns"] + 0.01 * delay_of(buffer), delay_of(buffer))
        return growing["ns"] if buffer == 5_000_000 else delay_of(buffer)

    link.delay_of = filling
    decisions = run(policy, link, lambda d: len(d) > 1 and settled(d), limit=3000)
    first, *search = decisions
    assert (first.phase, first.buffer_bytes) == ("settled", 5_000_000)
    assert "the flows do not fill it (watched" in first.reason
    assert search[0].phase == "search"
    assert "the flows now fill the buffer they did not" in search[0].reason
    assert search[0].reason.count("step 0: at 5000000 B") == 1
    # Step 0's queue is the watched one (here 2% of the buffer more each window, from 60% at
    # the settling): measured again, 1 s to settle and 2 s to measure, the buffer full.
    watched = re.search(r"fill the buffer they did not \(([0-9]+)% over 2 s\)", search[0].reason)
    zero = re.search(r"step 0: at 5000000 B .*?delay ([0-9.]+) ms", search[0].reason)
    assert watched and zero, search[0].reason
    filled = float(zero[1]) * 1e6 / delay_of(5_000_000)
    assert filled == pytest.approx(int(watched[1]) / 100, abs=0.01) and filled < 0.75
    assert search[-1].buffer_bytes < 1_000_000 and f_of(search[-1].buffer_bytes) > f_of(5_000_000)


def test_heavy_loss_in_the_buffer_in_force_has_the_top_probed_first() -> None:
    """From 300 kB, below the flows' standing queue: 15% loss, 56 times what 16 loss-based
    flows would lose there and the larger term of f. Step 1 is the search max; f is higher
    there, and the search settles on it."""

    policy = LossDelayFitPolicy(LINK, {})
    link = FakeLink(f_of=bbr_f(standing), loss_of=bbr_loss, delay_of=standing, buffer=300_000)
    decisions = run(policy, link, settled, limit=2000)
    assert [(d.phase, d.trial, d.buffer_bytes) for d in decisions] == [
        ("search", 1, LINK.max_buffer_bytes),
        ("settled", None, LINK.max_buffer_bytes),
    ]
    assert "flows that do not back off on loss; step 1 probes the top" in decisions[0].reason
    assert "f higher at the top than at 300000 B" in decisions[1].reason
    # a raise: measured once the queue is steady (BBR's own, 60 ms), not at once
    assert "step 1: at 5000000 B (queue at its level 2.0 s in: steady, 60.0 then 60.0 ms)" in (
        decisions[1].reason
    )


def test_flows_that_lose_far_more_than_loss_based_ones_at_the_first_guess_get_the_top_probed() -> (
    None
):
    """Step 0 shows nothing unusual (a full queue, no loss: the flows' start-up), so step 1
    is the first guess; there the flows lose 40 times what 16 loss-based flows would, so
    step 2 is the search max; f is higher there, and the search settles on it."""

    def full(buffer: int) -> float:
        return buffer / BYTES_PER_NS

    policy = LossDelayFitPolicy(LINK, {})
    link = FakeLink(f_of=bbr_f(full), loss_of=bbr_loss, delay_of=full)
    decisions = run(policy, link, settled, limit=2000)
    assert [(d.phase, d.trial) for d in decisions] == [
        ("search", 1),
        ("search", 2),
        ("settled", None),
    ]
    assert decisions[1].buffer_bytes == decisions[2].buffer_bytes == LINK.max_buffer_bytes
    assert "flows that do not back off on loss" in decisions[1].reason
    assert "f higher at the top than at" in decisions[2].reason


def test_a_raised_buffer_is_measured_once_its_queue_has_filled_it() -> None:
    """Loss-based flows that lose more than Mathis et al. predict (12 flows losing as 24 do,
    14 times the model at the first guess) have the top probed. A raised buffer fills at
    40 ms a second without a loss, then loses: measured 1 s after the raise, the top's queue
    would be a tenth full and f there the best seen (as on dyn-n-step, eval/README.md). The
    step waits for the queue's level (its first loss), finds f worse at the top than at the
    first guess, and the search goes on below the top, to the optimum."""
    link = power_law_link(flows=12)
    queue = {"ns": delay_of(link.buffer)}  # full at the start; 40 ms more a second, up to B / C

    def f_filling(buffer: int) -> float:  # the link asks for f first, once a window
        queue["ns"] = min(delay_of(buffer), queue["ns"] + 0.04 * WINDOW_NS)
        return -(0.5 * filling_loss(buffer) / 0.01 + 0.5 * queue["ns"] / D_HAT_NS)

    def filling_loss(buffer: int) -> float:
        return loss_of(buffer) if queue["ns"] >= delay_of(buffer) else 0.0

    link.f_of, link.loss_of, link.delay_of = f_filling, filling_loss, lambda b: queue["ns"]
    decisions = run(LossDelayFitPolicy(LINK, {}), link, settled, limit=5000)
    probe, after = decisions[1], decisions[2]
    assert (probe.trial, probe.buffer_bytes) == (2, LINK.max_buffer_bytes), probe.reason
    assert "flows that do not back off on loss; step 2 probes the top" in probe.reason
    level = re.search(
        r"step 2: at 5000000 B \(queue at its level ([0-9.]+) s in: a loss\)", after.reason
    )
    assert level, after.reason
    # 400 ms of queue at 40 ms a second: 10 s, and the top's delay measured at the full queue
    assert float(level[1]) == pytest.approx(10.0, abs=0.5)
    assert re.search(r"step 2: .*?delay 400\.00 ms", after.reason), after.reason
    assert "f higher at the top" not in after.reason
    assert f_of(decisions[-1].buffer_bytes) > f_of(optimum()) - 0.01


def test_an_unknown_buffer_in_force_makes_step_0_the_search_max() -> None:
    """Before any decision the metrics job cannot say which buffer is in force: step 0 is
    then a decision for the search max, measured once in force."""
    policy = LossDelayFitPolicy(LINK, {})
    link = power_law_link()
    first = replace(link.window(), buffer_bytes=None)
    [step0] = policy.decide(first)
    assert (step0.phase, step0.trial, step0.buffer_bytes) == ("search", 0, LINK.max_buffer_bytes)
    assert "the buffer in force is unknown" in step0.reason
    decisions = run(policy, link, settled, limit=2000)
    assert decisions[0].trial == 1 and "step 0: at 5000000 B" in decisions[0].reason


def test_a_change_restarts_the_search_from_the_first_guess_for_the_traffic_now() -> None:
    """With `zscore_change` (the metrics job's detector, the default before issue 39), after
    change_holdoff_ns a change flag starts a new search at the first guess for the flows of
    the window that showed it (twice as many as before here), its reason saying why; with
    no RTT in that window, from the settled buffer, measured in force."""
    policy = LossDelayFitPolicy(LINK, {"zscore_change": True})
    link = power_law_link()
    decisions = run(policy, link, settled, limit=2000)
    settled_on = decisions[-1].buffer_bytes
    while policy.snapshot()["step"]["in_force_ns"] is None:  # the settled buffer in force
        assert policy.decide(link.window(change=True)) == []
    for _ in range(50):  # change_holdoff_ns: 5 s
        assert policy.decide(link.window(change=True)) == []
    restored = LossDelayFitPolicy(LINK, {"zscore_change": True})
    restored.restore(policy.snapshot())
    link.flows = 48
    [first] = policy.decide(link.window(change=True))
    assert (first.phase, first.trial) == ("search", 1)
    assert first.buffer_bytes == round(first_guess_bytes(LINK, RTT_NS, 48))
    assert first.reason.startswith("change detected (z-score 20.0")
    assert "first step at the optimum of f for 48 loss-based flows" in first.reason
    assert policy.snapshot()["points"] == []
    link.rtt_min_ns = link.srtt_ns = None  # type: ignore[assignment]
    assert restored.decide(link.window(change=True)) == []
    state = restored.snapshot()
    assert (state["phase"], state["points"]) == ("search", [])
    assert (state["step"]["buffer_bytes"], state["step"]["trial"]) == (settled_on, 1)


def test_restored_policy_decides_what_the_uninterrupted_one_does() -> None:
    original = LossDelayFitPolicy(LINK, {})
    link = power_law_link(noise=0.02)
    run(original, link, lambda d: d[-1].trial == 2, limit=2000)
    for _ in range(link.lag + 12):
        assert original.decide(link.window()) == []
    restored = LossDelayFitPolicy(LINK, {})
    restored.restore(json.loads(json.dumps(original.snapshot())))
    while True:
        window = link.window()
        new = original.decide(window)
        assert restored.decide(window) == new
        link.apply(new)
        if new and new[-1].phase == "settled":
            break
    assert restored.snapshot() == original.snapshot()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"close_enough": 1}, "close_enough"),
        ({"max_stride": 0.5}, "max_stride"),
        ({"max_steps": 0}, "max_steps"),
        ({"min_gain": 1.5}, "min_gain"),
        ({"good_enough": -0.1}, "good_enough"),
        ({"loss_insensitive_ratio": 1}, "loss_insensitive_ratio"),
        ({"measure_ns": 0}, "measure_ns"),
        ({"search_max_ns": "soon"}, "search_max_ns"),
        ({"grid_step_ns": 1}, "grid_step_ns"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, object], named: str) -> None:
    with pytest.raises(PolicyOptionError, match=named):
        LossDelayFitPolicy(LINK, options)
