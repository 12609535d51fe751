"""The P4BS policy (optimizer/p4bs_optimizer/policies/p4bs.py) and its Ax search (bayes.py),
driven by synthetic LinkMetrics windows (tests/policylink.py): no Kafka, no router. An Ax
fit takes ~0.3 s; the file makes about 90 of them, 65 in the Fig. 18 test."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from policylink import BDP_BYTES, CAPACITY_BPS, FakeLink, make_link, run, settled

from p4bs_eval.acquisition import fig18_curve
from p4bs_optimizer.policies.base import Decision, PolicyOptionError
from p4bs_optimizer.policies.bayes import (
    BufferSearch,
    GridGP,
    Observation,
    SearchSpec,
    _expected_improvement,
    plan,
)
from p4bs_optimizer.policies.p4bs import P4bsPolicy


def loss_halving_per_doubling(at_bdp: float) -> Callable[[int], float]:
    """Loss falling with the square of the buffer: `at_bdp` at the BDP."""
    return lambda buffer: at_bdp * (BDP_BYTES / buffer) ** 2


# The search as this project first built it (continuous on log(buffer), each trial's SEM as
# the GP's noise, warm-started with the bound search, up to 8 trials of 3 s after 2 s), for
# the tests of the BO machinery itself; the defaults are the authors' controller's.
CONTINUOUS_SEARCH = {
    "grid_step_ns": 0,
    "warm_start": True,
    "max_trials": 8,
    "settle_ns": "2s",
    "settle_per_buffer": 0,
    "measure_ns": "3s",
    "ei_stop": 0.001,
}


# -- (1) BO on P4BS Fig. 18-like performance functions ------------------------------------


def test_bo_finds_the_optimum_of_multimodal_f_within_5_percent_in_8_trials() -> None:
    """Ten seeded noisy curves, each through the whole policy with the continuous search
    (bound search, then at most max_trials = 8 BO trials, stopping on small EI).

    Algorithm 1 gives [BDP / 4, 4 BDP] here: loss 2% at the BDP falls 4x per doubling, so
    the bound search measures BDP, 2 BDP and 4 BDP (loss 0.125% <= 0.25%), which warm-start
    the GP; N = 16 makes the lower bound BDP / 4. "Within 5%": the true (noise-free) f at
    the settled buffer is at least f_opt - 0.05 * (f_max - f_min), with f_opt = f_max the
    maximum and f_min the minimum of f on 400 log-spaced buffers over the search bounds.
    A window's f has noise of standard deviation 0.05 (a trial's mean over 30 windows has
    an SEM of ~0.009, ~1% of the range)."""
    within, report = 0, []
    for seed in range(10):
        curve = fig18_curve(random.Random(seed))
        policy = P4bsPolicy(make_link(), {**CONTINUOUS_SEARCH, "seed": seed})
        link = FakeLink(curve, loss_halving_per_doubling(0.02), noise=0.05, seed=seed)
        decisions = run(policy, link, settled, limit=2000)

        state = policy.snapshot()
        low, high = state["low_bytes"], state["high_bytes"]
        assert (low, high) == (BDP_BYTES // 4, 4 * BDP_BYTES)
        trials = [d.trial for d in decisions if d.phase == "optimise"]
        assert trials == list(range(1, len(trials) + 1))
        assert len(trials) <= 8
        grid = [low * (high / low) ** (i / 399) for i in range(400)]
        values = [curve(round(x)) for x in grid]
        gap = (max(values) - curve(decisions[-1].buffer_bytes)) / (max(values) - min(values))
        within += gap <= 0.05
        report.append((seed, len(trials), round(gap, 3)))
    assert within >= 9, report


# -- (2) Algorithm 1 --------------------------------------------------------------------


def test_bound_search_doubles_from_the_bdp_while_the_loss_is_above_epsilon() -> None:
    """BDP from the SRTT (30 ms: 375 kB), doubled while the loss is above 0.25%; the lower
    bound from RTT_min (20 ms) and N (9): C * RTT_min / sqrt(N) = 83,333 B."""
    bdp = CAPACITY_BPS * 30_000_000 // 8_000_000_000
    policy = P4bsPolicy(make_link(), {})
    link = FakeLink(
        lambda b: -abs(math.log2(b / 600_000)),
        lambda b: 0.02 * (bdp / b) ** 2,  # 2%, 0.5%, 0.1% (1.25 per 1000 rounds to 1)
        srtt_ns=30_000_000,
        flows=9,
        noise=0.01,
    )
    decisions = run(policy, link, lambda d: d[-1].phase != "bound_search", limit=1000)

    assert [d.buffer_bytes for d in decisions[:3]] == [bdp, 2 * bdp, 4 * bdp]
    assert {d.phase for d in decisions[:3]} == {"bound_search"}
    assert decisions[3].phase == "optimise" and decisions[3].trial == 1
    assert "loss 0.100% at 1500000 B" in decisions[3].reason
    state = policy.snapshot()
    assert (state["low_bytes"], state["high_bytes"]) == (83_333, 4 * bdp)
    assert 83_333 <= decisions[3].buffer_bytes <= 4 * bdp


def test_high_loss_at_the_bdp_makes_the_bounds_bdp_and_half_the_search_max() -> None:
    """Loss 5% at the BDP, at least high_loss (3%): no doubling, the bounds are [BDP,
    buffer.max / 2] at once (the authors' controller), and the first trial is the lower
    bound, measured again: the bound search's points are not the GP's."""
    policy = P4bsPolicy(make_link(), {})
    link = FakeLink(lambda b: -abs(math.log2(b / 600_000)), lambda b: 0.05, noise=0.01)
    decisions = run(policy, link, lambda d: d[-1].phase != "bound_search", limit=1000)

    assert [(d.phase, d.buffer_bytes, d.trial) for d in decisions] == [
        ("bound_search", BDP_BYTES, None),
        ("optimise", BDP_BYTES, 1),
    ]
    assert "5.000% at 250000 B" in decisions[1].reason
    assert "bounds [BDP, the link's buffer.max / 2] = [250000, 2500000] B" in decisions[1].reason
    state = policy.snapshot()
    assert (state["low_bytes"], state["high_bytes"]) == (BDP_BYTES, 2_500_000)


def test_bound_search_stops_at_search_max() -> None:
    """Loss 5% whatever the buffer, the high-loss rule off: 250 k, 500 k, 1 M, 2 M; 4 MB
    would pass search_max (200 ms: 2.5 MB), which becomes the upper bound untried."""
    policy = P4bsPolicy(make_link(), {"high_loss": 1, "search_max_ns": "200ms"})
    link = FakeLink(lambda b: -abs(math.log2(b / 600_000)), lambda b: 0.05, noise=0.01)
    decisions = run(policy, link, lambda d: d[-1].phase != "bound_search", limit=1000)

    bdp = BDP_BYTES
    assert [d.buffer_bytes for d in decisions[:4]] == [bdp, 2 * bdp, 4 * bdp, 8 * bdp]
    assert decisions[4].phase == "optimise"
    assert "would pass the cap search_max = 2500000 B" in decisions[4].reason
    state = policy.snapshot()
    assert (state["low_bytes"], state["high_bytes"]) == (bdp // 4, 2_500_000)
    assert decisions[4].buffer_bytes == bdp // 4  # the grid's first point


def test_bound_search_starts_at_search_max_below_the_bdp() -> None:
    """search_max 2 ms: 25 kB is below the BDP and the Stanford bound (62.5 kB), so the
    search starts there and, with nothing between the bounds, settles there."""
    policy = P4bsPolicy(make_link(), {"search_max_ns": "2ms"})
    link = FakeLink(lambda b: -0.5, lambda b: 0.05, noise=0.01)
    decisions = run(policy, link, settled, limit=1000)

    assert [(d.phase, d.buffer_bytes) for d in decisions] == [
        ("bound_search", 25_000),
        ("settled", 25_000),
    ]
    assert "nothing to search" in decisions[-1].reason


# -- (3) the whole state machine ------------------------------------------------------


def test_state_machine_measures_only_the_settled_buffer_then_restarts_on_change() -> None:
    """A decision reaches the windows 25 windows later (longer than settle_ns = 2 s), and
    f is 5 lower for 1 s after each change: a trial that counted a window of the old buffer
    or one of the transient would be off by far more than the noise (0.001)."""

    def curve(buffer: int) -> float:
        return -0.2 - 0.3 * math.log2(buffer / 300_000) ** 2

    policy = P4bsPolicy(make_link(), {})
    link = FakeLink(
        curve,
        loss_halving_per_doubling(0.01),  # 1% at the BDP, 0.25% at 2 BDP: bounds [BDP/4, 2 BDP]
        noise=0.001,
        lag=25,
        transient_ns=1_000_000_000,
        transient_f=-5.0,
    )
    decisions = run(policy, link, settled, limit=2000)

    phases = [d.phase for d in decisions]
    assert phases == ["bound_search"] * 2 + ["optimise"] * (len(phases) - 3) + ["settled"]
    state = policy.snapshot()
    observations = state["bound_points"] + state["trials"]
    assert 1 <= len(state["trials"]) == len(phases) - 3 <= 4
    for buffer, mean, sem in observations:
        assert abs(mean - curve(buffer)) < 0.003, (buffer, mean, curve(buffer))
        assert sem < 0.001
    # Each decision's f is the mean f of the step before it.
    assert [d.f for d in decisions[1:]] == [mean for _, mean, _ in observations]
    best = max(state["trials"], key=lambda o: o[1])  # x*: the best BO trial
    assert decisions[-1].buffer_bytes == best[0] and state["incumbent"] == best

    # A change flag within change_holdoff_ns (5 s) of the settled buffer being in force is
    # the policy's own move; one after it restarts Algorithm 1 from the new SRTT.
    while link.buffer != decisions[-1].buffer_bytes:  # until it is in force
        assert policy.decide(link.window(change=True)) == []
    for _ in range(30):
        assert policy.decide(link.window(change=True)) == []
    for _ in range(30):
        assert policy.decide(link.window()) == []
    link.srtt_ns = 40_000_000
    restart = policy.decide(link.window(change=True))
    assert [(d.phase, d.buffer_bytes) for d in restart] == [("bound_search", 2 * BDP_BYTES)]
    assert restart[0].reason.startswith("change detected (z-score 20.0")
    state = policy.snapshot()
    assert (state["phase"], state["trials"], state["bound_points"]) == ("bound_search", [], [])


def test_a_decision_never_in_force_is_decided_again() -> None:
    """The service held the BDP decision: after reissue_after_ns (here 5 s) the policy asks
    again, and measures once the windows show it."""
    policy = P4bsPolicy(make_link(), {"reissue_after_ns": "5s"})
    link = FakeLink(lambda b: -0.5, lambda b: 0.02, noise=0.01)
    first = policy.decide(link.window())
    assert [d.buffer_bytes for d in first] == [BDP_BYTES]
    again: list[Decision] = []
    while not again:
        again = policy.decide(link.window())  # not applied
    assert link.index == 51
    assert again[0].buffer_bytes == BDP_BYTES and "not in force 5.0 s" in again[0].reason
    link.apply(again)
    decisions = run(policy, link, lambda d: True, limit=100)
    assert (decisions[0].phase, decisions[0].buffer_bytes) == ("bound_search", 2 * BDP_BYTES)


# -- (4) snapshot and restore ---------------------------------------------------------


def test_restored_policy_decides_what_the_uninterrupted_one_does() -> None:
    """Snapshot in the middle of trial 2's measurement, through JSON, into a fresh
    instance: from there both see the same windows and must decide the same, Ax's
    suggestions included (the search is rebuilt from the persisted observations)."""

    def curve(buffer: int) -> float:
        u = math.log2(buffer / BDP_BYTES)
        return -0.5 + 0.3 * math.exp(-((u - 0.7) ** 2)) + 0.2 * math.exp(-((u + 1.3) ** 2) / 0.1)

    options = {**CONTINUOUS_SEARCH, "seed": 7, "ei_stop": 0.0, "max_trials": 4}
    original = P4bsPolicy(make_link(), options)
    link = FakeLink(curve, loss_halving_per_doubling(0.02), noise=0.05, seed=3)
    run(original, link, lambda d: d[-1].trial == 2, limit=2000)
    for _ in range(link.lag + 26):  # in force, settled, a few of 30 windows measured
        assert original.decide(link.window()) == []
    state = json.loads(json.dumps(original.snapshot()))
    assert state["step"]["trial"] == 2 and 0 < len(state["step"]["f_values"]) < 30
    restored = P4bsPolicy(make_link(), options)
    restored.restore(state)

    decisions = []
    while not decisions or decisions[-1].phase != "settled":
        window = link.window()
        new = original.decide(window)
        assert restored.decide(window) == new
        link.apply(new)
        decisions += new
    assert [d.trial for d in decisions] == [3, 4, None]
    assert restored.snapshot() == original.snapshot()


# -- the Ax search and the options ----------------------------------------------------


@pytest.mark.filterwarnings("ignore:ExpectedImprovement has known numerical issues")
def test_search_is_a_gp_with_rbf_kernel_and_expected_improvement() -> None:
    """The model Ax fitted is a ScaleKernel(RBF) GP, the EI the search reports is the
    acquisition Ax optimised (the same up to Ax's standardisation of f, a constant factor),
    and the suggestion maximises it; the posterior passes through the observations."""
    from ax.core.observation import ObservationFeatures
    from botorch.acquisition.analytic import ExpectedImprovement
    from gpytorch.kernels import RBFKernel, ScaleKernel

    def f(buffer: float) -> float:
        return -abs(math.log2(buffer / 300_000))

    buffers = [62_500, 250_000, 1_000_000]
    search = BufferSearch(62_500, 1_000_000, seed=1)
    for buffer in buffers:
        search.tell(buffer, f(buffer), 0.01)
    suggestion = search.suggest()

    assert search._client is not None
    adapter = search._client._generation_strategy.adapter  # the fitted model, for inspection
    assert adapter is not None
    generator = adapter.generator
    kernel = generator.surrogate.model.covar_module
    assert isinstance(kernel, ScaleKernel) and isinstance(kernel.base_kernel, RBFKernel)
    assert generator.botorch_acqf_class is ExpectedImprovement

    grid = search.grid(64)
    ours = search.expected_improvement(grid)
    theirs = adapter.evaluate_acquisition_function(
        [ObservationFeatures({"buffer": x}) for x in grid]
    )
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b > 1e-9]
    assert len(ratios) > 30 and max(ratios) / min(ratios) < 1.0001
    assert search.expected_improvement([suggestion])[0] >= 0.99 * search.max_expected_improvement()
    assert search.max_expected_improvement() == pytest.approx(
        max(search.expected_improvement(search.grid()))
    )

    means, stds = search.posterior([*buffers, 130_000])
    for mean, buffer in zip(means, buffers, strict=False):
        assert abs(mean - f(buffer)) < 0.03
    assert max(stds[:3]) < stds[3]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"loss_epsilon": 0}, "loss_epsilon"),
        ({"loss_epsilon": 1.5}, "loss_epsilon"),
        ({"settle_ns": "soon"}, "settle_ns"),
        ({"measure_ns": 0}, "measure_ns"),
        ({"ei_stop": -1}, "ei_stop"),
        ({"high_loss": 0}, "high_loss"),
        ({"warm_start": "yes"}, "warm_start"),
        ({"grid_step_ns": -1}, "grid_step_ns"),
        ({"search_max_ns": "big"}, "search_max_ns"),
        ({"noise_variance": -1}, "noise_variance"),
        ({"max_trials": 0}, "max_trials"),
        ({"max_trials": 2.5}, "max_trials"),
        ({"seed": True}, "seed"),
        ({"change_holdoff_ns": -1}, "change_holdoff_ns"),
        ({"budget": 3}, "budget"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, object], named: str) -> None:
    with pytest.raises(PolicyOptionError, match=named):
        P4bsPolicy(make_link(), options)


def test_options_take_durations_with_units() -> None:
    policy = P4bsPolicy(make_link(), {"settle_ns": "500ms", "measure_ns": 2_000_000_000})
    assert (policy.config.settle_ns, policy.config.measure_ns) == (500_000_000, 2_000_000_000)


def test_importing_the_policies_does_not_import_ax() -> None:
    code = (
        "import sys, p4bs_optimizer.policies.base, p4bs_optimizer.policies.p4bs; "
        "print(sorted(m for m in ('ax', 'torch', 'botorch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_warming_up_the_grid_search_loads_its_fit_without_ax() -> None:
    """The service warms the grid GP up before its first window (the first fit's imports
    held its loop for seconds on the testbed); Ax and torch stay out of it."""
    code = (
        "import sys, p4bs_optimizer.policies.p4bs; "
        "from p4bs_optimizer.policies import bayes; "
        "before = 'scipy.optimize' in sys.modules; "
        "seconds = bayes.warm_up(1_000); "
        "print(before, 'scipy.optimize' in sys.modules, seconds > 0, "
        "sorted(m for m in ('ax', 'torch', 'botorch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False True True []"


def test_the_ei_rule_waits_for_min_trials_trials() -> None:
    """A flat f (no improvement anywhere, EI 0) still gets `min_trials` trials before the
    search settles: a GP on the bound search's points alone cannot rule the range out."""
    policy = P4bsPolicy(make_link(), {**CONTINUOUS_SEARCH, "min_trials": 3})
    link = FakeLink(lambda b: -0.5, lambda b: 0.0, noise=0.01)
    decisions = run(policy, link, lambda d: d[-1].phase == "settled", limit=3000)
    trials = [d.trial for d in decisions if d.phase == "optimise"]
    assert trials == [1, 2, 3]


def test_default_search_is_the_authors_grid_with_a_unit_rbf_and_fitted_noise() -> None:
    """The default search (`grid_step_ns` 1.5 ms: 18,750 B at 100 Mbit/s): the lower bound
    first, then the EI's argmax among lower + k * step below the upper bound; the model a
    plain RBF (amplitude 1) with a zero prior mean on f as measured, its noise fitted rather
    than the SEMs told (0.5 here, which as fixed noise would flatten the posterior far from
    the points), or fixed at `noise_variance`."""

    def f(buffer: float) -> float:
        return -abs(math.log2(buffer / 300_000))

    step = 18_750
    search = BufferSearch(62_500, 500_000, seed=1, grid_step_bytes=step)
    assert search.grid()[:2] == [62_500.0, 81_250.0] and search.grid()[-1] < 500_000
    assert search.suggest() == 62_500
    for buffer in (62_500, 287_500, 493_750):
        search.tell(buffer, f(buffer), 0.5)
        suggestion = search.suggest()
        assert (suggestion - 62_500) % step == 0 and 62_500 <= suggestion < 500_000
    means, _ = search.posterior([62_500, 287_500, 493_750])
    assert all(abs(m - f(b)) < 0.1 for m, b in zip(means, (62_500, 287_500, 493_750), strict=True))
    # One point, noise fixed: the posterior there is k / (k + noise) of it with k = 1 (the
    # amplitude), shrunk towards 0 (the prior mean), its variance 1 - 1 / (1 + noise).
    fixed = GridGP([0.0], [-1.0], noise_variance=0.002)
    (mean,), (std,) = fixed.posterior([0.0])
    assert mean == pytest.approx(-1 / 1.002) and std == pytest.approx(math.sqrt(1 - 1 / 1.002))
    assert fixed.noise_variance == 0.002


def _authors_gp_in_ax(low: int, high: int, observations: list[Observation], noise: float | None):
    """The authors' GP as Ax and BoTorch fitted it before `GridGP` took its place: a
    SingleTaskGP with a zero mean and a plain RBF kernel on the buffer scaled to [0, 1] and
    f untransformed; returns Ax's client, its fitted model and the posterior on `grid`."""
    from ax.adapter.registry import Generators, MBM_X_trans
    from ax.api.client import Client
    from ax.api.configs import RangeParameterConfig
    from ax.generation_strategy.generation_node import GenerationNode
    from ax.generation_strategy.generation_strategy import GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generators.torch.botorch_modular.surrogate import SurrogateSpec
    from ax.generators.torch.botorch_modular.utils import ModelConfig
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import RBFKernel
    from gpytorch.means import ZeroMean

    class ZeroMeanGP(SingleTaskGP):  # type: ignore[misc]
        def __init__(
            self,
            train_X: Any,
            train_Y: Any,
            train_Yvar: Any = None,
            likelihood: Any = None,
            covar_module: Any = None,
            outcome_transform: Any = None,
            input_transform: Any = None,
        ) -> None:
            super().__init__(
                train_X,
                train_Y,
                train_Yvar=train_Yvar,
                likelihood=likelihood,
                covar_module=covar_module,
                mean_module=ZeroMean(),
                outcome_transform=outcome_transform,
                input_transform=input_transform,
            )

    client = Client(random_seed=0)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(
                name="buffer", bounds=(float(low), float(high)), parameter_type="float"
            )
        ]
    )
    client.configure_optimization(objective="f")
    for obs in observations:
        index = client.attach_trial({"buffer": float(obs.buffer_bytes)})
        value = obs.mean if noise is None else (obs.mean, math.sqrt(noise))
        client.complete_trial(index, {"f": value})
    model = ModelConfig(botorch_model_class=ZeroMeanGP, covar_module_class=RBFKernel)
    spec = GeneratorSpec(
        generator_enum=Generators.BOTORCH_MODULAR,
        generator_kwargs={
            "surrogate_spec": SurrogateSpec(model_configs=[model]),
            "transforms": [*MBM_X_trans],
        },
    )
    strategy = GenerationStrategy(
        name="authors", nodes=[GenerationNode(name="gp", generator_specs=[spec])]
    )
    client.set_generation_strategy(strategy)
    strategy.gen_single_trial(experiment=strategy.experiment)
    return client, strategy.adapter.generator.surrogate.model  # type: ignore[union-attr]


