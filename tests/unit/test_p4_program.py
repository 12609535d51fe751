"""Consistency checks of the Tofino P4 program (p4/tofino/) against p4/SPEC.md.

There is no bf-p4c here, so these read the P4 text: every size, hash and threshold the spec
names is parsed from the program's #defines and declarations (a constant changed in the P4
files fails here) and compared with the value parsed from SPEC.md; the hashes' parameters are
run through a reference CRC to prove they are the catalogue algorithms; the source is checked
for balanced brackets, a complete Pipeline, a closed parser state graph and the Tofino
stateful-ALU limits the program is written around. Runs in a few milliseconds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache

import pytest
from p4text import (
    NAME,
    TOFINO,
    block,
    const,
    source,
    sources,
    strip_comments,
    structs,
    value,
    width,
)

SPEC = TOFINO.parent / "SPEC.md"
README = TOFINO / "README.md"
MAIN = TOFINO / "p4bs.p4"


# --------------------------------------------------------------------------------------------
# Reading the P4 text
# --------------------------------------------------------------------------------------------


@cache
def registers() -> dict[str, tuple[str, str, int]]:
    """Register name -> (cell type, index type, size)."""
    found = {}
    pattern = rf"\bRegister<\s*({NAME}|bit<\d+>)\s*,\s*({NAME})\s*>\s*\(([^)]*)\)\s*({NAME})\s*;"
    for m in re.finditer(pattern, source()):
        found[m.group(4)] = (m.group(1), m.group(2), value(m.group(3)))
    return found


@cache
def register_actions() -> dict[str, str]:
    """RegisterAction name -> its register."""
    pattern = rf"\bRegisterAction<[^;{{]*?>\s*\(\s*({NAME})\s*\)\s*({NAME})\s*="
    return {m.group(2): m.group(1) for m in re.finditer(pattern, source())}


def register_action_body(name: str) -> str:
    text = source()
    start = re.search(rf"\)\s*{name}\s*=\s*\{{", text)
    assert start, f"no body for RegisterAction {name}"
    depth, i = 0, start.end() - 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i : j + 1]
    raise AssertionError(f"unterminated RegisterAction {name}")


@cache
def table(name: str) -> str:
    m = re.search(rf"\btable\s+{name}\s*\{{", source())
    assert m, f"table {name} is not declared"
    return block(source(), m.end() - 1)


def hash_inputs(hash_name: str) -> list[list[str]]:
    """The field lists every `hash_name.get({...})` call hashes, in order."""
    calls = re.findall(rf"\b{hash_name}\.get\(\s*\{{([^}}]*)\}}\s*\)", source())
    return [[field.strip() for field in call.split(",")] for call in calls]


@cache
def preprocessed(window_mode: bool) -> str:
    """The program after the C preprocessor, the SDE's <core.p4>/<tna.p4> left out (only
    PORT_METADATA_SIZE of them is a macro the program uses)."""
    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor (cpp) on this machine")
    text = re.sub(r"#include\s+<[^>]+>", "", MAIN.read_text())
    args = [cpp, "-P", "-undef", "-nostdinc", f"-I{TOFINO}", "-DPORT_METADATA_SIZE=32w64"]
    if window_mode:
        args.append("-DLONG_FLOW_WINDOW")
    out = subprocess.run(
        [*args, "-"], input=text, capture_output=True, text=True, check=False, cwd=TOFINO
    )
    assert out.returncode == 0, out.stderr
    return strip_comments(out.stdout)


# --------------------------------------------------------------------------------------------
# Reading SPEC.md
# --------------------------------------------------------------------------------------------


@cache
def spec() -> str:
    return SPEC.read_text()


def spec_number(pattern: str) -> int:
    """A number SPEC.md states, found by a regex whose group 1 is '2^16', '65536', '1 s' or
    '10 s' style."""
    m = re.search(pattern, spec())
    assert m, f"SPEC.md no longer says /{pattern}/: update this test with the spec"
    text = m.group(1).replace(" ", "")
    if "^" in text:
        base, exponent = text.split("^")
        return int(int(base) ** int(exponent))
    if text.endswith("ms"):
        return int(float(text[:-2]) * 1_000_000)
    if text.endswith("s"):
        return int(float(text[:-1]) * 1_000_000_000)
    return int(text)


@cache
def spec_hash_table() -> list[tuple[str, int, int]]:
    """The rows of SPEC section 2's hash table: (use, polynomial, init)."""
    rows = re.findall(
        r"^\|\s*([^|]+?)\s*\|\s*(0x[0-9A-Fa-f]{8})[^|]*\|\s*(0x[0-9A-Fa-f]{8})\s*\|\s*$",
        spec(),
        re.M,
    )
    assert len(rows) >= 5, "SPEC.md's hash table (use | polynomial | init) was not found"
    return [(use, int(poly, 16), int(init, 16)) for use, poly, init in rows]


