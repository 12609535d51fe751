"""Just enough rtnetlink to read qdisc statistics and change a FIFO's byte limit.

Runs in the caller's network namespace (the router agent and the recorder are started inside
the router's). A `change` keeps the queue and its flows: the kernel calls the FIFO's change
operation on the existing qdisc instead of replacing it (~0.1 ms versus ~6 ms for `tc`).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

RTM_NEWQDISC = 36
RTM_GETQDISC = 38
RTM_GETTCLASS = 42
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
TCA_KIND = 1
TCA_OPTIONS = 2
TCA_STATS2 = 7
TCA_STATS_BASIC = 1
TCA_STATS_QUEUE = 3
TCA_HTB_PARMS = 1
TCA_HTB_RATE64 = 6

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_RTA = struct.Struct("=HH")  # len, type


class NetlinkError(OSError):
    pass


@dataclass(frozen=True)
class QdiscStats:
    ifindex: int
    kind: str
    handle: int
    parent: int
    limit: int | None  # bytes for bfifo, packets for pfifo; None for other kinds
    bytes: int
    packets: int
    qlen: int
    backlog: int  # bytes queued now
    drops: int
    overlimits: int


@dataclass(frozen=True)
class HtbClass:
    ifindex: int
    handle: int
    parent: int
    rate_bps: int  # the class's guaranteed rate


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    return (
        _RTA.pack(_RTA.size + len(payload), kind)
        + payload
        + b"\0" * (_align(len(payload)) - len(payload))
    )


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + _RTA.size <= len(data):
        length, kind = _RTA.unpack_from(data, offset)
        if length < _RTA.size:
            break
        yield kind & 0x3FFF, data[offset + _RTA.size : offset + length]
        offset += _align(length)


def handle(text: str) -> int:
    """'1:10' -> 0x00010010, as tc writes handles (hexadecimal major:minor)."""
    major, _, minor = text.partition(":")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


class Rtnetlink:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Rtnetlink:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(self, msg_type: int, flags: int, body: bytes) -> Iterator[tuple[int, bytes]]:
        self._seq += 1
        seq = self._seq
        header = _NLMSG.pack(_NLMSG.size + len(body), msg_type, flags, seq, 0)
        self._sock.send(header + body)
        while True:
            data = self._sock.recv(1 << 20)
            offset = 0
            while offset < len(data):
                length, kind, _, reply_seq, _ = _NLMSG.unpack_from(data, offset)
                payload = data[offset + _NLMSG.size : offset + length]
                offset += _align(length)
                if reply_seq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise NetlinkError(-code, os.strerror(-code))
                    return
                yield kind, payload

    def change_fifo_limit(
        self, ifindex: int, qdisc: int, parent: int, limit: int, kind: str = "bfifo"
    ) -> None:
        """Sets an existing FIFO's limit in place (bytes for bfifo)."""
        body = _TCMSG.pack(socket.AF_UNSPEC, ifindex, qdisc, parent, 0)
        body += _attr(TCA_KIND, kind.encode() + b"\0")
        body += _attr(TCA_OPTIONS, struct.pack("=I", limit))
        for _ in self._request(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK, body):
            pass

    def qdiscs(self, ifindex: int = 0) -> list[QdiscStats]:
        body = _TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, 0, 0)
        out = []
        for _, payload in self._request(RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, body):
            _, index, qhandle, parent, _ = _TCMSG.unpack_from(payload)
            if ifindex and index != ifindex:
                continue
            kind, options, basic, queue = "", b"", (0, 0), (0, 0, 0, 0, 0)
            for attr, value in _attrs(payload[_TCMSG.size :]):
                if attr == TCA_KIND:
                    kind = value.rstrip(b"\0").decode()
                elif attr == TCA_OPTIONS:
                    options = value
                elif attr == TCA_STATS2:
                    for sub, stat in _attrs(value):
                        if sub == TCA_STATS_BASIC:
                            basic = struct.unpack_from("=QI", stat)
                        elif sub == TCA_STATS_QUEUE:
                            queue = struct.unpack_from("=IIIII", stat)
            limit = struct.unpack_from("=I", options)[0] if kind in ("bfifo", "pfifo") else None
            qlen, backlog, drops, _requeues, overlimits = queue
            out.append(
                QdiscStats(
                    index,
                    kind,
                    qhandle,
                    parent,
                    limit,
                    basic[0],
                    basic[1],
                    qlen,
                    backlog,
                    drops,
                    overlimits,
                )
            )
        return out

    def htb_classes(self, ifindex: int) -> list[HtbClass]:
        body = _TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, 0, 0)
        out = []
        for _, payload in self._request(RTM_GETTCLASS, NLM_F_REQUEST | NLM_F_DUMP, body):
            _, index, chandle, parent, _ = _TCMSG.unpack_from(payload)
            kind, rate = "", 0
            for attr, value in _attrs(payload[_TCMSG.size :]):
                if attr == TCA_KIND:
                    kind = value.rstrip(b"\0").decode()
                elif attr == TCA_OPTIONS:
                    for sub, option in _attrs(value):
                        if sub == TCA_HTB_PARMS and not rate:
                            # struct tc_htb_opt starts with tc_ratespec rate: bytes/s at +8.
                            rate = struct.unpack_from("=I", option, 8)[0]
                        elif sub == TCA_HTB_RATE64:
                            rate = struct.unpack_from("=Q", option)[0]
            if kind == "htb" and index == ifindex:
                out.append(HtbClass(index, chandle, parent, rate * 8))
        return out
