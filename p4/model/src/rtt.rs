//! The per-flow RTT table of SPEC §3: two hash stages of `{signature, timestamp}` slots keyed
//! by (flow key, expected ACK).

use crate::hash::{Crc32, CRC32, CRC32C, SIGNATURE};

/// 13-byte flow key (src, dst, sport, dport, protocol) + 4-byte expected ACK, big-endian.
pub type RttKey = [u8; 17];

#[derive(Clone, Copy, Default)]
struct Slot {
    signature: u32,
    ts: u64, // 0: empty
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Yes,
    TableFull,
    /// A live record had the same (flow, eACK): the segment was sent twice, so both are
    /// forgotten (Karn's rule: an ACK for it would be ambiguous).
    Duplicate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Sample(u64),
    Expired,
    Miss,
}

pub struct RttTable {
    stages: [Vec<Slot>; 2],
    mask: usize,
    max_age_ns: u64,
}

const STAGE_HASHES: [&Crc32; 2] = [&CRC32, &CRC32C];

impl RttTable {
    /// `slots_log2` slots per stage (SPEC default 16); samples older than `max_age_ns` expire.
    pub fn new(slots_log2: u32, max_age_ns: u64) -> RttTable {
        let slots = 1usize << slots_log2;
        RttTable {
            stages: [vec![Slot::default(); slots], vec![Slot::default(); slots]],
            mask: slots - 1,
            max_age_ns,
        }
    }

    fn index(&self, stage: usize, key: &RttKey) -> usize {
        STAGE_HASHES[stage].hash(key) as usize & self.mask
    }

    /// A data packet's (flow, eACK) seen at `now`: stored in the first free or stale slot.
    pub fn record(&mut self, key: &RttKey, now: u64) -> Stored {
        let signature = SIGNATURE.hash(key);
        for stage in 0..2 {
            let i = self.index(stage, key);
            let max_age = self.max_age_ns;
            let slot = &mut self.stages[stage][i];
            let live = slot.ts != 0 && now.saturating_sub(slot.ts) <= max_age;
            if live && slot.signature == signature {
                *slot = Slot::default();
                return Stored::Duplicate;
            }
            if !live {
                *slot = Slot { signature, ts: now };
                return Stored::Yes;
            }
        }
        Stored::TableFull
    }

    /// An ACK's (reverse flow, ack) seen at `now`: the RTT sample, if a live record matches.
    pub fn lookup(&mut self, key: &RttKey, now: u64) -> Lookup {
        match self.take_slot(key) {
            None => Lookup::Miss,
            Some(ts) => {
                let sample = now.saturating_sub(ts);
                if sample == 0 || sample > self.max_age_ns {
                    Lookup::Expired
                } else {
                    Lookup::Sample(sample)
                }
            }
        }
    }

    fn take_slot(&mut self, key: &RttKey) -> Option<u64> {
        let signature = SIGNATURE.hash(key);
        for stage in 0..2 {
            let i = self.index(stage, key);
            let slot = &mut self.stages[stage][i];
            if slot.ts != 0 && slot.signature == signature {
                let ts = slot.ts;
                *slot = Slot::default();
                return Some(ts);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32, eack: u32) -> RttKey {
        let mut k = [0u8; 17];
        k[..4].copy_from_slice(&n.to_be_bytes());
        k[13..].copy_from_slice(&eack.to_be_bytes());
        k
    }

    #[test]
    fn a_matching_ack_gives_one_sample() {
        let mut t = RttTable::new(16, 1_000_000_000);
        assert_eq!(t.record(&key(1, 1448), 1_000), Stored::Yes);
        assert_eq!(
            t.lookup(&key(1, 1448), 21_001_000),
            Lookup::Sample(21_000_000)
        );
        assert_eq!(t.lookup(&key(1, 1448), 22_000_000), Lookup::Miss); // the slot was cleared
        assert_eq!(t.lookup(&key(2, 1448), 22_000_000), Lookup::Miss);
    }

    #[test]
    fn retransmitted_segments_give_no_sample() {
        let mut t = RttTable::new(16, 1_000_000_000);
        // A segment recorded twice (sent again, both copies seen) leaves no record.
        t.record(&key(1, 1), 1_000);
        assert_eq!(t.record(&key(1, 1), 2_000), Stored::Duplicate);
        assert_eq!(t.lookup(&key(1, 1), 50_000_000), Lookup::Miss);
    }

    #[test]
    fn old_records_expire_and_free_their_slot() {
        let mut t = RttTable::new(16, 1_000_000_000);
        t.record(&key(1, 1), 1_000);
        assert_eq!(t.lookup(&key(1, 1), 2_000_000_000), Lookup::Expired);
        // A full table still takes a record where a slot has gone stale.
        let mut small = RttTable::new(0, 1_000);
        assert_eq!(small.record(&key(1, 1), 10), Stored::Yes);
        assert_eq!(small.record(&key(2, 2), 20), Stored::Yes);
        assert_eq!(small.record(&key(3, 3), 30), Stored::TableFull);
        assert_eq!(small.record(&key(3, 3), 5_000), Stored::Yes);
    }

    #[test]
    fn colliding_keys_are_told_apart_by_their_signature() {
        let mut t = RttTable::new(0, 1_000_000_000); // one slot per stage: everything collides
        t.record(&key(1, 1), 100);
        assert_eq!(t.lookup(&key(9, 9), 200), Lookup::Miss);
        assert_eq!(t.lookup(&key(1, 1), 300), Lookup::Sample(200));
    }
}
