"""The stale check's candidates (`QuietWatch`): exactly the links of controllers not
released, not on their safe buffer, that have had no window for the limit, whatever the
order of windows, fallbacks, releases and new links, though the watch looks at no other
link."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import cast

from p4bs_optimizer.service.controller import LinkController
from p4bs_optimizer.service.quiet import GRAIN_NS, QuietWatch

MS = 1_000_000
LIMIT_NS = 5_000 * MS


@dataclass
class State:
    fallback: bool = False


@dataclass(eq=False)  # hashed by identity, as a controller is
class Link:
    """What the watch reads of a LinkController."""

    last_window_wall_ns: int
    released: bool = False
    state: State = field(default_factory=State)


def _watch(watch: QuietWatch, now_ns: int) -> set[Link]:
    return {cast(Link, c) for c in watch.quiet(now_ns, LIMIT_NS)}


def _heard(watch: QuietWatch, link: Link, now_ns: int) -> None:
    link.last_window_wall_ns = now_ns
    watch.heard(cast(LinkController, link))


def test_a_link_is_asked_once_quiet_for_the_limit_and_no_longer_once_heard() -> None:
    watch = QuietWatch()
    a, b = Link(0), Link(0)
    for link in (a, b):
        watch.heard(cast(LinkController, link))
    for now in range(100 * MS, LIMIT_NS, 100 * MS):  # a window every 100 ms
        _heard(watch, a, now)
        assert _watch(watch, now) == set()
    assert _watch(watch, LIMIT_NS) == {b}
    assert _watch(watch, LIMIT_NS + 100 * MS) == {b}  # asked until it falls back
    b.state.fallback = True
    assert _watch(watch, LIMIT_NS + 200 * MS) == set()
    b.state.fallback = False  # its windows return
    _heard(watch, b, LIMIT_NS + 300 * MS)
    assert _watch(watch, 2 * LIMIT_NS + 200 * MS) == {a}
    assert _watch(watch, 2 * LIMIT_NS + 300 * MS) == {a, b}


def test_the_candidates_are_the_quiet_links_in_any_order_of_events() -> None:
    """Against the check of every link, over random windows (now and then a link goes
    silent for 1 to 12 s), fallbacks, windows returning, releases and new links."""
    rng = random.Random(41)
    watch = QuietWatch()
    links: list[Link] = []
    silent_until: dict[int, int] = {}
    now = 0
    quiet_steps = 0
    for step in range(4_000):
        now += rng.choice((10, 50, 100, 400)) * MS
        if rng.random() < 0.02 or not links:
            links.append(Link(now))
            watch.heard(cast(LinkController, links[-1]))
        for i, link in enumerate(links):
            if link.released or now < silent_until.get(i, 0):
                continue
            if rng.random() < 0.01:
                silent_until[i] = now + rng.randint(1_000, 12_000) * MS
            elif rng.random() < 0.5:
                link.state.fallback = False  # a window clears it
                _heard(watch, link, now)
        if rng.random() < 0.005:
            rng.choice(links).released = True
        expected = {
            link
            for link in links
            if not link.released
            and not link.state.fallback
            and now - link.last_window_wall_ns >= LIMIT_NS
        }
        asked = _watch(watch, now)
        assert asked == expected, step
        quiet_steps += bool(asked)
        for link in asked:
            if rng.random() < 0.7:
                link.state.fallback = True  # the check fell back (else: catching up)
    assert quiet_steps > 200  # the case was met often
    assert len(watch._times) <= len(links) * (LIMIT_NS // GRAIN_NS + 2)
