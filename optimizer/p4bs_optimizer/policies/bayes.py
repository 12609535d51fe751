"""Bayesian optimisation of one buffer size: a Gaussian process with an RBF kernel and
Expected Improvement, as in P4BS (TNSM 2023, §V-B, Algorithm 2).

`BufferSearch` searches one float parameter, the buffer in bytes, within [low, high]; it
maximises the performance function f (unitless, <= 0, higher is better). It is told
observations as (buffer bytes, mean f, standard error of that mean), suggests the next buffer
in whole bytes, and exposes the GP posterior and the EI over a grid so that both can be
plotted (P4BS Fig. 7) and the search stopped when the EI is small (Algorithm 2).

Two ways to search, as the policy asks:
- continuous (the default): x = log(buffer), the EI maximised by BoTorch's optimiser, the
  told SEM as each observation's fixed noise, the first suggestion the geometric middle;
- on a grid (`grid_step_bytes`), as the authors' controller (github.com/ekfoury/p4bs-bo):
  x = buffer, linear; the EI's argmax among low, low + step, ... below high; the first
  suggestion the grid's first point (with no data the EI is infinite everywhere). The GP
  is theirs: an RBF kernel of amplitude 1 on f as measured (not standardised), its length
  scale fitted; its noise is fitted too, by maximum likelihood as the paper's Eq. 11 says,
  or fixed (`noise_variance`) as the controller does; the SEMs are kept for the record.
  Its candidates are a grid, so no acquisition optimiser is needed, and a GP with two
  hyperparameters on a handful of points is a few milliseconds of numpy (`GridGP`) where
  Ax took ~100 ms: it is the model Ax fitted for this search before (BoTorch's exact
  marginal likelihood with its default noise prior, optimised by L-BFGS-B from BoTorch's
  initial values), and a test holds the two to the same suggestions.

The continuous search keeps its observations in one Ax `Client` (one completed single-arm
trial each). Every fit starts from a new generation strategy, so from freshly initialised
GP hyperparameters, and candidates are generated under the search's seed without becoming
trials (no pending points). Either search is therefore a pure function of (bounds, seed,
observations in order): one rebuilt from persisted observations (warm start) suggests
exactly what the original would have, which is what lets a restarted optimizer resume
mid-search.

Ax and torch take seconds to import: only this module imports them, and only when the first
continuous `BufferSearch` is made, so importing the policies stays fast.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ax.api.client import Client
    from ax.generation_strategy.generation_strategy import GenerationStrategy

PARAMETER = "buffer"
OBJECTIVE = "f"
GRID_POINTS = 256  # log-spaced buffers on which the EI's maximum is taken
# Raw samples and restarts of the acquisition optimiser. One dimension needs far fewer than
# Ax's defaults (1024 and 20, sized for many dimensions): 128 points cover [low, high] at
# 1/128 of its log range, and L-BFGS refines the best 8.
RAW_SAMPLES = 128
RESTARTS = 8
# The acquisition functions P4BS compares (Fig. 10): BoTorch's analytic ones, by name. EI is
# the policy's (its stopping rule needs it); UCB takes BoTorch's default beta (0.2).
ACQUISITIONS = ("ei", "ucb", "pi")
# BoTorch's defaults for a GP that infers its noise (botorch.models.utils.gpytorch_modules,
# get_gaussian_likelihood_with_lognormal_prior): a LogNormal(-4, 1) prior on the noise
# variance, which is at least 1e-4 and starts at the prior's mode.
NOISE_PRIOR_LOC = -4.0
NOISE_PRIOR_SCALE = 1.0
NOISE_PRIOR_MODE = math.exp(NOISE_PRIOR_LOC - NOISE_PRIOR_SCALE**2)
MIN_NOISE_VARIANCE = 1e-4
# What gpytorch adds to the diagonal, in turn, when K is not numerically positive definite
# (a fixed noise near 0 and two trials at one buffer).
CHOLESKY_JITTERS = (0.0, 1e-8, 1e-7, 1e-6)


class Observation(NamedTuple):
    """f measured at one buffer: the mean over a trial's windows and its standard error."""

    buffer_bytes: int
    mean: float
    sem: float


