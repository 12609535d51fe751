"""Software data plane throughput on a generated capture, with tshark on the same file.

    .venv/bin/python tests/bench/model.py [--packets 10000000] [--runs 3] [--tshark-packets N]

Generates a before-router and an after-router pcap of many TCP flows (data segments at both
taps, the after copy later by a varying queueing delay; an ACK every second segment, seen at
the after tap) with `--packets` frames in all, runs `p4bs-model analyze --summary` on them
pinned to one core `--runs` times (median), then tshark's TCP analysis (ack_rtt) on the same
files as the reference, and prints both rates and their ratio. Files go to .cache/bench/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p4bs import paths

MSS = 1448
FLOWS = 2000
T0_NS = 1_700_000_000 * 10**9
GAP_NS = 12_000  # between consecutive data segments of the link: ~1 Gbit/s
SNAPLEN = 66  # Ethernet + IPv4 + TCP headers, as a monitoring capture keeps them


def _frame(
    src: int,
    dst: int,
    sport: int,
    dport: int,
    seq: int,
    ack: int,
    flags: int,
    payload: int,
    ip_id: int,
) -> bytes:
    total = 20 + 20 + payload
    ip = struct.pack("!BBHHHBBHII", 0x45, 0, total, ip_id, 0x4000, 64, 6, 0, src, dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    return (b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + tcp)[:SNAPLEN]


def _record(ts_ns: int, frame: bytes, wire_len: int) -> bytes:
    return struct.pack("<IIII", ts_ns // 10**9, ts_ns % 10**9, len(frame), wire_len) + frame


def generate(before: Path, after: Path, packets: int) -> int:
    """Writes both files; returns the number of frames written."""
    header = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)  # ns timestamps
    seqs = [1000 * i for i in range(FLOWS)]
    segments = packets * 2 // 5  # each segment: 2 data copies + half an ACK
    written = 0
    with before.open("wb") as fb, after.open("wb") as fa:
        fb.write(header)
        fa.write(header)
        pending_after: list[bytes] = []
        for n in range(segments):
            flow = n % FLOWS
            src, dst = 0x0AC90100 + flow % 200, 0x0AC90202
            sport, dport = 10_000 + flow, 5201
            seq = seqs[flow]
            seqs[flow] = (seq + MSS) & 0xFFFFFFFF
            ts = T0_NS + n * GAP_NS
            data = _frame(src, dst, sport, dport, seq, 1, 0x10, MSS, n & 0xFFFF)
            fb.write(_record(ts, data, 14 + 40 + MSS))
            leaves = ts + 1_000_000 + (n % 1000) * 5_000  # 1-6 ms of queueing
            pending_after.append(_record(leaves, data, 14 + 40 + MSS))
            written += 2
            if (n // FLOWS) % 2 == 1:  # every second segment of the flow is ACKed
                ack = _frame(dst, src, dport, sport, 1, seqs[flow], 0x10, 0, 0)
                pending_after.append(_record(leaves + 20_000_000, ack, 14 + 40))
                written += 1
            if len(pending_after) >= 200_000:
                written_now = _flush_sorted(fa, pending_after, until=ts)
                pending_after = pending_after[written_now:]
        _flush_sorted(fa, pending_after, until=None)
    return written


def _flush_sorted(out: object, pending: list[bytes], until: int | None) -> int:
    """Writes the pending after-tap records due before `until` in time order."""
    pending.sort(key=lambda r: struct.unpack_from("<II", r))
    count = 0
    for record in pending:
        sec, nsec = struct.unpack_from("<II", record)
        if until is not None and sec * 10**9 + nsec > until:
            break
        out.write(record)  # type: ignore[attr-defined]
        count += 1
    return count


def run_model(spec: Path, before: Path, after: Path) -> tuple[float, int]:
    argv = [
        "taskset",
        "-c",
        "1",
        str(paths.built("p4bs-model")),
        "analyze",
        "--config",
        str(spec),
        "--pcap",
        f"before={before}",
        "--pcap",
        f"after={after}",
        "--summary",
    ]
    began = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - began
    summary = json.loads(result.stdout)
    return seconds, summary["counters"]["packets"]


def run_tshark(before: Path, after: Path, limit: int | None) -> tuple[float, int]:
    """tshark's TCP analysis (what ack_rtt needs) over both files, on one core."""
    seconds, frames = 0.0, 0
    for path in (before, after):
        argv = [
            "taskset",
            "-c",
            "1",
            "tshark",
            "-r",
            str(path),
            "-n",
            "-q",
            "-o",
            "tcp.analyze_sequence_numbers:TRUE",
            "-z",
            "io,stat,0,tcp.analysis.ack_rtt",
        ]
        if limit:
            argv += ["-c", str(limit // 2)]
        began = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        seconds += time.perf_counter() - began
        frames += (
            limit // 2
            if limit
            else int(
                subprocess.run(
                    ["capinfos", "-c", "-M", str(path)], capture_output=True, text=True, check=True
                ).stdout.split()[-1]
            )
        )
    return seconds, frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--packets", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tshark-packets", type=int, help="tshark on the first N frames only")
    args = parser.parse_args()
    folder = paths.cache_dir() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    before, after = folder / "model-before.pcap", folder / "model-after.pcap"
    stamp = folder / "model-packets.txt"
    if not stamp.exists() or stamp.read_text() != str(args.packets):
        began = time.perf_counter()
        frames = generate(before, after, args.packets)
        stamp.write_text(str(args.packets))
        print(f"generated {frames} frames in {time.perf_counter() - began:.0f} s", flush=True)
    spec = {
        "links": [{"id": "bench:eth1", "output_prefixes": ["10.201.2.0/24"]}],
        "ports": [
            {"port": tap, "link": "bench:eth1", "tap": tap, "direction": "both"}
            for tap in ("before", "after")
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec_file:
        json.dump(spec, spec_file)
        spec_file.flush()
        rates = []
        for i in range(args.runs):
            seconds, frames = run_model(Path(spec_file.name), before, after)
            rates.append(frames / seconds)
            print(
                f"model run {i + 1}: {frames} frames in {seconds:.2f} s = "
                f"{frames / seconds / 1e6:.2f} Mpps",
                flush=True,
            )
    model = statistics.median(rates)
    seconds, frames = run_tshark(before, after, args.tshark_packets)
    tshark = frames / seconds
    print(
        f"tshark (TCP analysis, same files): {frames} frames in {seconds:.1f} s = "
        f"{tshark / 1e6:.3f} Mpps"
    )
    print(
        f"model median {model / 1e6:.2f} Mpps on one core (goal 2 Mpps; ePPing reports "
        f"> 1 Mpps/core); {model / tshark:.0f}x tshark"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