# --------------------------------------------------------------------------------------------
# A reference CRC: reflected, table-free, as SPEC section 2 defines the hashes
# --------------------------------------------------------------------------------------------


def crc32_reflected(data: bytes, poly: int, init: int, xor_out: int) -> int:
    reflected = int(f"{poly:032b}"[::-1], 2)
    crc = init
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ reflected if crc & 1 else crc >> 1
    return crc ^ xor_out


# --------------------------------------------------------------------------------------------
# Tests: sizes and thresholds
# --------------------------------------------------------------------------------------------


def test_rtt_table_is_two_stages_of_spec_size() -> None:
    slots = spec_number(r"`rtt\.slots = ([\d^]+)` per stage")
    assert re.search(r"per stage, 2 stages", spec())
    stages = sorted(name for name in registers() if re.fullmatch(r"rtt_stage\d", name))
    assert stages == ["rtt_stage0", "rtt_stage1"]
    for name in stages:
        cell, index, size = registers()[name]
        assert size == slots == const("RTT_SLOTS") == 2**16
        assert cell == "sig_ts_t"
        assert width(index) == const("RTT_SLOTS_LOG2")
    assert const("RTT_MAX_AGE_NS") == spec_number(r"rtt\.max_age` \(\*config\*, default ([\d.]+ s)")


def test_sampling_limit_array_and_default() -> None:
    slots = spec_number(r"last emission time per flow \(([\d^]+) slots")
    assert registers()["rtt_last_emit"][2] == slots == 2**16
    assert const("RTT_MIN_INTERVAL_DEFAULT") == spec_number(
        r"`rtt\.min_interval`, default (\d+) = off"
    )
    assert re.search(
        r"RegisterParam<bit<32>>\(RTT_MIN_INTERVAL_DEFAULT\)\s+rtt_min_interval", source()
    )


def test_count_min_sketch_rows_width_threshold_and_reset() -> None:
    assert const("CMS_ROWS") == spec_number(r"`cms\.rows = (\d+)`") == 4
    cms_width = spec_number(r"`cms\.width = ([\d^]+)`")
    rows = sorted(name for name in registers() if re.fullmatch(r"cms_row\d", name))
    assert rows == [f"cms_row{i}" for i in range(const("CMS_ROWS"))]
    for name in rows:
        cell, _, size = registers()[name]
        assert size == cms_width == const("CMS_WIDTH") == 2**16
        # SPEC's cells are 32 bits: here a 16-bit saturating count and a 16-bit epoch.
        assert sum(width(t) for t, _ in structs()[cell]) == 32
    assert (
        const("CMS_THRESHOLD") == spec_number(r"`cms\.threshold` \(default (\d+) packets") == 2000
    )
    assert const("CMS_RESET_NS") == spec_number(r"`cms\.reset = (\d+ s)`") == 10 * 10**9
    count_type = {field: t for t, field in structs()["cms_cell_t"]}["count"]
    assert const("CMS_THRESHOLD") < 2 ** width(count_type)


