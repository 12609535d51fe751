"""The buffer a link's windows ran under, as the optimizer's state keeps it: the newest
change before a window's end, what later windows no longer need dropped, and the changes
carried through the changelog record (OptimizerLinkState v2) to the next owner."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from p4bs.config import LinkConfig
from p4bs_optimizer import changelog
from p4bs_optimizer.changelog import LinkState
from p4bs_optimizer.policies.base import Decision
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


# --- a saved state is checked against the link it claims (issue 38) --------------------------


def _link(policy: str) -> LinkConfig:
    return LinkConfig(
        router="r1", interface="eth1", switch="s1", capacity_bps=100_000_000,
        tap_before="tap-in", tap_after="tap-out", max_queue_delay_ns=10_000_000,
        max_loss=0.01, weight_loss=0.5, weight_delay=0.5, min_buffer_bytes=1_500,
        max_buffer_bytes=2_500_000, safe_buffer_bytes=250_000, policy=policy,
        policy_options={},
    )  # fmt: skip


def _record(**changes: Any) -> dict[str, Any]:
    state = LinkState("p4bs", intended={0: 100_000})
    state.unapplied[0] = Decision(100_000, "optimise", "trial", flows=("a:1>b:2/6",))
    return {**changelog.to_record("r1:eth1", state, "opt-0", 3_000), **changes}


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({}, "r2:eth9", r"record of link 'r1:eth1' under the key 'r2:eth9'"),
        ({"policy_state": "{not json"}, None, "policy_state is not JSON"),
        ({"policy_state": "[]"}, None, "policy_state is list, not a JSON object"),
        ({"policy_state": "7"}, None, "policy_state is int, not a JSON object"),
    ],
)
def test_a_record_that_holds_no_state_of_its_key_s_link_is_refused(
    changes: dict[str, Any], key: str | None, message: str
) -> None:
    with pytest.raises(changelog.StateError, match=message):
        changelog.from_record(_record(**changes), key)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (LinkState("p4bs", intended={0: 10**12}), r"intended\[0\]: 1000000000000 B is outside"),
        (
            LinkState("p4bs", unapplied={0: Decision(1, "optimise", "r")}),
            r"unapplied\[0\]: 1 B is outside the link's \[1500, 2500000\] B",
        ),
        (
            LinkState("p4bs", unapplied={2: Decision(100_000, "optimise", "r", queue=2)}),
            r"unapplied\[2\]: queue 2 on a link whose policy \(p4bs\) does not separate",
        ),
    ],
)
def test_a_saved_state_with_buffers_its_link_may_not_get_is_refused(
    state: LinkState, message: str
) -> None:
    with pytest.raises(changelog.StateError, match=message):
        changelog.checked(_link("p4bs"), state)


def test_only_a_jenks_link_keeps_the_flow_lists_of_its_pending_changes() -> None:
    """A flow list replaces the interface's classifier: a saved state of a link whose policy
    does not separate flows keeps its pending buffers, without flows."""
    state = changelog.from_record(_record())
    assert state.unapplied[0].flows == ("a:1>b:2/6",)
    kept = changelog.checked(_link("jenks"), state)
    assert kept.unapplied[0].flows == ("a:1>b:2/6",)
    stripped = changelog.checked(_link("p4bs"), state)
    assert stripped.unapplied[0].flows == ()
    assert stripped.unapplied[0].buffer_bytes == 100_000
    assert state.unapplied[0].flows == ("a:1>b:2/6",)  # the state read is left as it was


def _changed(value: Any) -> Any:
    """Another value of a LinkState field's kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, list):
        return [*value, (5, 6)]
    assert isinstance(value, dict), value
    return {**value, 7: 8}


def test_a_states_content_is_every_field_but_the_windows_it_covers() -> None:
    """What the periodic save compares (`changelog.content`): a change to any field is a
    new state to save, but to the windows covered; a change made in place after the content
    was taken too (a policy's snapshot holding a list it goes on filling)."""
    base = LinkState("globecom", {"srtt": 1}, 1_000, {0: 1}, {0: 1}, 5, [(0, 1)], False, {}, 2)
    for field in dataclasses.fields(LinkState):
        other = dataclasses.replace(base, **{field.name: _changed(getattr(base, field.name))})
        same = field.name == "last_window_end_ns"
        assert (changelog.content(other) == changelog.content(base)) is same, field.name
    state = dataclasses.replace(base, in_force={0: 1}, policy_state={"trials": [[1, 2.0]]})
    taken = changelog.content(state)
    state.in_force[0] = 2
    assert changelog.content(state) != taken
    state.in_force[0] = 1
    assert changelog.content(state) == taken
    state.policy_state["trials"].append([3, 4.0])
    assert changelog.content(state) != taken
