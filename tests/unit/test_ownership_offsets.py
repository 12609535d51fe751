"""The offsets the optimizer may commit (`Ownership.saved_offsets`): a partition's next
offset moves past the records whose windows the links' saved states cover, in order, up to
the first one not covered; a record of no link (None) is covered at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from p4bs import paths
from p4bs.config import load_config
from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.ownership import LinkHolder, Ownership
from p4bs_optimizer.service.stats import ServiceStats
from p4bs_optimizer.service.transaction import NextTransaction


@dataclass(eq=False)
class Link:
    saved_through: int = 0  # the windows its saved state covers


def test_a_partitions_offset_moves_past_the_records_the_saved_states_cover() -> None:
    stats = ServiceStats()
    owned = Ownership(
        load_config(paths.example_config()),
        stats,
        cast(LinkHolder, None),
        NextTransaction("opt-0", stats),
    )
    p0, p1 = ("feed", 0), ("feed", 1)
    a, b = Link(), Link()
    for offset, link, number in ((10, a, 1), (11, None, 0), (12, b, 1), (13, a, 2)):
        owned.received(p0, offset, cast(LinkController | None, link), number)
    owned.received(p1, 7, cast(LinkController, b), 2)
    assert owned.saved_offsets({p0, p1}) == {}  # nothing covered yet
    a.saved_through = 2
    assert owned.saved_offsets({p0, p1}) == {p0: 12}  # b's window 1 holds 12 back
    b.saved_through = 1
    assert owned.saved_offsets({p0, p1}) == {p0: 14}
    b.saved_through = 2
    assert owned.saved_offsets({p1}) == {p1: 8}
    owned.received(p0, 14, cast(LinkController, a), 3)
    assert owned.saved_offsets({p0, p1}) == {p0: 14, p1: 8}  # as committed last
