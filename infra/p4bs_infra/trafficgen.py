"""Traffic and measurement programs that run inside the testbed's namespaces.

    python -m p4bs_infra.trafficgen fct-server --port P
    python -m p4bs_infra.trafficgen fct-client --server IP --port P --bind IP --rate FLOWS_PER_S
        --min-size B --max-size B --duration S --out FILE [--seed N] [--sizes websearch]
        [--rate-changes FROM_S:FLOWS_PER_S,...]
    python -m p4bs_infra.trafficgen bulk-server --port P --out FILE
    python -m p4bs_infra.trafficgen bulk-client --server IP --port P --bind IP --flows N
        --cca CCA --go FILE --start S --stop S --out FILE
    python -m p4bs_infra.trafficgen voip-recv --port P --out FILE
    python -m p4bs_infra.trafficgen voip-send --dst IP --port P --bind IP --pps N --size B
        --duration S --out FILE
    python -m p4bs_infra.trafficgen qdisc-log --dev IF --hz N --out FILE
    python -m p4bs_infra.trafficgen ss-log --dst IP --hz N --out FILE
    python -m p4bs_infra.trafficgen ping-log --dst IP --hz N --out FILE

Long flows (bulk): the client connects all its flows at once when it starts (each with its
congestion control) and says so, then waits for the traffic's start (realtime ns, written to
the `--go` file once every client is connected), sends nothing until `--start` s after it,
then sends on every flow as fast as TCP allows until `--stop` s after it, when it resets
them: a group joins and leaves at its scheduled times whatever the queue. (iperf3 connects
its streams one after the other, an RTT each, and starts its timer after the last: it
joined 90 flows 3 s late behind a 4 ms queue and 20 s late behind 200 ms.) The server
discards what it receives and writes a record per flow: its bytes, first and last data.

Short flows: the client asks the server for SIZE bytes (8-byte request) and times the flow
from connect() to the server's close: the flow completion time. Sizes are log-uniform between
the bounds (web-like: many small, some large), or with `--sizes websearch` from the web search
flow-size CDF (SIZE_CDFS); arrivals are Poisson, at a rate `--rate-changes` may change at given
times (0 pauses them). VoIP: constant-rate UDP
datagrams carrying their sequence number and send time; sender and receiver share this host's
clock, so one-way delay is exact. Every program writes JSON lines and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import re
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any, cast

from p4bs_linux_tc.netlink import Rtnetlink

REQUEST = struct.Struct("!Q")
VOIP_HEADER = struct.Struct("!QQ")  # sequence number, send time (ns, realtime)
CHUNK = b"\0" * (1 << 16)

stop = threading.Event()


def _on_term(*_: object) -> None:
    stop.set()


def _writer(path: str) -> IO[str]:
    return open(path, "a", buffering=1)  # line-buffered: every record is on disk at once


def _emit(out: IO[str], record: dict[str, Any]) -> None:
    out.write(json.dumps(record, separators=(",", ":")) + "\n")


# ---- long flows --------------------------------------------------------------------------
BULK_READ = 1 << 18
BULK_READ_EVERY_S = 0.01
BULK_CONNECT_TIMEOUT_S = 10.0


def bulk_server(args: argparse.Namespace) -> None:
    """Accepts flows and discards what they send. One select loop that sleeps
    BULK_READ_EVERY_S between rounds, so that each read takes that long of a flow's data:
    woken per segment, a Python reader of 100 flows at 100 Mbit/s took 0.29 of a core.
    (SO_RCVLOWAT would batch the wakeups too, but Linux then clamps the flow's receive
    window to it: 64 kB held 10 flows to a 30 ms queue in a 200 ms buffer.)"""
    out = _writer(args.out)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(1024)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    flows: dict[socket.socket, dict[str, Any]] = {}
    buffer = bytearray(BULK_READ)

    def finish(sock: socket.socket) -> None:
        selector.unregister(sock)
        sock.close()
        _emit(out, flows.pop(sock))

    while not stop.is_set():
        for key, _ in selector.select(timeout=0.1):
            if key.fileobj is listener:
                try:
                    sock, peer = listener.accept()
                except BlockingIOError:
                    continue  # gone before it was accepted
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
                flows[sock] = {"src": peer[0], "sport": peer[1], "bytes": 0}
                continue
            sock = cast(socket.socket, key.fileobj)
            record = flows[sock]
            try:
                while n := sock.recv_into(buffer):
                    now = time.time_ns()
                    record.setdefault("first_ns", now)
                    record["last_ns"] = now
                    record["bytes"] += n
                finish(sock)  # closed by the client
            except BlockingIOError:
                pass  # all read
            except OSError:
                finish(sock)  # the client resets its flows at their stop (or the flow failed)
        time.sleep(BULK_READ_EVERY_S)
    for sock in list(flows):  # stopped: the flows still open are recorded as they stand
        finish(sock)


async def _send_until_cancelled(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await loop.sock_sendall(sock, CHUNK)


async def bulk_client(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    out = _writer(args.out)
    socks = []
    for _ in range(args.flows):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, args.cca.encode())
        # A reset, not a FIN, at the stop: nothing left in the socket (autotuning lets it
        # hold megabytes) goes out after it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.bind((args.bind, 0))
        sock.setblocking(False)
        socks.append(sock)
    record: dict[str, Any] = {"flows": args.flows, "cca": args.cca, "bind": args.bind}
    try:
        await asyncio.wait_for(
            asyncio.gather(*(loop.sock_connect(s, (args.server, args.port)) for s in socks)),
            BULK_CONNECT_TIMEOUT_S,
        )
    except (OSError, TimeoutError) as exc:
        _emit(out, record | {"error": f"connecting: {exc!r}"})
        return
    _emit(out, record | {"connected_ns": time.time_ns()})
    go = Path(args.go)
    while not go.exists():  # written (renamed into place) once every client is connected
        if stop.is_set():
            return
        await asyncio.sleep(0.01)
    traffic_start_ns = int(go.read_text())
    start_ns = traffic_start_ns + round(args.start * 1e9)
    stop_ns = traffic_start_ns + round(args.stop * 1e9)
    while (wait_s := (start_ns - time.time_ns()) / 1e9) > 0:  # stopped meanwhile: no traffic
        if stop.is_set():
            return
        await asyncio.sleep(min(wait_s, 0.1))
    started = time.time_ns()
    pumps = [asyncio.create_task(_send_until_cancelled(s)) for s in socks]
    while not stop.is_set() and time.time_ns() < stop_ns:
        done, _ = await asyncio.wait(pumps, timeout=min(0.1, (stop_ns - time.time_ns()) / 1e9))
        if done:  # a flow failed (reset by the receiver): the group is broken
            break
    for pump in pumps:
        pump.cancel()
    failed = [
        repr(e)
        for e in await asyncio.gather(*pumps, return_exceptions=True)
        if isinstance(e, Exception)  # not the CancelledError of a cancelled pump
    ]
    stopped = time.time_ns()
    for sock in socks:
        sock.close()
    _emit(
        out,
        record
        | {"start_ns": started, "stop_ns": stopped}
        | ({"error": failed[0]} if failed else {}),
    )


# ---- short flows -------------------------------------------------------------------------
async def _serve_flow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        (size,) = REQUEST.unpack(await reader.readexactly(REQUEST.size))
        while size > 0:
            chunk = CHUNK[: min(size, len(CHUNK))]
            writer.write(chunk)
            size -= len(chunk)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def fct_server(args: argparse.Namespace) -> None:
    server = await asyncio.start_server(_serve_flow, args.bind, args.port, reuse_address=True)
    async with server:
        while not stop.is_set():
            await asyncio.sleep(0.1)


async def _one_flow(args: argparse.Namespace, size: int, out: IO[str]) -> None:
    began = time.time_ns()
    record: dict[str, Any] = {"start_ns": began, "size_bytes": size, "src": args.bind}
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(args.server, args.port, local_addr=(args.bind, 0)), 30
        )
        writer.write(REQUEST.pack(size))
        received = 0
        while True:
            data = await asyncio.wait_for(reader.read(1 << 16), 60)
            if not data:
                break
            received += len(data)
        writer.close()
        record |= {"fct_ns": time.time_ns() - began, "ok": received == size}
    except (OSError, TimeoutError) as exc:
        record |= {"fct_ns": None, "ok": False, "error": str(exc)}
    _emit(out, record)


# Flow-size CDFs (bytes, cumulative probability), sampled with linear interpolation between
# the points. "websearch": the web search workload of DCTCP (Alizadeh et al., SIGCOMM 2010,
# Fig. 4), as pFabric (SIGCOMM 2013) and later work tabulate it (the DCTCP_CDF file of
# github.com/datacenter/empirical-traffic-gen): mean 1.71 MB, half the flows under 80 kB,
# 30% of them 1-30 MB carrying ~95% of the bytes.
SIZE_CDFS: dict[str, tuple[tuple[int, float], ...]] = {
    "websearch": (
        (0, 0.0), (10_000, 0.15), (20_000, 0.2), (30_000, 0.3), (50_000, 0.4),
        (80_000, 0.53), (200_000, 0.6), (1_000_000, 0.7), (2_000_000, 0.8),
        (5_000_000, 0.9), (10_000_000, 0.97), (30_000_000, 1.0),
    ),
}  # fmt: skip
LOG_UNIFORM = "log-uniform"


def size_from_cdf(cdf: tuple[tuple[int, float], ...], u: float) -> int:
    """The size at cumulative probability `u` (inverse CDF, linear between the points), at
    least 1 byte."""
    for (size_a, p_a), (size_b, p_b) in itertools.pairwise(cdf):
        if u <= p_b and p_b > p_a:
            return max(1, round(size_a + (size_b - size_a) * (u - p_a) / (p_b - p_a)))
    return cdf[-1][0]


def short_flow_schedule(
    seed: int,
    rate_per_s: float,
    duration_s: float,
    min_size: int,
    max_size: int,
    sizes: str = LOG_UNIFORM,
    rate_changes: tuple[tuple[float, float], ...] = (),
) -> list[tuple[float, int]]:
    """Every short flow of a run: (start, s after the client starts; size, bytes). Arrivals
    are Poisson at `rate_per_s`, and from each (from_s, rate) of `rate_changes` (in time
    order) at that rate; a gap that would cross a change is drawn again from the change (the
    process is memoryless), and a rate of 0 has no arrivals. One seed gives the same flows;
    without changes they are those the client drew before rate changes existed: a flow at 0,
    then the gaps."""
    rng = random.Random(seed)
    rates = [(0.0, rate_per_s), *rate_changes]

    def segment(t: float) -> tuple[float, float]:
        """The rate in force at t and when it ends."""
        k = max(i for i, (from_s, _) in enumerate(rates) if from_s <= t)
        end = rates[k + 1][0] if k + 1 < len(rates) else duration_s
        return rates[k][1], min(end, duration_s)

    def next_arrival(t: float) -> float | None:
        while t < duration_s:
            rate, end = segment(t)
            if rate > 0:
                candidate = t + rng.expovariate(rate)
                if candidate < end:
                    return candidate
            t = end
        return None

    def size() -> int:
        u = rng.random()
        if sizes == LOG_UNIFORM:
            return round(min_size * math.pow(max_size / min_size, u))
        return size_from_cdf(SIZE_CDFS[sizes], u)

    flows = []
    at = 0.0 if rate_per_s > 0 else next_arrival(0.0)
    while at is not None:
        flows.append((at, size()))
        at = next_arrival(at)
    return flows


def parse_rate_changes(text: str) -> tuple[tuple[float, float], ...]:
    """'40:0,70:2.5' -> ((40.0, 0.0), (70.0, 2.5)): from 40 s no short flows, from 70 s 2.5/s."""
    changes = []
    for item in filter(None, text.split(",")):
        from_s, _, rate = item.partition(":")
        changes.append((float(from_s), float(rate)))
    return tuple(changes)


async def fct_client(args: argparse.Namespace) -> None:
    schedule = short_flow_schedule(
        args.seed,
        args.rate,
        args.duration,
        args.min_size,
        args.max_size,
        args.sizes,
        parse_rate_changes(args.rate_changes),
    )
    out = _writer(args.out)
    flows: set[asyncio.Task[None]] = set()
    began = time.monotonic()
    for at, size in schedule:
        await asyncio.sleep(max(0.0, began + at - time.monotonic()))
        if stop.is_set():
            break
        task = asyncio.create_task(_one_flow(args, size, out))
        flows.add(task)
        task.add_done_callback(flows.discard)
    if flows:
        await asyncio.wait(flows, timeout=60)


# ---- VoIP-like stream --------------------------------------------------------------------
def voip_recv(args: argparse.Namespace) -> None:
    out = _writer(args.out)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.bind, args.port))
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            data = sock.recv(2048)
        except TimeoutError:
            continue
        now = time.time_ns()
        seq, sent = VOIP_HEADER.unpack_from(data)
        _emit(out, {"seq": seq, "send_ns": sent, "recv_ns": now})


def voip_send(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.bind, 0))
    padding = b"\0" * max(0, args.size - VOIP_HEADER.size)
    interval = 1.0 / args.pps
    began = time.monotonic()
    start_ns = time.time_ns()
    seq = 0
    while not stop.is_set() and seq < args.duration * args.pps:
        due = began + seq * interval  # absolute schedule: no drift from send times
        time.sleep(max(0.0, due - time.monotonic()))
        sock.sendto(VOIP_HEADER.pack(seq, time.time_ns()) + padding, (args.dst, args.port))
        seq += 1
    with _writer(args.out) as out:
        _emit(out, {"sent": seq, "pps": args.pps, "size_bytes": args.size, "start_ns": start_ns})


# ---- ground truth ------------------------------------------------------------------------
def qdisc_log(args: argparse.Namespace) -> None:
    """The FIFO behind the bottleneck: limit, backlog, drops, bytes sent, every 1/hz s."""
    ifindex = socket.if_nametoindex(args.dev)
    out = _writer(args.out)
    period = 1.0 / args.hz
    with Rtnetlink() as nl:
        next_at = time.monotonic()
        while not stop.is_set():
            ts = time.time_ns()
            for q in nl.qdiscs(ifindex):
                if q.kind == "bfifo":
                    _emit(
                        out,
                        {
                            "ts_ns": ts,
                            "handle": q.handle,
                            "limit_bytes": q.limit,
                            "backlog_bytes": q.backlog,
                            "qlen": q.qlen,
                            "drops": q.drops,
                            "sent_bytes": q.bytes,
                            "sent_packets": q.packets,
                        },
                    )
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))


_SS_FIELDS = {
    "cwnd": re.compile(r"\bcwnd:(\d+)"),
    "retrans": re.compile(r"\bretrans:\d+/(\d+)"),
    "bytes_acked": re.compile(r"\bbytes_acked:(\d+)"),
}
_SS_RTT = re.compile(r"\brtt:([0-9.]+)/([0-9.]+)")
_SS_MINRTT = re.compile(r"\bminrtt:([0-9.]+)")
_SS_ENDPOINTS = re.compile(r"(\S+):(\d+)\s+(\S+):(\d+)\s+(.*)$")
_SS_CCA = re.compile(r"^\s*(cubic|bbr|reno)\b")


def parse_ss(text: str, ts_ns: int) -> list[dict[str, Any]]:
    """`ss -tinHO` lines (one per connection) -> records; times in ns."""
    records = []
    for line in text.splitlines():
        m = _SS_ENDPOINTS.search(line)
        if m is None:
            continue
        info = m.group(5)
        cca = _SS_CCA.search(info)
        record: dict[str, Any] = {
            "ts_ns": ts_ns,
            "src": m.group(1),
            "sport": int(m.group(2)),
            "dst": m.group(3),
            "dport": int(m.group(4)),
            "cca": cca.group(1) if cca else None,
        }
        if rtt := _SS_RTT.search(info):
            record["rtt_ns"] = round(float(rtt.group(1)) * 1e6)
            record["rttvar_ns"] = round(float(rtt.group(2)) * 1e6)
        if minrtt := _SS_MINRTT.search(info):
            record["minrtt_ns"] = round(float(minrtt.group(1)) * 1e6)
        for name, pattern in _SS_FIELDS.items():
            found = pattern.search(info)
            record[name] = int(found.group(1)) if found else 0
        records.append(record)
    return records


_PING_LINE = re.compile(r"^\[(\d+\.\d+)\].*icmp_seq=(\d+).*time=([0-9.]+) ms")


def ping_log(args: argparse.Namespace) -> None:
    """A ping probe: the RTT a packet sees through the router's queue, free of TCP's own
    delays (delayed ACKs); its first samples, before any traffic, are the idle RTT."""
    out = _writer(args.out)
    ping = subprocess.Popen(
        ["ping", "-D", "-n", "-i", str(1.0 / args.hz), "-W", "2", args.dst],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert ping.stdout is not None

    def stop_ping() -> None:
        stop.wait()
        ping.terminate()

    threading.Thread(target=stop_ping, daemon=True).start()
    for line in ping.stdout:
        if m := _PING_LINE.match(line):
            _emit(
                out,
                {
                    "ts_ns": round(float(m.group(1)) * 1e9),
                    "seq": int(m.group(2)),
                    "rtt_ns": round(float(m.group(3)) * 1e6),
                },
            )
    ping.wait()


def ss_log(args: argparse.Namespace) -> None:
    """Per-flow RTT, cwnd and retransmissions seen by the senders' TCP stacks."""
    out = _writer(args.out)
    period = 1.0 / args.hz
    next_at = time.monotonic()
    while not stop.is_set():
        ts = time.time_ns()
        text = subprocess.run(
            ["ss", "-tinHO", "state", "established", "dst", args.dst],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for record in parse_ss(text, ts):
            _emit(out, record)
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))


