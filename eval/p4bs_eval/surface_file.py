"""Surfaces read from a buffer sweep's run folder, or from a dynamic scenario's runs under the
oracle's fixed buffers (and step runs from others), and a compact file of them to commit
(`p4bs eval surfaces`), which `p4bs eval offline` reads as it reads the folder."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from p4bs_eval.figures import read_jsonl, run_file
from p4bs_eval.report import load_results
from p4bs_eval.scenario import fixed_buffer_ms
from p4bs_eval.surface import (
    BLENDED,
    StepRun,
    Surface,
    SurfaceError,
    WindowRecord,
    source,
    step_key,
)

# A step run's buffers are the measured ones they are this close to (log scale: 2%; the
# router's buffer is whole bytes of a µs or a size).
STEP_SNAP = 0.02


def _traffic_windows(run: Path) -> list[WindowRecord]:
    """A run's windows of its traffic (traffic/timeline.json) from link_metrics.jsonl."""
    metrics, timeline = run_file(run / "link_metrics.jsonl"), run / "traffic" / "timeline.json"
    for path in (metrics, timeline):
        if not path.is_file():
            raise SurfaceError(f"{run}: an unfinished run (no {path.relative_to(run)})")
    # The traffic's own start and end: the metrics job's windows begin seconds earlier (the
    # testbed's idle RTT probe) and go on while the queue drains.
    times = json.loads(timeline.read_text())
    start, end = times["traffic_start_ns"], times["end_ns"]
    return [
        w
        for w in read_jsonl(metrics)
        if start <= w["window_start_ns"] and w["window_end_ns"] <= end and w["f"] is not None
    ]


def _cell_and_buffer(row: Mapping[str, Any], scenario: Mapping[str, Any]) -> tuple[str, int]:
    """A row's cell (its point's values but the buffer) and its initial buffer, bytes."""
    values = dict(row["values"])
    buffer_ns = values.pop("buffer", scenario["buffer_ms"] * 1e6)
    cell = ",".join(f"{k}={v}" for k, v in values.items()) or "base"
    return cell, round(row.get("rate_bps", 100_000_000) / 8 * buffer_ns / 1e9)


def surfaces(run_dir: Path) -> dict[str, Surface]:
    """The surfaces of a run folder, one per cell (the point's other values), from each
    run's link_metrics.jsonl: the windows of its traffic, warm-up included, as a simulated
    run has them. A buffer sweep's runs of policy `none`; else the oracle's fixed buffers
    (`fixed:*`) of a dynamic scenario, whose windows follow its traffic's phases in time."""
    scenario, rows = load_results(run_dir, SurfaceError)
    sweep = "buffer" in scenario["sweep_keys"]
    cells: dict[str, dict[int, list[list[WindowRecord]]]] = {}
    for row in rows:
        if "error" in row:
            continue
        cell, buffer = _cell_and_buffer(row, scenario)
        fixed_ms = fixed_buffer_ms(row["policy"])
        if not sweep and fixed_ms is not None:
            # The buffer the run's router was given; a row from before it was recorded, its
            # policy's delay at the link's rate.
            buffer = row.get("fixed_buffer_bytes") or round(
                row.get("rate_bps", 100_000_000) / 8 * fixed_ms / 1000
            )
        elif not (sweep and row["policy"] == "none"):
            continue
        kept = _traffic_windows(run_dir / row["run_dir"])
        if kept:
            cells.setdefault(cell, {}).setdefault(buffer, []).append(kept)
    if not cells:
        raise SurfaceError(
            f"{run_dir}: neither a buffer sweep's runs of policy none nor fixed:* runs with windows"
        )
    return {cell: Surface(runs) for cell, runs in cells.items()}


