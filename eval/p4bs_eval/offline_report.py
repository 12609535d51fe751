"""The offline evaluation (`p4bs eval offline`): each policy simulated on a cell's surface over
paired seeds (`evaluate`), and what the report and `p4bs eval claims` make of the runs.

Per policy: the whole-run mean f, the mean f after the policy settled and when, and the regret
to the oracle, the best fixed buffer measured in hindsight. Seeds are paired repeats, but they
all draw on the few runs measured per buffer (and move): the intervals of a policy's f and of
a paired difference add the surface's own error (each buffer's or move's standard error
between its runs, in proportion to the share of windows a policy drew from it:
`surface_variance`), which no number of seeds shrinks.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p4bs.config import LinkConfig, MetricsConfig
from p4bs_eval.simulator import LoopTiming, SimRun, simulate
from p4bs_eval.stats import KnownVariance, compare_in_cell, mean_ci
from p4bs_eval.surface import Surface, source_order
from p4bs_optimizer.policies import POLICIES


@dataclass(frozen=True)
class PolicySummary:
    """A policy's simulated runs on one surface."""

    policy: str
    runs: tuple[SimRun, ...]
    oracle: tuple[int, float]  # the best fixed buffer over the same windows, and its f
    surface_se: Mapping[str, float]  # Surface.mean_f_se over the same windows

    @property
    def oracle_f(self) -> float:
        return self.oracle[1]

    @property
    def f_means(self) -> list[float]:
        return [r.f_mean for r in self.runs]

    @property
    def regrets(self) -> list[float]:
        return [self.oracle_f - r.f_mean for r in self.runs]

    @property
    def exposure(self) -> dict[str, float]:
        """The runs' mean share of windows drawn from each source (`source`)."""
        out: dict[str, float] = {}
        for run in self.runs:
            for b, share in run.exposure.items():
                out[b] = out.get(b, 0.0) + share / len(self.runs)
        return out


def surface_variance(
    ours: Mapping[str, float], theirs: Mapping[str, float], se: Mapping[str, float]
) -> float:
    """The variance the surface's own measurement adds to a difference of two policies'
    mean f (`theirs` empty: to one policy's mean f), which seeds cannot show, as they all
    draw on the same few runs per buffer (and move): each source's mean f is known to its
    standard error `se`, and a policy carries it in its share of windows from that source
    (`PolicySummary.exposure`). Two policies on the same sources carry the same error."""
    return sum((ours.get(b, 0.0) - theirs.get(b, 0.0)) ** 2 * e**2 for b, e in se.items())


def surface_variances(
    exposure: Mapping[str, Mapping[str, float]], se: Mapping[str, float]
) -> KnownVariance:
    """(policy, rival) -> the `surface_variance` of their difference, from each policy's
    exposure: what `compare_in_cell` and the claims add to the seeds' variance."""
    return lambda ours, theirs: surface_variance(exposure[ours], exposure[theirs], se)


def evaluate(
    policy: str,
    options: Mapping[str, Any],
    surface: Surface,
    link: LinkConfig,
    metrics: MetricsConfig,
    initial_buffer: int,
    timing: LoopTiming,
    seeds: Sequence[int],
    shrink_burst: float = 0.0,
) -> PolicySummary:
    """A fresh `policy` with `options` per seed; the same seeds give every policy the same
    measured runs (the offline counterpart of paired repeats)."""
    runs = tuple(
        simulate(
            POLICIES[policy](link, options),
            surface,
            link,
            metrics,
            initial_buffer,
            timing,
            s,
            shrink_burst,
        )
        for s in seeds
    )
    skip = timing.warmup_ns // timing.window_ns
    return PolicySummary(policy, runs, surface.oracle(skip), surface.mean_f_se(skip))


def cell_report(
    cell: str, surface: Surface, summaries: Sequence[PolicySummary], rate_bps: int
) -> list[str]:
    """A cell's table: per policy the whole-run f and the regret with their intervals, when
    it settled, f after settling, and its paired difference to the best other policy."""
    best, best_f = summaries[0].oracle
    lines = [
        f"### {cell}",
        "",
        f"Measured buffers: {', '.join(f'{b / 1000:g}' for b in surface.buffers)} kB. Oracle "
        f"(best fixed buffer in hindsight): {best / 1000:g} kB ({best * 8e3 / rate_bps:.1f} ms)"
        f", mean f {best_f:.3f}."
        + (
            " Step runs (the moves measured, kB: runs): "
            + ", ".join(
                f"{a / 1000:g} -> {b / 1000:g}: {len(runs)}"
                for (a, b), runs in sorted(surface.steps.items())
            )
            + "."
            if surface.steps
            else ""
        ),
        "",
        "| policy | runs | whole-run f [95% CI] | regret [95% CI] | settled after, s (median, "
        "runs) | f after settling | against the best other: difference [95% CI] | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_policy = {s.policy: {r.seed: r.f_mean for r in s.runs} for s in summaries}
    exposure, se = {s.policy: s.exposure for s in summaries}, summaries[0].surface_se
    known_variance = surface_variances(exposure, se)
    compared = {c.policy: c for c in compare_in_cell(by_policy, known_variance=known_variance)}
    for s in summaries:
        settled = [r.settled_ns / 1e9 for r in s.runs if r.settled_ns is not None]
        after = [f for r in s.runs if (f := r.f_after_settling) is not None]
        c = compared.get(s.policy)
        versus = f"{c.against}: {c.difference.shown('+.3f')} | {c.verdict}" if c else "- | -"
        settled_s = f"{statistics.median(settled):.1f} ({len(settled)})" if settled else "-"
        after_f = f"{statistics.fmean(after):.3f}" if after else "-"
        f_mean = mean_ci(s.f_means, known_variance=surface_variance(s.exposure, {}, se))
        lines.append(
            f"| {s.policy} | {len(s.runs)} | {f_mean.shown('.3f')} | "
            f"{mean_ci(s.regrets).shown('.3f')} | {settled_s} | {after_f} | {versus} |"
        )
    return lines


def summary_data(cells: Mapping[str, Sequence[PolicySummary]]) -> dict[str, Any]:
    """Per cell the oracle and the surface's standard error per buffer, and per policy each
    seed's whole-run mean f, search time (s) and f after settling, and its mean share of
    windows per buffer: what `p4bs eval claims` reads (`offline.json`)."""

    def seconds(ns: int | None) -> float | None:
        return None if ns is None else ns / 1e9

    out: dict[str, Any] = {}
    for cell, summaries in cells.items():
        best, best_f = summaries[0].oracle
        out[cell] = {
            "oracle": {"buffer_bytes": best, "f": round(best_f, 6)},
            "surface_se": {b: round(e, 6) for b, e in summaries[0].surface_se.items()},
            "policies": {
                s.policy: {
                    "f_mean": {r.seed: round(r.f_mean, 6) for r in s.runs},
                    "exposure": {
                        b: round(x, 6)
                        for b, x in sorted(s.exposure.items(), key=lambda i: source_order(i[0]))
                    },
                    "search_s": {r.seed: seconds(r.search_ns) for r in s.runs},
                    "f_after_settling": {
                        r.seed: None if r.f_after_settling is None else round(r.f_after_settling, 6)
                        for r in s.runs
                    },
                }
                for s in summaries
            },
        }
    return out