def _receiver(sub: Any, name: str) -> argparse.ArgumentParser:
    """A program that listens: on `--port` of `--bind` (every address by default)."""
    p: argparse.ArgumentParser = sub.add_parser(name)
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="p4bs_infra.trafficgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _receiver(sub, "fct-server")
    p = sub.add_parser("fct-client")
    p.add_argument("--server", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", required=True)
    p.add_argument("--rate", type=float, required=True, help="flows per second (Poisson)")
    p.add_argument("--min-size", type=int, required=True)
    p.add_argument("--max-size", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sizes", choices=(LOG_UNIFORM, *SIZE_CDFS), default=LOG_UNIFORM)
    p.add_argument(
        "--rate-changes",
        default="",
        help="FROM_S:FLOWS_PER_S,...: the arrival rate from those times on (0 pauses them)",
    )
    _receiver(sub, "bulk-server").add_argument("--out", required=True)
    p = sub.add_parser("bulk-client")
    p.add_argument("--server", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", required=True)
    p.add_argument("--flows", type=int, required=True)
    p.add_argument("--cca", required=True, help="the flows' congestion control (cubic, bbr...)")
    p.add_argument("--go", required=True, help="where the traffic's start (realtime ns) appears")
    p.add_argument("--start", type=float, required=True, help="s after it: start sending")
    p.add_argument("--stop", type=float, required=True, help="s after it: reset the flows")
    p.add_argument("--out", required=True)
    _receiver(sub, "voip-recv").add_argument("--out", required=True)
    p = sub.add_parser("voip-send")
    p.add_argument("--dst", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", required=True)
    p.add_argument("--pps", type=float, default=50.0)
    p.add_argument("--size", type=int, default=172, help="bytes of UDP payload (G.711: 160+12)")
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("qdisc-log")
    p.add_argument("--dev", required=True)
    p.add_argument("--hz", type=float, default=50.0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("ss-log")
    p.add_argument("--dst", required=True)
    p.add_argument("--hz", type=float, default=5.0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("ping-log")
    p.add_argument("--dst", required=True)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    programs = {
        "bulk-server": bulk_server,
        "bulk-client": bulk_client,
        "fct-server": fct_server,
        "fct-client": fct_client,
        "voip-recv": voip_recv,
        "voip-send": voip_send,
        "qdisc-log": qdisc_log,
        "ss-log": ss_log,
        "ping-log": ping_log,
    }
    program = programs[args.command]
    if asyncio.iscoroutinefunction(program):
        asyncio.run(program(args))
    else:
        program(args)


if __name__ == "__main__":
    main()
