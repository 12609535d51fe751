"""What every policy has in common: the window of link metrics it reads, the decisions it
returns, and the interface the service drives it through.

A policy is a pure, deterministic state machine over the link's metrics stream: the service
hands it each LinkMetrics window of its link, in event-time order, and applies what it
returns. Time inside a policy is the windows' event time (`window_end_ns`), never the wall
clock, so that a policy replays identically from recorded metrics and its settling waits
mean the same on a slow machine. The buffer in force during a window
(`Window.buffer_bytes`) is the one the service applied last before the window's end (the
service knows its own changes; LinkMetrics does not carry them).

Safety (the link's [min, max], the minimum interval between changes, stale metrics) is the
service's job, not the policy's; a policy still decides within the link's bounds. The codec
refuses windows with values their fields cannot hold (p4bs_schemas.ranges); as a second line
of defence a policy passes over such a window (`Policy.passes_over`), and `clamp` gives the
safe buffer for a target that is not a finite number. `restore` never raises: a snapshot that
does not fit leaves the policy as new and says why.
"""

from __future__ import annotations

import copy
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any, ClassVar

from p4bs.config import LinkConfig
from p4bs_schemas.ranges import RangeCheck, field_ranges, nullable_fields
from p4bs_schemas.registry import current_schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Window:
    """One LinkMetrics record (schemas/p4bs_schemas/avro/LinkMetrics.avsc): ns, bytes,
    bit/s and fractions, as the metrics job wrote them, and the buffer in force. The
    record's offered load (`offered_bps`, `offered_utilisation`) is left out: no policy
    decides on it."""

    link_id: str
    window_start_ns: int
    window_end_ns: int
    rtt_samples: int
    rtt_flows: int
    rtt_hmean_ns: int | None
    srtt_ns: int | None
    rtt_min_ns: int | None
    long_flows: int
    data_packets: int
    retransmissions: int
    loss_rate: float
    loss_rate_ewma: float
    queue_delay_samples: int
    queue_delay_ns: int | None
    queue_delay_ewma_ns: int | None
    throughput_bps: int  # what the link carried (the after tap), bit/s
    utilisation: float  # throughput_bps / capacity: carried, not offered (LinkMetrics v2)
    f: float
    zscore: float
    change: bool
    buffer_bytes: int | None  # queue 0's, as the service applied it; None: not known
    # Its values were checked against LinkMetrics's ranges where they were read: the codec
    # checks every record it decodes, so the service's windows need no second check.
    read_checked: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], buffer_bytes: int | None, *, checked: bool = False
    ) -> Window:
        """The window of a decoded LinkMetrics record, under `buffer_bytes`; `checked`: the
        record was decoded by the codec (p4bs_schemas.codec), which checked its values."""
        # A frozen dataclass's __init__ sets its 22 fields one by one through
        # object.__setattr__, ~5 us a window, and the optimizer makes ~10 a second per link:
        # the fields go into the new window's __dict__ at once instead.
        window = object.__new__(cls)
        window.__dict__.update(zip(_RECORD_FIELDS, _record_values(record), strict=True))
        window.__dict__["buffer_bytes"] = buffer_bytes
        window.__dict__["read_checked"] = checked
        return window

    def problem(self) -> str | None:
        """Which value no LinkMetrics window can hold (NaN, infinite, negative, a fraction
        above 1), named; None if there is none (or the codec checked them as it read
        them)."""
        if self.read_checked:
            return None
        return _WINDOW_RANGES.problem(self.__dict__)


# The fields a window takes from its LinkMetrics record (all but buffer_bytes), and their
# values, taken at once.
_RECORD_FIELDS = tuple(
    f.name for f in fields(Window) if f.name not in ("buffer_bytes", "read_checked")
)
_record_values = itemgetter(*_RECORD_FIELDS)
# What each of a window's LinkMetrics fields may hold: the codec's check, for windows made
# otherwise too (the simulator's, a replay's).
_LINK_METRICS = current_schema("LinkMetrics")
_WINDOW_RANGES = RangeCheck(
    "window",
    {
        path: range_
        for path, range_ in field_ranges("LinkMetrics", _LINK_METRICS).items()
        if path in _RECORD_FIELDS
    },
    nullable_fields(_LINK_METRICS),
)


