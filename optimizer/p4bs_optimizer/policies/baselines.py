"""The buffer-sizing rules P4BS is compared against (P4BS §VI-B, Fig. 11): static, BDP,
Stanford, Tiny, Bloated, BSCL and ADT, each a `Policy` over the link's metric windows; and
`step`, one move of the buffer at a set time, which measures the link's response to it.

Each rule computes a target buffer from the window (or from its options alone), clamps it to
the link's bounds and decides only when that differs from its last decision by more than a
relative tolerance, so the service is not sent the same buffer every window. Also here: the
option reader and the RTT and N helpers the other policy modules share.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from p4bs.config import LinkConfig
from p4bs.units import UnitError, bytes_for_duration, parse_duration_ns, parse_size_bytes
from p4bs_optimizer.policies.base import Decision, Policy, PolicyOptionError, Window, bdp_bytes

DEFAULT_TOLERANCE = 0.05  # a recomputed target this close to the last decision is not sent


class OptionReader:
    """Reads one policy's `policy_options`, each with its default. A value of the wrong type
    or out of range raises PolicyOptionError naming the option; `finish` raises for options
    the policy never asked for (a misspelt option must not silently fall back to a default)."""

    def __init__(self, policy: str, options: Mapping[str, Any]) -> None:
        self._policy = policy
        self._options = options
        self._asked: set[str] = set()

    def _take(self, key: str) -> Any:
        self._asked.add(key)
        return self._options.get(key)

    def _error(self, key: str, message: str) -> PolicyOptionError:
        return PolicyOptionError(f"policy {self._policy!r}: option {key!r} {message}")

    def number(
        self,
        key: str,
        default: float,
        *,
        low: float,
        high: float = math.inf,
        low_open: bool = False,
        high_open: bool = False,
    ) -> float:
        """A real number in the interval [low, high], either end open if asked."""
        value = self._take(key)
        if value is None:
            return default
        high_open = high_open or high == math.inf
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._error(key, f"must be a number in {interval}, got {value!r}")
        above_low = value > low if low_open else value >= low
        below_high = value < high if high_open else value <= high
        if not (math.isfinite(value) and above_low and below_high):
            raise self._error(key, f"must be in {interval}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int, *, low: int, high: int) -> int:
        """A whole number in [low, high]."""
        value = self._take(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._error(key, f"must be a whole number in [{low}, {high}], got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """true or false."""
        value = self._take(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._error(key, f"must be true or false, got {value!r}")
        return value

    def size_bytes(self, key: str, default: int) -> int:
        """A positive size: bytes, or a string with a unit such as '64KiB'."""
        value = self._take(key)
        if value is None:
            return default
        try:
            size = parse_size_bytes(value)
        except UnitError as exc:
            raise self._error(key, str(exc)) from None
        if size <= 0:
            raise self._error(key, f"must be a positive size, got {value!r}")
        return size

    def duration_ns(self, key: str, default: int, *, allow_zero: bool = False) -> int:
        """A positive (or with `allow_zero`, non-negative) duration: ns, or a string with a
        unit such as '200ms'."""
        value = self._take(key)
        if value is None:
            return default
        try:
            duration = parse_duration_ns(value)
        except UnitError as exc:
            raise self._error(key, str(exc)) from None
        if duration < 0 or (duration == 0 and not allow_zero):
            kind = "non-negative" if allow_zero else "positive"
            raise self._error(key, f"must be a {kind} duration, got {value!r}")
        return duration

    def tolerance(self) -> float:
        """The relative change of a target below which no new decision is sent."""
        return self.number("tolerance", DEFAULT_TOLERANCE, low=0, high=1, high_open=True)

    def finish(self) -> None:
        """Raises for every option no reader asked for."""
        unknown = sorted(set(self._options) - self._asked)
        if unknown:
            takes = ", ".join(sorted(self._asked)) or "no options"
            raise PolicyOptionError(
                f"policy {self._policy!r}: unknown option(s) {', '.join(map(repr, unknown))};"
                f" it takes {takes}"
            )


def window_rtt_ns(window: Window) -> int | None:
    """The RTT the rules use, ns: the link's SRTT (smoothed harmonic mean of the flows' RTTs),
    else the window's harmonic mean; None until the metrics have seen an RTT."""
    return window.srtt_ns if window.srtt_ns is not None else window.rtt_hmean_ns


