//! Long flows (SPEC §4): which flows are long, by the count-min sketch (P4BS) or the packet
//! window rule (GLOBECOM Algorithm 1), and the idle-timeout table that ends them.

use std::collections::HashMap;

use crate::config::{LongFlowConfig, LongFlowMode};
use crate::hash::{CRC32, SIGNATURE};
use crate::parse::FlowKey;
use crate::record::FlowEventReason;
use crate::sketch::CountMinSketch;

/// GLOBECOM Algorithm 1's per-flow state: last packet time and a packet count.
#[derive(Clone, Copy, Default)]
struct WindowSlot {
    signature: u32,
    last_ts: u64,
    count: u32,
}

enum Detector {
    Sketch(CountMinSketch),
    Window { slots: Vec<WindowSlot>, mask: usize },
}

/// An entry of the long-flow table.
#[derive(Clone, Copy, Debug)]
pub struct LongFlow {
    pub link: u16,
    pub last_seen: u64,
    pub packets: u64,
}

pub enum Verdict {
    /// Nothing to report.
    None,
    /// The flow became long; `packets` is the detector's count.
    Start {
        reason: FlowEventReason,
        packets: u64,
    },
    /// A listed flow closed.
    End {
        reason: FlowEventReason,
        packets: u64,
    },
    /// It would be long but the table is full.
    TableFull,
}

pub struct LongFlows {
    detector: Detector,
    table: HashMap<FlowKey, LongFlow>,
    capacity: usize,
    threshold: u32,
    window_ns: u64,
    window_packets: u32,
    pub ttl_ns: u64,
}

impl LongFlows {
    pub fn new(c: &LongFlowConfig) -> LongFlows {
        let detector = match c.mode {
            LongFlowMode::Sketch => Detector::Sketch(CountMinSketch::new(
                c.cms_rows,
                c.cms_width_log2,
                c.cms_reset_ns,
            )),
            LongFlowMode::Window => Detector::Window {
                slots: vec![WindowSlot::default(); 1 << c.window_slots_log2],
                mask: (1 << c.window_slots_log2) - 1,
            },
        };
        LongFlows {
            detector,
            table: HashMap::with_capacity(c.capacity.min(65_536)),
            capacity: c.capacity,
            threshold: c.threshold,
            window_ns: c.window_ns,
            window_packets: c.window_packets,
            ttl_ns: c.ttl_ns,
        }
    }

    /// One packet of `key` in the data direction at the before tap. `data` is payload > 0.
    pub fn observe(
        &mut self,
        link: u16,
        key: &FlowKey,
        now: u64,
        data: bool,
        fin_or_rst: Option<FlowEventReason>,
    ) -> Verdict {
        if let Some(entry) = self.table.get_mut(key) {
            entry.last_seen = now;
            entry.packets += 1;
            if let Some(reason) = fin_or_rst {
                let packets = entry.packets;
                self.table.remove(key);
                return Verdict::End { reason, packets };
            }
            // A listed flow still counts in its detector, as the data plane's sketch does.
            self.count(key, now, data);
            return Verdict::None;
        }
        let Some((reason, packets)) = self.count(key, now, data) else {
            return Verdict::None;
        };
        if fin_or_rst.is_some() {
            return Verdict::None; // long only as it closes: nothing to list
        }
        if self.table.len() >= self.capacity {
            return Verdict::TableFull;
        }
        self.table.insert(
            *key,
            LongFlow {
                link,
                last_seen: now,
                packets: u64::from(packets),
            },
        );
        Verdict::Start {
            reason,
            packets: u64::from(packets),
        }
    }

    /// Feeds the detector; `Some` when the flow has just reached its threshold.
    fn count(&mut self, key: &FlowKey, now: u64, data: bool) -> Option<(FlowEventReason, u32)> {
        match &mut self.detector {
            Detector::Sketch(cms) => {
                if !data {
                    return None;
                }
                let estimate = cms.count(key, now);
                (estimate >= self.threshold).then_some((FlowEventReason::Threshold, estimate))
            }
            Detector::Window { slots, mask } => {
                let signature = SIGNATURE.hash(key);
                let slot = &mut slots[CRC32.hash(key) as usize & *mask];
                if slot.signature != signature || slot.last_ts == 0 {
                    *slot = WindowSlot {
                        signature,
                        last_ts: now,
                        count: 0,
                    };
                    return None;
                }
                let previous = std::mem::replace(&mut slot.last_ts, now);
                if now.saturating_sub(previous) < self.window_ns {
                    slot.count = slot.count.saturating_add(1);
                } else {
                    slot.count = 0;
                }
                (slot.count >= self.window_packets).then_some((FlowEventReason::Window, slot.count))
            }
        }
    }

