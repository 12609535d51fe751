//! Packet parsing (SPEC §2): Ethernet, up to two VLAN tags, IPv4 with options, TCP with
//! options. Anything else is a `Skip` with the reason, counted by `ParseCounters`.

/// The fields of a TCP/IPv4 packet the pipeline uses. Addresses and ports as on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tcp {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// TCP payload bytes: IPv4 total length minus both headers (never the frame length, which
    /// may be padded or cut at a capture's snap length).
    pub payload: u32,
    pub ip_id: u16,
    /// IPv4 total length, bytes.
    pub ip_len: u16,
}

/// A flow key (SPEC §2): src, dst, sport, dport, protocol, big-endian: the bytes hashed.
pub type FlowKey = [u8; 13];

impl Tcp {
    /// The key of this packet's own direction.
    pub fn flow_key(&self) -> FlowKey {
        key(self.src, self.dst, self.sport, self.dport)
    }

    /// The key of the opposite direction: what an ACK is matched against.
    pub fn reverse_key(&self) -> FlowKey {
        key(self.dst, self.src, self.dport, self.sport)
    }
}

fn key(src: u32, dst: u32, sport: u16, dport: u16) -> FlowKey {
    let mut k = [0u8; 13];
    k[0..4].copy_from_slice(&src.to_be_bytes());
    k[4..8].copy_from_slice(&dst.to_be_bytes());
    k[8..10].copy_from_slice(&sport.to_be_bytes());
    k[10..12].copy_from_slice(&dport.to_be_bytes());
    k[12] = 6;
    k
}

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// Why a frame was passed over; each has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    Truncated,
    VlanTooDeep,
    Ipv6,
    OtherL3,
    BadIpv4,
    Fragment,
    NonTcp,
    BadTcp,
}

impl Skip {
    pub const ALL: [Skip; 8] = [
        Skip::Truncated,
        Skip::VlanTooDeep,
        Skip::Ipv6,
        Skip::OtherL3,
        Skip::BadIpv4,
        Skip::Fragment,
        Skip::NonTcp,
        Skip::BadTcp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Skip::Truncated => "truncated",
            Skip::VlanTooDeep => "vlan_too_deep",
            Skip::Ipv6 => "ipv6",
            Skip::OtherL3 => "other_l3",
            Skip::BadIpv4 => "bad_ipv4",
            Skip::Fragment => "fragment",
            Skip::NonTcp => "non_tcp",
            Skip::BadTcp => "bad_tcp",
        }
    }
}

const MAX_VLAN_TAGS: usize = 2;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses one Ethernet frame.
pub fn parse(frame: &[u8]) -> Result<Tcp, Skip> {
    let mut at = 12;
    let mut ethertype = u16_at(frame, at).ok_or(Skip::Truncated)?;
    let mut tags = 0;
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        tags += 1;
        if tags > MAX_VLAN_TAGS {
            return Err(Skip::VlanTooDeep);
        }
        at += 4;
        ethertype = u16_at(frame, at).ok_or(Skip::Truncated)?;
    }
    match ethertype {
        0x0800 => {}
        0x86dd => return Err(Skip::Ipv6),
        _ => return Err(Skip::OtherL3),
    }
    let ip = &frame[at + 2..];
    let first = *ip.first().ok_or(Skip::Truncated)?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < 20 || ip.len() < ihl {
        return Err(Skip::BadIpv4);
    }
    let total = u16_at(ip, 2).ok_or(Skip::BadIpv4)?;
    if usize::from(total) < ihl {
        return Err(Skip::BadIpv4);
    }
    let fragment = u16_at(ip, 6).ok_or(Skip::BadIpv4)?;
    if fragment & 0x3fff != 0 {
        return Err(Skip::Fragment); // more-fragments flag or a non-zero offset
    }
    if ip[9] != 6 {
        return Err(Skip::NonTcp);
    }
    // The TCP header must lie inside both the IP packet and the captured bytes; the payload
    // need not have been captured (a capture cut at a snap length is normal for monitoring).
    let tcp = ip.get(ihl..).ok_or(Skip::BadTcp)?;
    let offset = usize::from(*tcp.get(12).ok_or(Skip::BadTcp)? >> 4) * 4;
    if offset < 20 || tcp.len() < offset || usize::from(total) < ihl + offset {
        return Err(Skip::BadTcp);
    }
    Ok(Tcp {
        src: u32_at(ip, 12).ok_or(Skip::BadIpv4)?,
        dst: u32_at(ip, 16).ok_or(Skip::BadIpv4)?,
        sport: u16_at(tcp, 0).ok_or(Skip::BadTcp)?,
        dport: u16_at(tcp, 2).ok_or(Skip::BadTcp)?,
        seq: u32_at(tcp, 4).ok_or(Skip::BadTcp)?,
        ack: u32_at(tcp, 8).ok_or(Skip::BadTcp)?,
        flags: tcp[13],
        payload: (usize::from(total) - ihl - offset) as u32,
        ip_id: u16_at(ip, 4).ok_or(Skip::BadIpv4)?,
        ip_len: total,
    })
}

/// SPEC §2's counters: every frame, the TCP ones, and each reason for passing one over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParseCounters {
    pub packets: u64,
    pub tcp_packets: u64,
    pub skipped: [u64; Skip::ALL.len()],
}

impl ParseCounters {
    pub fn count(&mut self, result: &Result<Tcp, Skip>) {
        self.packets += 1;
        match result {
            Ok(_) => self.tcp_packets += 1,
            Err(skip) => self.skipped[*skip as usize] += 1,
        }
    }