def flow_count(window: Window) -> int:
    """N, the long flows at the window's end, at least 1 so that N = 0 means one flow."""
    return max(window.long_flows, 1)


def stanford_bytes(capacity_bps: int, rtt_ns: float, flows: int) -> float:
    """Appenzeller et al.'s rule C·RTT/√N, bytes (N < 1 taken as 1)."""
    return bdp_bytes(capacity_bps, rtt_ns) / math.sqrt(max(flows, 1))


def clamp_note(link: LinkConfig, target: float, buffer: int) -> str:
    """What a reason adds when the target was outside the link's bounds ('' when inside)."""
    if round(target) == buffer:
        return ""
    return (
        f"; clamped to the link's [min, max] = [{link.min_buffer_bytes}, {link.max_buffer_bytes}] B"
    )


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _mbit(bps: float) -> str:
    return f"{bps / 1e6:g} Mbit/s"


class _TargetPolicy(Policy):
    """A rule that yields a target buffer per window: decides the clamped target when there is
    no decision yet or it moved more than `tolerance` (relative) from the last decision."""

    phase: ClassVar[str]
    tolerance: float = 0.0  # constant targets never move, so they need no tolerance option

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self._decided: int | None = None
        reader = OptionReader(self.name, options)
        self.read_options(reader)
        reader.finish()

    def read_options(self, reader: OptionReader) -> None:
        """Reads the rule's options into attributes (none by default)."""

    @abstractmethod
    def target(self, window: Window) -> tuple[float, str] | None:
        """The buffer the rule wants now, bytes (not yet clamped), and how it was computed;
        None when the window does not have what the rule needs."""

    def decide(self, window: Window) -> list[Decision]:
        if self.passes_over(window):
            return []
        found = self.target(window)
        if found is None:
            return []
        target, how = found
        buffer = self.clamp(target)
        last = self._decided
        if last is not None and abs(buffer - last) <= self.tolerance * last:
            return []
        self._decided = buffer
        reason = how + clamp_note(self.link, target, buffer)
        return [Decision(buffer_bytes=buffer, phase=self.phase, reason=reason)]

    def snapshot(self) -> dict[str, Any]:
        return {"decided": self._decided}

    def load(self, state: Mapping[str, Any]) -> None:
        self._decided = state.get("decided")

    def loaded_problem(self) -> str | None:
        if self._decided is None:
            return None
        return self.buffer_problem("the buffer decided", self._decided)


class StaticPolicy(_TargetPolicy):
    """A fixed buffer: option `buffer` (bytes, or a size such as '256KiB'; default the link's
    safe buffer), which must lie within the link's bounds. Decides once."""

    name = "static"
    phase = "static"

    def read_options(self, reader: OptionReader) -> None:
        self.buffer_bytes = reader.size_bytes("buffer", self.link.safe_buffer_bytes)
        low, high = self.link.min_buffer_bytes, self.link.max_buffer_bytes
        if not low <= self.buffer_bytes <= high:
            raise PolicyOptionError(
                f"policy {self.name!r}: option 'buffer' ({self.buffer_bytes} B) is outside "
                f"the link's [min, max] = [{low}, {high}] B"
            )

    def target(self, window: Window) -> tuple[float, str] | None:
        return self.buffer_bytes, f"static buffer {self.buffer_bytes} B"


