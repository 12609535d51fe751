"""`p4bs eval report RUN_DIR`: report.md and PNG plots, regenerated from a run folder alone
(scenario.json, results.jsonl and each run's files)."""

from __future__ import annotations

import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from p4bs_eval.stats import compare_in_cell, mean_ci
from p4bs_infra.traffic import percentile

# The table's columns: key in results.jsonl, heading, scale, format.
COLUMNS = (
    ("utilisation", "util, %", 100, ".1f"),
    ("jain_flows", "Jain (flows)", 1, ".3f"),
    ("jain_groups", "Jain (groups)", 1, ".3f"),
    ("rtt_mean_ms", "mean RTT, ms", 1, ".1f"),
    ("probe_rtt_ms", "probe RTT, ms", 1, ".1f"),
    ("loss_mean", "loss (p4bs), %", 100, ".2f"),
    ("f_mean", "f (p4bs)", 1, ".3f"),
    ("settled_after_s", "settled after, s", 1, ".0f"),
    ("f_after_settling", "f after settling", 1, ".3f"),
    ("decisions_applied", "changes", 1, "d"),
    ("buffer_final_bytes", "last buffer, kB", 1e-3, ".1f"),
    ("fct_p50_ms", "FCT p50, ms", 1, ".0f"),
    ("fct_p90_ms", "FCT p90, ms", 1, ".0f"),
    ("fct_p99_ms", "FCT p99, ms", 1, ".0f"),
    ("voip_delay_p50_ms", "VoIP delay p50, ms", 1, ".1f"),
    ("voip_jitter_ms", "VoIP jitter, ms", 1, ".2f"),
    ("voip_loss", "VoIP loss, %", 100, ".2f"),
)


def run_key(row: dict[str, Any]) -> tuple[str, str, int]:
    """Which run a row of results.jsonl is: point, policy, repeat."""
    return row["point"], row["policy"], row["repeat"]


