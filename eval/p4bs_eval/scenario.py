"""Evaluation scenarios: what traffic runs through the testbed, for how long, under which
policies, and which reports are made of it (a TOML file, see eval/README.md).

A scenario may sweep: each `[sweep]` key lists values that replace that field in every flow
group (`flows`, `cca`, `rtt`) or the router's initial buffer (`buffer`), and every
combination of them is a point. Each point runs under each policy, `repeat` times.

Traffic that changes: groups start and `stop` (flows that leave), and `[[phases]]` name the
parts of a run (each from its `start` to the next one's), where the short-flow rate may
change; each phase's figures are reported apart. `oracle_buffers` adds a fixed-buffer policy
per buffer (`fixed:<ms>ms`): the sweep the oracles are read from.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from p4bs.config import Config, FlowGroup, load_config, parse_config
from p4bs.units import UnitError, parse_duration_ns
from p4bs_infra.traffic import ShortFlows, Voip
from p4bs_infra.trafficgen import LOG_UNIFORM, SIZE_CDFS
from p4bs_optimizer.policies import POLICIES

# Runs the data plane and the metrics job but no optimizer: the router keeps its initial
# buffer ("without resizing").
NO_POLICY = "none"
REPORTS = ("sweep", "timeseries", "groups", "heatmap", "cdf", "fct", "buffer")
SWEEPABLE = ("flows", "cca", "rtt", "buffer")
# Settings of the testbed link's entry in the config a scenario may replace (the SLA bounds
# and weights of f: P4BS searches up to C * d-hat, and f is normalised by them).
LINK_SETTINGS = ("sla", "weights")
CCAS = ("cubic", "bbr", "reno")
# The oracle's policies: no optimizer, the router's initial buffer this many ms of line rate.
FIXED_PREFIX = "fixed:"
# The active queue management baselines (p4bs_infra.testbed.Aqm's kinds): no optimizer, the
# bottleneck queue that AQM on the scenario's initial buffer.
AQM_POLICIES = ("red", "codel")
# A scenario without [[phases]] has this one, from the warm-up's end to the run's end.
WHOLE_RUN = "all"


def fixed_policy(buffer_ms: float) -> str:
    """The oracle policy that keeps `buffer_ms` (ms of line rate): 'fixed:12.5ms'."""
    return f"{FIXED_PREFIX}{buffer_ms:g}ms"


def fixed_buffer_ms(policy: str) -> float | None:
    """The buffer (ms of line rate) a `fixed:<ms>ms` policy keeps; None for other policies
    or a malformed number."""
    if not (policy.startswith(FIXED_PREFIX) and policy.endswith("ms")):
        return None
    try:
        ms = float(policy[len(FIXED_PREFIX) : -2])
    except ValueError:
        return None
    return ms if ms > 0 and math.isfinite(ms) else None


class ScenarioError(ValueError):
    """A scenario file that cannot run; the message names the file and the field."""


@dataclass(frozen=True)
class Point:
    """One combination of the sweep's values (empty without a sweep)."""

    values: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        if not self.values:
            return "base"
        parts = []
        for key, value in self.values:
            shown = f"{value / 1e6:g}ms" if key in ("rtt", "buffer") else str(value)
            parts.append(f"{key}={shown}")
        return ",".join(parts)

    @property
    def slug(self) -> str:
        return self.label.replace(",", "_").replace("=", "-")


@dataclass(frozen=True)
class Phase:
    """A named part of a run, from `start_s` after the traffic starts to the next phase's start
    (the last to the run's end); from it on the short flows arrive at
    `short_flows_rate_per_s` when set."""

    name: str
    start_s: float
    short_flows_rate_per_s: float | None = None


