//! Long-flow detection by count-min sketch (SPEC §4): `rows` hash rows of `width` counters,
//! zeroed every reset period; a flow's estimate is its smallest counter.

use crate::hash::{Crc32, CRC32, CRC32C, CRC32D, CRC32Q};
use crate::parse::FlowKey;

const ROW_HASHES: [&Crc32; 4] = [&CRC32, &CRC32C, &CRC32D, &CRC32Q];

pub struct CountMinSketch {
    rows: Vec<Vec<u32>>,
    mask: usize,
    reset_ns: u64,
    window_start: Option<u64>,
}

impl CountMinSketch {
    /// SPEC defaults: 4 rows, width 2^16, reset every 10 s.
    pub fn new(rows: usize, width_log2: u32, reset_ns: u64) -> CountMinSketch {
        assert!((1..=ROW_HASHES.len()).contains(&rows), "1..=4 rows");
        let width = 1usize << width_log2;
        CountMinSketch {
            rows: vec![vec![0; width]; rows],
            mask: width - 1,
            reset_ns,
            window_start: None,
        }
    }

    /// Counts one packet of `key` at `now` and returns the flow's estimate (never below its
    /// true count within the window).
    pub fn count(&mut self, key: &FlowKey, now: u64) -> u32 {
        match self.window_start {
            Some(start) if now.saturating_sub(start) < self.reset_ns => {}
            _ => {
                for row in &mut self.rows {
                    row.fill(0);
                }
                self.window_start = Some(now);
            }
        }
        // All indices first: the rows' cache misses then overlap instead of taking turns.
        let mut cells = [0usize; 4];
        for (cell, hash) in cells.iter_mut().zip(ROW_HASHES) {
            *cell = hash.hash(key) as usize & self.mask;
        }
        let mut estimate = u32::MAX;
        for (row, i) in self.rows.iter_mut().zip(cells) {
            let cell = &mut row[i];
            *cell = cell.saturating_add(1);
            estimate = estimate.min(*cell);
        }
        estimate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> FlowKey {
        let mut k = [0u8; 13];
        k[..4].copy_from_slice(&n.to_be_bytes());
        k[12] = 6;
        k
    }

    #[test]
    fn estimates_never_undercount_and_reset_with_the_window() {
        let mut cms = CountMinSketch::new(4, 10, 10_000_000_000);
        let mut last = 0;
        for i in 0..500u64 {
            for flow in 0..50 {
                let estimate = cms.count(&key(flow), i * 1_000_000);
                if flow == 7 {
                    last = estimate;
                }
            }
        }
        assert!(last >= 500, "undercount: {last}");
        assert!(
            last < 600,
            "a 1024-wide sketch with 50 flows should barely collide: {last}"
        );
        // A new window starts from zero.
        assert_eq!(cms.count(&key(7), 10_500_000_000), 1);
    }

    #[test]
    fn one_collision_free_row_keeps_the_estimate_exact() {
        let mut cms = CountMinSketch::new(4, 17, 10_000_000_000);
        for _ in 0..2000 {
            cms.count(&key(1), 1);
        }
        assert_eq!(cms.count(&key(1), 2), 2001);
        assert_eq!(cms.count(&key(2), 3), 1);
    }
}
