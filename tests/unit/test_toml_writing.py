"""Config data written back as TOML (tomli_w, as the closed loop and the local stack write it)
reads back equal with tomllib: odd keys, odd strings, and the example config's own shape."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from p4bs.config import parse_config

ODD_KEYS = ["r1:eth1", "a.b", "with space", "ünïcödé", "", 'quote"d', "back\\slash", "1"]
ODD_STRINGS = [
    "line one\nline two",
    'say "hi"',
    "C:\\path\\to",
    "tab\there",
    "ünïcödé ✓ 😀",
    "",
    "'single' and \"double\"",
    "ends with backslash\\",
    "\r\n and \x7f",
    '"""',
]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_read_back(key: str) -> None:
    data = {key: 1, "table": {key: "v", "nested": {key: [1, 2]}}, "tables": [{key: True}]}
    assert tomllib.loads(tomli_w.dumps(data)) == data


@pytest.mark.parametrize("text", ODD_STRINGS)
def test_odd_strings_read_back(text: str) -> None:
    data = {"top": text, "table": {"value": text, "list": [text, text]}, "rows": [{"v": text}]}
    assert tomllib.loads(tomli_w.dumps(data)) == data


def test_the_example_config_changed_as_the_loop_does_reads_back(repo: Path) -> None:
    """The example's tables and arrays of tables ([[links]], [[routers]], ...) with what the
    closed loop and the tests change in them: a nested table, inline options, odd strings."""
    data: dict[str, Any] = tomllib.loads((repo / "config" / "testbed.toml").read_text())
    data["optimizer"] = {**data.get("optimizer", {}), "stale_after": "2s", "group": 'a "q" g'}
    data["links"][0]["policy_options"] = {"gamma": 0.2, "nested": {"r1:eth1": "odd\nname"}}
    text = tomli_w.dumps(data)
    assert tomllib.loads(text) == data
    assert parse_config(tomllib.loads(text)).optimizer.stale_after_ns == 2 * 10**9
