"""The Tofino program (p4/tofino/*.p4) and the exporter's tofino target agree on their
control-plane contract.

`p4bs_exporter.tofino_contract` keeps every name, code and width the tofino target takes from
the program; these tests read each of them back from the P4 sources and compare, so a
change on either side alone fails here, naming the item. The reader is a few regexes over
the comment-stripped source: #defines and consts (evaluated), typedefs, structs and headers,
and per control its parameters, tables, actions, registers, RegisterParams and Digests. No
compiler, no SDE, no services: a few milliseconds.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from p4text import NAME, TOFINO, TYPE, block, const, layout, source, structs, value, width

import p4bs_exporter.tofino as exporter
import p4bs_exporter.tofino_contract as contract

README = TOFINO / "README.md"


# --------------------------------------------------------------------------------------------
# Reading the P4 text
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Control:
    name: str
    params: dict[str, str]  # parameter name -> type
    body: str


@cache
def controls() -> dict[str, Control]:
    found = {}
    for m in re.finditer(rf"\bcontrol\s+({NAME})\s*\(([^)]*)\)\s*\{{", source()):
        params = {}
        for param in m.group(2).split(","):
            *_, p4_type, name = param.split()
            params[name] = p4_type
        found[m.group(1)] = Control(m.group(1), params, block(source(), m.end() - 1))
    return found


def control_of(qualified: str) -> tuple[Control, str]:
    """bfrt's "<control>.<object>" -> (the control, the object's name)."""
    control, _, name = qualified.partition(".")
    assert control in controls(), f"{qualified}: the P4 has no control {control}"
    return controls()[control], name


@dataclass(frozen=True)
class Table:
    keys: list[tuple[str, str]]  # (field, match kind) in order
    actions: dict[str, bool]  # action -> @defaultonly
    idle_timeout: bool


def table(qualified: str) -> Table:
    control, name = control_of(qualified)
    m = re.search(rf"\btable\s+{name}\s*\{{", control.body)
    assert m, f"{qualified}: no table {name} in control {control.name}"
    body = block(control.body, m.end() - 1)
    key = re.search(r"\bkey\s*=\s*\{([^}]*)\}", body)
    keys = re.findall(r"([\w.]+)\s*:\s*(\w+)\s*;", key.group(1)) if key else []
    listed = re.search(r"\bactions\s*=\s*\{([^}]*)\}", body)
    assert listed, f"{qualified}: no actions list"
    actions = {
        action: "@defaultonly" in annotations
        for annotations, action in re.findall(rf"((?:@\w+\s+)*)({NAME})\s*;", listed.group(1))
    }
    idle = re.search(r"\bidle_timeout\s*=\s*true\s*;", body) is not None
    return Table(keys, actions, idle)


def action_params(qualified: str) -> list[tuple[str, str]]:
    """(type, name) of an action's parameters, in order."""
    control, name = control_of(qualified)
    m = re.search(rf"\baction\s+{name}\s*\(([^)]*)\)", control.body)
    assert m, f"{qualified}: no action {name} in control {control.name}"
    params = []
    for param in filter(str.strip, m.group(1).split(",")):
        p4_type, param_name = param.rsplit(None, 1)
        params.append((p4_type.split()[-1], param_name))
    return params


def declaration(qualified: str, extern: str) -> tuple[list[str], str]:
    """`extern<type args>(ctor args) name;` in the object's control: (type args, ctor args)."""
    control, name = control_of(qualified)
    m = re.search(rf"\b{extern}<([^;(]*)>\s*\(([^)]*)\)\s*{name}\s*;", control.body)
    assert m, f"{qualified}: no {extern} {name} in control {control.name}"
    args = [a.strip() for a in re.split(r",(?![^<]*>)", m.group(1))]
    return args, m.group(2).strip()