def test_long_flow_table_capacity_idle_timeout_and_ttl() -> None:
    body = table("long_flows")
    assert re.search(r"\bidle_timeout\s*=\s*true\s*;", body)
    size = re.search(r"\bsize\s*=\s*(\w+)\s*;", body)
    assert size
    capacity = spec_number(r"`long_flows\.capacity = (\d+)`")
    assert value(size.group(1)) == capacity == 65536
    assert const("LONG_FLOW_TTL_MS") * 1_000_000 == spec_number(r"`long_flows\.ttl = (\d+ s)`")
    keys = re.findall(r"([\w.]+)\s*:\s*exact\s*;", body)
    assert keys == [
        "md.link",
        "hdr.ipv4.src_addr",
        "hdr.ipv4.dst_addr",
        "hdr.tcp.src_port",
        "hdr.tcp.dst_port",
    ]


def test_globecom_window_mode_constants() -> None:
    assert const("WINDOW_SLOTS") == spec_number(r"hash-indexed, ([\d^]+) slots with signatures")
    assert const("WINDOW_T_THRESH_NS") == spec_number(r"`window\.t_thresh` \(default ([\d.]+ s)\)")
    assert const("WINDOW_C_THRESH") == spec_number(r"`window\.c_thresh` \(default (\d+)\)")
    assert registers()["window_last"][2] == registers()["window_count"][2] == const("WINDOW_SLOTS")


def test_loss_table_size() -> None:
    slots = spec_number(r"Per flow \(hash-indexed, ([\d^]+) slots `\{signature, next_seq\}`\)")
    cell, _, size = registers()["loss_table"]
    assert size == slots == const("LOSS_SLOTS") == 2**16
    assert [field for _, field in structs()[cell]] == ["sig", "next_seq"]


def test_queueing_delay_table_max_age_and_ewma_shift() -> None:
    slots = spec_number(r"`qdelay\.slots = ([\d^]+)`")
    assert registers()["qdelay_table"][2] == slots == const("QDELAY_SLOTS") == 2**16
    assert const("QDELAY_MAX_AGE_NS") == spec_number(
        r"qdelay\.max_age` \(\*config\*, default ([\d.]+ s)"
    )
    assert (
        const("QDELAY_EWMA_SHIFT")
        == spec_number(r"ewma \+= \(sample \N{MINUS SIGN} ewma\) >> (\d+)")
        == 3
    )


def test_per_link_registers_are_indexed_by_link() -> None:
    per_link = [
        "link_traffic",
        "link_after",
        "link_data",
        "link_retx",
        "link_qdelay_sum",
        "link_qdelay_samples",
        "link_qdelay_ewma",
    ]
    for name in per_link:
        _, index, size = registers()[name]
        assert index == "link_index_t", name
        assert size == const("MAX_LINKS") == 2 ** const("LINK_INDEX_BITS")
    assert re.search(r"\bLpf<bit<32>,\s*link_index_t>\(MAX_LINKS\)\s+link_qdelay_lpf;", source())


# --------------------------------------------------------------------------------------------
# Tests: hashes
# --------------------------------------------------------------------------------------------

CRC32 = (0x04C11DB7, 0xFFFFFFFF)
CRC32C = (0x1EDC6F41, 0xFFFFFFFF)
CRC32D = (0xA833982B, 0xFFFFFFFF)
CRC32Q = (0x814141AB, 0xFFFFFFFF)
SIGNATURE = (0x04C11DB7, 0x00000000)