    /// Removes the entries idle for the TTL at `now` (the idle-timeout sweep).
    pub fn expire(&mut self, now: u64, mut ended: impl FnMut(&FlowKey, &LongFlow)) {
        let ttl = self.ttl_ns;
        self.table.retain(|key, entry| {
            let idle = now.saturating_sub(entry.last_seen) >= ttl;
            if idle {
                ended(key, entry);
            }
            !idle
        });
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> FlowKey {
        let mut k = [0u8; 13];
        k[3] = n;
        k[12] = 6;
        k
    }

    fn starts(v: &Verdict) -> bool {
        matches!(v, Verdict::Start { .. })
    }

    #[test]
    fn the_sketch_starts_a_flow_once_at_the_threshold_and_idle_ends_it() {
        let config = LongFlowConfig {
            threshold: 10,
            ..Default::default()
        };
        let mut lf = LongFlows::new(&config);
        let verdicts: Vec<bool> = (0..30)
            .map(|i| starts(&lf.observe(0, &key(1), 1_000 + i, true, None)))
            .collect();
        assert_eq!(verdicts.iter().filter(|s| **s).count(), 1);
        assert!(verdicts[9], "the 10th packet crosses the threshold");
        assert_eq!(lf.len(), 1);
        let mut ended = Vec::new();
        lf.expire(1_000 + 29 + config.ttl_ns - 1, |k, _| ended.push(*k));
        assert!(ended.is_empty());
        lf.expire(1_000 + 29 + config.ttl_ns, |k, _| ended.push(*k));
        assert_eq!(ended, vec![key(1)]);
        assert!(lf.is_empty());
    }

    #[test]
    fn pure_acks_do_not_count_and_fin_ends_a_listed_flow() {
        let config = LongFlowConfig {
            threshold: 3,
            ..Default::default()
        };
        let mut lf = LongFlows::new(&config);
        for t in 0..10 {
            assert!(!starts(&lf.observe(0, &key(2), 10 + t, false, None)));
        }
        for t in 0..3 {
            lf.observe(0, &key(2), 100 + t, true, None);
        }
        assert_eq!(lf.len(), 1);
        match lf.observe(0, &key(2), 200, false, Some(FlowEventReason::Fin)) {
            Verdict::End { reason, packets } => {
                assert_eq!(reason, FlowEventReason::Fin);
                assert_eq!(packets, 4);
            }
            _ => panic!("FIN must end the flow"),
        }
        assert!(lf.is_empty());
    }

    #[test]
    fn the_window_rule_restarts_its_count_after_a_gap() {
        let config = LongFlowConfig {
            mode: LongFlowMode::Window,
            window_ns: 1_000,
            window_packets: 5,
            ..Default::default()
        };
        let mut lf = LongFlows::new(&config);
        let mut t = 1;
        for _ in 0..5 {
            assert!(!starts(&lf.observe(0, &key(3), t, true, None)));
            t += 500;
        }
        t += 5_000; // a gap longer than the window: the count starts again
        for _ in 0..5 {
            assert!(!starts(&lf.observe(0, &key(3), t, true, None)));
            t += 500;
        }
        match lf.observe(0, &key(3), t, true, None) {
            Verdict::Start { reason, packets } => {
                assert_eq!(reason, FlowEventReason::Window);
                assert_eq!(packets, 5);
            }
            _ => panic!("the fifth packet within the window starts the flow"),
        }
    }

    #[test]
    fn a_full_table_is_reported() {
        let config = LongFlowConfig {
            threshold: 1,
            capacity: 1,
            ..Default::default()
        };
        let mut lf = LongFlows::new(&config);
        assert!(starts(&lf.observe(0, &key(1), 1, true, None)));
        assert!(matches!(
            lf.observe(0, &key(2), 2, true, None),
            Verdict::TableFull
        ));
    }
}