def load_results(
    run_dir: Path, error: type[Exception] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The scenario and one row per run, in the order the runs first ran: a run done again
    (`p4bs eval run --resume` after it failed) is its latest row. Given `error`, a file
    missing or unreadable raises it, naming the folder, instead of OSError."""
    try:
        scenario = json.loads((run_dir / "scenario.json").read_text())
        latest: dict[tuple[str, str, int], dict[str, Any]] = {}
        for line in (run_dir / "results.jsonl").open():
            if line.strip():
                row = json.loads(line)
                latest[run_key(row)] = row
    except OSError as exc:
        if error is None:
            raise
        raise error(f"{run_dir}: not a run folder ({exc.strerror}: {exc.filename})") from None
    return scenario, list(latest.values())


def averaged(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(point, policy) -> each figure's mean over the repeats that ran."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if "error" not in row:
            grouped[(row["point"], row["policy"])].append(row)
    means: dict[tuple[str, str], dict[str, Any]] = {}
    for key, runs in grouped.items():
        mean: dict[str, Any] = {"runs": len(runs)}
        for name, *_ in COLUMNS:
            values = [r[name] for r in runs if isinstance(r.get(name), int | float)]
            mean[name] = statistics.fmean(values) if values else None
        groups: dict[str, list[float]] = defaultdict(list)
        for r in runs:
            for group, mbps in r.get("group_mbps", {}).items():
                groups[group].append(mbps)
        mean["group_mbps"] = {g: statistics.fmean(v) for g, v in sorted(groups.items())}
        means[key] = mean
    return means


def _cell(value: Any, scale: float, fmt: str) -> str:
    if value is None:
        return "-"
    return format(round(value * scale) if fmt == "d" else value * scale, fmt)


def claims(scenario: dict[str, Any], means: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Per point: each resizing policy's mean RTT against the fixed initial buffer's
    (`none`), and p4bs's mean f against the best other policy's."""
    lines = []
    for point in scenario["points"]:
        fixed = means.get((point, "none"))
        if fixed is None or not fixed["rtt_mean_ms"]:
            continue
        for policy in scenario["policies"]:
            m = means.get((point, policy))
            if policy == "none" or m is None or not m["rtt_mean_ms"]:
                continue
            lines.append(
                f"- {point}: {policy} cuts the long flows' mean RTT {fixed['rtt_mean_ms']:.1f} "
                f"-> {m['rtt_mean_ms']:.1f} ms ({fixed['rtt_mean_ms'] / m['rtt_mean_ms']:.1f}x) "
                f"at {m['utilisation'] * 100:.1f}% utilisation (fixed buffer "
                f"{fixed['utilisation'] * 100:.1f}%)"
            )
    for point in scenario["points"]:
        f = {
            policy: m["f_mean"]
            for policy in scenario["policies"]
            if (m := means.get((point, policy))) and m["f_mean"] is not None
        }
        if "p4bs" not in f or len(f) < 2:
            continue
        best, best_f = max(((p, v) for p, v in f.items() if p != "p4bs"), key=lambda x: x[1])
        verdict = "at or above" if f["p4bs"] >= best_f else "below"
        lines.append(
            f"- {point}: p4bs's mean f {f['p4bs']:.3f} is {verdict} the best other "
            f"policy's, {best} {best_f:.3f}"
        )
    return lines


# The figures compared between policies with repeats: key, heading, whether higher is better,
# format.
COMPARED = (
    ("f_mean", "mean f (p4bs)", True, ".3f"),
    ("rtt_mean_ms", "mean RTT, ms", False, ".1f"),
    ("fct_p50_ms", "FCT p50, ms", False, ".0f"),
)


def paired_comparisons(scenario: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Per point and compared figure, once a policy has two repeats: each policy's mean with
    its 95% interval, and its paired difference to the best other policy (the same repeat
    saw the same traffic) with its p-values and the verdict (stats.py: best, equivalent
    within 2% of the rival's mean, inconclusive or worse, Holm-adjusted within the table)."""
    lines = []
    for point in scenario["points"]:
        for key, heading, higher, fmt in COMPARED:
            by_policy: dict[str, dict[int, float]] = defaultdict(dict)
            for row in rows:
                value = row.get(key)
                if row["point"] == point and "error" not in row and isinstance(value, int | float):
                    by_policy[row["policy"]][row["repeat"]] = float(value)
            if len(by_policy) < 2 or max(len(v) for v in by_policy.values()) < 2:
                continue
            lines += [
                "",
                f"{point}, {heading} ({'higher' if higher else 'lower'} is better):",
                "",
                "| policy | n | mean [95% CI] | against | paired difference [95% CI] | "
                "p (difference; equivalence) | verdict |",
                "|---|---|---|---|---|---|---|",
            ]
            compared = {c.policy: c for c in compare_in_cell(by_policy, higher)}
            for policy, values in by_policy.items():
                ci = mean_ci(list(values.values()))
                c = compared[policy]
                d = c.difference
                lines.append(
                    f"| {policy} | {ci.n} | {ci.shown(fmt)} | {c.against} | "
                    f"{d.shown('+' + fmt)} (n {d.n}) | {c.test.p_difference:.2g}; "
                    f"{c.test.p_equivalence:.2g} | {c.verdict} |"
                )
    return lines


def _plotted_runs(run_dir: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs a per-run plot draws: each point and policy's first repeat, when it did not
    fail and its raw folder is here (kept rows resumed on another machine have none)."""
    return [
        row
        for row in rows
        if "error" not in row and row["repeat"] == 1 and (run_dir / row["run_dir"]).is_dir()
    ]


def write_report(run_dir: Path) -> Path:
    scenario, rows = load_results(run_dir)
    means = averaged(rows)
    plots = []
    for kind in scenario["reports"] if means else ():  # nothing to plot when every run failed
        plots += PLOTS[kind](run_dir, scenario, rows, means)
    lines = [
        f"# {scenario['title']}",
        "",
        f"Scenario `{scenario['name']}`: {scenario['duration_s']:g} s of traffic per run, the "
        f"first {scenario['warmup_s']:g} s left out; initial buffer {scenario['buffer_ms']:g} ms "
        "of 100 Mbit/s. Ground truth from the router, the senders and a ping probe; `(p4bs)` "
        "columns from p4bs's own link metrics.",
        "",
        "| point | policy | runs | " + " | ".join(c[1] for c in COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for (point, policy), m in means.items():
        cells = [_cell(m[name], scale, fmt) for name, _, scale, fmt in COLUMNS]
        lines.append(f"| {point} | {policy} | {m['runs']} | " + " | ".join(cells) + " |")
    found = claims(scenario, means)
    if found:
        lines += ["", "Claims, per point:", "", *found]
    paired = paired_comparisons(scenario, rows)
    if paired:
        lines += [
            "",
            "## Paired comparisons",
            "",
            "Verdicts (eval/README.md): `best` or `worse` when the paired difference is shown "
            "(t-test over the repeats), `equivalent` when shown within 2% of the rival's mean "
            "(two one-sided tests), `inconclusive` otherwise; p-values unadjusted, the verdicts "
            "Holm-adjusted within each table (`p4bs eval claims` adjusts across the suite).",
            *paired,
        ]
    pooled = pooled_fcts(run_dir, scenario, rows)
    if pooled:
        lines += ["", "## Short-flow FCT, pooled over the repeats", *pooled]
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} run(s) failed:", ""]
        lines += [f"- {r['run_dir']}: {r['error']}" for r in errors]
    took = sum(r.get("wall_s", 0) for r in rows)
    lines += ["", f"{len(rows)} runs took {took / 60:.0f} min."]
    absent = [r for r in rows if "error" not in r and not (run_dir / r["run_dir"]).is_dir()]
    if absent:
        lines += [
            "",
            f"{len(absent)} run(s) have no raw folder here (made on another machine): the "
            "tables use their rows; the per-run plots leave them out.",
        ]
    lines += ["", *(f"![{p.stem}]({p.name})" for p in plots)]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    run_dir: Path,
    scenario: dict[str, Any],
    means: dict[tuple[str, str], dict[str, Any]],
    metrics: list[tuple[str, str, float]],
    name: str,
) -> list[Path]:
    """Grouped bars: one panel per metric, points on x, a bar per policy."""
    plt = _pyplot()
    points, policies = scenario["points"], scenario["policies"]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(6, len(points) * 0.9), 3 * len(metrics)))
    axes = axes if len(metrics) > 1 else [axes]
    width = 0.8 / len(policies)
    for ax, (key, label, scale) in zip(axes, metrics, strict=True):
        for i, policy in enumerate(policies):
            values = [(means.get((p, policy), {}).get(key) or 0) * scale for p in points]
            ax.bar([x + i * width for x in range(len(points))], values, width, label=policy)
        ax.set_ylabel(label)
        ax.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(points))])
        ax.set_xticklabels(points, rotation=30, ha="right", fontsize=7)
    axes[0].legend()
    axes[0].set_title(scenario["title"])
    fig.tight_layout()
    path = run_dir / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def plot_sweep(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    metrics = [
        ("utilisation", "utilisation, %", 100.0),
        ("jain_flows", "Jain fairness", 1.0),
        ("rtt_mean_ms", "mean RTT, ms", 1.0),
    ]
    return _bars(run_dir, scenario, means, metrics, "sweep")


def plot_groups(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    """Each flow group's throughput per policy, and the flows' Jain index."""
    plt = _pyplot()
    keys = list(means)
    groups = sorted({g for m in means.values() for g in m["group_mbps"]})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, len(keys) * 1.2), 7))
    width = 0.8 / max(1, len(groups))
    for i, group in enumerate(groups):
        values = [means[k]["group_mbps"].get(group, 0) for k in keys]
        top.bar([x + i * width for x in range(len(keys))], values, width, label=group)
    top.set_ylabel("group throughput, Mbit/s")
    top.legend()
    top.set_title(scenario["title"])
    bottom.bar(range(len(keys)), [means[k]["jain_flows"] or 0 for k in keys])
    bottom.set_ylabel("Jain fairness (flows)")
    bottom.set_ylim(0, 1.05)
    for ax in (top, bottom):
        ax.set_xticks(
            [x + (width * (len(groups) - 1) / 2 if ax is top else 0) for x in range(len(keys))]
        )
        ax.set_xticklabels([f"{p}\n{pol}" for p, pol in keys], fontsize=7)
    fig.tight_layout()
    path = run_dir / "groups.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def _heat_panel(ax: Any, grid: list[list[float | None]], rows: list[str], cols: list[str]) -> Any:
    image = ax.imshow(
        [[v if v is not None else float("nan") for v in row] for row in grid],
        cmap="RdYlGn",
        aspect="auto",
        vmin=min((v for row in grid for v in row if v is not None), default=-1.0),
        vmax=max((v for row in grid for v in row if v is not None), default=0.0),
    )
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels(cols, rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=7)
    return image


def plot_heatmap(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    """Mean f (p4bs's performance function). A sweep over CCA and N gives P4BS Fig. 11's
    layout: a panel per policy, a row per CCA, a column per N, one colour scale for all;
    otherwise one panel, a row per policy and a column per point."""
    plt = _pyplot()
    policies = scenario["policies"]
    values = {(r["point"], r["policy"]): r.get("values", {}) for r in rows}
    ccas = list(dict.fromkeys(v["cca"] for v in values.values() if "cca" in v))  # as swept
    flows = sorted({v["flows"] for v in values.values() if "flows" in v})
    f = {key: m.get("f_mean") for key, m in means.items()}
    found = [v for v in f.values() if v is not None]
    if ccas and flows and set(scenario.get("sweep_keys", ())) == {"cca", "flows"}:
        by_cell = {(v["cca"], v["flows"], pol): f.get((p, pol)) for (p, pol), v in values.items()}
        fig, axes = plt.subplots(
            1, len(policies), figsize=(2.2 * len(policies) + 1, 0.5 * len(ccas) + 1.6),
            squeeze=False,
        )  # fmt: skip
        for ax, policy in zip(axes[0], policies, strict=True):
            grid = [[by_cell.get((c, n, policy)) for n in flows] for c in ccas]
            image = _heat_panel(ax, grid, ccas, [f"N={n}" for n in flows])
            image.set_clim(min(found, default=-1.0), max(found, default=0.0))
            ax.set_title(policy, fontsize=9)
            if ax is not axes[0][0]:
                ax.set_yticklabels([])
    else:
        points = scenario["points"]
        fig, ax = plt.subplots(figsize=(max(6, len(points) * 0.9), 1 + 0.6 * len(policies)))
        image = _heat_panel(ax, [[f.get((p, pol)) for p in points] for pol in policies],
                            policies, points)  # fmt: skip
        axes = [[ax]]
    fig.colorbar(image, ax=list(axes[0]), label="mean f (higher is better)")
    fig.suptitle(f"{scenario['title']}: mean f", fontsize=10)
    path = run_dir / "heatmap.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [path]


def plot_buffer(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    """P4BS Fig. 17 (Appendix): loss, the long flows' mean RTT and f against the router's
    buffer, a line per policy (a sweep over `buffer`)."""
    plt = _pyplot()
    buffer_ms = {r["point"]: r["values"]["buffer"] / 1e6 for r in rows if "buffer" in r["values"]}
    metrics = [
        ("loss_mean", "loss (p4bs), %", 100.0),
        ("rtt_mean_ms", "mean RTT, ms", 1.0),
        ("f_mean", "mean f", 1.0),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(13, 3.6))
    for policy in scenario["policies"]:
        points = sorted((p for p in buffer_ms if (p, policy) in means), key=buffer_ms.__getitem__)
        for ax, (key, label, scale) in zip(axes, metrics, strict=True):
            found = [(p, means[(p, policy)][key]) for p in points]
            xy = [(buffer_ms[p], v * scale) for p, v in found if v is not None]
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=policy)
            ax.set_ylabel(label)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("buffer, ms of line rate")
    axes[0].legend(fontsize=7)
    fig.suptitle(scenario["title"], fontsize=10)
    fig.tight_layout()
    path = run_dir / "buffer.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def _per_second(samples: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    bins: dict[int, list[float]] = defaultdict(list)
    for t, v in samples:
        bins[int(t)].append(v)
    xs = sorted(bins)
    return [float(x) for x in xs], [statistics.fmean(bins[x]) for x in xs]


def plot_timeseries(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    """Per run (first repeat): buffer, utilisation, loss and each group's RTT over time."""
    plt = _pyplot()
    paths = []
    for row in _plotted_runs(run_dir, rows):
        run = run_dir / row["run_dir"]
        traffic = run / "traffic"
        start = json.loads((traffic / "timeline.json").read_text())["traffic_start_ns"]
        qdisc = [json.loads(line) for line in (traffic / "qdisc.jsonl").open()]
        fig, axes = plt.subplots(4, 1, sharex=True, figsize=(10, 9))
        by_handle: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for q in qdisc:
            by_handle[q["handle"]].append(q)
        for handle, samples in sorted(by_handle.items()):
            xs = [(q["ts_ns"] - start) / 1e9 for q in samples]
            axes[0].step(xs, [q["limit_bytes"] / 1000 for q in samples], where="post",
                         label=f"queue {handle >> 16:x}:")  # fmt: skip
        axes[0].set_ylabel("buffer, kB")
        axes[0].set_yscale("log")
        axes[0].legend(loc="upper right", fontsize=7)
        sent_bits: dict[int, float] = defaultdict(float)  # second -> bits the queues sent
        for queue in by_handle.values():
            for a, b in itertools.pairwise(queue):
                sent_bits[int((b["ts_ns"] - start) / 1e9)] += (
                    b["sent_bytes"] - a["sent_bytes"]
                ) * 8
        seconds = sorted(sent_bits)
        axes[1].plot(seconds, [sent_bits[t] / 1e6 for t in seconds])
        axes[1].set_ylabel("router, Mbit/s")
        windows = [json.loads(line) for line in (run / "link_metrics.jsonl").open()]
        windows = [w for w in windows if w["window_end_ns"] >= start]
        axes[2].plot([(w["window_end_ns"] - start) / 1e9 for w in windows],
                     [w["loss_rate"] * 100 for w in windows])  # fmt: skip
        axes[2].set_ylabel("loss (p4bs), %")
        ss = [json.loads(line) for line in (traffic / "ss.jsonl").open()]
        by_group: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in ss:
            if r.get("rtt_ns") and r["ts_ns"] >= start:
                by_group[r["src"]].append(((r["ts_ns"] - start) / 1e9, r["rtt_ns"] / 1e6))
        for src, rtts in sorted(by_group.items()):
            gx, gy = _per_second(rtts)
            axes[3].plot(gx, gy, label=src)
        axes[3].set_ylabel("RTT (senders), ms")
        axes[3].set_xlabel("s since the traffic started")
        axes[3].legend(loc="upper right", fontsize=7)
        axes[0].set_title(f"{scenario['title']}: {row['point']}, {row['policy']}")
        fig.tight_layout()
        path = run_dir / f"timeseries-{row['run_dir'].split('/')[1]}-{row['policy']}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _short_fcts_ms(run_dir: Path, row: dict[str, Any], warmup_s: float) -> list[float]:
    """The completed short flows' FCTs over the measured part, sorted, ms: from the row's
    `short_flows` (what results.jsonl keeps), else from the run's folder (rows made before
    it)."""
    if "short_flows" in row:
        flows = row["short_flows"]
        return sorted(
            fct
            for start_s, fct in zip(flows["start_s"], flows["fct_ms"], strict=True)
            if fct is not None and start_s >= warmup_s
        )
    traffic = run_dir / row["run_dir"] / "traffic"
    if not (traffic / "fct.jsonl").exists():
        return []
    steady = json.loads((traffic / "timeline.json").read_text())["steady_from_ns"]
    records = [json.loads(line) for line in (traffic / "fct.jsonl").open() if line.strip()]
    return sorted(f["fct_ns"] / 1e6 for f in records if f.get("ok") and f["start_ns"] >= steady)


def _pooled_short_fcts_ms(
    run_dir: Path, scenario: dict[str, Any], rows: list[dict[str, Any]]
) -> dict[tuple[str, str], list[float]]:
    """(point, policy) -> every repeat's completed short flows' FCTs (measured part), sorted."""
    pooled: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        if "error" not in row and row.get("short_flows_completed") is not None:
            fcts = _short_fcts_ms(run_dir, row, scenario["warmup_s"])
            pooled[row["point"], row["policy"]] += fcts
    return {key: sorted(values) for key, values in pooled.items()}


def pooled_fcts(run_dir: Path, scenario: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """P4BS Fig. 14's figures over every repeat's short flows: per point and policy the flows
    and the FCT's p50, p90 and p99 (nearest rank), ms."""
    pooled = _pooled_short_fcts_ms(run_dir, scenario, rows)
    if not pooled:
        return []
    lines = [
        "",
        "| point | policy | repeats | short flows | FCT p50, ms | FCT p90, ms | FCT p99, ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in scenario["points"]:
        for (at, policy), fcts in pooled.items():
            if at != point or not fcts:
                continue
            repeats = len({r["repeat"] for r in rows if (r["point"], r["policy"]) == (at, policy)})
            quantiles = " | ".join(f"{percentile(fcts, q):.0f}" for q in (0.5, 0.9, 0.99))
            lines.append(f"| {point} | {policy} | {repeats} | {len(fcts)} | {quantiles} |")
    return lines


def _plot_cdf_line(ax: Any, values: list[float], label: str) -> None:
    if values:
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)


def plot_cdf(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    """CDFs per policy: short flows' completion times and the probe's RTT (a short flow's
    view of the queue), over the measured part."""
    plotted = _plotted_runs(run_dir, rows)
    if not plotted:
        return []  # an empty figure would only say what the report's text says
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for row in plotted:
        traffic = run_dir / row["run_dir"] / "traffic"
        steady = json.loads((traffic / "timeline.json").read_text())["steady_from_ns"]
        label = f"{row['point']} {row['policy']}"
        _plot_cdf_line(left, _short_fcts_ms(run_dir, row, scenario["warmup_s"]), label)
        ping = sorted(
            json.loads(line)["rtt_ns"] / 1e6
            for line in (traffic / "ping.jsonl").open()
            if json.loads(line)["ts_ns"] >= steady
        )
        _plot_cdf_line(right, ping, label)
    left.set_xlabel("short-flow FCT, ms")
    left.set_xscale("log")
    right.set_xlabel("probe RTT, ms")
    for ax in (left, right):
        ax.set_ylabel("CDF")
        ax.legend(fontsize=7)
    fig.suptitle(scenario["title"])
    fig.tight_layout()
    path = run_dir / "cdf.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def plot_fct(run_dir: Path, scenario: dict[str, Any], rows: Any, means: Any) -> list[Path]:
    """P4BS Fig. 14: the short flows' FCT CDF per policy over every repeat, a panel per point
    (the long flows' load); with a VoIP stream, its one-way delay, jitter and loss per policy
    and point."""
    plt = _pyplot()
    points = scenario["points"]
    fig, axes = plt.subplots(
        1, len(points), figsize=(4 * len(points), 3.5), squeeze=False, sharey=True
    )
    for (point, policy), fcts in _pooled_short_fcts_ms(run_dir, scenario, rows).items():
        _plot_cdf_line(axes[0][points.index(point)], fcts, f"{policy} ({len(fcts)})")
    for ax, point in zip(axes[0], points, strict=True):
        ax.set_title(point, fontsize=9)
        ax.set_xscale("log")
        ax.set_xlabel("short-flow FCT, ms")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("CDF")
    fig.suptitle(scenario["title"], fontsize=10)
    fig.tight_layout()
    path = run_dir / "fct.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths = [path]
    if any(m.get("voip_delay_p50_ms") is not None for m in means.values()):
        voip = [
            ("voip_delay_p50_ms", "VoIP one-way delay p50, ms", 1.0),
            ("voip_jitter_ms", "VoIP jitter, ms", 1.0),
            ("voip_loss", "VoIP loss, %", 100.0),
        ]
        paths += _bars(run_dir, scenario, means, voip, "voip")
    return paths


PLOTS = {
    "sweep": plot_sweep,
    "groups": plot_groups,
    "heatmap": plot_heatmap,
    "timeseries": plot_timeseries,
    "cdf": plot_cdf,
    "fct": plot_fct,
    "buffer": plot_buffer,
}