def field_width(control: Control, path: str) -> int:
    """Width of `param.field.field...` through the control's parameter types."""
    first, *rest = path.split(".")
    assert first in control.params, f"{path}: {first} is not a parameter of {control.name}"
    p4_type = control.params[first]
    for part in rest:
        fields = {field: t for t, field in structs().get(p4_type, [])}
        assert part in fields, f"{path}: {p4_type} has no field {part}"
        p4_type = fields[part]
    return width(p4_type)


def bfrt_fields(cell: str) -> list[str]:
    """bfrt's data fields of a register cell: a struct's field names, "f1" for a bit<N>."""
    return [field for _, field in structs()[cell]] if cell in structs() else ["f1"]


def agree(item: str, ours: object, theirs: object, where: str) -> None:
    """`tofino_contract.<item>` (ours) is what the P4 says at `where` (theirs)."""
    assert ours == theirs, (
        f"tofino_contract.{item} = {ours!r}, but the P4 ({where}) says {theirs!r}"
    )


def entry_action(qualified_table: str, qualified_action: str) -> None:
    """The table lists the action, and not only as its default (the exporter adds entries)."""
    actions = table(qualified_table).actions
    name = qualified_action.partition(".")[2]
    assert name in actions, f"{qualified_table} does not list {qualified_action}: {actions}"
    assert not actions[name], f"{qualified_table}: {qualified_action} is @defaultonly"


# --------------------------------------------------------------------------------------------
# Program, codes and widths
# --------------------------------------------------------------------------------------------


def test_program_name() -> None:
    main = TOFINO / f"{contract.PROGRAM}.p4"
    assert main.is_file(), f"tofino_contract.PROGRAM = {contract.PROGRAM!r}, but there is no {main}"
    assert re.search(r"\bSwitch\(\s*\w+\s*\)\s+main\s*;", main.read_text()), main
    build = f"-DP4_NAME={contract.PROGRAM}"
    assert build in README.read_text(), f"README.md does not build with {build}"


# exporter constant -> the P4 #define or const it restates
CODES = {
    "LINK_INDEX_BITS": "LINK_INDEX_BITS",
    "MAX_LINKS": "MAX_LINKS",
    "TCP": "IP_PROTO_TCP",
    "TAP_BEFORE": "TAP_BEFORE",
    "TAP_AFTER": "TAP_AFTER",
    "DIR_OUT": "DIR_OUT",
    "DIR_BACK": "DIR_BACK",
    "DIR_BOTH": "DIR_BOTH",
    "FLOW_START_THRESHOLD": "FLOW_START_THRESHOLD",
    "FLOW_START_WINDOW": "FLOW_START_WINDOW",
    "FLOW_END_FIN": "FLOW_END_FIN",
    "FLOW_END_RST": "FLOW_END_RST",
    "QDELAY_EWMA_SHIFT": "QDELAY_EWMA_SHIFT",
}


@pytest.mark.parametrize("item", CODES)
def test_code(item: str) -> None:
    agree(item, getattr(contract, item), const(CODES[item]), CODES[item])


def test_flow_reasons_are_the_event_codes() -> None:
    """Every FLOW_<KIND>_<REASON> code of the P4 and nothing else, as (kind, reason)."""
    pattern = rf"\bconst\s+{TYPE}\s+(FLOW_(START|END)_(\w+))\s*="
    codes = {
        const(name): (kind.lower(), reason.lower())
        for name, kind, reason in re.findall(pattern, source())
    }
    agree("FLOW_REASONS", contract.FLOW_REASONS, codes, "const FLOW_<KIND>_<REASON>")
    event = dict(layout("flow_digest_t"))["event"]
    assert all(0 < code < 1 << event for code in codes), f"codes {codes} vs event bit<{event}>"


# --------------------------------------------------------------------------------------------
# Tables and actions
# --------------------------------------------------------------------------------------------