# Each Hash instance of the program, what SPEC section 2 says it must be, and the key it
# hashes (SPEC: flow key = src, dst, sport, dport, protocol; RTT key = flow key + number;
# queue key = flow key + TCP seq + IPv4 id, all big-endian in that order).
FLOW_KEY = [
    "hdr.ipv4.src_addr",
    "hdr.ipv4.dst_addr",
    "hdr.tcp.src_port",
    "hdr.tcp.dst_port",
    "hdr.ipv4.protocol",
]
RTT_FLOW_KEY = ["md.k_src", "md.k_dst", "md.k_sport", "md.k_dport", "hdr.ipv4.protocol"]
RTT_KEY = [*RTT_FLOW_KEY, "md.k_num"]
QUEUE_KEY = [*FLOW_KEY, "hdr.tcp.seq_no", "hdr.ipv4.identification"]
HASHES: dict[str, tuple[tuple[int, int], list[str]]] = {
    "hash_flow": (CRC32, FLOW_KEY),  # CMS row 0, loss (and window, report-gap) index
    "hash_cms1": (CRC32C, FLOW_KEY),
    "hash_cms2": (CRC32D, FLOW_KEY),
    "hash_cms3": (CRC32Q, FLOW_KEY),
    "hash_flow_sig": (SIGNATURE, FLOW_KEY),
    "hash_rtt_idx0": (CRC32, RTT_KEY),
    "hash_rtt_idx1": (CRC32C, RTT_KEY),
    "hash_rtt_sig": (SIGNATURE, RTT_KEY),
    "hash_rtt_flow": (CRC32, RTT_FLOW_KEY),
    "hash_qdelay_idx": (CRC32, QUEUE_KEY),
    "hash_qdelay_sig": (SIGNATURE, QUEUE_KEY),
}
# SPEC's hash table rows (use column, by substring) -> the hash instances implementing them.
SPEC_USES = {
    "RTT table stage 0": ["hash_rtt_idx0"],
    "CMS row 0": ["hash_flow"],
    "loss": ["hash_flow"],
    "queueing-delay": ["hash_qdelay_idx"],
    "RTT table stage 1": ["hash_rtt_idx1"],
    "CMS row 1": ["hash_cms1"],
    "CMS row 2": ["hash_cms2"],
    "CMS row 3": ["hash_cms3"],
    "signatures": ["hash_flow_sig", "hash_rtt_sig", "hash_qdelay_sig"],
}


@cache
def polynomials() -> dict[str, tuple[int, bool, bool, bool, int, int]]:
    """CRCPolynomial name -> (poly, reversed, msb, extended, init, xor)."""
    found = {}
    pattern = rf"\bCRCPolynomial<bit<32>>\(([^)]*)\)\s*({NAME})\s*;"
    for m in re.finditer(pattern, source()):
        args = [arg.strip() for arg in m.group(1).split(",")]
        assert len(args) == 6, m.group(0)
        poly, reversed_, msb, extended, init, xor = args
        found[m.group(2)] = (
            value(poly),
            reversed_ == "true",
            msb == "true",
            extended == "true",
            value(init),
            value(xor),
        )
    return found


@cache
def hashes() -> dict[str, tuple[int, bool, bool, bool, int, int]]:
    """Hash instance name -> its polynomial's parameters."""
    found = {}
    pattern = rf"\bHash<bit<32>>\(HashAlgorithm_t\.CUSTOM,\s*({NAME})\)\s*({NAME})\s*;"
    for m in re.finditer(pattern, source()):
        assert m.group(1) in polynomials(), f"{m.group(2)} uses undeclared {m.group(1)}"
        found[m.group(2)] = polynomials()[m.group(1)]
    return found


def test_every_hash_is_the_spec_crc_over_the_spec_key() -> None:
    assert set(hashes()) == set(HASHES)
    for name, ((poly, init), key) in HASHES.items():
        got_poly, reflected, msb, extended, got_init, xor = hashes()[name]
        assert (got_poly, got_init) == (poly, init), name
        assert reflected and not msb and not extended, f"{name}: SPEC hashes are reflected"
        assert xor == 0xFFFFFFFF, name
        inputs = hash_inputs(name)
        assert inputs, f"{name} is declared but never used"
        assert all(fields == key for fields in inputs), f"{name} hashes {inputs}, not {key}"


