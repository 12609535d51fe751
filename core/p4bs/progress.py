"""A progress line for long commands (evaluations, chaos runs, long benchmarks): a bar, what
is running now, and the time left.

On a terminal the line is rewritten in place; lines marked final (a run's outcome) stay.
Piped into a file, every line stays, so a log shows the same story. The time left comes
from the items finished so far (their mean wall time), or from a first guess before any.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO

BAR_WIDTH = 20
LINE_WIDTH = 160


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """`[#####-----]`: `fraction` (clamped to [0, 1]) of `width` filled."""
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def duration_text(seconds: float) -> str:
    """A time left as people read it: seconds under two minutes, then minutes, then hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Progress over `total` items (runs, rounds), each taking about `first_guess_s` until
    one has been measured."""

    def __init__(self, total: int, first_guess_s: float, out: TextIO | None = None) -> None:
        self.total = total
        self.first_guess_s = first_guess_s
        self.done = 0
        self.spent_s = 0.0  # wall time of the finished items
        self.out = out if out is not None else sys.stdout
        self.tty = self.out.isatty()

    def per_item_s(self) -> float:
        return self.spent_s / self.done if self.done else self.first_guess_s

    def left_s(self, elapsed_s: float) -> float:
        """Time left with the current item `elapsed_s` in: the rest of it (at least nothing)
        and the items after it."""
        per_item = self.per_item_s()
        after = max(0, self.total - self.done - 1)
        return max(0.0, per_item - elapsed_s) + per_item * after

    def finished(self, wall_s: float) -> None:
        """An item finished after `wall_s` of wall time."""
        self.done += 1
        self.spent_s += wall_s

    def show(self, what: str, *, elapsed_s: float | None = None, final: bool = False) -> None:
        """The line: the bar (items done, and the current one's share by its expected time),
        `done/total`, `what`, and the time left when `elapsed_s` into the current item."""
        current = 0.0 if elapsed_s is None else min(1.0, elapsed_s / self.per_item_s())
        fraction = (self.done + current) / self.total if self.total else 1.0
        line = f"{bar(fraction)} {self.done}/{self.total} {what}"
        if elapsed_s is not None:
            line += f" | about {duration_text(self.left_s(elapsed_s))} left"
        if not self.tty:
            print(line, file=self.out, flush=True)
        elif final:  # over the line in place, padded to cover it all
            print(f"\r{line:<{LINE_WIDTH}}", file=self.out, flush=True)
        else:
            print(f"\r{line[:LINE_WIDTH]:<{LINE_WIDTH}}", end="", file=self.out, flush=True)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """One item: `what` shown with the time left, as a line that stays (the item's own
        output follows it), then the item counted as finished with its wall time."""
        self.show(what, elapsed_s=0.0, final=True)
        began = time.monotonic()
        yield
        self.finished(time.monotonic() - began)
