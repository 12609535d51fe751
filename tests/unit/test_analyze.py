"""`p4bs analyze` on generated captures: exact records for known flows, and malformed input
counted and reported without a crash."""

from __future__ import annotations

import ipaddress
import json
import struct
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from pcapgen import FlowPlan, flows_through_router, tcp_frame, write_pcap, write_taps

from p4bs import paths
from p4bs.config import parse_config
from p4bs_exporter import dataplane_spec

T0 = 1_700_000_000 * 10**9
RECEIVERS = "10.201.2.0/24"


def analyze(*args: str | Path) -> subprocess.CompletedProcess[str]:
    argv = [str(paths.home() / ".venv" / "bin" / "p4bs"), "analyze", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def records(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_known_flows_give_their_rtt_queue_delay_counters_and_long_flow(tmp_path: Path) -> None:
    long_flow = FlowPlan(
        "10.201.1.10", "10.201.2.2", 40000, 5201, T0, 2500, 100_000, 30_000_000, 2_000_000
    )
    short_flow = FlowPlan(
        "10.201.1.11", "10.201.2.2", 40001, 5201, T0 + 5_000, 20, 1_000_000, 50_000_000
    )
    before, after = write_taps(tmp_path, [long_flow, short_flow])
    out = records(analyze(before, "--after", after, "--output-prefix", RECEIVERS))

    rtt = [r for r in out if r["kind"] == "rtt_sample"]
    assert len(rtt) == 2520  # every segment is ACKed once
    by_flow = {(r["src_ip"], r["src_port"], r["dst_ip"], r["dst_port"]) for r in rtt}
    assert by_flow == {
        ("10.201.1.10", 40000, "10.201.2.2", 5201),
        ("10.201.1.11", 40001, "10.201.2.2", 5201),
    }
    assert {r["rtt_ns"] for r in rtt if r["src_port"] == 40000} == {30_000_000}
    assert {r["rtt_ns"] for r in rtt if r["src_port"] == 40001} == {50_000_000}
    assert all(r["link_id"] == "capture" and r["protocol"] == 6 for r in rtt)

    delays = [r for r in out if r["kind"] == "queue_delay"]
    assert len(delays) == 2520
    assert {r["queue_delay_ns"] for r in delays} == {2_000_000, 1_000_000}

    flows = [r for r in out if r["kind"] == "long_flow"]
    assert [(f["event"], f["reason"], f["src_port"]) for f in flows] == [
        ("start", "threshold", 40000),
        ("end", "fin", 40000),
    ]
    assert flows[0]["packets"] == 2000

    counters = [r for r in out if r["kind"] == "link_counters"]
    assert [c["seq"] for c in counters] == list(range(len(counters)))
    assert sum(c["data_packets"] for c in counters) == 2520
    assert sum(c["packets"] for c in counters) == 2520  # ACKs are not the data direction
    assert sum(c["bytes"] for c in counters) == 2520 * 1488  # IP total length
    # Nothing dropped: what left the router (the after tap) is what entered it.
    assert sum(c["after_packets"] for c in counters) == 2520
    assert sum(c["after_bytes"] for c in counters) == 2520 * 1488
    assert sum(c["retransmissions"] for c in counters) == 0
    assert sum(c["queue_delay_samples"] for c in counters) == 2520
    # Intervals end on multiples of 100 ms; the last one ends at the last packet.
    assert all(c["ts_ns"] % 100_000_000 == 0 for c in counters[:-1])
    assert all(c["interval_ns"] == 100_000_000 for c in counters[1:-1])

    summary = json.loads(analyze(before, "--after", after, "--summary").stdout)
    assert summary["links"]["capture"]["rtt_samples"] == 2520
    assert summary["long_flows_listed_at_end"] == 0


def test_the_after_tap_counts_what_the_router_carried(tmp_path: Path) -> None:
    """The router drops every 4th segment: the before tap's packets and bytes are the
    offered load, the after tap's (after_packets, after_bytes) what left the router, per
    export interval by the time each packet passed its own tap."""
    segments, gap, queue = 1000, 200_000, 30_000_000  # 5 segments per ms, 30 ms in the queue
    plan = FlowPlan(
        "10.201.1.10", "10.201.2.2", 40000, 5201, T0, segments, gap, 20_000_000, queue,
        drop_every=4,
    )  # fmt: skip
    before, after = write_taps(tmp_path, [plan])
    counters = [
        r
        for r in records(analyze(before, "--after", after, "--output-prefix", RECEIVERS))
        if r["kind"] == "link_counters"
    ]
    ip_len = 20 + 20 + 1448
    carried = [k for k in range(segments) if k % 4 != 3]
    assert sum(c["packets"] for c in counters) == segments
    assert sum(c["bytes"] for c in counters) == segments * ip_len
    assert sum(c["after_packets"] for c in counters) == len(carried) == 750
    assert sum(c["after_bytes"] for c in counters) == 750 * ip_len
    # Each interval counts the segments that entered in it at `before` and those that left
    # in it at `after` (30 ms later): [T0, T0 + 100 ms) has 500 in and 3/4 of 350 out.
    first = counters[0]
    assert first["ts_ns"] == T0 + 100_000_000
    assert first["packets"] == 500
    left = [k for k in carried if T0 + k * gap + queue < first["ts_ns"]]
    assert first["after_packets"] == len(left) == 263
    assert first["after_bytes"] == 263 * ip_len
    assert first["queue_delay_samples"] == 263
    summary = analyze(before, "--after", after, "--output-prefix", RECEIVERS, "--summary")
    totals = json.loads(summary.stdout)["links"]["capture"]
    assert (totals["bytes"], totals["after_bytes"]) == (segments * ip_len, 750 * ip_len)


def _ipv4_tcp(ip_options: bytes = b"", tcp_offset_words: int = 5) -> bytes:
    frame, _ = tcp_frame("10.201.1.10", "10.201.2.2", 40000, 5201, 1, 1, 0x10, 100)
    ip = bytearray(frame[14:34])
    ip[0] = 0x40 | ((20 + len(ip_options)) // 4)
    ip[2:4] = struct.pack("!H", 20 + len(ip_options) + 20 + 100)
    tcp = bytearray(frame[34:54])
    tcp[12] = tcp_offset_words << 4
    return frame[:14] + bytes(ip) + ip_options + bytes(tcp)


def test_malformed_frames_are_counted_by_reason_and_a_cut_file_is_reported(
    tmp_path: Path,
) -> None:
    good = _ipv4_tcp()
    eth, ip = good[:12], good[14:]
    bad_ihl = bytearray(good)
    bad_ihl[14] = 0x44
    fragment = bytearray(good)
    fragment[14 + 6] = 0x20  # more fragments
    udp = bytearray(good)
    udp[14 + 9] = 17
    frames = [
        good,
        _ipv4_tcp(ip_options=b"\x01" * 8),  # IPv4 options are skipped, not refused
        eth + b"\x81\x00\x00\x05" + b"\x88\xa8\x00\x06" + b"\x08\x00" + ip,  # QinQ
        good[:10],  # truncated Ethernet
        bytes(bad_ihl),
        _ipv4_tcp(tcp_offset_words=4),  # TCP data offset below 5
        bytes(fragment),
        eth + b"\x86\xdd" + bytes(40),  # IPv6
        eth + b"\x81\x00\x00\x05" * 3 + b"\x08\x00" + ip,  # three VLAN tags
        bytes(udp),
        eth + b"\x08\x06" + bytes(28),  # ARP
        good[:40],  # cut inside the TCP header
    ]
    path = tmp_path / "bad.pcap"
    write_pcap(path, [(T0 + i * 1000, f, len(f)) for i, f in enumerate(frames)])
    path.write_bytes(path.read_bytes() + struct.pack("<IIII", 1, 0, 200, 200) + b"\x00" * 50)

    result = analyze(path, "--summary")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    counters = summary["counters"]
    expected = {
        "packets": 12,
        "tcp_packets": 3,
        "truncated": 1,
        "bad_ipv4": 1,
        "bad_tcp": 2,
        "fragment": 1,
        "ipv6": 1,
        "vlan_too_deep": 1,
        "non_tcp": 1,
        "other_l3": 1,
    }
    assert {k: counters[k] for k in expected} == expected
    assert summary["links"]["capture"]["packets"] == 3
    assert summary["problems"] == [
        f"{path}: file ends inside record 12; the records before it were used"
    ]
    assert "input problem" in result.stderr and "bad_tcp 2" in result.stderr


def test_unusable_input_is_an_error_naming_it(tmp_path: Path) -> None:
    not_pcap = tmp_path / "notes.txt"
    not_pcap.write_text("not a capture at all, just some words\n")
    result = analyze(not_pcap)
    assert result.returncode == 1
    assert f"{not_pcap}: not a pcap or pcapng file" in result.stderr
    missing = analyze(tmp_path / "missing.pcap")
    assert missing.returncode == 1 and "missing.pcap" in missing.stderr
    bad_prefix = analyze(not_pcap, "--output-prefix", "10.0.0.1/33")
    assert bad_prefix.returncode == 2 and "--output-prefix" in bad_prefix.stderr
    config = tmp_path / "p4bs.toml"
    text = (paths.example_config()).read_text()
    config.write_text(text.replace("rtt_slots = 65536", "rtt_slots = 1000"))
    bad_config = analyze(not_pcap, "--config", config)
    assert bad_config.returncode == 1
    assert "dataplane.rtt_slots: must be a power of two" in bad_config.stderr


def test_per_direction_tap_ports_measure_what_merged_ports_with_prefixes_do(
    tmp_path: Path, repo: Path
) -> None:
    """An optical tap's layout: each tap point as two ports, one per direction, and no
    output_prefixes. The config's spec for the software data plane gives the same RTT
    samples, queueing delays and counters as the merged taps told apart by prefixes."""
    plans = [
        FlowPlan("10.201.1.10", "10.201.2.2", 40000, 5201, T0, 600, 100_000, 30_000_000),
        FlowPlan(
            "10.201.1.11", "10.201.2.2", 40001, 5201, T0, 300, 200_000, 50_000_000, drop_every=7
        ),
    ]
    before, after = write_taps(tmp_path, plans)
    merged = records(analyze(before, "--after", after, "--output-prefix", RECEIVERS))

    example = tomllib.loads((repo / "config" / "testbed.toml").read_text())
    link = example["links"][0]
    del link["output_prefixes"]
    link["taps"] = {"before": {"out": "bo", "back": "bb"}, "after": {"out": "ao", "back": "ab"}}
    config = parse_config(example)
    spec = dataplane_spec.live_spec(config, config.links)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    argv = [str(paths.built("p4bs-model")), "analyze", "--config", str(tmp_path / "spec.json")]
    senders = ipaddress.IPv4Network("10.201.1.0/24")
    for tap, packets in zip(("b", "a"), flows_through_router(plans), strict=True):
        # The data direction (`out`) is what the senders send: source address at 26..30.
        out = [p for p in packets if ipaddress.IPv4Address(p[1][26:30]) in senders]
        back = [p for p in packets if ipaddress.IPv4Address(p[1][26:30]) not in senders]
        for port, chosen in ((f"{tap}o", out), (f"{tap}b", back)):
            write_pcap(tmp_path / f"{port}.pcap", chosen)
            argv += ["--pcap", f"{port}={tmp_path / f'{port}.pcap'}"]
    argv.append("--queue-delay-samples")
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    split = records(run)

    def measured(out: list[dict[str, Any]]) -> dict[str, Any]:
        counters = [r for r in out if r["kind"] == "link_counters"]
        return {
            "rtt": sorted((r["src_port"], r["rtt_ns"]) for r in out if r["kind"] == "rtt_sample"),
            "delays": sorted(r["queue_delay_ns"] for r in out if r["kind"] == "queue_delay"),
            "totals": {
                k: sum(c[k] for c in counters)
                for k in ("packets", "bytes", "after_packets", "data_packets", "retransmissions")
            },
        }

    expected = measured(merged)
    assert len(expected["rtt"]) == 600 + 300 - 300 // 7 and expected["totals"]["packets"] == 900
    assert measured(split) == expected
    assert {r["link_id"] for r in split} == {"r1:eth1"}