def load_ax() -> None:
    """Sets up torch and Ax's logging before a search first uses them. Imported here, not at
    the top: Ax and torch take seconds to import, and a process that only imports the
    policies should not pay for that. A service calls it ahead of the first search (see
    `warm_up`); it is cheap once done."""
    import ax.adapter.transforms.standardize_y
    import ax.api.client
    import torch

    # The policy runs one search per link in a service that handles many links; a fit is a
    # small sequential computation, and more threads only contend with other links' work.
    torch.set_num_threads(1)
    # Ax logs every attached trial at INFO and warns that f is constant when one observation
    # is all there is; the policy's decisions already say what the search did. (Ax sets its
    # loggers' levels when their modules are imported, hence after the imports.)
    for module in (ax.api.client, ax.adapter.transforms.standardize_y):
        logging.getLogger(module.__name__).setLevel(logging.ERROR)


def _generation_strategy(acquisition: str = "ei") -> GenerationStrategy:
    """One node, GP + EI from the first trial on (no quasi-random initialisation: the bound
    search's measurements warm-start the GP, and `BufferSearch` picks the first point itself
    when there is none).

    What makes it RBF + EI rather than Ax's defaults:
    - `SingleTaskGP` with `covar_module_class=ScaleKernel` around a plain `RBFKernel`: the
      paper's K(x, x') = a * exp(-|x - x'|^2 / 2b^2), a = the scale kernel's outputscale,
      b = the RBF lengthscale, both fitted by maximum likelihood (Eq. 11). Ax's default
      would pick its own kernel and priors.
    - Observation noise: the SEM told with each observation is the GP's fixed noise (the
      sigma^2 the paper adds on the diagonal).
    - `botorch_acqf_class=ExpectedImprovement`, BoTorch's analytic EI (Eq. 13) with the best
      observed mean as the incumbent. Ax's default would be qLogNoisyExpectedImprovement
      (Monte-Carlo, log scale); we want EI itself, for the stopping rule and Fig. 7.
      (`acquisition` "ucb" or "pi" puts UpperConfidenceBound or ProbabilityOfImprovement
      there instead, for the comparison of Fig. 10.)
    - Transforms: Ax's continuous-parameter ones (among them Log, so the GP works in
      log(buffer), scaled to [0, 1] inside the model) and StandardizeY only. Ax's default
      Y transforms also winsorize the objective, which would clip the poor end of f that
      the GP should see.
    """
    from ax.adapter.registry import Generators, MBM_X_trans
    from ax.adapter.transforms.standardize_y import StandardizeY
    from ax.generation_strategy.generation_node import GenerationNode
    from ax.generation_strategy.generation_strategy import GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generators.torch.botorch_modular.surrogate import SurrogateSpec
    from ax.generators.torch.botorch_modular.utils import ModelConfig
    from botorch.acquisition.analytic import (
        ExpectedImprovement,
        ProbabilityOfImprovement,
        UpperConfidenceBound,
    )
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import RBFKernel, ScaleKernel  # type: ignore[import-untyped]

    model = ModelConfig(
        botorch_model_class=SingleTaskGP,
        covar_module_class=ScaleKernel,
        # A new RBFKernel per strategy: the fitted hyperparameters live in the module,
        # and a shared one would carry them into the next fit and break determinism.
        covar_module_options={"base_kernel": RBFKernel()},
    )
    spec = GeneratorSpec(
        generator_enum=Generators.BOTORCH_MODULAR,
        generator_kwargs={
            "surrogate_spec": SurrogateSpec(model_configs=[model]),
            "botorch_acqf_class": {
                "ei": ExpectedImprovement,
                "ucb": UpperConfidenceBound,
                "pi": ProbabilityOfImprovement,
            }[acquisition],
            "transforms": [*MBM_X_trans, StandardizeY],
        },
        generator_gen_kwargs={
            "model_gen_options": {
                "optimizer_kwargs": {"raw_samples": RAW_SAMPLES, "num_restarts": RESTARTS}
            }
        },
    )
    return GenerationStrategy(
        name="p4bs_gp_rbf_ei", nodes=[GenerationNode(name="gp_rbf_ei", generator_specs=[spec])]
    )


