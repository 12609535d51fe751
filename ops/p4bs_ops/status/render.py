"""The results on the screen (`render_text`: a line per part, its details below in human
units) and as `p4bs status --json`'s object (`to_json`: the system's units, ns and bytes)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from p4bs.units import format_duration_ns, format_rate_bps, format_size_bytes
from p4bs_ops.status.runner import MS_NS, PartStatus


def to_json(results: Iterable[PartStatus], config_path: str, checked_at_ns: int) -> dict[str, Any]:
    """The stable JSON object of `p4bs status --json` (ns, bytes, bit/s as integers)."""
    results = list(results)
    return {
        "healthy": all(r.healthy for r in results),
        "config": config_path,
        "checked_at_ns": checked_at_ns,
        "parts": {
            r.name: {
                "healthy": r.healthy,
                "summary": r.summary,
                "took_ns": r.took_ns,
                "details": r.details,
            }
            for r in results
        },
    }


def render_text(
    results: Iterable[PartStatus],
    config_path: str | None = None,
    checked_at_ns: int | None = None,
    *,
    details: bool = True,
) -> str:
    """The screen: a line per part (OK/FAIL, name, summary), its details indented below,
    then the verdict."""
    results = list(results)
    lines = []
    if config_path is not None:
        at = ""
        if checked_at_ns is not None:
            when = datetime.fromtimestamp(checked_at_ns / 1e9, UTC)
            at = " at " + when.isoformat(timespec="seconds").replace("+00:00", "Z")
        lines.append(f"p4bs status of {config_path}{at}")
    width = max((len(r.name) for r in results), default=0)
    for r in results:
        took = f" [{format_duration_ns(r.took_ns)}]" if r.took_ns >= MS_NS else ""
        lines.append(f"{'OK' if r.healthy else 'FAIL':<4}  {r.name:<{width}}  {r.summary}{took}")
        if details:
            lines.extend(_detail_lines(r.details, " " * (width + 8)))
    bad = [r.name for r in results if not r.healthy]
    if bad:
        lines.append(f"unhealthy: {', '.join(bad)} ({len(bad)} of {len(results)} parts)")
    else:
        lines.append("healthy: " + ("1 part" if len(results) == 1 else f"all {len(results)} parts"))
    return "\n".join(lines)


_FIELD = re.compile(r"[a-z][a-z0-9_]*")


def _label(key: str) -> str:
    """A details key as printed: a field name without its unit suffix, underscores as
    spaces ("age_ns" -> "age"); a name (a link, a group, a topic) as it is."""
    if not _FIELD.fullmatch(key):
        return key
    for suffix in ("_ns", "_bytes", "_bps", "_per_s"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def format_value(key: str, value: Any) -> str:
    """A details value in human units, by its key's unit suffix."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if key.endswith("_ns"):
            return format_duration_ns(int(value))
        if key.endswith("_bytes"):
            return format_size_bytes(int(value))
        if key.endswith("_bps"):
            return format_rate_bps(int(value))
        if key.endswith("_per_s"):
            return f"{value:,.1f}/s"
        return f"{value:,}" if isinstance(value, int) else f"{value:g}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "none"
    return str(value)


def _scalar(value: Any) -> bool:
    """A value printed within a line: a scalar or a list of scalars."""
    if isinstance(value, list):
        return not any(isinstance(x, dict | list) for x in value)
    return not isinstance(value, dict)


def _inline(value: Mapping[str, Any]) -> str:
    """A dict's scalar entries on one line (empty lists left out)."""
    return ", ".join(
        f"{_label(k)} {format_value(k, v)}" for k, v in value.items() if _scalar(v) and v != []
    )


def _detail_lines(details: Mapping[str, Any], indent: str) -> list[str]:
    """Each entry on a line of its own; a dict's scalars inline after its name and its
    nested entries below, indented; a list of dicts one item a line."""
    lines = []
    for key, value in details.items():
        name = _label(str(key))
        if isinstance(value, dict):
            nested = {k: v for k, v in value.items() if not _scalar(v)}
            inline = _inline(value)
            if inline:
                lines.append(f"{indent}{name}: {inline}")
            else:
                lines.append(f"{indent}{name}:" + ("" if nested else " none"))
            lines.extend(_detail_lines(nested, indent + "  "))
        elif isinstance(value, list) and not _scalar(value):
            lines.append(f"{indent}{name}:" + ("" if value else " none"))
            for item in value:
                if isinstance(item, dict):
                    lines.append(f"{indent}  - {_inline(item)}")
                    nested = {k: v for k, v in item.items() if not _scalar(v)}
                    lines.extend(_detail_lines(nested, indent + "    "))
                else:
                    lines.append(f"{indent}  - {item}")
        else:
            lines.append(f"{indent}{name}: {format_value(str(key), value)}")
    return lines
