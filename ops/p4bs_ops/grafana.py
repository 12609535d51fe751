"""The Grafana dashboards of `ops/grafana/dashboards`: every InfluxQL query in them, and
Grafana's macros rendered as Grafana renders them, so that a test or an operator's tool can
run the dashboards' queries against InfluxDB without a Grafana.

A dashboard's queries are its panels' targets (also those of panels inside collapsed rows),
its annotation queries and its query variables' queries. The macros a query may hold:

- `$timeFilter`: `time >= <from>ms and time <= <to>ms` (the dashboard's range, in ms);
- `$__interval`: the panel's interval (`200ms`, `1s`, `1m`): the range over the panel's data
  points, at least the panel's minimum interval (its `interval`); `$__interval_ms` in ms;
- `$__from`, `$__to`: the range's ends in ms;
- the dashboard's variables, as `$name`, `${name}` or `[[name]]`: a multi-value variable's
  values regex-escaped, several as `(a|b)` (Grafana's form for `=~ /^$link$/`); a
  single-value variable's value as it is, regex-escaped inside a regex literal; "All" as
  the variable's `allValue`, unescaped.

Nothing else that starts with `$` followed by a letter is allowed in a query (MacroError):
a typo in a macro fails here, not on the operator's screen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from p4bs import paths
from p4bs.retention import influxql_duration_ns

DATASOURCE_TYPE = "influxdb"
DATASOURCE_UID = "p4bs-influxdb"  # ops/grafana/provisioning/datasources/p4bs.yaml
BUILTINS = frozenset({"timeFilter", "__interval", "__interval_ms", "__from", "__to"})
ALL = "$__all"  # the value Grafana gives a variable whose "All" is selected

_MS = 1_000_000
_UNITS_NS = (
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", _MS),
)
# `$name`, `${name}` (optionally `${name:format}`, refused) and `[[name]]`. A `$` not followed
# by a letter or `_` is no macro: the regex anchor in `/^$link$/` stays as it is.
_REFERENCE = re.compile(
    r"\$\{(?P<braced>\w+)(?P<format>:[^}]*)?\}|\[\[(?P<bracketed>\w+)\]\]|\$(?P<plain>[A-Za-z_]\w*)"
)
# A regex literal of InfluxQL: after `=~` or `!~`, from `/` to the next unescaped `/`.
_REGEX_LITERAL = re.compile(r"[=!]~\s*/(?:[^/\\\n]|\\.)*/")
_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
# How Grafana rounds the range over a panel's points to its interval (rangeutil's
# roundInterval): (below this many ms, this interval in ms); a year above the last.
_ROUNDING_MS = (
    (10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1_500, 1_000),
    (3_500, 2_000), (7_500, 5_000), (12_500, 10_000), (17_500, 15_000), (25_000, 20_000),
    (45_000, 30_000), (90_000, 60_000), (210_000, 120_000), (450_000, 300_000),
    (750_000, 600_000), (1_050_000, 900_000), (1_500_000, 1_200_000), (2_700_000, 1_800_000),
    (5_400_000, 3_600_000), (9_000_000, 7_200_000), (16_200_000, 10_800_000),
    (32_400_000, 21_600_000), (86_400_000, 43_200_000), (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000), (3_628_800_000, 2_592_000_000),
)  # fmt: skip
_YEAR_MS = 31_536_000_000


class MacroError(ValueError):
    """A query names a macro or variable that is not Grafana's nor the dashboard's, or uses
    a form this module does not render."""


@dataclass(frozen=True)
class Variable:
    """A dashboard's template variable, as far as rendering it needs."""

    name: str
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None  # what "All" renders as (None: every value, as `(a|b)`)


@dataclass(frozen=True)
class Query:
    """One InfluxQL query of a dashboard, with Grafana's macros still in it."""

    dashboard: str  # the dashboard's title
    title: str  # the panel's title, or the annotation's or variable's name
    kind: Literal["panel", "annotation", "variable"]
    ref_id: str
    text: str
    min_interval_ns: int = 0  # the panel's `interval`: $__interval is never below it
    variables: tuple[Variable, ...] = field(default=(), repr=False)

    @property
    def where(self) -> str:
        """Where it is, for messages: dashboard / panel / refId."""
        return f"{self.dashboard} / {self.kind} {self.title!r} / {self.ref_id}"


@dataclass(frozen=True)
class Context:
    """What Grafana fills the macros with: the range, the interval and the variables'
    values (`ALL` for "All")."""

    start_ns: int
    end_ns: int
    interval_ns: int
    values: Mapping[str, Sequence[str]] = field(default_factory=dict)


def dashboards_dir() -> Path:
    """Where the dashboards' JSON files are in this checkout."""
    return paths.home() / "ops" / "grafana" / "dashboards"