class GridGP:
    """The GP of the authors' controller, on the grid search's x: the buffer scaled to [0, 1]
    over the search's bounds, and f as measured. Zero prior mean (sklearn's, which makes
    every unexplored buffer look better than f <= 0 measured anywhere, so the search
    explores) and an RBF kernel of amplitude 1, k(x, x') = exp(-(x - x')^2 / 2b^2): fitted
    to one or two points, an amplitude would collapse and the EI with it; 1, large against
    f's variation, keeps the EI open until the grid is covered, as the authors' search does.

    The length scale b, and the noise variance unless fixed, maximise the marginal
    likelihood times BoTorch's default noise prior, as BoTorch's `fit_gpytorch_mll` did
    when Ax fitted this model: b = softplus(r) from r = 0, the noise variance at least
    `MIN_NOISE_VARIANCE` from the prior's mode, L-BFGS-B on the log posterior over the
    number of points."""

    def __init__(self, x: Sequence[float], f: Sequence[float], noise_variance: float | None):
        import numpy as np
        from scipy.optimize import minimize

        self._x = np.asarray(x, dtype=float)
        f_measured = np.asarray(f, dtype=float)
        squared = (self._x[:, None] - self._x[None, :]) ** 2
        count = len(self._x)

        def fitted(raw_length: float, noise: float) -> tuple[Any, Any, Any, Any, Any]:
            """The RBF's scaled squared distances and values, the Cholesky factor L of K,
            K^-1 and K^-1 f. A handful of points: numpy's own routines, as scipy's wrappers
            took most of a fit's time."""
            scaled, kernel = _rbf(squared, _softplus(raw_length))
            for jitter in CHOLESKY_JITTERS:
                covariance = kernel.copy()
                covariance[np.diag_indices(count)] += noise + jitter
                try:
                    lower = np.linalg.cholesky(covariance)
                    break
                except np.linalg.LinAlgError:
                    if jitter == CHOLESKY_JITTERS[-1]:
                        raise
            lower_inverse = np.linalg.inv(lower)
            inverse = lower_inverse.T @ lower_inverse
            return scaled, kernel, lower, inverse, inverse @ f_measured

        def loss(theta: Any) -> tuple[float, Any]:
            """Minus the log posterior over the number of points, and its gradient in
            (r, noise): d log p(f) / d theta = tr((alpha alpha' - K^-1) dK / d theta) / 2,
            with dK / db = K * d^2 / b^3 and db / dr = sigmoid(r)."""
            raw_length = float(theta[0])
            noise = float(theta[1]) if noise_variance is None else noise_variance
            scaled, kernel, lower, inverse, alpha = fitted(raw_length, noise)
            value = (
                -0.5 * float(f_measured @ alpha)
                - float(np.log(np.diag(lower)).sum())
                - 0.5 * count * math.log(2 * math.pi)
            )
            inner = np.outer(alpha, alpha) - inverse
            # Where the kernel has fallen to 0 its derivative has too (inf * 0 otherwise).
            slope = kernel * np.where(kernel > 0, scaled, 0.0)
            # sigmoid(r) / softplus(r), which tends to 1 as r falls (both are e^r there).
            if raw_length < -30:
                per_length = 1.0
            else:
                per_length = 1 / (1 + math.exp(-raw_length)) / _softplus(raw_length)
            gradient = [0.5 * float(np.sum(inner * slope)) * per_length]
            if noise_variance is None:
                value += _log_noise_prior(noise)
                d_prior = -(1 + (math.log(noise) - NOISE_PRIOR_LOC) / NOISE_PRIOR_SCALE**2) / noise
                gradient.append(0.5 * float(np.trace(inner)) + d_prior)
            return -value / count, -np.asarray(gradient) / count

        if noise_variance is None:
            start, bounds = [0.0, NOISE_PRIOR_MODE], [(None, None), (MIN_NOISE_VARIANCE, None)]
        else:
            start, bounds = [0.0], [(None, None)]
        best = minimize(loss, start, jac=True, method="L-BFGS-B", bounds=bounds).x
        self.length_scale = _softplus(float(best[0]))
        self.noise_variance = float(best[1]) if noise_variance is None else noise_variance
        _, _, _, self._inverse, self._alpha = fitted(float(best[0]), self.noise_variance)

    def posterior(self, x: Sequence[float]) -> tuple[list[float], list[float]]:
        """Mean and standard deviation of the latent f at `x` (without the noise)."""
        import numpy as np

        at = np.asarray(x, dtype=float)
        _, cross = _rbf((at[:, None] - self._x[None, :]) ** 2, self.length_scale)
        variance = 1.0 - np.einsum("ij,ji->i", cross, self._inverse @ cross.T)
        return (cross @ self._alpha).tolist(), np.sqrt(np.clip(variance, 0.0, None)).tolist()


