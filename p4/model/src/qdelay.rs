//! Queueing delay (SPEC §6): a data packet's time at the tap before the router, matched with
//! the same packet's time at the tap after it.

use crate::hash::{CRC32, SIGNATURE};

/// Flow key (13 B) + TCP seq (4 B) + IPv4 id (2 B), big-endian.
pub type QueueKey = [u8; 19];

#[derive(Clone, Copy, Default)]
struct Slot {
    signature: u32,
    ts: u64, // 0: empty
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    Sample(u64),
    Expired,
    Miss,
}

pub struct QueueDelayTable {
    slots: Vec<Slot>,
    mask: usize,
    max_age_ns: u64,
}

impl QueueDelayTable {
    pub fn new(slots_log2: u32, max_age_ns: u64) -> QueueDelayTable {
        QueueDelayTable {
            slots: vec![Slot::default(); 1 << slots_log2],
            mask: (1 << slots_log2) - 1,
            max_age_ns,
        }
    }

    /// A packet entering the router at `now`; true when it overwrote a packet still waiting
    /// to be seen leaving (that one can no longer give a sample).
    pub fn arrive(&mut self, key: &QueueKey, now: u64) -> bool {
        let slot = &mut self.slots[CRC32.hash(key) as usize & self.mask];
        let overwritten = slot.ts != 0 && now.saturating_sub(slot.ts) <= self.max_age_ns;
        *slot = Slot {
            signature: SIGNATURE.hash(key),
            ts: now,
        };
        overwritten
    }

    /// The packet leaving the router at `now`: its queueing delay if it was seen entering.
    pub fn depart(&mut self, key: &QueueKey, now: u64) -> Departure {
        let slot = &mut self.slots[CRC32.hash(key) as usize & self.mask];
        if slot.ts == 0 || slot.signature != SIGNATURE.hash(key) {
            return Departure::Miss;
        }
        let delay = now.saturating_sub(slot.ts);
        *slot = Slot::default();
        if delay > self.max_age_ns {
            Departure::Expired
        } else {
            Departure::Sample(delay)
        }
    }
}

/// The per-link EWMA of SPEC §6, in integer shifts as the switch computes it: weight 1/8.
pub fn ewma_update(ewma: u64, sample: u64) -> u64 {
    if sample >= ewma {
        ewma + ((sample - ewma) >> 3)
    } else {
        ewma - ((ewma - sample) >> 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> QueueKey {
        let mut k = [0u8; 19];
        k[0] = n;
        k
    }

    #[test]
    fn the_same_packet_at_both_taps_gives_its_delay_once() {
        let mut t = QueueDelayTable::new(16, 1_000_000_000);
        assert!(!t.arrive(&key(1), 1_000));
        assert_eq!(t.depart(&key(1), 5_001_000), Departure::Sample(5_000_000));
        assert_eq!(t.depart(&key(1), 6_000_000), Departure::Miss);
        assert_eq!(t.depart(&key(2), 6_000_000), Departure::Miss);
    }

    #[test]
    fn overwrites_and_expiry_are_reported() {
        let mut t = QueueDelayTable::new(0, 1_000);
        assert!(!t.arrive(&key(1), 10));
        assert!(t.arrive(&key(2), 20)); // one slot: the first packet is lost
        assert_eq!(t.depart(&key(1), 30), Departure::Miss);
        assert_eq!(t.depart(&key(2), 5_000), Departure::Expired);
        assert!(!t.arrive(&key(3), 10_000));
        assert!(!t.arrive(&key(4), 20_000)); // the old entry had expired: no loss
    }

    #[test]
    fn the_ewma_moves_an_eighth_of_the_way() {
        assert_eq!(ewma_update(0, 800), 100);
        assert_eq!(ewma_update(800, 0), 700);
        let mut e = 0;
        for _ in 0..200 {
            e = ewma_update(e, 10_000_000);
        }
        assert!(e > 9_999_990 && e <= 10_000_000, "{e}");
    }
}