@dataclass(frozen=True)
class PhaseSpan:
    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class EvalScenario:
    name: str
    title: str
    duration_s: float
    warmup_s: float
    buffer_ms: float  # the router's initial buffer, ms of line rate
    groups: tuple[FlowGroup, ...]
    policies: tuple[str, ...]
    repeat: int = 1
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sweep: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    short_flows: ShortFlows | None = None
    voip: Voip | None = None
    reports: tuple[str, ...] = ()
    loop_sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    link_settings: Mapping[str, Any] = field(default_factory=dict)
    phases: tuple[Phase, ...] = ()
    # A phase's first seconds, left out of its figures (the traffic's change settling).
    settle_s: float = 0.0
    oracle_buffers_ms: tuple[float, ...] = ()

    def phase_spans(self) -> list[PhaseSpan]:
        """The phases with their ends, s after the traffic starts; without [[phases]] one,
        "all", from the warm-up's end to the run's end."""
        if not self.phases:
            return [PhaseSpan(WHOLE_RUN, self.warmup_s, self.duration_s)]
        ends = [p.start_s for p in self.phases[1:]] + [self.duration_s]
        return [PhaseSpan(p.name, p.start_s, end) for p, end in zip(self.phases, ends, strict=True)]

    def short_flow_rate_changes(self) -> tuple[tuple[float, float], ...]:
        """(from_s, rate): where a phase sets the short flows' rate."""
        return tuple(
            (p.start_s, p.short_flows_rate_per_s)
            for p in self.phases
            if p.short_flows_rate_per_s is not None
        )

    def points(self) -> list[Point]:
        keys = [key for key, _ in self.sweep]
        combos = itertools.product(*(values for _, values in self.sweep))
        return [Point(tuple(zip(keys, combo, strict=True))) for combo in combos]

    def groups_at(self, point: Point) -> list[FlowGroup]:
        """The flow groups with the point's values in place."""
        changes = dict(point.values)
        changes.pop("buffer", None)
        if "rtt" in changes:
            changes["rtt_ns"] = changes.pop("rtt")
        return [replace(group, **changes) for group in self.groups]

    def buffer_ms_at(self, point: Point) -> float:
        """The router's initial buffer at the point, ms of line rate."""
        buffer_ns = dict(point.values).get("buffer")
        return self.buffer_ms if buffer_ns is None else buffer_ns / 1e6

    def runs(self, policies: tuple[str, ...] | None = None) -> Iterator[tuple[Point, str, int]]:
        """Repeat by repeat, and within a repeat point by point, every policy in turn (the
        oracle's fixed buffers too): repeat r of every point and policy runs before repeat
        r + 1, so what drifts on the machine over hours weighs on all of them alike (their
        paired difference is what the report compares), and a stopped evaluation has whole
        repeats."""
        for repeat in range(1, self.repeat + 1):
            for point in self.points():
                for policy in policies or self.policies:
                    yield point, policy, repeat


def config_with_link_settings(config_path: Path, link_settings: Mapping[str, Any]) -> Config:
    """The config with a scenario's [link] settings (SLA, weights) in every link's entry
    (ConfigError names a problem)."""
    if not link_settings:
        return load_config(config_path)
    data = tomllib.loads(config_path.read_text())
    for link in data.get("links", []):
        link.update(link_settings)
    return parse_config(data, f"{config_path} with the scenario's [link]")


def check_policies(policies: tuple[str, ...], where: str) -> None:
    for policy in policies:
        if policy not in (NO_POLICY, *AQM_POLICIES, *POLICIES) and fixed_buffer_ms(policy) is None:
            raise ScenarioError(
                f"{where}: policy {policy!r} unknown; known: {NO_POLICY}, "
                f"{FIXED_PREFIX}<ms>ms (a fixed buffer), {', '.join(AQM_POLICIES)} (AQM), "
                f"{', '.join(sorted(POLICIES))}"
            )


def load_scenario(path: Path) -> EvalScenario:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return parse_scenario(data, path.stem, str(path))


