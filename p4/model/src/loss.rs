//! Retransmission detection (SPEC §5): per flow, the highest `seq + payload` seen; a data
//! segment starting below it is a retransmission, unless it is a keep-alive.

use crate::hash::{CRC32, SIGNATURE};
use crate::parse::FlowKey;

#[derive(Clone, Copy, Default)]
struct Slot {
    signature: u32,
    next_seq: u32,
    used: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    New,
    Retransmission,
    KeepAlive,
    /// The flow's slot belonged to another flow: taken over, this segment not judged.
    Unjudged,
}

pub struct LossTracker {
    slots: Vec<Slot>,
    mask: usize,
}

/// `a < b` in 32-bit sequence space (RFC 1982 serial-number arithmetic).
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl LossTracker {
    pub fn new(slots_log2: u32) -> LossTracker {
        let slots = 1usize << slots_log2;
        LossTracker {
            slots: vec![Slot::default(); slots],
            mask: slots - 1,
        }
    }

    /// Judges a data segment (payload > 0) of `key` and remembers how far the flow got.
    pub fn observe(&mut self, key: &FlowKey, seq: u32, payload: u32) -> Segment {
        let signature = SIGNATURE.hash(key);
        let slot = &mut self.slots[CRC32.hash(key) as usize & self.mask];
        let end = seq.wrapping_add(payload);
        if !slot.used || slot.signature != signature {
            *slot = Slot {
                signature,
                next_seq: end,
                used: true,
            };
            return Segment::Unjudged;
        }
        if !before(seq, slot.next_seq) {
            slot.next_seq = end;
            return Segment::New;
        }
        if payload <= 1 && seq == slot.next_seq.wrapping_sub(1) {
            return Segment::KeepAlive;
        }
        if before(slot.next_seq, end) {
            slot.next_seq = end; // a retransmission that also carries new data
        }
        Segment::Retransmission
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: FlowKey = [10, 201, 1, 10, 10, 201, 2, 2, 0x9c, 0x40, 0x14, 0x51, 6];

    #[test]
    fn in_order_segments_are_new_and_repeats_are_retransmissions() {
        let mut t = LossTracker::new(16);
        assert_eq!(t.observe(&K, 1000, 1448), Segment::Unjudged);
        assert_eq!(t.observe(&K, 2448, 1448), Segment::New);
        assert_eq!(t.observe(&K, 1000, 1448), Segment::Retransmission);
        assert_eq!(t.observe(&K, 3896, 1448), Segment::New);
        assert_eq!(t.observe(&K, 5343, 1), Segment::KeepAlive);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut t = LossTracker::new(16);
        t.observe(&K, u32::MAX - 1000, 1448);
        assert_eq!(t.observe(&K, 447, 1448), Segment::New); // past the wrap
        assert_eq!(
            t.observe(&K, u32::MAX - 1000, 1448),
            Segment::Retransmission
        );
    }

    #[test]
    fn a_slot_taken_by_another_flow_is_not_judged() {
        let mut t = LossTracker::new(0); // a single slot: every flow collides
        let mut other = K;
        other[11] = 0x52;
        t.observe(&K, 1000, 1448);
        assert_eq!(t.observe(&other, 5, 10), Segment::Unjudged);
        assert_eq!(t.observe(&K, 1000, 1448), Segment::Unjudged);
    }
}