@pytest.mark.filterwarnings("ignore:ExpectedImprovement has known numerical issues")
def test_the_grid_gp_is_the_model_ax_fitted_and_suggests_the_same_trials() -> None:
    """`GridGP` against the same model fitted by Ax and BoTorch, on 24 random searches
    (bounds, 1-5 points of a noisy peaked f, noise fitted or fixed): the same length scale
    and noise, the same posterior on the grid, hence the same next trial. (On 300 such
    searches all 300 suggestions agreed; a GridGP fit takes ~3 ms, Ax's ~100 ms.)"""
    rng = random.Random(7)
    for _ in range(24):
        low = rng.choice([32_768, 62_500, 250_000])
        high = rng.choice([1_250_000, 2_500_000])
        peak, width = rng.uniform(low, high), rng.uniform(0.3, 2.0)
        noise = rng.choice([None, None, 0.002])
        search = BufferSearch(low, high, grid_step_bytes=18_750, noise_variance=noise)
        buffers = [low] + [rng.choice(search.grid()) for _ in range(rng.randint(0, 4))]
        observations = [
            Observation(round(b), -0.2 - width * abs(math.log(b / peak)) + rng.gauss(0, 0.05), 0.02)
            for b in buffers
        ]
        for obs in observations:
            search.tell(*obs)
        client, model = _authors_gp_in_ax(low, high, observations, noise)
        ours = search._fitted_grid_gp()
        assert ours.length_scale == pytest.approx(float(model.covar_module.lengthscale), rel=0.02)
        assert ours.noise_variance == pytest.approx(float(model.likelihood.noise.max()), rel=0.02)
        grid = search.grid()
        predicted = client.predict([{"buffer": b} for b in grid])
        means, stds = search.posterior(grid)
        assert means == pytest.approx([p["f"][0] for p in predicted], abs=1e-3)
        assert stds == pytest.approx([p["f"][1] for p in predicted], abs=1e-3)
        best = search.best().mean
        theirs = [_expected_improvement(p["f"][0] - best, p["f"][1]) for p in predicted]
        assert search.suggest() == round(grid[max(range(len(grid)), key=theirs.__getitem__)])


