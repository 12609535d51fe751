"""The exporter's Tofino driver (and the fake switch its tests run against) checked against the
BF Runtime schema the real compiler writes for the program: bf-p4c's `bfrt.json`.

The compiler is not part of the project (it is built by hand, beside it: p4/tofino/README,
"Compiled"), so this runs when P4BS_TOFINO_BUILD names its output folder (the `-o` of
bf-p4c, holding bfrt.json) and is skipped otherwise. What it guards: every table, action,
parameter, key, register field and digest field the driver names exists with that name and
width, so a rename in the P4 or the driver cannot pass unnoticed where the compiler runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fakebfrt
import pytest

from p4bs_exporter import tofino_contract as tofino

BUILD = os.environ.get("P4BS_TOFINO_BUILD", "")
pytestmark = pytest.mark.skipif(
    not BUILD, reason="P4BS_TOFINO_BUILD (bf-p4c's output folder) is not set"
)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    path = Path(BUILD) / "bfrt.json"
    assert path.is_file(), f"{path}: no bfrt.json (is P4BS_TOFINO_BUILD bf-p4c's -o folder?)"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def by_name(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The object whose full name ends in `name`, as bfrt_grpc resolves a partial name."""
    found = [o for o in objects if o["name"] == name or o["name"].endswith("." + name)]
    assert len(found) == 1, f"{name}: {len(found)} objects in bfrt.json"
    return found[0]


def keys(table: dict[str, Any]) -> dict[str, tuple[str, int | None]]:
    return {k["name"]: (k["match_type"], k["type"].get("width")) for k in table.get("key", [])}


def data_fields(table: dict[str, Any]) -> dict[str, int | None]:
    return {
        d["singleton"]["name"]: d["singleton"]["type"].get("width")
        for d in table.get("data", [])
        if "singleton" in d
    }


def actions(table: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {
        a["name"]: {p["name"]: p["type"]["width"] for p in a.get("data", [])}
        for a in table.get("action_specs", [])
    }


def test_match_tables_take_what_the_driver_writes(schema: dict[str, Any]) -> None:
    tables = schema["tables"]
    ports = by_name(tables, tofino.PORT_TABLE)
    assert keys(ports) == {tofino.PORT_KEY: ("Exact", 9)}
    assert tuple(actions(ports)[tofino.SET_LINK]) == tofino.SET_LINK_PARAMS
    assert actions(ports)[tofino.SET_LINK]["link"] == tofino.LINK_INDEX_BITS

    prefixes = by_name(tables, tofino.PREFIX_TABLE)
    assert keys(prefixes) == {tofino.PORT_KEY: ("Exact", 9), tofino.PREFIX_KEY: ("LPM", 32)}
    assert actions(prefixes)[tofino.DST_IS_OUTPUT] == {}

    config = by_name(tables, tofino.CONFIG_TABLE)
    assert actions(config)[tofino.SET_CONFIG] == {tofino.CMS_EPOCH: tofino.CMS_EPOCH_BITS}

    flows = by_name(tables, tofino.LONG_FLOWS)
    assert tuple(keys(flows)) == tofino.LONG_FLOW_KEYS
    assert all(match == "Exact" for match, _ in keys(flows).values())
    assert tofino.ENTRY_TTL in data_fields(flows)
    assert tofino.LONG_FLOW_HIT in actions(flows)

    interval = by_name(tables, tofino.RTT_MIN_INTERVAL)
    assert interval["table_type"] == "RegisterParam"
    assert data_fields(interval) == {tofino.REGISTER_PARAM_VALUE: 32}


def test_registers_have_the_fields_the_driver_reads(schema: dict[str, Any]) -> None:
    tables = schema["tables"]
    fields = [(r, [f for f, _ in pairs]) for r, pairs in tofino.COUNTER_REGISTERS]
    fields += [
        (tofino.QDELAY_SUM, [tofino.QDELAY_SUM_LO, tofino.QDELAY_SUM_HI]),
        (tofino.QDELAY_EWMA, [tofino.QDELAY_EWMA_FIELD]),
    ]
    for register, names in fields:
        table = by_name(tables, register)
        assert table["table_type"] == "Register", register
        assert tofino.REGISTER_INDEX in keys(table), register
        assert table["size"] == 2**tofino.LINK_INDEX_BITS, register
        for name in names:
            assert data_fields(table).get(f"{register}.{name}") == tofino.COUNTER_BITS, (
                f"{register}.{name}"
            )
    lpf = by_name(tables, tofino.QDELAY_LPF)
    assert lpf["table_type"] == "Lpf"
    assert tofino.LPF_INDEX in keys(lpf)


def test_digests_have_the_layout_the_driver_decodes(schema: dict[str, Any]) -> None:
    learns = schema["learn_filters"]
    for name, layout in (
        (tofino.RTT_DIGEST, tofino.RTT_DIGEST_LAYOUT),
        (tofino.FLOW_DIGEST, tofino.FLOW_DIGEST_LAYOUT),
    ):
        learn = by_name(learns, name)
        got = tuple((f["name"], f["type"]["width"]) for f in learn["fields"])
        assert got == layout, name


def test_the_fake_switch_has_the_real_objects(schema: dict[str, Any]) -> None:
    # The driver's tests run against tests/fakebfrt.py: its objects must be the program's.
    switch = fakebfrt.Switch()
    for name in switch.tables:
        by_name(schema["tables"], name)
    for name, fields in fakebfrt.COUNTER_FIELDS.items():
        real = data_fields(by_name(schema["tables"], name))
        assert {f"{name}.{f}" for f in fields} == set(real), name
    for name in switch.learns:
        by_name(schema["learn_filters"], name)
