"""Config data written back as TOML text (tomllib reads, nothing in the standard library
writes)."""

from __future__ import annotations

from typing import Any


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def config_toml(data: dict[str, Any]) -> str:
    """TOML text for a config's raw data (what tomllib read from a file, changed by a
    program): `load_config` of the text reads the same data. Top-level tables and arrays of
    tables are written as sections, anything nested deeper inline."""
    lines = [
        f"{k} = {_toml_value(v)}"
        for k, v in data.items()
        if not isinstance(v, dict) and not _is_tables(v)
    ]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in value.items() if not _is_tables(v)]
            for k, v in value.items():
                if _is_tables(v):
                    for item in v:
                        lines += ["", f"[[{key}.{k}]]"]
                        lines += [f"{ik} = {_toml_value(iv)}" for ik, iv in item.items()]
        elif _is_tables(value):
            for item in value:
                lines += ["", f"[[{key}]]"]
                lines += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
    return "\n".join(lines) + "\n"


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