def test_default_policy_makes_four_grid_trials_from_the_lower_bound() -> None:
    """With the defaults, Algorithm 2 tells the GP only its own trials (the first at the
    lower bound), makes at most 4, all on the grid, and keeps the best of them."""

    def curve(buffer: int) -> float:
        return -0.2 - 0.3 * math.log2(buffer / 300_000) ** 2

    policy = P4bsPolicy(make_link(), {})
    link = FakeLink(curve, loss_halving_per_doubling(0.01), noise=0.001)
    decisions = run(policy, link, settled, limit=2000)
    trials = [d for d in decisions if d.phase == "optimise"]
    state = policy.snapshot()
    assert 3 <= len(trials) <= 4 and trials[0].buffer_bytes == state["low_bytes"] == 62_500
    assert all((d.buffer_bytes - 62_500) % 18_750 == 0 for d in trials)
    assert decisions[-1].buffer_bytes == max(state["trials"], key=lambda o: o[1])[0]


def test_trials_wait_longer_for_deeper_buffers() -> None:
    """The authors' wait: 1 s for a buffer of 10 ms of line rate or less, 3.5 s at 200 ms;
    a bound-search step always waits 1 s."""
    config = P4bsPolicy(make_link(), {}).config
    assert config.settle_for(5_000_000, trial=True) == 1_000_000_000
    assert config.settle_for(200_000_000, trial=True) == 3_500_000_000
    assert config.settle_for(105_000_000, trial=True) == 2_250_000_000
    assert config.settle_for(200_000_000, trial=False) == 1_000_000_000


