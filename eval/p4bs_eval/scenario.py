"""Evaluation scenarios: what traffic runs through the testbed, for how long, under which
policies, and which reports are made of it (a TOML file, see eval/README.md).

A scenario may sweep: each `[sweep]` key lists values that replace that field in every flow
group (`flows`, `cca`, `rtt`) or the router's initial buffer (`buffer`), and every
combination of them is a point. Each point runs under each policy, `repeat` times.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from p4bs.config import Config, FlowGroup, load_config, parse_config
from p4bs.units import UnitError, parse_duration_ns
from p4bs_infra.traffic import ShortFlows, Voip
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
        """Point by point, repeat by repeat, every policy in turn: a repeat's policies run
        back to back, so what drifts on the machine over hours weighs on all of them alike
        (their paired difference is what the report compares)."""
        for point in self.points():
            for repeat in range(1, self.repeat + 1):
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
        if policy != NO_POLICY and policy not in POLICIES:
            raise ScenarioError(
                f"{where}: policy {policy!r} unknown; known: {NO_POLICY}, "
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
        extra = sorted(set(g) - {"name", "flows", "cca", "rtt", "start"})
        if extra:
            raise fail(f"groups[{i}]: unknown field(s) {', '.join(extra)}")
        flows, cca = g.get("flows"), g.get("cca", "cubic")
        if not isinstance(flows, int) or isinstance(flows, bool) or flows < 1:
            raise fail(f"groups[{i}].flows: a whole number >= 1, got {flows!r}")
        if cca not in CCAS:
            raise fail(f"groups[{i}].cca: one of {', '.join(CCAS)}, got {cca!r}")
        rtt = g.get("rtt")
        groups.append(
            FlowGroup(
                str(g.get("name", f"g{i}")),
                flows,
                cca,
                round(duration_s(f"groups[{i}].start", g.get("start", "0s"), zero=True) * 1e9),
                None if rtt is None else round(duration_s(f"groups[{i}].rtt", rtt) * 1e9),
            )
        )
    if not groups:
        raise fail("no [[groups]] of long flows")

    policies = tuple(data.get("policies", [NO_POLICY]))
    check_policies(policies, where)
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
    return EvalScenario(
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
    )
