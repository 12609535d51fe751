"""Backward compatibility of Avro schemas: can a new reader read what an old writer wrote?

Implements the resolution rules of the Avro specification ("Schema Resolution") for the
reader/writer pair, plus one p4bs rule: a string field's `allowed` values may grow but not
shrink, because old data may carry any old value. Returns the list of problems, empty when
compatible.
"""

from __future__ import annotations

from typing import Any

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        inner = schema["type"]
        return _kind(inner) if isinstance(inner, dict | list) else str(inner)
    return str(schema)


def _name(schema: Any) -> str | None:
    return schema.get("name") if isinstance(schema, dict) else None


def _names_match(reader: Any, writer: Any) -> bool:
    return _name(reader) == _name(writer) or _name(writer) in reader.get("aliases", [])


def _matches(reader: Any, writer: Any) -> bool:
    """Whether a writer branch could resolve to this reader branch (first-match rule)."""
    rk, wk = _kind(reader), _kind(writer)
    if rk in ("record", "enum", "fixed"):
        return rk == wk and _names_match(reader, writer)
    return rk == wk or rk in _PROMOTIONS.get(wk, set())


def check_backward(reader: Any, writer: Any, path: str = "") -> list[str]:
    """Problems preventing `reader` (new) from reading data written with `writer` (old)."""
    here = path or (_name(reader) or "<root>")
    rk, wk = _kind(reader), _kind(writer)
    if wk == "union":
        problems = []
        for branch in writer:
            problems += check_backward(reader, branch, f"{here}<{_kind(branch)}>")
        return problems
    if rk == "union":
        for branch in reader:
            if _matches(branch, writer):
                return check_backward(branch, writer, here)
        return [f"{here}: no branch of the reader's union accepts the writer's {wk}"]
    if not _matches(reader, writer):
        return [f"{here}: writer type {wk} cannot be read as {rk}"]
    if rk == "record":
        return _check_record(reader, writer, here)
    if rk == "enum":
        missing = set(writer["symbols"]) - set(reader["symbols"])
        if missing and "default" not in reader:
            return [f"{here}: enum symbols {sorted(missing)} removed without a default"]
    if rk == "fixed" and reader["size"] != writer["size"]:
        return [f"{here}: fixed size changed {writer['size']} -> {reader['size']}"]
    if rk == "array":
        return check_backward(reader["items"], writer["items"], f"{here}[]")
    if rk == "map":
        return check_backward(reader["values"], writer["values"], f"{here}{{}}")
    return []


def _check_record(reader: Any, writer: Any, here: str) -> list[str]:
    problems = []
    writer_fields = {f["name"]: f for f in writer["fields"]}
    for field in reader["fields"]:
        names = [field["name"], *field.get("aliases", [])]
        old = next((writer_fields[n] for n in names if n in writer_fields), None)
        where = f"{here}.{field['name']}"
        if old is None:
            if "default" not in field:
                problems.append(f"{where}: new field without a default")
            continue
        problems += check_backward(field["type"], old["type"], where)
        if "allowed" in field:
            old_allowed = set(old.get("allowed", []))
            if "allowed" not in old:
                problems.append(f"{where}: restricts to allowed values the old data never had")
            elif old_allowed - set(field["allowed"]):
                dropped = sorted(old_allowed - set(field["allowed"]))
                problems.append(f"{where}: allowed values {dropped} removed")
    return problems
