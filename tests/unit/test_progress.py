"""The progress line of long commands: the bar, the time left from the items measured so
far, and lines that stay in a log."""

from __future__ import annotations

import io

from p4bs.progress import Progress, bar, duration_text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_fills_with_the_fraction_done() -> None:
    assert bar(0.0, width=10) == "[----------]"
    assert bar(0.25, width=10) == "[##--------]"  # 2.5 rounds to even
    assert bar(0.5, width=10) == "[#####-----]"
    assert bar(1.7, width=10) == "[##########]"  # clamped


def test_time_left_reads_in_the_unit_people_use() -> None:
    assert duration_text(45) == "45 s"
    assert duration_text(600) == "10 min"
    assert duration_text(3 * 3600) == "3.0 h"


def test_time_left_comes_from_the_items_measured_and_the_guess_before_any() -> None:
    progress = Progress(4, first_guess_s=100.0, out=io.StringIO())
    assert progress.left_s(elapsed_s=30.0) == 70.0 + 3 * 100.0
    progress.finished(200.0)
    progress.finished(100.0)
    assert progress.left_s(elapsed_s=30.0) == 120.0 + 150.0  # the third half done, the fourth
    assert progress.left_s(elapsed_s=400.0) == 150.0  # an item over its mean: none of it left


def test_piped_into_a_log_every_line_stays_with_its_bar() -> None:
    out = io.StringIO()
    progress = Progress(2, first_guess_s=60.0, out=out)
    progress.show("run a | traffic 30/60 s", elapsed_s=30.0)
    progress.finished(60.0)
    progress.show("run a: done", final=True)
    lines = out.getvalue().splitlines()
    assert lines == [
        f"{bar(0.25)} 0/2 run a | traffic 30/60 s | about 90 s left",
        f"{bar(0.5)} 1/2 run a: done",
    ]


def test_on_a_terminal_the_line_is_rewritten_and_a_final_one_covers_it() -> None:
    out = _Terminal()
    progress = Progress(1, first_guess_s=10.0, out=out)
    progress.show("a long line that the final one must cover" * 2, elapsed_s=1.0)
    progress.show("done", final=True)
    text = out.getvalue()
    assert "\n" not in text.split("\r")[1]  # the running line stays in place
    final = text.split("\r")[2]
    assert final.startswith(f"{bar(0.0)} 0/1 done") and len(final.rstrip("\n")) >= len(
        text.split("\r")[1].rstrip()
    )


def test_a_step_shows_what_runs_with_the_time_left_then_counts_itself_finished() -> None:
    out = io.StringIO()
    progress = Progress(3, first_guess_s=60.0, out=out)
    with progress.step("searching: 200 links"):
        shown = "[--------------------] 0/3 searching: 200 links | about 3 min left\n"
        assert out.getvalue() == shown
    assert progress.done == 1 and 0 <= progress.spent_s < 1
    with progress.step("decision"):
        pass
    assert out.getvalue().splitlines()[1].startswith("[#######-------------] 1/3 decision")