def _rbf(squared_distances: Any, length: float) -> tuple[Any, Any]:
    """d^2 / length^2 and exp(-d^2 / 2 length^2), 1 at distance 0 and 0 elsewhere however
    short the length scale (as gpytorch computes it, from x / length)."""
    import numpy as np

    with np.errstate(divide="ignore", over="ignore"):
        scaled = np.divide(
            squared_distances,
            length**2,
            out=np.zeros_like(squared_distances),
            where=squared_distances > 0,
        )
    return scaled, np.exp(-0.5 * scaled)


def _softplus(raw: float) -> float:
    return raw + math.log1p(math.exp(-raw)) if raw > 0 else math.log1p(math.exp(raw))


def _log_noise_prior(variance: float) -> float:
    """log density of BoTorch's LogNormal prior on the noise variance."""
    z = (math.log(variance) - NOISE_PRIOR_LOC) / NOISE_PRIOR_SCALE
    return -math.log(variance * NOISE_PRIOR_SCALE * math.sqrt(2 * math.pi)) - 0.5 * z * z


class BufferSearch:
    """GP (RBF kernel) + Expected Improvement over the buffer in [low_bytes, high_bytes],
    maximising f, continuous on log(buffer) (Ax) or on a linear grid (`GridGP`).
    Deterministic for a given seed and set of observations."""

    def __init__(
        self,
        low_bytes: int,
        high_bytes: int,
        *,
        seed: int = 0,
        observations: Iterable[Observation] = (),
        acquisition: str = "ei",
        grid_step_bytes: int | None = None,
        noise_variance: float | None = None,
    ) -> None:
        if not 0 < low_bytes < high_bytes:
            raise ValueError(f"bounds must satisfy 0 < low < high, got [{low_bytes}, {high_bytes}]")
        if acquisition not in ACQUISITIONS:
            raise ValueError(f"acquisition {acquisition!r}: one of {', '.join(ACQUISITIONS)}")
        if grid_step_bytes is not None and grid_step_bytes <= 0:
            raise ValueError(f"grid step must be positive, got {grid_step_bytes}")
        self.acquisition = acquisition
        self.low_bytes = low_bytes
        self.high_bytes = high_bytes
        self.seed = seed
        self.grid_step_bytes = grid_step_bytes
        self.noise_variance = noise_variance
        self._observations: list[Observation] = []
        self._suggestion: int | None = None  # the EI maximiser for the current observations
        self._grid_gp: GridGP | None = None  # fitted to the current observations
        self._client: Client | None = None
        if grid_step_bytes is None:
            self._client = self._ax_client()
        for obs in observations:
            self.tell(*obs)

    def _ax_client(self) -> Client:
        """The continuous search's Ax experiment: the buffer on a log scale."""
        load_ax()
        from ax.api.client import Client
        from ax.api.configs import RangeParameterConfig

        client = Client(random_seed=self.seed)
        client.configure_experiment(
            parameters=[
                RangeParameterConfig(
                    name=PARAMETER,
                    bounds=(float(self.low_bytes), float(self.high_bytes)),
                    parameter_type="float",
                    scaling="log",
                )
            ]
        )
        client.configure_optimization(objective=OBJECTIVE)
        return client

    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._observations)

    def tell(self, buffer_bytes: int, mean: float, sem: float) -> None:
        """Adds f measured at `buffer_bytes`: its mean and standard error (unitless)."""
        if not self.low_bytes <= buffer_bytes <= self.high_bytes:
            raise ValueError(
                f"buffer {buffer_bytes} B is outside [{self.low_bytes}, {self.high_bytes}] B"
            )
        if not (math.isfinite(mean) and math.isfinite(sem) and sem >= 0):
            raise ValueError(f"need a finite mean and a finite SEM >= 0, got {mean}, {sem}")
        obs = Observation(int(buffer_bytes), float(mean), float(sem))
        if self._client is not None:
            index = self._client.attach_trial({PARAMETER: float(obs.buffer_bytes)})
            self._client.complete_trial(index, {OBJECTIVE: (obs.mean, obs.sem)})
        self._observations.append(obs)
        self._suggestion = None
        self._grid_gp = None

    def best(self) -> Observation:
        """The observation with the highest mean f (the paper's x*)."""
        if not self._observations:
            raise ValueError("no observations yet")
        return max(self._observations, key=lambda o: o.mean)

    def suggest(self) -> int:
        """The next buffer to try, bytes: the maximiser of EI (on the grid when searching
        one), or with no observation yet the geometric middle of the bounds (the grid's
        first point)."""
        if self.grid_step_bytes is not None:
            if not self._observations:
                return self.low_bytes
            grid = self.grid()
            ei = self.expected_improvement(grid)
            return round(grid[max(range(len(grid)), key=ei.__getitem__)])
        if not self._observations:
            return round(math.sqrt(self.low_bytes * self.high_bytes))
        return self._fit()

    def grid(self, points: int = GRID_POINTS) -> list[float]:
        """The candidates, bytes: with a grid step, low, low + step, ... below high (the
        authors' grid, high excluded); otherwise `points` buffers evenly spaced in
        log(buffer) from low to high, both included."""
        if self.grid_step_bytes is not None:
            step = self.grid_step_bytes
            count = max(1, math.ceil((self.high_bytes - self.low_bytes) / step))
            return [float(self.low_bytes + i * step) for i in range(count)]
        ratio = self.high_bytes / self.low_bytes
        inner = [self.low_bytes * ratio ** (i / (points - 1)) for i in range(1, points - 1)]
        return [float(self.low_bytes), *inner, float(self.high_bytes)]  # ends exact: Ax checks

    def posterior(self, buffers: Sequence[float]) -> tuple[list[float], list[float]]:
        """The GP posterior of f at `buffers` (bytes): mean and standard deviation of the
        latent f (without the observation noise), in units of f."""
        if self._client is None:
            return self._fitted_grid_gp().posterior([self._unit(b) for b in buffers])
        self._fit()
        predictions = self._client.predict([{PARAMETER: float(b)} for b in buffers])
        means = [float(p[OBJECTIVE][0]) for p in predictions]
        stds = [float(p[OBJECTIVE][1]) for p in predictions]
        return means, stds

    def expected_improvement(self, buffers: Sequence[float]) -> list[float]:
        """EI at `buffers` (bytes) over the best observed mean, in units of f: the
        acquisition Ax maximises, up to Ax's standardisation of f (a constant factor)."""
        means, stds = self.posterior(buffers)
        best = self.best().mean
        return [_expected_improvement(m - best, s) for m, s in zip(means, stds, strict=True)]

    def max_expected_improvement(self, points: int = GRID_POINTS) -> float:
        """The largest EI on `grid(points)` (the grid, when searching one), units of f;
        infinite with no observation."""
        if not self._observations:
            return math.inf
        return max(self.expected_improvement(self.grid(points)))

    def _unit(self, buffer_bytes: float) -> float:
        """The grid GP's x: the buffer scaled to [0, 1] over the bounds."""
        return (buffer_bytes - self.low_bytes) / (self.high_bytes - self.low_bytes)

    def _fitted_grid_gp(self) -> GridGP:
        if not self._observations:
            raise ValueError("no observations yet")
        if self._grid_gp is None:
            self._grid_gp = GridGP(
                [self._unit(o.buffer_bytes) for o in self._observations],
                [o.mean for o in self._observations],
                self.noise_variance,
            )
        return self._grid_gp

    def _fit(self) -> int:
        """Fits the continuous search's GP to the observations and returns the EI
        maximiser, bytes; once per set of observations (`posterior` reads the same fitted
        model)."""
        if not self._observations:
            raise ValueError("no observations yet")
        assert self._client is not None
        if self._suggestion is None:
            from ax.utils.common.random import with_rng_seed

            strategy = _generation_strategy(self.acquisition)
            self._client.set_generation_strategy(strategy)
            with warnings.catch_warnings(), with_rng_seed(self.seed):
                # BoTorch recommends log-EI for its numerics in high dimensions; in one
                # dimension the optimiser's raw samples cover EI's flat parts.
                warnings.filterwarnings("ignore", message=".*ExpectedImprovement has known")
                run = strategy.gen_single_trial(experiment=strategy.experiment)
            value = run.arms[0].parameters[PARAMETER]
            assert isinstance(value, float)
            self._suggestion = min(max(round(value), self.low_bytes), self.high_bytes)
        return self._suggestion


