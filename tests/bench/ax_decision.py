"""Benchmark: how long the P4BS policy's search takes to decide, next to what it must fit in.

    .venv/bin/python tests/bench/ax_decision.py [--trials 10] [--repeats 3]

Both searches `BufferSearch` offers: the default, the authors' grid (1.5 ms of line rate at
100 Mbit/s, the GP fitted in numpy: `bayes.GridGP`), and the continuous one on
log(buffer) with Ax (one torch thread). Each repeat makes a search over [BDP / 4, 4 BDP]
warm-started with 3 bound-search points, then plays `--trials` BO trials on a noisy
two-optimum f, timing per trial:
  - tell + suggest: the wrapper's decision (attach the observation, fit the GP, maximise EI);
  - tell + suggest + max EI: what `P4bsPolicy` does when a trial ends (the stopping rule's
    EI over 256 buffers reads the same fit).
Prints p50/p99 over the trials of each repeat, and the median of those over the repeats.
In the same run, the references: the time one window covers (100 ms, flink.window's
default) and how long `P4bsPolicy.decide` takes on an ordinary window, and the budget a
decision has: a trial lasts settle_ns + measure_ns (5 s by default), and the metrics job
emits a window every 100 ms, so a decision slower than a window delays the windows behind
it (the policy catches up, as its time is the windows' event time). Also prints the Ax
import time and the load average, as the numbers scale with a busy machine's load.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from dataclasses import replace

from benchkit import quantiles

from p4bs.config import FlinkConfig, LinkConfig
from p4bs_optimizer.policies.base import Window
from p4bs_optimizer.policies.p4bs import P4bsOptions, P4bsPolicy

BDP = 250_000  # 100 Mbit/s * 20 ms
GRID_STEP_BYTES = 18_750  # the default grid_step_ns, 1.5 ms, at 100 Mbit/s


def f_of(buffer: float) -> float:
    """A broad optimum at 1.4 BDP and a secondary one at BDP / 2, unitless."""
    u = math.log2(buffer / BDP)
    return -1 + 0.8 * math.exp(-((u - 0.5) ** 2) / 1.6) + 0.5 * math.exp(-((u + 1) ** 2) / 0.18)


def one_repeat(trials: int, seed: int, grid: bool) -> tuple[list[float], list[float]]:
    """Seconds of tell + suggest, and of tell + max EI + suggest, per trial."""
    from p4bs_optimizer.policies.bayes import BufferSearch

    rng = random.Random(seed)

    def measured(buffer: int) -> tuple[float, float]:
        return f_of(buffer) + rng.gauss(0, 0.01), 0.01

    warm = [(b, *measured(b)) for b in (BDP, 2 * BDP, 4 * BDP)]
    step = GRID_STEP_BYTES if grid else None
    search = BufferSearch(BDP // 4, 4 * BDP, seed=seed, observations=warm, grid_step_bytes=step)
    decide, policy_like = [], []
    buffer = search.suggest()  # the first fit is not a trial's decision
    for _ in range(trials):
        mean, sem = measured(buffer)
        t0 = time.perf_counter()
        search.tell(buffer, mean, sem)
        buffer = search.suggest()  # fits the GP and maximises EI
        t1 = time.perf_counter()
        search.max_expected_improvement()  # reads the same fit
        t2 = time.perf_counter()
        decide.append(t1 - t0)
        policy_like.append(t2 - t0)
    return decide, policy_like


def ordinary_window_seconds(windows: int) -> float:
    """Median seconds of `P4bsPolicy.decide` on windows that end no step (settling)."""
    link = LinkConfig(
        router="r1",
        interface="eth1",
        switch="s1",
        capacity_bps=100_000_000,
        tap_before="a",
        tap_after="b",
        max_queue_delay_ns=200_000_000,
        max_loss=0.01,
        weight_loss=0.5,
        weight_delay=0.5,
        min_buffer_bytes=10_000,
        max_buffer_bytes=5_000_000,
        safe_buffer_bytes=2_500_000,
        policy="p4bs",
        policy_options={},
    )
    policy = P4bsPolicy(link, {"settle_ns": 10**15})  # never done settling: no Ax
    first = Window(
        link_id=link.id,
        window_start_ns=1_700_000_000 * 10**9,
        window_end_ns=1_700_000_000 * 10**9 + 100_000_000,
        rtt_samples=100,
        rtt_flows=10,
        rtt_hmean_ns=20_000_000,
        srtt_ns=20_000_000,
        rtt_min_ns=20_000_000,
        long_flows=10,
        data_packets=1000,
        retransmissions=5,
        loss_rate=0.005,
        loss_rate_ewma=0.005,
        queue_delay_samples=100,
        queue_delay_ns=1_000_000,
        queue_delay_ewma_ns=1_000_000,
        throughput_bps=100_000_000,
        utilisation=1.0,
        f=-0.3,
        zscore=0.0,
        change=False,
        buffer_bytes=BDP,
    )
    policy.decide(first)  # starts the bound search at the BDP, in force from then on
    times = []
    for i in range(1, windows + 1):
        shift = i * 100_000_000
        window = replace(
            first,
            window_start_ns=first.window_start_ns + shift,
            window_end_ns=first.window_end_ns + shift,
        )
        t0 = time.perf_counter()
        policy.decide(window)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_policy_decision(trials: int) -> None:
    """The P4BS policy's decision at a trial's end with its default search (the authors'
    grid), as tests/bench/optimizer_service.py adds it to the reaction path."""
    _, policy_like = one_repeat(trials, seed=0, grid=True)
    p50, p99 = quantiles(policy_like)
    options = P4bsOptions()
    print(
        f"  P4BS decision at a trial's end (tell + fit + EI + max EI; ax_decision.py, {trials} "
        f"trials): p50 {p50 * 1e3:.1f} ms p99 {p99 * 1e3:.1f} ms, on top of settle_ns + "
        f"measure_ns = {(options.settle_ns + options.measure_ns) / 1e9:g} s per trial",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="BO trials per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    t0 = time.perf_counter()
    from p4bs_optimizer.policies import bayes

    bayes.BufferSearch(1, 2)  # imports Ax, torch and BoTorch
    import_s = time.perf_counter() - t0

    window_s = FlinkConfig().window_ns / 1e9
    options = P4bsOptions()
    trial_s = (options.settle_ns + options.measure_ns) / 1e9
    print(f"P4BS decision latency, {args.repeats} repeats x {args.trials} trials")
    print("(3 warm-start points + up to the trials; medians over the repeats)")
    whole_p50 = {}
    for search, grid in (("grid, numpy GP (default)", True), ("continuous, Ax", False)):
        runs = [one_repeat(args.trials, seed, grid) for seed in range(args.repeats)]
        print(f"  {search}:")
        for name, stats in (
            ("tell + suggest", [quantiles(d) for d, _ in runs]),
            ("tell + suggest + max EI", [quantiles(p) for _, p in runs]),
        ):
            p50 = whole_p50[search] = statistics.median(p for p, _ in stats)
            p99 = statistics.median(p for _, p in stats)
            print(f"    {name:<24} p50 {p50 * 1e3:7.1f} ms   p99 {p99 * 1e3:7.1f} ms")
    print("references, same run:")
    print(f"  one metrics window          {window_s * 1e3:7.1f} ms (flink.window default)")
    print(f"  decide() on other windows   {ordinary_window_seconds(200) * 1e6:7.1f} us (median)")
    print(f"  one trial (settle+measure)  {trial_s * 1e3:7.1f} ms: a decision takes")
    for search, p50 in whole_p50.items():
        print(f"    {p50 / window_s:.2f} windows, {p50 / trial_s:.2%} of a trial ({search})")
    print(f"  Ax import                   {import_s * 1e3:7.1f} ms (once per process)")
    print(f"  load average                {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
