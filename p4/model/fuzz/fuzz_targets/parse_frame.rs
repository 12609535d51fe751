//! `parse` on arbitrary bytes as one Ethernet frame. Beyond "never panics", it checks the
//! result against a second reading of SPEC §2 written with frame offsets, and the properties
//! the pipeline relies on: the payload is the IPv4 length less both headers, which lie inside
//! the frame, and never more than the frame holds unless the capture was cut short; Ethernet
//! padding changes nothing; the reverse key is the flow key of the other way.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p4bs_model::parse::{parse, ParseCounters, Skip, Tcp};

const ETHERNET: usize = 14;
const MIN_IPV4: usize = 20;
const MIN_TCP: usize = 20;

/// Where the headers of a parsed frame lie.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Offset of the IPv4 header in the frame.
    ip: usize,
    ihl: usize,
    data_offset: usize,
    /// The IPv4 packet goes on past the captured bytes (a capture's snap length).
    cut: bool,
}

fuzz_target!(|frame: &[u8]| {
    let result = parse(frame);
    let expected = reference(frame);
    assert_eq!(result, expected.map(|(tcp, _)| tcp), "frame {frame:02x?}");

    let mut counters = ParseCounters::default();
    counters.count(&result);
    let skipped: u64 = Skip::ALL.iter().map(|s| counters.skipped(*s)).sum();
    assert_eq!((counters.packets, counters.tcp_packets + skipped), (1, 1));

    if let (Ok(tcp), Ok((_, layout))) = (result, expected) {
        check_packet(frame, &tcp, layout);
    }
});

fn be16(f: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(f.get(at..at + 2)?.try_into().ok()?))
}

fn be32(f: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(f.get(at..at + 4)?.try_into().ok()?))
}

/// SPEC §2, step by step, with absolute offsets into the frame; on success also where the
/// headers lie. Where SPEC's table leaves a choice it follows `parse`: an IPv4 EtherType with
/// no byte after it is `truncated` (not `bad_ipv4`).
fn reference(f: &[u8]) -> Result<(Tcp, Layout), Skip> {
    if f.len() < ETHERNET {
        return Err(Skip::Truncated);
    }
    let mut type_at = 12;
    let mut tags = 0;
    let ethertype = loop {
        let ethertype = be16(f, type_at).ok_or(Skip::Truncated)?;
        if ethertype != 0x8100 && ethertype != 0x88a8 {
            break ethertype;
        }
        if tags == 2 {
            return Err(Skip::VlanTooDeep);
        }
        tags += 1;
        type_at += 4;
    };
    match ethertype {
        0x0800 => {}
        0x86dd => return Err(Skip::Ipv6),
        _ => return Err(Skip::OtherL3),
    }

    let ip = type_at + 2;
    let first = *f.get(ip).ok_or(Skip::Truncated)?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < MIN_IPV4 || ip + ihl > f.len() {
        return Err(Skip::BadIpv4);
    }
    let total = usize::from(be16(f, ip + 2).unwrap());
    if total < ihl {
        return Err(Skip::BadIpv4);
    }
    let more_fragments = f[ip + 6] & 0x20 != 0;
    let offset = be16(f, ip + 6).unwrap() & 0x1fff;
    if more_fragments || offset != 0 {
        return Err(Skip::Fragment);
    }
    if f[ip + 9] != 6 {
        return Err(Skip::NonTcp);
    }

    // The TCP header must lie inside both the IPv4 packet and the captured bytes.
    let tcp = ip + ihl;
    let tcp_bytes = total - ihl;
    if tcp_bytes < 13 || tcp + 13 > f.len() {
        return Err(Skip::BadTcp);
    }
    let data_offset = usize::from(f[tcp + 12] >> 4) * 4;
    if data_offset < MIN_TCP || data_offset > tcp_bytes || tcp + data_offset > f.len() {
        return Err(Skip::BadTcp);
    }
    let packet = Tcp {
        src: be32(f, ip + 12).unwrap(),
        dst: be32(f, ip + 16).unwrap(),
        sport: be16(f, tcp).unwrap(),
        dport: be16(f, tcp + 2).unwrap(),
        seq: be32(f, tcp + 4).unwrap(),
        ack: be32(f, tcp + 8).unwrap(),
        flags: f[tcp + 13],
        payload: (tcp_bytes - data_offset) as u32,
        ip_id: be16(f, ip + 4).unwrap(),
        ip_len: total as u16,
    };
    let layout = Layout {
        ip,
        ihl,
        data_offset,
        cut: ip + total > f.len(),
    };
    Ok((packet, layout))
}

/// Properties of a parsed packet whose headers lie as `layout` says.
fn check_packet(frame: &[u8], tcp: &Tcp, layout: Layout) {
    let Layout {
        ip,
        ihl,
        data_offset,
        cut,
    } = layout;
    let ip_len = usize::from(tcp.ip_len);
    let payload = tcp.payload as usize;
    // The payload is the IPv4 length less both headers, which were captured; it never
    // exceeds what the frame holds after them, unless the capture cut the packet short.
    assert!(ip >= ETHERNET && ihl >= MIN_IPV4 && data_offset >= MIN_TCP);
    assert!(ip + ihl + data_offset <= frame.len());
    assert_eq!(payload + ihl + data_offset, ip_len);
    assert_eq!(cut, ip + ip_len > frame.len());
    if !cut {
        assert!(payload <= frame.len() - (ip + ihl + data_offset));
        // Cutting off the Ethernet padding (or any trailer) changes nothing.
        assert_eq!(parse(&frame[..ip + ip_len]), Ok(*tcp));
    }

    // Nor does adding some.
    let mut padded = frame.to_vec();
    padded.extend_from_slice(&[0xa5; 46]);
    assert_eq!(parse(&padded), Ok(*tcp));

    // The flow key is the 5-tuple big-endian; the reverse key is the same with both ends
    // swapped, so it is the flow key of a packet going the other way, and back again.
    let key = tcp.flow_key();
    let reverse = tcp.reverse_key();
    assert_eq!(&key[0..4], &tcp.src.to_be_bytes());
    assert_eq!(&key[4..8], &tcp.dst.to_be_bytes());
    assert_eq!(&key[8..10], &tcp.sport.to_be_bytes());
    assert_eq!(&key[10..12], &tcp.dport.to_be_bytes());
    assert_eq!((key[12], reverse[12]), (6, 6));
    assert_eq!((&reverse[0..4], &reverse[4..8]), (&key[4..8], &key[0..4]));
    assert_eq!(
        (&reverse[8..10], &reverse[10..12]),
        (&key[10..12], &key[8..10])
    );
    let back = Tcp {
        src: tcp.dst,
        dst: tcp.src,
        sport: tcp.dport,
        dport: tcp.sport,
        ..*tcp
    };
    assert_eq!((back.flow_key(), back.reverse_key()), (reverse, key));
    let symmetric = tcp.src == tcp.dst && tcp.sport == tcp.dport;
    assert_eq!(key == reverse, symmetric);
}