class SearchSpec(NamedTuple):
    """Everything a search's next step depends on (a search is a pure function of it), in a
    form another process can be handed."""

    low_bytes: int
    high_bytes: int
    seed: int
    observations: tuple[Observation, ...]
    grid_step_bytes: int | None
    noise_variance: float | None


class Plan(NamedTuple):
    """A search's next step: the largest EI over the grid (infinite with no observation)
    and the buffer EI suggests next, bytes."""

    max_ei: float
    suggestion: int


def plan(spec: SearchSpec) -> Plan:
    """Fits the search `spec` describes and returns its next step. Deterministic: the same
    spec gives the same plan in any process, whatever ran there before (the fit is seeded)."""
    search = BufferSearch(
        spec.low_bytes,
        spec.high_bytes,
        seed=spec.seed,
        observations=spec.observations,
        grid_step_bytes=spec.grid_step_bytes,
        noise_variance=spec.noise_variance,
    )
    return Plan(search.max_expected_improvement(), search.suggest())


def warm_up(grid_step_bytes: int | None = None) -> float:
    """Fits a throwaway search of the kind `grid_step_bytes` says (None: continuous, with Ax
    and torch; a grid: numpy and scipy's optimiser) on two made-up points, so that a link's
    first real fit does not pay for the imports, which take far longer than a fit: unwarmed,
    that first fit holds the link's windows (and, for a grid search decided on the service's
    loop, every link) and keeps P4BS's first trial longer than the simulator gives it
    (optimizer/README.md has the measurements). Returns the seconds it took."""
    began = time.monotonic()
    search = BufferSearch(1_000, 100_000, grid_step_bytes=grid_step_bytes)
    search.tell(10_000, -1.0, 0.1)
    search.tell(50_000, -2.0, 0.1)
    search.suggest()
    return time.monotonic() - began


def _expected_improvement(gain: float, std: float) -> float:
    """E[max(0, f - best)] for f ~ N(best + gain, std^2): gain * Phi(z) + std * phi(z)."""
    if std <= 0:
        return max(gain, 0.0)
    z = gain / std
    cdf = 0.5 * math.erfc(-z / math.sqrt(2))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return gain * cdf + std * pdf