def test_hash_table_of_the_spec_is_what_the_program_uses() -> None:
    covered = set()
    for use, poly, init in spec_hash_table():
        for phrase, names in SPEC_USES.items():
            if phrase in use:
                covered.add(phrase)
                for name in names:
                    assert HASHES[name][0] == (poly, init), f"{name} vs SPEC row '{use}'"
    assert covered == set(SPEC_USES), f"SPEC rows not matched: {set(SPEC_USES) - covered}"


def test_hash_parameters_are_the_catalogue_algorithms() -> None:
    # Check values over "123456789" (the model's hash.rs tests the same ones).
    check = b"123456789"
    expected = {CRC32: 0xCBF43926, CRC32C: 0xE3069283, CRC32D: 0x87315576}
    for (poly, init), check_value in expected.items():
        users = [n for n, ((p, i), _) in HASHES.items() if (p, i) == (poly, init)]
        assert users
        got_poly, _, _, _, got_init, xor = hashes()[users[0]]
        assert crc32_reflected(check, got_poly, got_init, xor) == check_value
    # A signature is CRC-32 from 0: never equal to the index hash of the same key.
    key = bytes.fromhex("0ac9010a0ac902029c40145106")
    assert crc32_reflected(key, *SIGNATURE, 0xFFFFFFFF) != crc32_reflected(key, *CRC32, 0xFFFFFFFF)


def test_indices_come_from_the_right_hashes() -> None:
    text = source()
    assert re.search(r"md\.flow_crc32\s*=\s*hash_flow\.get", text)
    assert re.search(r"cms_row0_add\.execute\(\(cms_index_t\)md\.flow_crc32\)", text)
    assert re.search(r"loss_judge\.execute\(\(loss_index_t\)md\.flow_crc32\)", text)
    for row in (1, 2, 3):
        assert re.search(rf"md\.cms_idx{row}\s*=\s*hash_cms{row}\.get", text)
        assert re.search(rf"cms_row{row}_add\.execute\(\(cms_index_t\)md\.cms_idx{row}\)", text)
    assert re.search(r"rtt0_record\.execute\(\(rtt_index_t\)md\.rtt_idx0\)", text)
    assert re.search(r"rtt1_record\.execute\(\(rtt_index_t\)md\.rtt_idx1\)", text)
    assert re.search(r"rtt_limit\.execute\(\s*\(rtt_limit_index_t\)md\.rtt_flow_crc32\)", text)
    assert re.search(r"md\.rtt_idx0\s*=\s*hash_rtt_idx0\.get", text)
    assert re.search(r"md\.rtt_idx1\s*=\s*hash_rtt_idx1\.get", text)
    assert re.search(r"qd_index\s*=\s*\(bit<16>\)hash_qdelay_idx\.get", text)
    # "An index into a table of 2^k slots is the hash's low k bits": the casts above
    # truncate to the index type, whose width is the table's log2.
    for name, (_, index, size) in registers().items():
        if index != "link_index_t":
            assert 2 ** width(index) == size, name


# --------------------------------------------------------------------------------------------
# Tests: Tofino limits the program is written around
# --------------------------------------------------------------------------------------------


def test_register_cells_fit_a_stateful_alu() -> None:
    for name, (cell, _, _) in registers().items():
        if cell.startswith("bit<"):
            assert width(cell) in (8, 16, 32), name
            continue
        widths = [width(t) for t, _ in structs()[cell]]
        assert len(widths) == 2 and widths[0] == widths[1] and widths[0] in (8, 16, 32), (
            f"{name}: a cell is one 8/16/32-bit value or a pair of equal halves, not {cell}"
        )


