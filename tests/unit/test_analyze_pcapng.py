"""`p4bs analyze` on pcapng written by Wireshark's tools (tshark, editcap, mergecap, dumpcap):
the same records as on the same packets in classic pcap, at nanosecond and microsecond
resolution, with the packets of one tap spread over two interfaces of one file, and on
dumpcap's capture of the test's own loopback traffic."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pcapgen import FlowPlan, write_taps
from test_analyze import RECEIVERS, T0, analyze, records

from p4bs_infra.procs import free_port

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


def undamaged(*args: str | Path) -> list[dict[str, object]]:
    """`p4bs analyze`'s records, where no file ended early (damage is not an exit code)."""
    result = analyze(*args)
    assert "the records before it were used" not in result.stderr, result.stderr
    return records(result)


def analysis(before: Path, after: Path) -> list[dict[str, object]]:
    out = undamaged(before, "--after", after, "--output-prefix", RECEIVERS)
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


def loopback_traffic_until(port: int, done: Callable[[], bool], timeout_s: float) -> None:
    """A TCP connection on 127.0.0.1:`port` trading small messages, each answered before the
    next goes (a segment each), until `done()` (dumpcap has its packets: it may start
    capturing some time after it says so)."""
    deadline = time.monotonic() + timeout_s
    with (
        socket.create_server(("127.0.0.1", port)) as server,
        socket.create_connection(("127.0.0.1", port), timeout=10) as client,
    ):
        peer, _ = server.accept()
        with peer:
            while not done():
                assert time.monotonic() < deadline, "dumpcap never got its packets"
                client.sendall(b"x" * 100)
                assert peer.recv(100)
                peer.sendall(b"y")
                assert client.recv(1) == b"y"


@pytest.mark.skipif(shutil.which("dumpcap") is None, reason="needs dumpcap")
def test_dumpcap_pcapng_of_loopback_traffic_gives_the_classic_records(tmp_path: Path) -> None:
    """dumpcap's own pcapng (section and interface options, an interface statistics block
    at the end) reads as tshark's classic copy of it does."""
    port, packets = free_port(), 40
    capture = tmp_path / "lo.pcapng"
    dumpcap = subprocess.Popen(
        ["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {port}", "-c", str(packets), "-w", capture],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert dumpcap.stderr is not None
        started = dumpcap.stderr.readline()  # "Capturing on 'Loopback: lo'", or why not
        if "Capturing on" not in started:
            pytest.skip(f"dumpcap cannot capture on lo here: {started.strip()}")
        loopback_traffic_until(port, lambda: dumpcap.poll() is not None, timeout_s=60)
        assert dumpcap.wait(timeout=60) == 0
    finally:
        if dumpcap.poll() is None:
            dumpcap.kill()
            dumpcap.wait()
    assert capture.read_bytes()[:4] == PCAPNG_MAGIC
    classic = tmp_path / "lo.pcap"
    wireshark_tool("tshark", "-r", capture, "-w", classic, "-F", "nsecpcap")
    out = undamaged(capture, "--output-prefix", "127.0.0.1/32")
    assert out == undamaged(classic, "--output-prefix", "127.0.0.1/32")
    counters = [r for r in out if r["kind"] == "link_counters"]
    assert sum(c["packets"] for c in counters) == packets