def parse_scenario(data: Mapping[str, Any], name: str, where: str) -> EvalScenario:
    def fail(message: str) -> ScenarioError:
        return ScenarioError(f"{where}: {message}")

    known = {
        "title", "duration", "warmup", "buffer", "groups", "policies", "repeat",
        "policy_options", "sweep", "short_flows", "voip", "reports", "loop", "link",
        "phases", "settle", "oracle_buffers",
    }  # fmt: skip
    unknown = sorted(set(data) - known)
    if unknown:
        raise fail(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")

    def duration_s(key: str, value: Any, *, zero: bool = False) -> float:
        try:
            ns = parse_duration_ns(value)
        except UnitError as exc:
            raise fail(f"{key}: {exc}") from None
        if ns < 0 or (ns == 0 and not zero):
            raise fail(f"{key}: must be {'non-negative' if zero else 'positive'}, got {value!r}")
        return ns / 1e9

    duration = duration_s("duration", data.get("duration", "60s"))
    warmup = duration_s("warmup", data.get("warmup", "0s"), zero=True)
    if warmup >= duration:
        raise fail(f"warmup ({warmup:g} s) must be shorter than the duration ({duration:g} s)")
    buffer_ms = duration_s("buffer", data.get("buffer", "200ms")) * 1000

    groups = []
    for i, g in enumerate(data.get("groups", [])):
        extra = sorted(set(g) - {"name", "flows", "cca", "rtt", "start", "stop"})
        if extra:
            raise fail(f"groups[{i}]: unknown field(s) {', '.join(extra)}")
        flows, cca = g.get("flows"), g.get("cca", "cubic")
        if not isinstance(flows, int) or isinstance(flows, bool) or flows < 1:
            raise fail(f"groups[{i}].flows: a whole number >= 1, got {flows!r}")
        if cca not in CCAS:
            raise fail(f"groups[{i}].cca: one of {', '.join(CCAS)}, got {cca!r}")
        rtt = g.get("rtt")
        start = duration_s(f"groups[{i}].start", g.get("start", "0s"), zero=True)
        if start >= duration:
            raise fail(
                f"groups[{i}].start ({start:g} s) must be before the run's end ({duration:g} s)"
            )
        stop = None if "stop" not in g else duration_s(f"groups[{i}].stop", g["stop"])
        if stop is not None and not start < stop <= duration:
            raise fail(
                f"groups[{i}].stop ({stop:g} s) must be after the group's start ({start:g} s) "
                f"and at most the run's end ({duration:g} s)"
            )
        groups.append(
            FlowGroup(
                str(g.get("name", f"g{i}")),
                flows,
                cca,
                round(start * 1e9),
                None if rtt is None else round(duration_s(f"groups[{i}].rtt", rtt) * 1e9),
                None if stop is None else round(stop * 1e9),
            )
        )
    if not groups:
        raise fail("no [[groups]] of long flows")
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise fail(f"groups: names must be unique, got {', '.join(names)}")

    policies = tuple(data.get("policies", [NO_POLICY]))
    check_policies(policies, where)
    oracle = data.get("oracle_buffers", [])
    if not isinstance(oracle, list):
        raise fail(f"oracle_buffers: a list of buffers (time of line rate), got {oracle!r}")
    oracle_ms = tuple(
        duration_s(f"oracle_buffers[{i}]", value) * 1000 for i, value in enumerate(oracle)
    )
    fixed = tuple(fixed_policy(ms) for ms in oracle_ms)
    repeated = sorted({p for p in fixed if fixed.count(p) > 1} | (set(fixed) & set(policies)))
    if repeated:
        raise fail(f"oracle_buffers: {', '.join(repeated)} listed twice")
    policies += fixed
    repeat = data.get("repeat", 1)
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise fail(f"repeat: a whole number >= 1, got {repeat!r}")

    sweep = []
    for key, values in data.get("sweep", {}).items():
        if key not in SWEEPABLE:
            raise fail(f"sweep.{key}: only {', '.join(SWEEPABLE)} can be swept")
        if not isinstance(values, list) or not values:
            raise fail(f"sweep.{key}: a non-empty list, got {values!r}")
        if key in ("rtt", "buffer"):
            values = [round(duration_s(f"sweep.{key}", v) * 1e9) for v in values]
        elif key == "cca" and any(v not in CCAS for v in values):
            raise fail(f"sweep.cca: each one of {', '.join(CCAS)}, got {values!r}")
        elif key == "flows" and any(not isinstance(v, int) or v < 1 for v in values):
            raise fail(f"sweep.flows: whole numbers >= 1, got {values!r}")
        sweep.append((key, tuple(values)))

    reports = tuple(data.get("reports", []))
    for report in reports:
        if report not in REPORTS:
            raise fail(f"report {report!r} unknown; known: {', '.join(REPORTS)}")
    link = data.get("link", {})
    if not isinstance(link, dict) or not all(isinstance(v, dict) for v in link.values()):
        raise fail(f"link: a table of tables ({', '.join(LINK_SETTINGS)}), got {link!r}")
    extra = sorted(set(link) - set(LINK_SETTINGS))
    if extra:
        raise fail(f"link: only {', '.join(LINK_SETTINGS)} can be set, not {', '.join(extra)}")
    short = data.get("short_flows")
    voip = data.get("voip")
    try:
        short_flows = None if short is None else ShortFlows(**short)
        voip_stream = None if voip is None else Voip(**voip)
    except TypeError as exc:
        raise fail(f"short_flows/voip: {exc}") from None
    if short_flows is not None:
        check_short_flows(short_flows, fail)
    phases = parse_phases(data.get("phases", []), duration, short_flows is not None, fail)
    scenario = EvalScenario(
        name=name,
        title=str(data.get("title", name)),
        duration_s=duration,
        warmup_s=warmup,
        buffer_ms=buffer_ms,
        groups=tuple(groups),
        policies=policies,
        repeat=repeat,
        policy_options=data.get("policy_options", {}),
        sweep=tuple(sweep),
        short_flows=short_flows,
        voip=voip_stream,
        reports=reports,
        loop_sections=data.get("loop", {}),
        link_settings=link,
        phases=phases,
        settle_s=duration_s("settle", data.get("settle", "0s"), zero=True),
        oracle_buffers_ms=oracle_ms,
    )
    shortest = min(span.end_s - span.start_s for span in scenario.phase_spans())
    if scenario.settle_s >= shortest:
        raise fail(
            f"settle ({scenario.settle_s:g} s) must be shorter than the shortest phase "
            f"({shortest:g} s)"
        )
    return scenario


def check_short_flows(short: ShortFlows, fail: Callable[[str], ScenarioError]) -> None:
    if not isinstance(short.rate_per_s, int | float) or short.rate_per_s < 0:
        raise fail(f"short_flows.rate_per_s: a number >= 0, got {short.rate_per_s!r}")
    if not 1 <= short.min_size_bytes <= short.max_size_bytes:
        raise fail(
            "short_flows: 1 <= min_size_bytes <= max_size_bytes, got "
            f"{short.min_size_bytes!r} and {short.max_size_bytes!r}"
        )
    if short.sizes not in (LOG_UNIFORM, *SIZE_CDFS):
        raise fail(
            f"short_flows.sizes: one of {', '.join((LOG_UNIFORM, *SIZE_CDFS))}, got {short.sizes!r}"
        )


def parse_phases(
    tables: Any, duration: float, has_short_flows: bool, fail: Callable[[str], ScenarioError]
) -> tuple[Phase, ...]:
    """[[phases]]: named, in time order, each starting inside the run; a phase that sets the
    short flows' rate needs [short_flows] (their sizes)."""
    if not isinstance(tables, list):
        raise fail(f"phases: a list of [[phases]] tables, got {tables!r}")
    phases: list[Phase] = []
    for i, table in enumerate(tables):
        where = f"phases[{i}]"
        if not isinstance(table, dict):
            raise fail(f"{where}: a table, got {table!r}")
        extra = sorted(set(table) - {"name", "start", "short_flows_rate_per_s"})
        if extra:
            raise fail(f"{where}: unknown field(s) {', '.join(extra)}")
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise fail(f"{where}.name: a name is required, got {name!r}")
        if "start" not in table:
            raise fail(f"{where}.start: required (time after the traffic starts)")
        try:
            start_ns = parse_duration_ns(table["start"])
        except UnitError as exc:
            raise fail(f"{where}.start: {exc}") from None
        start = start_ns / 1e9
        if not 0 <= start < duration:
            raise fail(f"{where}.start ({start:g} s) must be inside the run (0 to {duration:g} s)")
        if phases and start <= phases[-1].start_s:
            raise fail(
                f"{where}.start ({start:g} s) must be after phase {phases[-1].name!r}'s "
                f"({phases[-1].start_s:g} s): phases in time order"
            )
        if name in (p.name for p in phases):
            raise fail(f"{where}.name: {name!r} used twice")
        rate = table.get("short_flows_rate_per_s")
        if rate is not None:
            if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
                raise fail(f"{where}.short_flows_rate_per_s: a number >= 0, got {rate!r}")
            if not has_short_flows:
                raise fail(
                    f"{where}.short_flows_rate_per_s: needs a [short_flows] table (the sizes)"
                )
            rate = float(rate)
        phases.append(Phase(name, start, rate))
    return tuple(phases)
