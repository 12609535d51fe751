//! Which delay each packet gets: a base plus a per-flow extra, or a fixed delay for flows of
//! an address group. Both directions of a flow get the same extra, so a flow's whole round
//! trip sees one delay, split over the two directions.
//!
//! The extra comes from hashing the flow's 5-tuple, or, with a seed, from a sequence the seed
//! fixes, drawn in the order flows first appear on the wire: the k-th flow of a run gets the
//! seed's k-th extra whatever its (ephemeral) ports, so runs of the same traffic schedule
//! under the same seed give each flow the same RTT (paired repeats in the evaluation).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// Flows remembered for seeded extras; past this, a flow's extra comes from its hash.
const MAX_SEEDED_FLOWS: usize = 1 << 16;

#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub network: u32,
    pub prefix_len: u32,
    pub delay_ns: u64,
}

impl Group {
    /// Parses `10.1.0.0/16=30000000` (CIDR = added round-trip delay in ns).
    pub fn parse(text: &str) -> Result<Group, String> {
        let (cidr, delay) = text
            .split_once('=')
            .ok_or_else(|| format!("group {text:?}: expected CIDR=DELAY_NS"))?;
        let (addr, len) = cidr.split_once('/').unwrap_or((cidr, "32"));
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("group {text:?}: bad IPv4 address {addr:?}"))?;
        let prefix_len: u32 = len
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("group {text:?}: prefix length must be 0..32"))?;
        let delay_ns = delay
            .parse()
            .map_err(|_| format!("group {text:?}: delay must be integer ns"))?;
        Ok(Group {
            network: u32::from(addr) & mask(prefix_len),
            prefix_len,
            delay_ns,
        })
    }

    fn contains(&self, ip: u32) -> bool {
        ip & mask(self.prefix_len) == self.network
    }
}

fn mask(prefix_len: u32) -> u32 {
    if prefix_len == 0 {
        0
    } else {
        u32::MAX << (32 - prefix_len)
    }
}

/// The addresses and ports of an IPv4 packet, read from its Ethernet frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flow {
    pub src: u32,
    pub dst: u32,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// Reads the flow of an Ethernet frame (802.1Q/QinQ tags skipped); None if not IPv4.
pub fn flow_of(frame: &[u8]) -> Option<Flow> {
    let mut offset = 12;
    let mut ethertype = u16::from_be_bytes([*frame.get(offset)?, *frame.get(offset + 1)?]);
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        offset += 4;
        ethertype = u16::from_be_bytes([*frame.get(offset)?, *frame.get(offset + 1)?]);
    }
    if ethertype != 0x0800 {
        return None;
    }
    let ip = frame.get(offset + 2..)?;
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    if ihl < 20 || ip.len() < ihl {
        return None;
    }
    let proto = ip[9];
    let src = u32::from_be_bytes(ip[12..16].try_into().ok()?);
    let dst = u32::from_be_bytes(ip[16..20].try_into().ok()?);
    let fragment_offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
    let (sport, dport) = match (proto, ip.get(ihl..ihl + 4)) {
        (6 | 17, Some(ports)) if fragment_offset == 0 => (
            u16::from_be_bytes([ports[0], ports[1]]),
            u16::from_be_bytes([ports[2], ports[3]]),
        ),
        _ => (0, 0),
    };
    Some(Flow {
        src,
        dst,
        proto,
        sport,
        dport,
    })
}

pub struct DelayPolicy {
    pub base_ns: u64,
    pub extra_max_ns: u64,
    pub groups: Vec<Group>,
    pub seed: Option<u64>,
    /// With a seed: each flow seen (both directions alike) -> its extra, by arrival order.
    seeded: Mutex<HashMap<(u64, u64, u8), u64>>,
}

impl DelayPolicy {
    pub fn new(base_ns: u64, extra_max_ns: u64, groups: Vec<Group>, seed: Option<u64>) -> Self {
        DelayPolicy {
            base_ns,
            extra_max_ns,
            groups,
            seed,
            seeded: Mutex::new(HashMap::new()),
        }
    }

    /// The round-trip delay this wire adds to a flow (None: a non-IPv4 frame, base only).
    pub fn round_trip_ns(&self, flow: Option<Flow>) -> u64 {
        let Some(f) = flow else { return self.base_ns };
        if let Some(g) = self
            .groups
            .iter()
            .find(|g| g.contains(f.src) || g.contains(f.dst))
        {
            return g.delay_ns;
        }
        if self.extra_max_ns == 0 {
            return self.base_ns;
        }
        self.base_ns + self.extra_draw(f) % (self.extra_max_ns + 1)
    }

    fn extra_draw(&self, f: Flow) -> u64 {
        let key = symmetric_key(f);
        let Some(seed) = self.seed else {
            return mix(key.0 ^ key.1.rotate_left(29) ^ (u64::from(key.2) << 56));
        };
        let mut seen = self.seeded.lock().unwrap();
        let index = seen.len() as u64;
        if let Some(draw) = seen.get(&key) {
            return *draw;
        }
        if seen.len() >= MAX_SEEDED_FLOWS {
            return mix(key.0 ^ key.1.rotate_left(29) ^ seed);
        }
        // The seed's splitmix64 stream: its index-th value.
        let draw = mix(mix(seed).wrapping_add(index.wrapping_mul(0x9e3779b97f4a7c15)));
        seen.insert(key, draw);
        draw
    }
}