def test_no_search_starts_before_the_link_is_busy() -> None:
    """Utilisation under min_utilisation (95%): nothing decided; the first busy window
    starts the bound search."""
    policy = P4bsPolicy(make_link(), {})
    link = FakeLink(lambda b: -0.5, lambda b: 0.0, utilisation=0.94)
    assert all(policy.decide(link.window()) == [] for _ in range(100))
    link.utilisation = 0.96
    assert [d.phase for d in policy.decide(link.window())] == ["bound_search"]


def test_a_search_step_fitted_in_fit_processes_is_the_one_fitted_here() -> None:
    """The service fits P4BS's GPs in a pool of spawned processes: a step computed there
    is exactly the one computed in this process, for searches handed out together (each
    process seeds its own generators around a fit, whatever it fitted before)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    def f(buffer: float) -> float:
        return -abs(math.log2(buffer / 300_000))

    specs = [
        SearchSpec(
            62_500,
            1_000_000,
            seed,
            tuple(Observation(b, f(b), 0.01) for b in buffers),
            step,
            None,
        )
        for seed, buffers, step in (
            (1, (62_500, 250_000, 1_000_000), None),
            (2, (100_000, 400_000), None),
            (3, (62_500, 500_000), 18_750),  # the authors' grid, its noise fitted
        )
    ]
    here = [plan(spec) for spec in specs]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        there = list(pool.map(plan, [*specs, *reversed(specs)]))
    assert there == [*here, *reversed(here)]
    assert all(62_500 <= p.suggestion <= 1_000_000 and p.max_ei > 0 for p in here)