def test_register_actions_stay_within_stateful_alu_limits() -> None:
    operand = r"[\w.]+(?:\(\))?"
    side = rf"{operand}(?:\s*[-+]\s*{operand})?"
    per_register: dict[str, list[str]] = {}
    for action, register in register_actions().items():
        assert register in registers(), f"{action} acts on undeclared {register}"
        per_register.setdefault(register, []).append(action)
    for register, actions in per_register.items():
        assert len(actions) <= 4, f"{register}: {len(actions)} RegisterActions (Tofino: 4)"
    for action in register_actions():
        body = register_action_body(action)
        code = re.sub(r"\b(?:int|bit)<\d+>", "", body)  # casts are not comparisons
        # A comparison repeated (in this.predicate(...) and an if) uses the same unit.
        comparisons = {
            " ".join(m.group(0).split())
            for m in re.finditer(rf"{side}\s*(?:==|!=|<=|>=|(?<![<>])[<>](?![<>=]))\s*{side}", code)
        }
        assert len(comparisons) <= 2, f"{action}: comparisons {comparisons} (Tofino 1: 2)"
        assert "<<" not in body and ">>" not in body, f"{action}: stateful ALUs cannot shift"


def test_every_register_action_runs_from_exactly_one_place() -> None:
    # One access per register per packet is enforced by the control flow; textually, each
    # RegisterAction is executed from one call site, and none is dead code.
    for action in register_actions():
        calls = re.findall(rf"\b{action}\.execute\(", source())
        assert len(calls) == 1, f"{action} is executed from {len(calls)} places"
    for register in registers():
        assert register in register_actions().values(), f"{register} is never used"


def test_timestamps_in_registers_are_32_bit_with_a_nonzero_live_value() -> None:
    # Ages are compared mod 2^32 ns (4.29 s): every age limit must be far below that.
    for name in ("RTT_MAX_AGE_NS", "QDELAY_MAX_AGE_NS", "WINDOW_T_THRESH_NS", "LF_REPORT_GAP_NS"):
        assert const(name) < 2**31, name
    assert re.search(r"md\.now\s*=\s*ig_intr_md\.ingress_mac_tstamp\[31:0\]\s*\|\s*32w1;", source())
    # RTT slots: 2^RTT_TS_SHIFT ns units with the top bit set, so that an empty slot (0) is
    # older than any live one and "live" is one comparison.
    shift = const("RTT_TS_SHIFT")
    assert const("RTT_MAX_AGE_UNITS") == const("RTT_MAX_AGE_NS") >> shift < 2**31
    assert re.search(
        r"md\.rtt_now\s*=\s*ig_intr_md\.ingress_mac_tstamp\[RTT_TS_SHIFT \+ 31:RTT_TS_SHIFT\]"
        r"\s*\|\s*32w0x80000000;",
        source(),
    )
    assert re.search(r"md\.rtt\s*=\s*md\.rtt_units\s*<<\s*RTT_TS_SHIFT;", source())
    for action in ("rtt0_record", "rtt1_record"):
        assert "md.rtt_now - s.ts <= RTT_MAX_AGE_UNITS" in register_action_body(action)