def test_port_to_link() -> None:
    keys = table(contract.PORT_TABLE).keys
    agree("PORT_KEY", [(contract.PORT_KEY, "exact")], keys, f"{contract.PORT_TABLE} key")
    entry_action(contract.PORT_TABLE, contract.SET_LINK)
    params = action_params(contract.SET_LINK)
    names = tuple(name for _, name in params)
    agree("SET_LINK_PARAMS", contract.SET_LINK_PARAMS, names, f"action {contract.SET_LINK}")
    widths = {name: width(p4_type) for p4_type, name in params}
    link, tap, direction = contract.SET_LINK_PARAMS
    agree("LINK_INDEX_BITS", contract.LINK_INDEX_BITS, widths[link], f"{contract.SET_LINK} {link}")
    for item in ("TAP_BEFORE", "TAP_AFTER"):
        code = getattr(contract, item)
        assert 0 <= code < 1 << widths[tap], (
            f"tofino_contract.{item} = {code} vs {tap} bit<{widths[tap]}>"
        )
    for item in ("DIR_OUT", "DIR_BACK", "DIR_BOTH"):
        code, bits = getattr(contract, item), widths[direction]
        assert 0 <= code < 1 << bits, f"tofino_contract.{item} = {code} vs {direction} bit<{bits}>"


def test_output_prefixes() -> None:
    keys = table(contract.PREFIX_TABLE).keys
    ours = [(contract.PORT_KEY, "exact"), (contract.PREFIX_KEY, "lpm")]
    agree("PORT_KEY, PREFIX_KEY", ours, keys, f"{contract.PREFIX_TABLE} key")
    entry_action(contract.PREFIX_TABLE, contract.DST_IS_OUTPUT)
    params = action_params(contract.DST_IS_OUTPUT)
    assert params == [], f"{contract.DST_IS_OUTPUT} takes {params}; the exporter gives none"


def test_config() -> None:
    keys = table(contract.CONFIG_TABLE).keys
    assert keys == [], f"{contract.CONFIG_TABLE} has keys {keys}; the exporter sets its default"
    assert contract.SET_CONFIG.partition(".")[2] in table(contract.CONFIG_TABLE).actions, (
        f"{contract.CONFIG_TABLE} does not list {contract.SET_CONFIG}"
    )
    params = [(name, width(p4_type)) for p4_type, name in action_params(contract.SET_CONFIG)]
    ours = [(contract.CMS_EPOCH, contract.CMS_EPOCH_BITS)]
    agree("CMS_EPOCH, CMS_EPOCH_BITS", ours, params, f"action {contract.SET_CONFIG}")


def test_rtt_min_interval() -> None:
    (cell,), _ = declaration(contract.RTT_MIN_INTERVAL, "RegisterParam")
    assert width(cell) == 32, f"{contract.RTT_MIN_INTERVAL} is {cell}"
    control, name = control_of(contract.RTT_MIN_INTERVAL)
    m = re.search(r"\bmd\.now_us\s*=\s*[\w.]+\[(\d+):(\d+)\]\s*;", control.body)
    assert m, "md.now_us is no longer a slice of the clock"
    assert re.search(rf"\bmd\.now_us\b[^;]*\b{name}\.read\(\)", control.body), (
        f"{contract.RTT_MIN_INTERVAL} is no longer compared with md.now_us"
    )
    unit = 1 << int(m.group(2))
    agree("RTT_MIN_INTERVAL_UNIT_NS", contract.RTT_MIN_INTERVAL_UNIT_NS, unit, "md.now_us")


# The flow digest's fields that make a FlowKey, in the order of the long_flows key.
FLOW_KEY_FIELDS = ("link", "src_addr", "dst_addr", "src_port", "dst_port")