def load_dashboards(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every dashboard of the folder (its `*.json`), by file name without `.json`."""
    folder = folder or dashboards_dir()
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def interval_text(ns: int) -> str:
    """An interval as Grafana writes `$__interval`: in the largest unit that divides it."""
    if ns <= 0 or ns % _MS:
        raise ValueError(f"an interval is a positive number of ms: {ns} ns")
    unit, size = next((unit, size) for unit, size in _UNITS_NS if ns % size == 0)
    return f"{ns // size}{unit}"


def auto_interval_ns(start_ns: int, end_ns: int, max_points: int = 1000) -> int:
    """The interval Grafana gives a panel of `max_points` points over the range (its width
    in pixels, or its max data points): the range over the points, rounded as Grafana
    rounds it. A panel's minimum interval is applied by `render`."""
    raw_ms = (end_ns - start_ns) / _MS / max_points
    nice = next((ms for below, ms in _ROUNDING_MS if raw_ms < below), _YEAR_MS)
    return nice * _MS


def _variables(dashboard: Mapping[str, Any]) -> tuple[Variable, ...]:
    return tuple(
        Variable(
            name=v["name"],
            multi=bool(v.get("multi", False)),
            include_all=bool(v.get("includeAll", False)),
            all_value=v.get("allValue") or None,
        )
        for v in dashboard.get("templating", {}).get("list", [])
    )


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Panels in order, those of a collapsed row after the row (Grafana keeps them in the
    row's own `panels` until it is opened)."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _is_influx(datasource: Any) -> bool:
    return isinstance(datasource, Mapping) and datasource.get("type") == DATASOURCE_TYPE


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """The dashboard's InfluxQL queries: its variables', its annotations', its panels'."""
    title = str(dashboard.get("title", ""))
    variables = _variables(dashboard)
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query" and _is_influx(v.get("datasource")):
            text = v["query"] if isinstance(v["query"], str) else v["query"]["query"]
            yield Query(title, v["name"], "variable", "var", text, 0, variables)
    for a in dashboard.get("annotations", {}).get("list", []):
        if _is_influx(a.get("datasource")):
            # Grafana reads an InfluxQL annotation's query from its `target` (older
            # dashboards had it beside the target; Grafana moves it there when it loads them).
            target = a.get("target") or {}
            text = target.get("query") or a.get("query", "")
            ref_id = str(target.get("refId", "Anno"))
            yield Query(title, a["name"], "annotation", ref_id, text, 0, variables)
    for panel in _panels(dashboard.get("panels", [])):
        minimum = influxql_duration_ns(panel["interval"]) if panel.get("interval") else 0
        for target in panel.get("targets", []):
            if _is_influx(target.get("datasource") or panel.get("datasource")):
                yield Query(
                    title,
                    str(panel.get("title", "")),
                    "panel",
                    str(target.get("refId", "")),
                    str(target.get("query", "")),
                    minimum,
                    variables,
                )


def all_queries(folder: Path | None = None) -> Iterator[Query]:
    """Every query of every dashboard of the folder."""
    for dashboard in load_dashboards(folder).values():
        yield from queries(dashboard)


def references(text: str) -> list[str]:
    """The names of the macros and variables the query uses, in order (MacroError on a
    `${name:format}`, which Grafana formats in ways this module does not render)."""
    names = []
    for found in _REFERENCE.finditer(text):
        if found["format"]:
            raise MacroError(f"formatted variable {found[0]!r}: not rendered here")
        names.append(found["braced"] or found["bracketed"] or found["plain"])
    return names


def check(query: Query) -> None:
    """MacroError unless every macro of the query is Grafana's or one of its dashboard's
    variables."""
    known = BUILTINS | {v.name for v in query.variables}
    unknown = [name for name in references(query.text) if name not in known]
    if unknown:
        raise MacroError(f"{query.where}: unknown macro or variable {', '.join(unknown)}")


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m[0], value)


def _variable_value(variable: Variable, values: Sequence[str], in_regex: bool) -> str:
    if list(values) == [ALL] and variable.all_value is not None:
        return variable.all_value  # Grafana inserts a custom "All" value as it is
    if ALL in values:
        raise MacroError(f"${variable.name}: 'All' without an allValue needs the values")
    if variable.multi or variable.include_all:
        # Grafana escapes a multi-value variable's values wherever it is used.
        escaped = [_regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"
    if len(values) != 1:
        raise MacroError(f"${variable.name} takes one value, not {len(values)}")
    return _regex_escape(values[0]) if in_regex else values[0]


def render(query: Query, context: Context) -> str:
    """The query as Grafana sends it to InfluxDB for this range, interval and values."""
    check(query)
    interval = max(context.interval_ns, query.min_interval_ns)
    start_ms = context.start_ns // _MS
    end_ms = -(-context.end_ns // _MS)  # the range's last ms included
    builtins = {
        "timeFilter": f"time >= {start_ms}ms and time <= {end_ms}ms",
        "__interval": interval_text(interval),
        "__interval_ms": str(interval // _MS),
        "__from": str(start_ms),
        "__to": str(end_ms),
    }
    variables = {v.name: v for v in query.variables}
    regexes = [m.span() for m in _REGEX_LITERAL.finditer(query.text)]

    def value(found: re.Match[str]) -> str:
        name = found["braced"] or found["bracketed"] or found["plain"]
        if name in builtins:
            return builtins[name]
        if name not in context.values:
            raise MacroError(f"{query.where}: no value given for ${name}")
        in_regex = any(start < found.start() < end for start, end in regexes)
        return _variable_value(variables[name], context.values[name], in_regex)

    return _REFERENCE.sub(value, query.text)
