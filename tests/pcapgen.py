"""Small pcap files of TCP flows at known times, for tests of the data plane and exporter.

`flows_through_router` plays long TCP transfers through one router as its two taps see them:
`before` gets each data segment as it enters, `after` the same segment `queue_ns` later as it
leaves (unless the plan has the router drop it), and both get the receiver's ACK of every
segment `rtt_ns` after the segment left. So the data plane sees an RTT sample per segment
(after tap), counters and long flows (before tap), what the link carried (after tap) and
queueing delay (both). Frames are cut at the headers like a snap-length capture (the IP
total length still counts the payload), timestamps have ns resolution.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PCAP_NS_MAGIC = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
ACK, FIN, PSH = 0x10, 0x01, 0x08
MSS = 1448

Packet = tuple[int, bytes, int]  # (ts_ns, captured frame, length on the wire)


def tcp_frame(
    src: str, dst: str, sport: int, dport: int, seq: int, ack: int, flags: int, payload: int
) -> tuple[bytes, int]:
    """Ethernet/IPv4/TCP headers of a segment carrying `payload` bytes (not captured)."""
    total = 20 + 20 + payload
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        total,
        (seq // MSS) & 0xFFFF,  # an IP id per segment: the queueing-delay match uses it
        0x4000,
        64,
        6,
        0,
        ipaddress.IPv4Address(src).packed,
        ipaddress.IPv4Address(dst).packed,
    )
    tcp = struct.pack(
        "!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0
    )
    eth = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    frame = eth + ip + tcp
    return frame, 14 + total


def write_pcap(path: Path, packets: Iterable[Packet]) -> int:
    """Writes the packets in time order; returns how many."""
    ordered = sorted(packets, key=lambda p: p[0])
    out = bytearray(struct.pack("<IHHiIII", PCAP_NS_MAGIC, 2, 4, 0, 0, 65535, LINKTYPE_ETHERNET))
    for ts, frame, wire in ordered:
        out += struct.pack("<IIII", ts // 10**9, ts % 10**9, len(frame), wire)
        out += frame
    path.write_bytes(bytes(out))
    return len(ordered)


@dataclass(frozen=True)
class FlowPlan:
    """One TCP transfer: `segments` full-size segments, one every `gap_ns` from `start_ns`."""

    src: str
    dst: str
    sport: int
    dport: int
    start_ns: int
    segments: int
    gap_ns: int
    rtt_ns: int
    queue_ns: int = 1_000_000
    fin: bool = True  # close with a FIN (else the flow just stops: an idle timeout)
    drop_every: int = 0  # the router drops every n-th segment (n = 5: segments 4, 9, ...)


def flows_through_router(plans: Iterable[FlowPlan]) -> tuple[list[Packet], list[Packet]]:
    """The (before, after) taps' packets of the planned flows."""
    before: list[Packet] = []
    after: list[Packet] = []
    for p in plans:
        seq0 = 1000 + p.sport  # any initial sequence number
        for k in range(p.segments):
            last = k == p.segments - 1
            flags = ACK | PSH | (FIN if last and p.fin else 0)
            seq = seq0 + k * MSS
            data = tcp_frame(p.src, p.dst, p.sport, p.dport, seq, 1, flags, MSS)
            t_in = p.start_ns + k * p.gap_ns
            t_out = t_in + p.queue_ns
            before.append((t_in, *data))
            if p.drop_every and k % p.drop_every == p.drop_every - 1:
                continue  # dropped by the router: never at the after tap, never ACKed
            after.append((t_out, *data))
            eack = seq + MSS + (1 if flags & FIN else 0)
            ack = tcp_frame(p.dst, p.src, p.dport, p.sport, 1, eack, ACK, 0)
            after.append((t_out + p.rtt_ns, *ack))
            before.append((t_out + p.rtt_ns + 10_000, *ack))
    return before, after


def write_taps(directory: Path, plans: Iterable[FlowPlan]) -> tuple[Path, Path]:
    """before.pcap and after.pcap of the planned flows in `directory`."""
    before, after = flows_through_router(plans)
    paths = directory / "before.pcap", directory / "after.pcap"
    write_pcap(paths[0], before)
    write_pcap(paths[1], after)
    return paths


def read_pcap(path: Path) -> list[tuple[int, bytes]]:
    """(ts_ns, frame) of a file `write_pcap` wrote."""
    data = path.read_bytes()
    at, packets = 24, []
    while at + 16 <= len(data):
        sec, nsec, caplen, _ = struct.unpack_from("<IIII", data, at)
        packets.append((sec * 10**9 + nsec, data[at + 16 : at + 16 + caplen]))
        at += 16 + caplen
    return packets


def replay(files: dict[Path, str]) -> int:
    """Sends the frames of pcap files on interfaces (file -> interface) at their own pace,
    all files merged in time order; returns how many were sent. Needs CAP_NET_RAW."""
    sockets = {}
    for interface in set(files.values()):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind((interface, 0))
        sockets[interface] = s
    frames = sorted((ts, files[f], frame) for f in files for ts, frame in read_pcap(f))
    began = time.monotonic()
    for ts, interface, frame in frames:
        wait = (ts - frames[0][0]) / 1e9 - (time.monotonic() - began)
        if wait > 0:
            time.sleep(wait)  # the traffic's own pacing
        sockets[interface].send(frame)
    return len(frames)


if __name__ == "__main__":
    # python pcapgen.py FILE=INTERFACE ...: replay captures onto interfaces.
    pairs = [arg.split("=", 1) for arg in sys.argv[1:]]
    print(replay({Path(f): i for f, i in pairs}))