class BdpPolicy(_TargetPolicy):
    """The rule of thumb (Villamizar & Song): B = C·RTT, the bandwidth-delay product, with C
    the link capacity and RTT the window's SRTT. Option `tolerance` (default 5%)."""

    name = "bdp"
    phase = "recompute"

    def read_options(self, reader: OptionReader) -> None:
        self.tolerance = reader.tolerance()

    def target(self, window: Window) -> tuple[float, str] | None:
        rtt = window_rtt_ns(window)
        if rtt is None:
            return None
        capacity = self.link.capacity_bps
        buffer = bdp_bytes(capacity, rtt)
        return buffer, f"C·SRTT = {_mbit(capacity)} * {_ms(rtt)} = {buffer:.0f} B"


class StanfordPolicy(_TargetPolicy):
    """The Stanford rule (Appenzeller, Keslassy & McKeown, SIGCOMM 2004): B = C·RTT/√N, with
    RTT the window's SRTT and N its long flows (N < 1 taken as 1). Option `tolerance`."""

    name = "stanford"
    phase = "recompute"

    def read_options(self, reader: OptionReader) -> None:
        self.tolerance = reader.tolerance()

    def target(self, window: Window) -> tuple[float, str] | None:
        rtt = window_rtt_ns(window)
        if rtt is None:
            return None
        capacity, flows = self.link.capacity_bps, flow_count(window)
        buffer = stanford_bytes(capacity, rtt, flows)
        how = f"C·SRTT/√N = {_mbit(capacity)} * {_ms(rtt)} / √{flows} = {buffer:.0f} B"
        return buffer, how


class TinyPolicy(_TargetPolicy):
    """The tiny-buffer rule (Enachescu et al., CCR 2005; 20-50 packets): option `packets`
    (default 32) times option `packet_bytes` (default 1500). Decides once."""

    name = "tiny"
    phase = "static"

    def read_options(self, reader: OptionReader) -> None:
        self.packets = reader.integer("packets", 32, low=1, high=1_000_000)
        self.packet_bytes = reader.integer("packet_bytes", 1500, low=64, high=65_535)

    def target(self, window: Window) -> tuple[float, str]:
        buffer = self.packets * self.packet_bytes
        return buffer, f"tiny buffer: {self.packets} packets * {self.packet_bytes} B = {buffer} B"


class BloatedPolicy(_TargetPolicy):
    """The vendors' deep buffer: B = D·C with D the option `delay_ns` (ns, or a duration such
    as '200ms'; default 200 ms) and C the link capacity. Decides once."""

    name = "bloated"
    phase = "static"

    def read_options(self, reader: OptionReader) -> None:
        self.delay_ns = reader.duration_ns("delay_ns", 200_000_000)

    def target(self, window: Window) -> tuple[float, str]:
        capacity = self.link.capacity_bps
        buffer = bytes_for_duration(self.delay_ns, capacity)
        return buffer, f"bloated buffer: {_ms(self.delay_ns)} * {_mbit(capacity)} = {buffer} B"