@dataclass(frozen=True)
class Decision:
    """A buffer a policy wants in force, and why (a BufferDecision record's policy fields)."""

    buffer_bytes: int
    phase: str  # e.g. "static", "bound_search", "optimise", "settled"
    reason: str  # for people: what the policy saw and concluded
    queue: int = 0  # router queue; 0 unless the policy separates flows into queues
    trial: int | None = None  # optimisation trial this buffer is, if it is one
    f: float | None = None  # mean f measured for the previous trial, if one ended
    flows: tuple[str, ...] = ()  # flows classified into `queue` ("src:sport>dst:dport/proto")
    window_end_ns: int | None = None  # the window it was made on (the service sets it)


class Policy(ABC):
    """One link's policy. `decide` is called once per window of the link, in order; it
    returns the decisions to apply now ([] keeps what is in force). `snapshot` returns the
    policy's state as JSON-able data and `restore` resumes from it, so that a restarted
    service continues a search where it was."""

    name: ClassVar[str]

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        self.link = link
        self.options = dict(options)

    @abstractmethod
    def decide(self, window: Window) -> list[Decision]: ...

    def snapshot(self) -> dict[str, Any]:
        """The state to persist; a stateless policy has none."""
        return {}

    def restore(self, state: Any) -> str | None:
        """Resumes from what `snapshot` returned. Never raises: a snapshot that does not fit
        (not a JSON object, a field missing or of the wrong kind, a number that is NaN or
        infinite, a buffer outside the link's bounds) leaves the policy as new, is logged with
        the link, and its reason returned; None when the policy resumed."""
        resumed = copy.copy(self)  # loaded on the side: a failed load leaves self as new
        try:
            if not isinstance(state, Mapping):
                raise TypeError(f"a snapshot is a JSON object, not {type(state).__name__}")
            odd = next(_not_finite(state, "snapshot"), None)
            if odd is not None:
                raise ValueError(f"{odd} is not a finite number")
            resumed.load(state)
            problem = resumed.loaded_problem()
        except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            log.error(
                "link %s: saved %s state refused, the policy starts afresh: %s",
                self.link.id,
                self.name,
                problem,
            )
            return problem
        self.__dict__.update(resumed.__dict__)
        return None

    def load(self, state: Mapping[str, Any]) -> None:
        """Takes the state `snapshot` returned (called by `restore`, which refuses what this
        raises on). A stateless policy takes none."""
        if state:
            raise ValueError(f"policy {self.name!r} keeps no state, was given {dict(state)!r}")

    def loaded_problem(self) -> str | None:
        """What makes the state just loaded unusable for this link, or None."""
        return None

    def buffer_problem(self, what: str, buffer_bytes: Any) -> str | None:
        """Why `buffer_bytes` (of a loaded state) is not a buffer of this link, or None."""
        low, high = self.link.min_buffer_bytes, self.link.max_buffer_bytes
        if isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int):
            return f"{what} {buffer_bytes!r} is not a number of bytes"
        if not low <= buffer_bytes <= high:
            return f"{what} {buffer_bytes} B is outside the link's [{low}, {high}] B"
        return None

    def passes_over(self, window: Window) -> bool:
        """Whether the window holds a value no policy can decide on (logged): the codec
        refuses such windows, this is the policies' second line of defence."""
        problem = window.problem()
        if problem is not None:
            log.warning(
                "link %s: window ending %s passed over: %s",
                self.link.id,
                window.window_end_ns,
                problem,
            )
        return problem is not None

    def clamp(self, buffer_bytes: float) -> int:
        """A buffer within the link's [min, max], in whole bytes; the safe buffer for a target
        that is not a finite number."""
        if not math.isfinite(buffer_bytes):
            return self.link.safe_buffer_bytes
        low, high = self.link.min_buffer_bytes, self.link.max_buffer_bytes
        return int(min(max(round(buffer_bytes), low), high))


def _not_finite(value: Any, where: str) -> Iterator[str]:
    """Where a NaN or an infinity sits in JSON-like data (json.loads reads both)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield f"{where} = {value}"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _not_finite(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _not_finite(item, f"{where}[{i}]")


class PolicyOptionError(ValueError):
    """A policy option in the config is unknown or has a bad value (the message says which)."""


def bdp_bytes(capacity_bps: int, rtt_ns: int | float) -> float:
    """The bandwidth-delay product C * RTT, bytes."""
    return capacity_bps * rtt_ns / 8e9