    pub fn skipped(&self, skip: Skip) -> u64 {
        self.skipped[skip as usize]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An Ethernet/IPv4/TCP frame; `ip_options` and `tcp_options` are padded to 4 bytes.
    pub fn frame(payload: usize, ip_options: usize, tcp_options: usize, vlans: usize) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        for _ in 0..vlans {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let ihl = 20 + ip_options;
        let doff = 20 + tcp_options;
        let total = (ihl + doff + payload) as u16;
        let mut ip = vec![0u8; ihl];
        ip[0] = 0x40 | (ihl / 4) as u8;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6] = 0x40; // don't fragment
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 201, 1, 10]);
        ip[16..20].copy_from_slice(&[10, 201, 2, 2]);
        let mut tcp = vec![0u8; doff];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&5201u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&7u32.to_be_bytes());
        tcp[12] = ((doff / 4) as u8) << 4;
        tcp[13] = ACK;
        f.extend_from_slice(&ip);
        f.extend_from_slice(&tcp);
        f.extend(std::iter::repeat_n(0xab, payload));
        f
    }

    fn ip_start(f: &[u8]) -> usize {
        let mut at = 12;
        while f[at] == 0x81 {
            at += 4;
        }
        at + 2
    }

    #[test]
    fn parses_tcp_with_options_and_vlans() {
        for vlans in 0..=2 {
            let p = parse(&frame(1448, 8, 12, vlans)).unwrap();
            assert_eq!((p.sport, p.dport, p.seq, p.ack), (40000, 5201, 1000, 7));
            assert_eq!(p.payload, 1448);
            assert_eq!(p.src, u32::from_be_bytes([10, 201, 1, 10]));
            assert_eq!(p.ip_id, 0x1234);
            assert_eq!(p.flags, ACK);
        }
    }

    #[test]
    fn payload_comes_from_the_ip_length_not_the_padded_or_cut_frame() {
        let mut f = frame(0, 0, 0, 0);
        f.extend_from_slice(&[0u8; 6]); // Ethernet minimum-size padding
        assert_eq!(parse(&f).unwrap().payload, 0);
        let mut snapped = frame(1448, 0, 12, 0);
        snapped.truncate(14 + 20 + 32); // a capture keeping only the headers
        assert_eq!(parse(&snapped).unwrap().payload, 1448);
    }

    #[test]
    fn each_malformed_kind_is_its_own_skip() {
        assert_eq!(parse(&[0u8; 10]), Err(Skip::Truncated));
        assert_eq!(parse(&frame(0, 0, 0, 3)), Err(Skip::VlanTooDeep));
        let mut v6 = frame(0, 0, 0, 0);
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(parse(&v6), Err(Skip::Ipv6));
        let mut arp = frame(0, 0, 0, 0);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse(&arp), Err(Skip::OtherL3));

        let good = frame(100, 0, 0, 0);
        let ip = ip_start(&good);
        let mut bad_ihl = good.clone();
        bad_ihl[ip] = 0x44;
        assert_eq!(parse(&bad_ihl), Err(Skip::BadIpv4));
        let mut ihl_past_frame = good.clone();
        ihl_past_frame.truncate(ip + 30);
        ihl_past_frame[ip] = 0x4f;
        assert_eq!(parse(&ihl_past_frame), Err(Skip::BadIpv4));
        let mut fragment = good.clone();
        fragment[ip + 6] = 0x20; // more fragments
        assert_eq!(parse(&fragment), Err(Skip::Fragment));
        let mut later_fragment = good.clone();
        later_fragment[ip + 7] = 0x10; // offset 16
        assert_eq!(parse(&later_fragment), Err(Skip::Fragment));
        let mut udp = good.clone();
        udp[ip + 9] = 17;
        assert_eq!(parse(&udp), Err(Skip::NonTcp));
        let mut small_offset = good.clone();
        small_offset[ip + 20 + 12] = 0x40;
        assert_eq!(parse(&small_offset), Err(Skip::BadTcp));
        let mut offset_past_packet = good.clone();
        offset_past_packet[ip + 2..ip + 4].copy_from_slice(&40u16.to_be_bytes());
        offset_past_packet[ip + 20 + 12] = 0xf0;
        assert_eq!(parse(&offset_past_packet), Err(Skip::BadTcp));
        let mut cut = good.clone();
        cut.truncate(ip + 30); // capture ended inside the TCP header
        assert_eq!(parse(&cut), Err(Skip::BadTcp));
    }

    #[test]
    fn an_ack_carries_the_reverse_key_of_its_data() {
        let data = parse(&frame(100, 0, 0, 0)).unwrap();
        let mut ack = data;
        (ack.src, ack.dst, ack.sport, ack.dport) = (data.dst, data.src, data.dport, data.sport);
        assert_eq!(ack.reverse_key(), data.flow_key());
        assert_eq!(&data.flow_key()[8..10], &40000u16.to_be_bytes());
    }

    #[test]
    fn counters_add_up() {
        let mut counters = ParseCounters::default();
        for f in [frame(10, 0, 0, 0), vec![0u8; 3], frame(0, 0, 0, 3)] {
            counters.count(&parse(&f));
        }
        assert_eq!(counters.packets, 3);
        assert_eq!(counters.tcp_packets, 1);
        assert_eq!(counters.skipped(Skip::Truncated), 1);
        assert_eq!(counters.skipped(Skip::VlanTooDeep), 1);
        assert_eq!(
            Skip::ALL.iter().map(|s| counters.skipped(*s)).sum::<u64>(),
            2
        );
    }

    #[test]
    fn never_panics_on_any_prefix_or_byte_flip() {
        let good = frame(64, 4, 12, 1);
        for len in 0..good.len() {
            let _ = parse(&good[..len]);
        }
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut f = good.clone();
                f[i] ^= 1 << bit;
                let _ = parse(&f);
            }
        }
    }
}