class BsclPolicy(_TargetPolicy):
    """BSCL's loss-rate constraint (Dhamdhere, Jiang & Dovrolis, "Buffer sizing for congested
    Internet links", INFOCOM 2005): the buffer that keeps the loss rate of the link's
    persistent TCP flows at or below a target p̂. The form implemented (the paper's text was
    not in the reference material at hand, so this is its model as derived below):

        B = K·N/√p̂ - C·T   (packets; here * S to give bytes)

    It follows from TCP's square-root law: each of the N flows has a window of K/√p packets,
    their windows add up to what the path and the full buffer hold, C·T + B, so the loss rate
    is p = (K·N / (C·T + B))², and p <= p̂ needs B >= K·N/√p̂ - C·T. The symbols:

    - N: the locally bottlenecked persistent flows; here the window's `long_flows` (N < 1
      taken as 1), the flows the data plane counts as long.
    - p̂: the target loss rate, option `target_loss` (default the link's SLA `max_loss`).
    - K: the square-root law's constant, option `k` (default 0.87 = √(3/4), the constant
      with delayed ACKs).
    - S: the segment size that turns packets into bytes, option `packet_bytes` (default 1500).
    - C: the link capacity.
    - T: the flows' round-trip time without this link's queueing, their harmonic mean (the
      mean that adding up the flows' rates, each ∝ 1/T_i, calls for). Here the window's SRTT
      (the smoothed harmonic mean across flows) minus the smoothed queueing delay
      `queue_delay_ewma_ns`; when the queueing delay is not measured, the minimum RTT
      `rtt_min_ns` stands in; never below `rtt_min_ns`. No decision until there is an SRTT.

    Only this loss constraint is implemented; the paper's other (utilisation) constraint is
    not, so when the formula gives B <= 0 (the flows' windows fit in the pipe) the decision
    is the link's minimum buffer. Option `tolerance` (default 5%).
    """

    name = "bscl"
    phase = "recompute"

    def read_options(self, reader: OptionReader) -> None:
        self.tolerance = reader.tolerance()
        self.target_loss = reader.number(
            "target_loss", self.link.max_loss, low=0, high=1, low_open=True, high_open=True
        )
        self.k = reader.number("k", 0.87, low=0, low_open=True)
        self.packet_bytes = reader.integer("packet_bytes", 1500, low=64, high=65_535)

    def target(self, window: Window) -> tuple[float, str] | None:
        rtt = window_rtt_ns(window)
        if rtt is None:
            return None
        if window.queue_delay_ewma_ns is not None:
            base_rtt, source = rtt - window.queue_delay_ewma_ns, "SRTT - queueing delay"
        elif window.rtt_min_ns is not None:
            base_rtt, source = window.rtt_min_ns, "min RTT"
        else:
            base_rtt, source = rtt, "SRTT"
        base_rtt = max(base_rtt, window.rtt_min_ns or 0)
        flows, capacity = flow_count(window), self.link.capacity_bps
        packets = self.k * flows / math.sqrt(self.target_loss)
        buffer = packets * self.packet_bytes - bdp_bytes(capacity, base_rtt)
        how = (
            f"K·N/√p̂ - C·T = {self.k:g} * {flows} / √{self.target_loss:g} * "
            f"{self.packet_bytes} B - {_mbit(capacity)} * {_ms(base_rtt)} ({source}) "
            f"= {buffer:.0f} B"
        )
        return buffer, how