def test_long_flows() -> None:
    t = table(contract.LONG_FLOWS)
    ours = [(key, "exact") for key in contract.LONG_FLOW_KEYS]
    agree("LONG_FLOW_KEYS", ours, t.keys, f"{contract.LONG_FLOWS} key")
    assert t.idle_timeout, f"{contract.LONG_FLOWS} has no idle_timeout = true"
    entry_action(contract.LONG_FLOWS, contract.LONG_FLOW_HIT)
    params = action_params(contract.LONG_FLOW_HIT)
    assert params == [], f"{contract.LONG_FLOW_HIT} takes {params}; the exporter gives none"
    control, _ = control_of(contract.LONG_FLOWS)
    keys = [field_width(control, key) for key in contract.LONG_FLOW_KEYS]
    digest = dict(contract.FLOW_DIGEST_LAYOUT)
    fields = [digest[f] for f in FLOW_KEY_FIELDS]
    assert keys == fields, f"{contract.LONG_FLOWS} key widths {keys}, digest fields {fields}"


# --------------------------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------------------------

# learn object -> (its layout, the digest type it is declared with)
DIGESTS = {
    "RTT_DIGEST": ("RTT_DIGEST_LAYOUT", "DIGEST_RTT"),
    "FLOW_DIGEST": ("FLOW_DIGEST_LAYOUT", "DIGEST_FLOW"),
}


@pytest.mark.parametrize("item", DIGESTS)
def test_digest_layout(item: str) -> None:
    """Field names, order and widths of the learn object's struct."""
    learn: str = getattr(contract, item)
    layout_name, code = DIGESTS[item]
    (struct,), digest_type = declaration(learn, "Digest")
    assert digest_type == code, f"{learn} is Digest<{struct}>({digest_type}), not ({code})"
    agree(layout_name, list(getattr(contract, layout_name)), layout(struct), f"struct {struct}")


def test_digest_type_codes() -> None:
    assert const("DIGEST_RTT") != const("DIGEST_FLOW")
    assert 0 < const("DIGEST_RTT") < 8 and 0 < const("DIGEST_FLOW") < 8  # 3-bit digest_type


@pytest.mark.parametrize("struct", ["rtt_digest_t", "flow_digest_t"])
def test_readme_documents_the_digest_layout(struct: str) -> None:
    m = re.search(rf"`{struct}`[^\n]*\n+```\n([^`]*)```", README.read_text())
    assert m, f"README.md does not document {struct} in a code block after its name"
    lines = re.findall(rf"^({NAME}):\s*bit<(\d+)>", m.group(1), re.M)
    documented = [(name, int(bits)) for name, bits in lines]
    assert documented == layout(struct), f"README.md's {struct} is {documented}"


# --------------------------------------------------------------------------------------------
# Per-link registers
# --------------------------------------------------------------------------------------------


def exported_registers() -> dict[str, tuple[str, list[str]]]:
    """Register -> (the constant naming its fields, the bfrt data fields the exporter reads)."""
    registers = {
        reg: ("COUNTER_REGISTERS", [f for f, _ in fields])
        for reg, fields in contract.COUNTER_REGISTERS
    }
    registers[contract.QDELAY_SUM] = (
        "QDELAY_SUM_LO, QDELAY_SUM_HI",
        [contract.QDELAY_SUM_LO, contract.QDELAY_SUM_HI],
    )
    registers[contract.QDELAY_EWMA] = ("QDELAY_EWMA_FIELD", [contract.QDELAY_EWMA_FIELD])
    return registers


@pytest.mark.parametrize("register", exported_registers())
def test_link_register(register: str) -> None:
    (cell, index), size = declaration(register, "Register")
    assert index == "link_index_t", f"{register} is indexed by {index}, not the link index"
    agree("MAX_LINKS", contract.MAX_LINKS, value(size), f"{register} size {size}")
    item, fields = exported_registers()[register]
    agree(item, fields, bfrt_fields(cell), f"{register}, cell {cell}")