def origin_of(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """What a dynamic scenario's surfaces bring along: its name (the offline runs are
    checked against that scenario's live runs only: its cells are its own traffic, not a
    sweep's cells that other scenarios share) and its timing (the offline runs' defaults).
    Empty for a buffer sweep."""
    if "buffer" in scenario["sweep_keys"]:
        return {}
    return {key: scenario[key] for key in ("name", "duration_s", "warmup_s", "buffer_ms")}


class LoadedSurfaces(NamedTuple):
    """What `load_surfaces` reads: the surfaces per cell, the scenario's link settings (SLA,
    weights), its origin (`origin_of`) and its traffic (runner.traffic_of; None from a
    folder or file made before scenario.json recorded it)."""

    found: dict[str, Surface]
    link_settings: dict[str, Any]
    origin: dict[str, Any]
    traffic: dict[str, Any] | None


def _same_traffic(run_dir: Path, theirs: Any, ours: Any) -> None:
    """Raises SurfaceError naming what differs between a step folder's traffic and its
    surface's; nothing to compare when either was made before scenario.json recorded it."""
    if theirs is None or ours is None:
        return
    differs = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if differs:
        raise SurfaceError(
            f"{run_dir}: its traffic is not the surface's (differs in {', '.join(differs)}): "
            f"its moves would be measured on other traffic"
        )


def with_steps(
    found: Mapping[str, Surface], run_dir: Path, traffic: Mapping[str, Any] | None
) -> dict[str, Surface]:
    """The surfaces with the step runs of a run folder (policy `step`) added to their cells:
    each run's move from its initial buffer to the buffer it applied, at the first window
    the metrics job labels with it (the window its change fell in). Both buffers must be
    measured ones of the cell's surface, and the folder's traffic the surface's `traffic`
    (its scenario's but for the buffers; the cell's values are in its name)."""
    scenario, rows = load_results(run_dir, SurfaceError)
    _same_traffic(run_dir, scenario.get("traffic"), traffic)
    # Per cell, its step runs so far and this folder's.
    steps = {cell: {k: list(v) for k, v in s.steps.items()} for cell, s in found.items()}
    added = 0
    for row in rows:
        if row["policy"] != "step" or "error" in row:
            continue
        cell, moved_from = _cell_and_buffer(row, scenario)
        run = run_dir / row["run_dir"]
        if cell not in found:
            raise SurfaceError(f"{run}: cell {cell} has no fixed-buffer surface")
        kept = _traffic_windows(run)
        if not run_file(run / "decisions.jsonl").is_file():
            raise SurfaceError(f"{run}: no decisions.jsonl")
        applied = [d for d in read_jsonl(run / "decisions.jsonl") if d["outcome"] == "applied"]
        if not applied:
            raise SurfaceError(f"{run}: the step was never applied")
        moved_to = applied[0]["buffer_bytes"]
        surface = found[cell]
        key = (surface.nearest(moved_from), surface.nearest(moved_to))
        if any(
            abs(math.log(measured / b)) > STEP_SNAP
            for measured, b in zip(key, (moved_from, moved_to), strict=True)
        ):
            raise SurfaceError(
                f"{run}: a move {moved_from} -> {moved_to} B between buffers the surface of "
                f"{cell} did not measure ({', '.join(map(str, surface.buffers))} B)"
            )
        moved_at = next(
            (i for i, w in enumerate(kept) if w["window_end_ns"] > applied[0]["ts_ns"]), None
        )
        if moved_at is None:
            raise SurfaceError(f"{run}: the step came after the traffic")
        steps[cell].setdefault(key, []).append(StepRun(moved_at, kept))
        added += 1
    if not added:
        raise SurfaceError(f"{run_dir}: no run of policy step")
    return {cell: Surface(s.runs, steps[cell]) for cell, s in found.items()}


def load_surfaces(source: Path) -> LoadedSurfaces:
    """A run folder's surfaces, from the folder or from the file `save_surfaces` wrote."""
    if source.is_dir():
        found = surfaces(source)
        scenario, _ = load_results(source)
        return LoadedSurfaces(
            found, scenario.get("link_settings", {}), origin_of(scenario), scenario.get("traffic")
        )
    try:
        with gzip.open(source, "rt") as file:
            data = json.load(file)
        steps = data.get("steps", {})
        cells = {
            cell: Surface(
                {int(b): runs for b, runs in by_buffer.items()},
                {
                    step_key(key): [StepRun(r["moved_at"], r["windows"]) for r in runs]
                    for key, runs in steps.get(cell, {}).items()
                },
            )
            for cell, by_buffer in data["cells"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SurfaceError(f"{source}: not a run folder or a surfaces file ({exc})") from None
    return LoadedSurfaces(cells, data["link_settings"], data.get("origin", {}), data.get("traffic"))


def save_surfaces(
    path: Path,
    found: Mapping[str, Surface],
    link_settings: Mapping[str, Any],
    origin: Mapping[str, Any],
    traffic: Mapping[str, Any] | None,
) -> None:
    """The surfaces as a compact file: per cell, buffer and run, the windows' measured fields
    the simulator reads (six significant digits), and the cells' step runs, gzipped JSON."""

    def compact(value: Any) -> Any:
        return float(f"{value:.6g}") if isinstance(value, float) else value

    def windows(run: Sequence[WindowRecord]) -> list[dict[str, Any]]:
        return [{k: compact(w[k]) for k in BLENDED} for w in run]

    cells = {
        cell: {source(b): list(map(windows, runs)) for b, runs in sorted(s.runs.items())}
        for cell, s in found.items()
    }
    steps = {
        cell: {
            source(key): [{"moved_at": r.moved_at, "windows": windows(r.windows)} for r in runs]
            for key, runs in sorted(s.steps.items())
        }
        for cell, s in found.items()
        if s.steps
    }
    data: dict[str, Any] = {"link_settings": dict(link_settings), "cells": cells}
    if origin:
        data["origin"] = dict(origin)
    if traffic is not None:
        data["traffic"] = dict(traffic)
    if steps:
        data["steps"] = steps
    with gzip.open(path, "wt") as file:
        json.dump(data, file, separators=(",", ":"))