def test_each_measurement_runs_at_the_spec_tap() -> None:
    # SPEC: loss and long flows at the before tap (out direction), RTT at the after tap (data
    # out, ACKs back), queueing delay between the two (egress, both taps).
    text = source()
    order = [
        "if (md.tap == TAP_BEFORE && md.is_out == 1)",
        "loss_judge_one_byte.execute(",
        "lf_report.execute(",
        "} else if (md.tap == TAP_AFTER)",
        "if (md.is_out == 1 && md.is_data == 1)",
        "} else if (md.is_out == 0 && hdr.tcp.ack == 1)",
        "rtt0_record.execute(",
        "rtt0_take.execute(",
    ]
    positions = [text.find(marker) for marker in order]
    assert all(p >= 0 for p in positions), dict(zip(order, positions, strict=True))
    assert positions == sorted(positions), "the measurements are not under the right taps"
    # The bridge flags, per (tap, payload, retransmission): before the tap, count what went
    # in and record data for queueing delay; after it, count what the link carried and
    # match data. Every out-direction packet of the after tap reaches egress (none dropped
    # in ingress for want of a payload) and counts in link_after.
    assert re.search(
        r"if \(md\.is_out == 1\) \{\s*hdr\.bridge\.setValid\(\);\s*bridge_flags\.apply", text
    )
    params = re.search(r"action set_bridge_flags\(([^)]*)\)", text)
    assert params
    names = [p.split()[-1] for p in params.group(1).split(",")]
    entries = re.findall(
        r"\((TAP_\w+), (\d), (\d)\) : set_bridge_flags\(([^)]*)\);", preprocessed(False)
    )
    flags = {
        (tap, int(p), int(r)): dict(zip(names, map(int, args.split(",")), strict=True))
        for tap, p, r, args in entries
    }
    before = {
        ("TAP_BEFORE", p, r): {
            "count_traffic": 1,
            "count_after": 0,
            "is_data": p,
            "retx": r,
            "qd_write": p,
            "qd_read": 0,
        }
        for p, r in [(0, 0), (1, 0), (1, 1)]  # a retransmission always has a payload
    }
    after = {
        ("TAP_AFTER", p, 0): {
            "count_traffic": 0,
            "count_after": 1,
            "is_data": p,
            "retx": 0,
            "qd_write": 0,
            "qd_read": p,
        }
        for p in (0, 1)
    }
    assert flags == before | after
    assert "TAP_AFTER && md.has_payload == 0" not in text
    assert re.search(
        r"else if \(hdr\.bridge\.count_after == 1\) \{\s*link_after_add\.execute\(link\);", text
    )


# --------------------------------------------------------------------------------------------
# Tests: well-formed source
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in TOFINO.glob("*.p4")))
def test_brackets_balance(name: str) -> None:
    text = sources()[name]
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[tuple[str, int]] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        for ch in line:
            if ch in "([{":
                stack.append((ch, line_no))
            elif ch in pairs:
                assert stack and stack[-1][0] == pairs[ch], f"{name}:{line_no}: unmatched {ch}"
                stack.pop()
    assert not stack, f"{name}: unclosed {stack[-1][0]} from line {stack[-1][1]}"
    opened = re.findall(r"^\s*#\s*(?:ifdef|ifndef|if)\b", text, re.M)
    closed = re.findall(r"^\s*#\s*endif\b", text, re.M)
    assert len(opened) == len(closed), f"{name}: {len(opened)} #if*, {len(closed)} #endif"


def test_pipeline_parts_are_all_defined() -> None:
    text = sources()["p4bs.p4"]
    m = re.search(r"\bPipeline\(([^;]*)\)\s*pipe\s*;", text)
    assert m, "no Pipeline(...) pipe; instantiation"
    parts = re.findall(rf"({NAME})\s*\(\s*\)", m.group(1))
    assert len(parts) == 6, parts
    kinds = ["parser", "control", "control", "parser", "control", "control"]
    for kind, part in zip(kinds, parts, strict=True):
        assert re.search(rf"\b{kind}\s+{part}\s*\(", source()), f"{kind} {part} is not defined"
    assert re.search(r"\bSwitch\(pipe\)\s+main\s*;", text)
    for include in re.findall(r'#include\s+"([^"]+)"', text):
        assert (TOFINO / include).is_file(), include


