"""P4BS Fig. 10: Bayesian optimisation's convergence with EI, UCB and PI (`p4bs eval
acquisition`). Each acquisition function searches the same f(buffer) curves for a fixed
number of iterations, without a stopping rule; reported per iteration, averaged over the
seeds: the cumulative regret R_T = sum over t of f(x*) - f(x_t) (true, noise-free f) and
the best f attained (true f at the best observed buffer). EI's stopping rule (max EI <=
the policy's `ei_stop`, once it has had `min_trials` trials, defaults) is noted where it
would have stopped.

The curves, one per seed, are shaped like P4BS Fig. 18 (a broad optimum, a narrower local
one, a tilt for the delay of large buffers), over [BDP/4, 4 BDP]; each observation is f plus
Gaussian noise of the SEM of a trial's mean over 30 windows. Or (`--curve RUN_DIR`) the
curve is the f measured on the testbed by a run over a sweep of fixed buffers (the
`p4bs-fig17` scenario): mean f per buffer, linear in log(buffer) in between, over the swept
range, with the noise of a trial's mean of the policy's measured windows as measured there;
the seeds then vary the noise and the search's seed. The paper measured its Fig. 10 live on
its testbed with 100 Cubic flows.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p4bs.progress import Progress
from p4bs_optimizer.policies.bayes import ACQUISITIONS, BufferSearch
from p4bs_optimizer.policies.p4bs import P4bsOptions

BDP_BYTES = 250_000  # 100 Mbit/s x 20 ms
WINDOW_NOISE = 0.05  # standard deviation of one window's f
TRIAL_WINDOWS = 30
RULE = P4bsOptions()  # the policy's stopping rule: ei_stop, min_trials


def two_optima(
    main: float, width: float, secondary: float, height: float
) -> Callable[[float], float]:
    """f(u): a bump of 0.8 and `width` (standard deviation, octaves) at `main`, one of
    0.8 * `height` and 0.3 octaves at `secondary`, on -1 - 0.1 u."""

    def f(u: float) -> float:
        return (
            -1.0
            + 0.8 * math.exp(-((u - main) ** 2) / (2 * width**2))
            + 0.8 * height * math.exp(-((u - secondary) ** 2) / (2 * 0.3**2))
            - 0.1 * u
        )

    return f


def fig18_curve(rng: random.Random, bdp_bytes: int = BDP_BYTES) -> Callable[[int], float]:
    """f against the buffer shaped like P4BS Fig. 18: in u = log2(buffer / BDP) over the
    search bounds [-2, 2], a broad optimum, a narrower secondary local optimum 1.2-1.8
    octaves away, and a downward tilt for the queueing delay of large buffers; f is about
    -1 ... 0. Parameters are drawn again until the broad optimum is the global one and the
    secondary one is a separate local maximum."""
    us = [-2 + i / 100 for i in range(401)]
    while True:
        main = rng.uniform(-1.2, 1.2)
        distance = rng.uniform(1.2, 1.8)
        secondary = main - distance if main >= 0 else main + distance
        f_of_u = two_optima(main, rng.uniform(0.8, 1.0), secondary, rng.uniform(0.5, 0.8))
        values = [f_of_u(u) for u in us]
        peaks = [us[i] for i in range(1, 400) if values[i - 1] < values[i] >= values[i + 1]]
        best = us[values.index(max(values))]
        if len(peaks) == 2 and abs(best - main) < 0.5:
            return lambda buffer: f_of_u(math.log2(buffer / bdp_bytes))


class CurveError(ValueError):
    """A run folder that holds no measured curve; the message says what is missing."""


@dataclass(frozen=True)
class Curve:
    """A true f(buffer) over [low, high] bytes and the noise (SEM) of a trial's mean."""

    f: Callable[[int], float]
    low_bytes: int
    high_bytes: int
    sem: float
    knots: tuple[int, ...] = ()  # buffers where f is known exactly (its maximum is at one)


def synthetic_curve(seed: int) -> Curve:
    return Curve(
        fig18_curve(random.Random(seed)),
        BDP_BYTES // 4,
        4 * BDP_BYTES,
        WINDOW_NOISE / math.sqrt(TRIAL_WINDOWS),
    )


def measured_curve(run_dir: Path) -> Curve:
    """f as measured by a run over fixed buffers (a `buffer` sweep): the mean over the runs at
    each buffer, linear in log(buffer) in between. The noise is one window's spread there
    (median over the runs) over the windows a P4BS trial measures."""
    from p4bs_eval.report import load_results

    _, rows = load_results(run_dir)
    at: dict[int, list[float]] = {}
    spreads, windows_ns = [], []
    for row in rows:
        if "error" in row or "buffer" not in row.get("values", {}) or row["f_mean"] is None:
            continue
        buffer = round(row["rate_bps"] / 8 * row["values"]["buffer"] / 1e9)
        at.setdefault(buffer, []).append(row["f_mean"])
        spreads.append(row["f_std"])
        windows_ns.append(row["window_ns"])
    if len(at) < 3:
        raise CurveError(
            f"{run_dir}: f measured at {len(at)} buffer(s) of a `buffer` sweep; a curve needs "
            "3 or more (run the p4bs-fig17 scenario)"
        )
    points = sorted((math.log(b), statistics.fmean(fs)) for b, fs in at.items())
    trial_windows = max(2, round(RULE.measure_ns / statistics.median(windows_ns)))

    def f(buffer: int) -> float:
        u = math.log(buffer)
        for (u0, f0), (u1, f1) in itertools.pairwise(points):
            if u <= u1:
                return f0 + (f1 - f0) * max(0.0, u - u0) / (u1 - u0)
        return points[-1][1]

    sem = statistics.median(spreads) / math.sqrt(trial_windows)
    return Curve(f, min(at), max(at), sem, tuple(sorted(at)))


