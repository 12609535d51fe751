"""`p4bs eval objective`: the buffer f picks against the buffer short flows want (issue 39,
item 6: can f see what short flows suffer?).

f = -(w1 loss / p-hat + w2 delay / d-hat) trades loss for queueing delay at one rate: a
loss of 1% weighs as much as `exchange_ms` of queueing delay, w1 0.01 d-hat / (p-hat w2)
(50 ms with the SLA's p-hat 1%, d-hat 50 ms and equal weights). Only that rate decides which
buffer f prefers. For each cell of a run folder (the sweep's point without its buffer) this
reads every buffer's runs (`fixed:*` policies, or the sweep's `buffer` under policy `none`),
their mean loss and the mean queueing delay their f implies (from the row's `f_mean` and
`loss_mean`, with the folder's link settings: the windows' mean, as f's), and the short
flows' median FCT (the row's `fct_p50_ms`, all sizes pooled); then which buffer f picks at
each exchange rate given, and which buffer the short flows' median FCT prefers.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from p4bs.config import LinkConfig
from p4bs_eval.scenario import fixed_buffer_ms

LOSS_UNIT = 0.01  # the exchange rate is per 1% of loss


class ObjectiveError(ValueError):
    """A folder whose rows this cannot read; the message names it."""


@dataclass(frozen=True)
class BufferFigures:
    """One buffer's runs in a cell: their means."""

    buffer_ms: float
    runs: int
    loss: float  # a fraction
    delay_ms: float  # the mean queueing delay f implies
    fct_p50_ms: float | None  # short flows' median FCT, None without short flows

    def cost_ms(self, exchange_ms: float) -> float:
        """-f in ms of queueing delay at `exchange_ms` per 1% of loss."""
        return self.loss / LOSS_UNIT * exchange_ms + self.delay_ms


def exchange_ms(link: LinkConfig) -> float:
    """The queueing delay (ms) f weighs as much as 1% of loss on this link."""
    delay_ms = link.max_queue_delay_ns / 1e6
    return link.weight_loss * LOSS_UNIT * delay_ms / (link.max_loss * link.weight_delay)


def row_buffer_ms(row: dict[str, Any]) -> float | None:
    """The fixed buffer a row ran under (ms of line rate), None for a row of a sizing policy."""
    fixed = fixed_buffer_ms(row["policy"])
    if fixed is not None:
        return fixed
    buffer_ns = row.get("values", {}).get("buffer")
    return buffer_ns / 1e6 if row["policy"] == "none" and buffer_ns else None


def cells(rows: Iterable[dict[str, Any]], link: LinkConfig) -> dict[str, list[BufferFigures]]:
    """Each cell's buffers, smallest first; rows of sizing policies and failed rows left out."""
    runs: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for row in rows:
        buffer_ms = row_buffer_ms(row)
        if buffer_ms is None or row.get("f_mean") is None or row.get("loss_mean") is None:
            continue
        cell = ",".join(
            f"{k}={v}" for k, v in sorted(row.get("values", {}).items()) if k != "buffer"
        )
        runs.setdefault(cell or "base", {}).setdefault(buffer_ms, []).append(row)
    out = {}
    for cell, by_buffer in runs.items():
        figures = []
        for buffer_ms, rs in sorted(by_buffer.items()):
            loss = statistics.fmean(r["loss_mean"] for r in rs)
            f = statistics.fmean(r["f_mean"] for r in rs)
            loss_term, _ = link.f_terms(loss, 0)
            delay_ns = (-f - loss_term) * link.max_queue_delay_ns / link.weight_delay
            fcts = [r["fct_p50_ms"] for r in rs if r.get("fct_p50_ms") is not None]
            fct = statistics.fmean(fcts) if fcts else None
            figures.append(BufferFigures(buffer_ms, len(rs), loss, delay_ns / 1e6, fct))
        out[cell] = figures
    return out


def picked(figures: Sequence[BufferFigures], exchange: float) -> BufferFigures:
    """The buffer f picks at `exchange` ms per 1% of loss."""
    return min(figures, key=lambda b: b.cost_ms(exchange))


def fct_preferred(figures: Sequence[BufferFigures]) -> BufferFigures | None:
    """The buffer with the shortest median FCT, None without short flows."""
    timed = [b for b in figures if b.fct_p50_ms is not None]
    return min(timed, key=lambda b: b.fct_p50_ms or 0.0) if timed else None


def markdown(
    name: str, figures_by_cell: dict[str, list[BufferFigures]], own: float, rates: Sequence[float]
) -> list[str]:
    """Per cell: each buffer's figures and f's cost at each rate (the pick in bold), and the
    buffer the short flows' median FCT prefers."""
    shown = sorted({own, *rates}, reverse=True)
    lines = [
        f"## f against short flows: {name}",
        "",
        f"Cost = -f in ms of queueing delay, at each exchange rate (ms worth 1% of loss; the "
        f"folder's f: {own:g} ms). f picks the lowest (bold).",
    ]
    for cell, figures in figures_by_cell.items():
        head = "| buffer | runs | loss | delay ms | FCT p50 ms | " + " | ".join(
            f"{r:g} ms{' (f)' if r == own else ''}" for r in shown
        )
        lines += ["", f"### {cell}", "", head + " |", "|---" * (5 + len(shown)) + "|"]
        picks = {r: picked(figures, r) for r in shown}
        for b in figures:
            costs = [
                f"**{b.cost_ms(r):.1f}**" if picks[r] is b else f"{b.cost_ms(r):.1f}" for r in shown
            ]
            fct = "-" if b.fct_p50_ms is None else f"{b.fct_p50_ms:.0f}"
            lines.append(
                f"| {b.buffer_ms:g} ms | {b.runs} | {b.loss:.2%} | {b.delay_ms:.1f} | {fct} | "
                + " | ".join(costs)
                + " |"
            )
        best = fct_preferred(figures)
        if best is None:
            lines += ["", "No short flows: no FCT to compare."]
            continue
        agree = [f"{r:g}" for r in shown if picks[r] is best]
        lines += [
            "",
            f"Short flows' median FCT prefers {best.buffer_ms:g} ms; f picks it at "
            + (f"{', '.join(agree)} ms per 1% of loss." if agree else "none of these rates."),
        ]
    return lines
