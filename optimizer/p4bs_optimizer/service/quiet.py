"""Which links may have gone quiet: the candidates of the stale check (`QuietWatch`).

A link falls back to its safe buffer when no window has come for `[optimizer] stale_after`
(twice that while its partition's backlog is read: `LinkController.check_stale`). Asking
every link ten times a second cost ~0.4 us a link each time, ~4 us a second per link: at
10,000 settled links on the optimizer feed (a window a second each) a tenth of the
service's CPU, spent on links that all reported. The watch keeps the links in the order of
their last window instead: an entry (time, controller) appended when a window comes (at most
one per link a GRAIN_NS, so that a link's windows every 100 ms append one a second), so
that a check looks only at the links whose newest entry is older than the limit, and at
those it found so before that have neither fallen back nor been heard from since (a link
catching up may be quiet up to twice the limit; one heard within GRAIN_NS after its entry
waits until its last window is as old).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p4bs_optimizer.service.controller import LinkController

# A link's newest entry is at most this much older than its last window: a link is taken
# from the queue that early, then asked at each check until it is stale or heard from.
GRAIN_NS = 1_000_000_000


class QuietWatch:
    """The service's links in the order of their last window (`heard`), and which of them
    the stale check asks (`quiet`)."""

    def __init__(self) -> None:
        # The entries, oldest first, as two queues (times, controllers): a tuple each would
        # be an object for the garbage collector, thousands a second living seconds, which
        # made its full collections (a pause of 0.1-0.5 s at 10,000 links) several times
        # as frequent.
        self._times: deque[int] = deque()
        self._controllers: deque[LinkController] = deque()
        self._newest: dict[LinkController, int] = {}  # each queued link's newest entry
        self._quiet: set[LinkController] = set()  # past the limit, not fallen back

    def heard(self, controller: LinkController) -> None:
        """The link had a window, or its controller was made: watched from then
        (`last_window_wall_ns`)."""
        at = controller.last_window_wall_ns
        newest = self._newest.get(controller)
        if newest is None or at - newest >= GRAIN_NS:
            self._times.append(at)
            self._controllers.append(controller)
            self._newest[controller] = at

    def quiet(self, now_ns: int, limit_ns: int) -> list[LinkController]:
        """The links of controllers not released that have had no window for `limit_ns`
        and are not on their safe buffer already: what the stale check asks."""
        cutoff = now_ns - limit_ns
        while self._times and self._times[0] <= cutoff:
            at, controller = self._times.popleft(), self._controllers.popleft()
            if self._newest.get(controller) == at:  # nothing queued for it since
                del self._newest[controller]
                self._quiet.add(controller)
        candidates = []
        for controller in list(self._quiet):
            if controller.released or controller.state.fallback or controller in self._newest:
                # Queued again (heard since), or nothing to ask: a window that comes
                # queues it (entries are queued in the order of their times, so a link
                # heard since its entry, within GRAIN_NS of it, waits here until then).
                self._quiet.discard(controller)
            elif controller.last_window_wall_ns <= cutoff:
                candidates.append(controller)
        return candidates