def search_trace(curve: Curve, acquisition: str, seed: int, iterations: int) -> dict[str, Any]:
    """One search: per iteration the buffer, its true f, the best true f attained, the
    cumulative regret and (EI) whether the stopping rule would have stopped before it."""
    low, high, sem = curve.low_bytes, curve.high_bytes, curve.sem
    grid = [round(low * (high / low) ** (i / 399)) for i in range(400)]
    f_best = max(curve.f(b) for b in [*grid, *curve.knots])
    noise = random.Random(seed + 10_000)
    search = BufferSearch(low, high, seed=seed, acquisition=acquisition)
    regret, trace, stopped_at = 0.0, [], None
    for t in range(1, iterations + 1):
        if (
            acquisition == "ei"
            and stopped_at is None
            and t > RULE.min_trials
            and search.max_expected_improvement() <= RULE.ei_stop
        ):
            stopped_at = t - 1
        buffer = search.suggest()
        true_f = curve.f(buffer)
        search.tell(buffer, true_f + noise.gauss(0, sem), sem)
        regret += f_best - true_f
        trace.append(
            {
                "t": t,
                "buffer_bytes": buffer,
                "f": true_f,
                "best_f": curve.f(search.best().buffer_bytes),
                "regret": regret,
            }
        )
    return {"acquisition": acquisition, "seed": seed, "f_opt": f_best, "ei_stop": stopped_at,
            "trace": trace}  # fmt: skip


def run_acquisitions(out: Path, seeds: int, iterations: int, measured: Path | None = None) -> Path:
    """Every acquisition function on every seed's curve (`measured`: the run folder's
    measured curve for all seeds), then the report."""
    out.mkdir(parents=True, exist_ok=True)
    curve = measured_curve(measured) if measured else None
    runs = []
    # A search's time is a few seconds of fits; the first one measured sets the pace.
    progress = Progress(seeds * len(ACQUISITIONS), first_guess_s=5.0)
    for seed in range(seeds):
        for acquisition in ACQUISITIONS:
            began = time.monotonic()
            runs.append(search_trace(curve or synthetic_curve(seed), acquisition, seed, iterations))
            progress.finished(time.monotonic() - began)
            progress.show(
                f"{acquisition} seed {seed}: R_T {runs[-1]['trace'][-1]['regret']:.2f}",
                elapsed_s=0.0,
                final=True,
            )
    source = f"the f measured in {measured}" if measured else "seeded Fig. 18-shaped curves"
    (out / "acquisition.json").write_text(json.dumps({"curves": source, "runs": runs}) + "\n")
    return write_acquisition_report(out)


def write_acquisition_report(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved = json.loads((out / "acquisition.json").read_text())
    runs, source = saved["runs"], saved["curves"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    lines = [
        "# P4BS Fig. 10: convergence of EI, UCB and PI",
        "",
        f"{len(runs) // len(ACQUISITIONS)} seeds on {source}, "
        f"{len(runs[0]['trace'])} iterations each, means over the seeds.",
        "",
        "| acquisition | R_T at 8 | R_T at the end | best f gap at 8 | best f gap at the end "
        "| iterations to within 5% |",
        "|---|---|---|---|---|---|",
    ]
    for acquisition in ACQUISITIONS:
        mine = [r for r in runs if r["acquisition"] == acquisition]
        steps = len(mine[0]["trace"])
        regret = [statistics.fmean(r["trace"][t]["regret"] for r in mine) for t in range(steps)]
        gap = [
            statistics.fmean(r["f_opt"] - r["trace"][t]["best_f"] for r in mine)
            for t in range(steps)
        ]
        within = [
            next((s["t"] for s in r["trace"] if r["f_opt"] - s["best_f"] <= 0.05), None)
            for r in mine
        ]
        found = [w for w in within if w is not None]
        reach = f"median {statistics.median(found):g} ({len(found)}/{len(mine)})" if found else "-"
        at8 = min(8, steps) - 1
        lines.append(
            f"| {acquisition.upper()} | {regret[at8]:.2f} | {regret[-1]:.2f} | {gap[at8]:.3f} "
            f"| {gap[-1]:.3f} | {reach} |"
        )
        xs = list(range(1, steps + 1))
        left.plot(xs, regret, label=acquisition.upper())
        right.plot(xs, [-g for g in gap], label=acquisition.upper())
    stops = [r["ei_stop"] for r in runs if r["acquisition"] == "ei" and r["ei_stop"]]
    if stops:
        lines += ["", f"EI's stopping rule would have stopped after {statistics.median(stops):g}"
                  f" iterations (median; {len(stops)} of the EI runs stopped)."]  # fmt: skip
    left.set_xlabel("iteration")
    left.set_ylabel("cumulative regret R_T")
    right.set_xlabel("iteration")
    right.set_ylabel("best f attained - f(x*)")
    for ax in (left, right):
        ax.legend()
    fig.suptitle(f"P4BS Fig. 10 on {source}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "acquisition.png", dpi=100)
    plt.close(fig)
    lines += ["", "![acquisition](acquisition.png)"]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