@pytest.mark.parametrize("window_mode", [False, True], ids=["sketch", "window"])
def test_parser_states_form_a_closed_graph(window_mode: bool) -> None:
    text = preprocessed(window_mode)
    for parser in re.finditer(rf"\bparser\s+({NAME})\s*\(", text):
        body_start = text.index("{", parser.end())
        depth = 0
        for end in range(body_start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        body = text[body_start:end]
        states = set(re.findall(rf"\bstate\s+({NAME})\s*\{{", body))
        assert "start" in states, parser.group(1)
        targets = set(re.findall(rf"\btransition\s+({NAME})\s*;", body))
        targets |= set(re.findall(rf":\s*({NAME})\s*;", body))
        missing = targets - states - {"accept", "reject"}
        assert not missing, f"{parser.group(1)}: undefined states {missing}"
        unreachable = states - targets - {"start"}
        assert not unreachable, f"{parser.group(1)}: unreachable states {unreachable}"


@pytest.mark.parametrize("window_mode", [False, True], ids=["sketch", "window"])
def test_preprocessed_program_is_complete(window_mode: bool) -> None:
    text = preprocessed(window_mode)
    # The lengths table covers every legal (IHL, data offset): 11 x 11, each giving minus the
    # IP header length and minus both header lengths, in 32-bit words of 4 bytes.
    entries = re.findall(
        r"\((\d+), (\d+)\) : set_lengths\(32w0 - 4 \* (\d+), 32w0 - 4 \* \((\d+) \+ (\d+)\)\);",
        text,
    )
    assert sorted({(int(i), int(d)) for i, d, *_ in entries}) == [
        (i, d) for i in range(5, 16) for d in range(5, 16)
    ]
    assert all((i, i, d) == (ip, i2, d2) for i, d, ip, i2, d2 in entries)
    # One skip state per IHL with options, advancing 32 bits per option word.
    skips = re.findall(r"state skip_ipv4_options_(\d+) \{ pkt\.advance\(32w32 \* (\d+)\);", text)
    assert [(int(a), int(b)) for a, b in skips] == [(w, w) for w in range(1, 11)]
    # Every table applied is declared, and every action a table lists exists.
    for applied in set(re.findall(rf"\b({NAME})\.apply\(\)", text)):
        assert re.search(rf"\btable\s+{applied}\s*\{{", text), f"table {applied} undeclared"
    for actions in re.findall(r"\bactions\s*=\s*\{([^}]*)\}", text):
        for action in re.findall(rf"(?:@defaultonly\s+)?({NAME})\s*;", actions):
            assert action == "NoAction" or re.search(rf"\baction\s+{action}\s*\(", text), action
    sketch = "cms_row0_add" in text
    assert sketch != window_mode and ("window_touch" in text) == window_mode


# --------------------------------------------------------------------------------------------
# Tests: the control-plane contract in README.md
# --------------------------------------------------------------------------------------------


def test_readme_names_every_control_plane_object() -> None:
    readme = README.read_text()
    for name in [
        "Ingress.port_to_link",
        "Ingress.set_link",
        "Ingress.output_prefixes",
        "Ingress.long_flows",
        "Ingress.config",
        "Ingress.rtt_min_interval",
        "IngressDeparser.rtt_digest",
        "IngressDeparser.flow_digest",
        "Egress.link_traffic",
        "Egress.link_after",
        "Egress.link_data",
        "Egress.link_retx",
        "Egress.link_qdelay_sum",
        "Egress.link_qdelay_samples",
        "Egress.link_qdelay_ewma",
        "Egress.link_qdelay_lpf",
        "Ingress.parse_stats",
        "Ingress.unmapped_packets",
        "Ingress.port_packets",
        "Ingress.rtt_stats",
        "Ingress.flow_stats",
        "Egress.qdelay_stats",
    ]:
        obj = name.split(".")[1]
        assert re.search(rf"\b{obj}\b", source()), f"{obj} is not in the program"
        assert name in readme, f"README.md does not document {name}"
    # Every code the control plane sees (action parameters, counter indices, digest
    # values) is documented.
    for name in re.findall(rf"\bconst\s+[\w<>]+\s+({NAME})\s*=", source()):
        if name.startswith(("RTT_OP_", "RTT_REC_", "RTT_LIMIT_", "ETHERTYPE_", "IP_PROTO_")):
            continue
        assert name in readme, f"README.md does not document {name}"