/// A flow's addresses and ports in an order both directions share, and its protocol.
fn symmetric_key(f: Flow) -> (u64, u64, u8) {
    let a = (u64::from(f.src) << 16) | u64::from(f.sport);
    let b = (u64::from(f.dst) << 16) | u64::from(f.dport);
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    (lo, hi, f.proto)
}

/// splitmix64's finaliser: spreads neighbouring inputs over the whole range.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = 6;
        f[14 + 12..14 + 16].copy_from_slice(&src);
        f[14 + 16..14 + 20].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn both_directions_of_a_flow_get_the_same_delay() {
        let p = DelayPolicy::new(20_000_000, 15_000_000, vec![], None);
        let fwd = flow_of(&tcp_frame([10, 0, 0, 1], [10, 0, 1, 1], 40000, 5201));
        let rev = flow_of(&tcp_frame([10, 0, 1, 1], [10, 0, 0, 1], 5201, 40000));
        assert_eq!(p.round_trip_ns(fwd), p.round_trip_ns(rev));
    }

    #[test]
    fn extra_delay_spreads_over_the_range() {
        let p = DelayPolicy::new(20_000_000, 15_000_000, vec![], None);
        let delays: Vec<u64> = (0..1000)
            .map(|port| {
                p.round_trip_ns(flow_of(&tcp_frame(
                    [10, 0, 0, 1],
                    [10, 0, 1, 1],
                    40000 + port,
                    5201,
                )))
            })
            .collect();
        assert!(delays.iter().all(|d| (20_000_000..=35_000_000).contains(d)));
        let low = delays.iter().filter(|d| **d < 27_500_000).count();
        assert!((400..600).contains(&low), "{low} of 1000 below the middle");
    }

    #[test]
    fn groups_fix_the_delay_of_their_addresses() {
        let p = DelayPolicy::new(
            20_000_000,
            15_000_000,
            vec![Group::parse("10.0.3.0/24=70000000").unwrap()],
            None,
        );
        let f = flow_of(&tcp_frame([10, 0, 3, 7], [10, 0, 1, 1], 1, 2));
        assert_eq!(p.round_trip_ns(f), 70_000_000);
        assert_eq!(p.round_trip_ns(None), 20_000_000);
    }

    /// The delays a seeded wire gives flows arriving with the given source ports, in order.
    fn seeded_delays(seed: u64, ports: &[u16]) -> Vec<u64> {
        let p = DelayPolicy::new(20_000_000, 15_000_000, vec![], Some(seed));
        ports
            .iter()
            .map(|port| {
                p.round_trip_ns(flow_of(&tcp_frame(
                    [10, 0, 0, 1],
                    [10, 0, 1, 1],
                    *port,
                    5201,
                )))
            })
            .collect()
    }

    #[test]
    fn a_seed_gives_the_kth_flow_the_same_delay_whatever_its_ports() {
        let first = seeded_delays(7, &[40001, 40002, 40003, 40004]);
        let again = seeded_delays(7, &[51234, 33333, 60000, 41000]);
        assert_eq!(first, again);
        assert_ne!(first, seeded_delays(8, &[40001, 40002, 40003, 40004]));
        assert!(first.iter().all(|d| (20_000_000..=35_000_000).contains(d)));
        // A flow keeps its delay, in both directions, whatever came in between.
        let p = DelayPolicy::new(20_000_000, 15_000_000, vec![], Some(7));
        let fwd = flow_of(&tcp_frame([10, 0, 0, 1], [10, 0, 1, 1], 40000, 5201));
        let rev = flow_of(&tcp_frame([10, 0, 1, 1], [10, 0, 0, 1], 5201, 40000));
        let other = flow_of(&tcp_frame([10, 0, 0, 2], [10, 0, 1, 1], 40000, 5201));
        let d = p.round_trip_ns(fwd);
        assert_eq!(p.round_trip_ns(other), seeded_delays(7, &[1, 2])[1]);
        assert_eq!((p.round_trip_ns(rev), p.round_trip_ns(fwd)), (d, d));
    }

    #[test]
    fn seeded_delays_spread_over_the_range() {
        let ports: Vec<u16> = (0..1000).map(|i| 40000 + i).collect();
        let delays = seeded_delays(3, &ports);
        let low = delays.iter().filter(|d| **d < 27_500_000).count();
        assert!((400..600).contains(&low), "{low} of 1000 below the middle");
    }

    #[test]
    fn bad_groups_and_frames_are_rejected() {
        assert!(Group::parse("10.0.0.0/33=5").is_err());
        assert!(Group::parse("10.0.0.0/8").is_err());
        assert!(Group::parse("nope/8=5").is_err());
        assert_eq!(flow_of(&[0u8; 10]), None);
        let mut arp = tcp_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(flow_of(&arp), None);
    }
}
