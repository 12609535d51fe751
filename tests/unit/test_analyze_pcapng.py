"""`p4bs analyze` on pcapng written by Wireshark's tools (tshark, editcap, mergecap): the same
records as on the same packets in classic pcap, at nanosecond and microsecond resolution, and
with the packets of one tap spread over two interfaces of one file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pcapgen import FlowPlan, write_taps
from test_analyze import RECEIVERS, T0, analyze, records

TOOLS = ("tshark", "editcap", "mergecap")
pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS),
    reason="needs Wireshark's command-line tools (apt-get install tshark)",
)

PCAPNG_MAGIC = bytes.fromhex("0a0d0d0a")


def wireshark_tool(*argv: str | Path) -> None:
    subprocess.run(list(map(str, argv)), check=True, capture_output=True, timeout=60)


def to_pcapng(pcap: Path) -> Path:
    """tshark's copy of a classic pcap as pcapng, at the input's timestamp resolution."""
    out = pcap.with_suffix(".pcapng")
    wireshark_tool("tshark", "-r", pcap, "-w", out, "-F", "pcapng")
    assert out.read_bytes()[:4] == PCAPNG_MAGIC
    return out


def taps(directory: Path) -> tuple[Path, Path]:
    """Classic nanosecond pcaps of a long flow with drops and a short flow."""
    long_flow = FlowPlan(
        "10.201.1.10",
        "10.201.2.2",
        40000,
        5201,
        T0,
        2200,
        100_123,
        30_000_011,
        2_000_007,
        drop_every=50,
    )
    short_flow = FlowPlan(
        "10.201.1.11", "10.201.2.2", 40001, 5201, T0 + 5_003, 20, 1_000_000, 50_000_000
    )
    return write_taps(directory, [long_flow, short_flow])


def analysis(before: Path, after: Path) -> list[dict[str, object]]:
    out = records(analyze(before, "--after", after, "--output-prefix", RECEIVERS))
    assert {"rtt_sample", "queue_delay", "long_flow", "link_counters"} <= {r["kind"] for r in out}
    return out


def test_tshark_pcapng_at_nanoseconds_gives_the_classic_records(tmp_path: Path) -> None:
    before, after = taps(tmp_path)
    classic = analysis(before, after)
    assert analysis(to_pcapng(before), to_pcapng(after)) == classic
    # One tap of each format.
    assert analysis(to_pcapng(before), after) == classic
    # The packets carry sub-microsecond times: a reader taking the pcapng's nanosecond
    # timestamps as microseconds would not give these.
    assert {r["rtt_ns"] for r in classic if r["kind"] == "rtt_sample"} >= {30_000_011}


def test_tshark_pcapng_at_microseconds_gives_the_classic_records(tmp_path: Path) -> None:
    before_ns, after_ns = taps(tmp_path)
    # editcap's classic pcap is microsecond (the default pcapng resolution, which tshark keeps).
    before, after = tmp_path / "before-us.pcap", tmp_path / "after-us.pcap"
    wireshark_tool("editcap", "-F", "pcap", before_ns, before)
    wireshark_tool("editcap", "-F", "pcap", after_ns, after)
    classic = analysis(before, after)
    assert analysis(to_pcapng(before), to_pcapng(after)) == classic
    assert classic != analysis(before_ns, after_ns)  # the microsecond rounding shows


def test_mergecap_pcapng_with_two_interfaces_reads_as_one_tap(tmp_path: Path) -> None:
    before, after = taps(tmp_path)
    # The before tap's packets split by flow into two files, then merged back into one
    # pcapng in time order, one interface description per input file (-I none).
    halves = []
    for port in (40000, 40001):
        half = tmp_path / f"before-{port}.pcap"
        wireshark_tool(
            "tshark", "-r", before, "-Y", f"tcp.port == {port}", "-w", half, "-F", "nsecpcap"
        )
        halves.append(half)
    merged = tmp_path / "before-merged.pcapng"
    wireshark_tool("mergecap", "-I", "none", "-F", "pcapng", "-w", merged, *halves)
    interfaces = subprocess.run(
        ["tshark", "-r", str(merged), "-T", "fields", "-e", "frame.interface_id"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    assert set(interfaces) == {"0", "1"}
    assert analysis(merged, after) == analysis(before, after)