class AdtPolicy(_TargetPolicy):
    """Active/Adaptive Drop-Tail, ADT (Stanojević, Shorten & Kellett, "Adaptive tuning of
    drop-tail buffers for reducing queueing delays", IEEE Commun. Lett. 10(7), 2006; P4BS's
    reference [32]): the drop-tail limit q is steered to the smallest buffer that still gives
    a desired utilisation u. Every sample period it estimates the utilisation and steps q
    multiplicatively (MIMD):

        û ← (1 - rho)·û + rho·u_sample
        q ← c·q   if û < u   (the buffer limits utilisation: grow it)
        q ← q/c   otherwise  (utilisation to spare: shrink it)

    Options and defaults: `target_utilisation` u = 0.98 (the target P4BS ran ADT with, §VI-E),
    `step` c = 1.01, `gain` rho = 0.1 and `sample_period_ns` = 300 ms (the letter's simulation
    settings), `tolerance` (default 5%). The estimator's form (an EWMA of gain rho) is as
    given here; the letter's text was not in the reference material at hand.

    Adaptations to a policy over metric windows: u_sample is the duration-weighted mean of
    the windows' `utilisation` (what the link carried, from the after tap; the offered load
    exceeds u whenever a queue builds, and would always shrink q) over one sample period
    (windows shorter than the period are pooled); windows without data packets are not
    samples (an idle link says nothing about whether the buffer limits it); q starts at the
    buffer in force (the window's `buffer_bytes`, else the link's safe buffer) and stays
    within the link's bounds so it does not wind up past them; the first û is the first
    sample. q changes by 1% a period; a decision is sent when it has moved more than
    `tolerance` from the last one.
    """

    name = "adt"
    phase = "adapt"

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self.limit_bytes: float | None = None  # q
        self.utilisation: float | None = None  # û
        self._pooled_ns = 0  # data windows' time since the last sample
        self._pooled_utilisation_ns = 0.0  # their utilisation * duration

    def read_options(self, reader: OptionReader) -> None:
        self.tolerance = reader.tolerance()
        self.target_utilisation = reader.number(
            "target_utilisation", 0.98, low=0, high=1, low_open=True
        )
        self.step = reader.number("step", 1.01, low=1, high=2, low_open=True)
        self.gain = reader.number("gain", 0.1, low=0, high=1, low_open=True)
        self.sample_period_ns = reader.duration_ns("sample_period_ns", 300_000_000)

    def target(self, window: Window) -> tuple[float, str] | None:
        if window.data_packets == 0:
            return None
        if self.limit_bytes is None:
            in_force = window.buffer_bytes or self.link.safe_buffer_bytes
            self.limit_bytes = float(self.clamp(in_force))
        duration = window.window_end_ns - window.window_start_ns
        self._pooled_ns += duration
        self._pooled_utilisation_ns += window.utilisation * duration
        if self._pooled_ns < self.sample_period_ns:
            return None
        sample = self._pooled_utilisation_ns / self._pooled_ns
        self._pooled_ns, self._pooled_utilisation_ns = 0, 0.0
        if self.utilisation is None:
            self.utilisation = sample
        else:
            self.utilisation = (1 - self.gain) * self.utilisation + self.gain * sample
        if self.utilisation < self.target_utilisation:
            stepped, rule = self.limit_bytes * self.step, f"< u = {self.target_utilisation:g}: q·c"
        else:
            stepped, rule = self.limit_bytes / self.step, f">= u = {self.target_utilisation:g}: q/c"
        low, high = self.link.min_buffer_bytes, self.link.max_buffer_bytes
        self.limit_bytes = min(max(stepped, low), high)
        how = f"utilisation û = {self.utilisation:.4f} {rule} with c = {self.step:g} → q = "
        return self.limit_bytes, how + f"{self.limit_bytes:.0f} B"

    def snapshot(self) -> dict[str, Any]:
        return {
            **super().snapshot(),
            "limit_bytes": self.limit_bytes,
            "utilisation": self.utilisation,
            "pooled_ns": self._pooled_ns,
            "pooled_utilisation_ns": self._pooled_utilisation_ns,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        super().load(state)
        self.limit_bytes = state.get("limit_bytes")
        self.utilisation = state.get("utilisation")
        self._pooled_ns = state.get("pooled_ns", 0)
        self._pooled_utilisation_ns = state.get("pooled_utilisation_ns", 0.0)


class StepPolicy(StaticPolicy):
    """One move of the buffer, to measure the link's response to it: the static buffer
    (option `buffer`), decided once option `at` (a duration, default 10 s) has passed since
    the start of the first window with data packets (the traffic's start, to a window);
    until then the buffer in force stays. Its runs are the offline simulator's step runs
    (eval/p4bs_eval/simulator.py): a fixed-buffer sweep shows each buffer from the traffic's
    start, not after a move from another."""

    name = "step"

    def __init__(self, link: LinkConfig, options: Mapping[str, Any]) -> None:
        super().__init__(link, options)
        self.traffic_start_ns: int | None = None

    def read_options(self, reader: OptionReader) -> None:
        super().read_options(reader)
        self.at_ns = reader.duration_ns("at", 10_000_000_000, allow_zero=True)

    def target(self, window: Window) -> tuple[float, str] | None:
        if self.traffic_start_ns is None:
            if window.data_packets == 0:
                return None
            self.traffic_start_ns = window.window_start_ns
        if window.window_end_ns < self.traffic_start_ns + self.at_ns:
            return None
        return self.buffer_bytes, f"step to {self.buffer_bytes} B, {_ms(self.at_ns)} in"

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "traffic_start_ns": self.traffic_start_ns}

    def load(self, state: Mapping[str, Any]) -> None:
        super().load(state)
        self.traffic_start_ns = state.get("traffic_start_ns")
