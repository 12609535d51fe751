"""The buffer a link's windows ran under, as the optimizer's state keeps it: the newest
change before a window's end, what later windows no longer need dropped, and the changes
carried through the changelog record (OptimizerLinkState v2) to the next owner."""

from __future__ import annotations

from p4bs_optimizer import changelog
from p4bs_optimizer.changelog import LinkState
from p4bs_schemas.codec import codec


def test_a_window_runs_under_the_newest_buffer_that_came_into_force_before_its_end() -> None:
    s = LinkState("p4bs")
    assert s.buffer_at(1_000) is None  # nothing read, nothing applied
    s.buffer_changed(0, 500_000)  # the router's own, read before any change
    s.buffer_changed(1_050, 250_000)
    s.buffer_changed(1_300, 125_000)
    assert s.buffer_at(1_000) == 500_000
    assert s.buffer_at(1_050) == 500_000  # a change at a window's end is the next one's
    assert s.buffer_at(1_100) == 250_000  # a change inside a window counts for it
    assert s.buffer_at(1_300) == 250_000
    assert s.buffer_at(9_000) == 125_000


def test_changes_no_window_to_come_can_need_are_dropped() -> None:
    s = LinkState("p4bs", last_window_end_ns=1_000)
    s.buffer_changed(0, 500_000)
    s.buffer_changed(400, 250_000)
    s.buffer_changed(900, 125_000)  # the newest before the last window decided: kept
    assert s.buffer_changes == [(900, 125_000)]
    s.buffer_changed(1_500, 64_000)
    s.last_window_end_ns = 1_200
    s.buffer_changed(1_700, 32_000)  # 1_500 is after 1_200: a window ending at 1_600 needs it
    assert s.buffer_changes == [(900, 125_000), (1_500, 64_000), (1_700, 32_000)]
    assert s.buffer_at(1_300) == 125_000


def test_the_changes_travel_in_the_changelog_record() -> None:
    s = LinkState("p4bs", last_window_end_ns=1_000, in_force={0: 125_000}, last_change_ns=1_500)
    s.buffer_changed(0, 500_000)
    s.buffer_changed(1_500, 125_000)
    records = codec("OptimizerLinkState")
    record = records.decode(records.encode(changelog.to_record("r1:eth1", s, "opt-0", 3_000)))
    assert record["buffer_changes"] == [
        {"ts_ns": 0, "buffer_bytes": 500_000},
        {"ts_ns": 1_500, "buffer_bytes": 125_000},
    ]
    assert changelog.from_record(record).buffer_changes == s.buffer_changes