@pytest.mark.parametrize("register", [r for r, _ in contract.COUNTER_REGISTERS])
def test_counter_width(register: str) -> None:
    (cell, _), _ = declaration(register, "Register")
    widths = [width(t) for t, _ in structs()[cell]] if cell in structs() else [width(cell)]
    agree("COUNTER_BITS", [contract.COUNTER_BITS] * len(widths), widths, f"{register} {cell}")


def test_queueing_delay_sum_width() -> None:
    (cell, _), _ = declaration(contract.QDELAY_SUM, "Register")
    widths = dict(layout(cell))
    lo, hi = widths[contract.QDELAY_SUM_LO], widths[contract.QDELAY_SUM_HI]
    agree("QDELAY_SUM_LO_BITS", contract.QDELAY_SUM_LO_BITS, lo, f"{cell}")
    agree("QDELAY_SUM_BITS", contract.QDELAY_SUM_BITS, lo + hi, f"{cell}")


def test_queueing_delay_filter() -> None:
    """The LPF the exporter programs per link is the one whose output the EWMA register
    keeps, indexed by the link index, MAX_LINKS of them."""
    (_, index), size = declaration(contract.QDELAY_LPF, "Lpf")
    assert index == "link_index_t", f"{contract.QDELAY_LPF} is indexed by {index}"
    agree("MAX_LINKS", contract.MAX_LINKS, value(size), f"{contract.QDELAY_LPF} size {size}")
    control, name = control_of(contract.QDELAY_LPF)
    feeds = re.search(rf"\b(md\.\w+)\s*=\s*{name}\.execute\(", control.body)
    assert feeds, f"{contract.QDELAY_LPF} is not executed into a metadata field"
    _, ewma = control_of(contract.QDELAY_EWMA)
    action = rf"RegisterAction<.*?>\({ewma}\)[^{{]*\{{[^}}]*=\s*{feeds.group(1)}\s*;"
    kept = re.search(action, control.body)
    assert kept, f"{contract.QDELAY_EWMA} does not keep {feeds.group(1)}, the filter's output"


def test_every_per_link_register_is_exported() -> None:
    pattern = rf"\bRegister<\s*{TYPE}\s*,\s*({NAME})\s*>\s*\([^)]*\)\s*({NAME})\s*;"
    per_link = {
        f"{control.name}.{name}"
        for control in controls().values()
        for index, name in re.findall(pattern, control.body)
        if index == "link_index_t"
    }
    ours = set(exported_registers())
    assert per_link == ours, f"the P4's per-link registers {sorted(per_link)}, read {sorted(ours)}"


# --------------------------------------------------------------------------------------------
# bfrt_grpc's own names, and the contract kept in one place
# --------------------------------------------------------------------------------------------


BFRT_NAMES = [
    "ENTRY_TTL",
    "REGISTER_INDEX",
    "REGISTER_PARAM_VALUE",
    "REGISTER_SYNC",
    "LPF_INDEX",
    "LPF_SPEC_TYPE",
    "LPF_SAMPLE",
    "LPF_GAIN_TIME_CONSTANT",
    "LPF_DECAY_TIME_CONSTANT",
    "LPF_OUT_SCALE_DOWN",
    "ENTRY_SCOPE",
]


@pytest.mark.parametrize("item", BFRT_NAMES)
def test_bfrt_names_are_the_documented_ones(item: str) -> None:
    name = getattr(contract, item)
    assert f"`{name}`" in README.read_text(), (
        f"tofino_contract.{item} = {name!r} is not in README.md"
    )


def test_contract_names_are_only_in_the_contract_module() -> None:
    """tofino.py spells out no P4 object or bfrt name: it takes them from tofino_contract."""
    tree = ast.parse(Path(exporter.__file__).read_text())
    qualified = re.compile(rf"^(?:{'|'.join(map(re.escape, controls()))})\.\w|^\$")
    scattered = [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and qualified.match(node.value)
    ]
    assert not scattered, f"contract names outside tofino_contract.py: {scattered}"
