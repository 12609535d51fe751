//! RED, Random Early Detection (Floyd and Jacobson, "Random Early Detection Gateways for
//! Congestion Avoidance", IEEE/ACM ToN 1(4), 1993), with the "gentle" variant routers ship
//! (Floyd, "Recommendation on using the gentle variant of RED", 2000; ns-2's default since).
//!
//! - The average queue `avg` is an EWMA of the backlog with weight `w_q`, updated at every
//!   arrival (dropped ones too). After an idle link it first decays as if `m` packets of the
//!   typical size had been sent meanwhile: avg <- (1 - w_q)^m avg (the paper's idle-time
//!   correction; m = idle time / one such packet's transmission time).
//! - p_b rises linearly from 0 at min_th to max_p at max_th; gentle: on from max_p at max_th
//!   to 1 at 2 max_th; beyond (or beyond max_th without gentle) every arrival is dropped.
//! - Drops are spaced by the count of packets since the last one: p_a = p_b / (1 - count p_b),
//!   so the gap between drops is uniform on 1..1/p_b (the paper's section 7, "method 2").
//! - Byte queue, packet mode: the queue and the thresholds are in bytes (as Linux's sch_red),
//!   and each packet is dropped with p_a whatever its size (RFC 7141: do not favour small
//!   packets). The paper's byte mode would scale p_b by size / maximum size.

use crate::delay::mix;

#[derive(Clone, Debug)]
pub struct RedParams {
    pub min_th_bytes: f64,
    pub max_th_bytes: f64,
    pub max_p: f64,
    pub w_q: f64,
    /// The transmission time of one typical packet: m = idle time / this.
    pub idle_packet_ns: u64,
    pub gentle: bool,
}

impl RedParams {
    pub fn check(&self) -> Result<(), String> {
        if !(self.min_th_bytes >= 0.0 && self.min_th_bytes < self.max_th_bytes) {
            return Err(format!(
                "RED thresholds: min_th ({} B) must be below max_th ({} B)",
                self.min_th_bytes, self.max_th_bytes
            ));
        }
        if !(self.max_p > 0.0 && self.max_p <= 1.0) {
            return Err(format!("RED max_p must be in (0, 1], got {}", self.max_p));
        }
        if !(self.w_q > 0.0 && self.w_q < 1.0) {
            return Err(format!("RED w_q must be in (0, 1), got {}", self.w_q));
        }
        if self.idle_packet_ns == 0 {
            return Err("RED's typical packet time must be > 0 ns".into());
        }
        Ok(())
    }

    /// p_b at average queue `avg` (bytes): 0 below min_th, 1 where every arrival is dropped.
    pub fn drop_probability(&self, avg: f64) -> f64 {
        let (min, max) = (self.min_th_bytes, self.max_th_bytes);
        if avg < min {
            0.0
        } else if avg < max {
            self.max_p * (avg - min) / (max - min)
        } else if self.gentle && avg < 2.0 * max {
            self.max_p + (1.0 - self.max_p) * (avg - max) / max
        } else {
            1.0
        }
    }
}

/// What RED does with an arriving packet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    Accept,
    /// Dropped with probability p_a (between the thresholds, or in the gentle region).
    EarlyDrop,
    /// Dropped because p_b is 1 (avg at or above 2 max_th, or max_th without gentle).
    ForcedDrop,
}

pub struct Red {
    pub params: RedParams,
    avg: f64,
    /// Packets accepted since the last drop while p_b > 0 (0 below min_th).
    count: u64,
    rng: u64,
}

impl Red {
    pub fn new(params: RedParams, seed: u64) -> Red {
        Red {
            params,
            avg: 0.0,
            count: 0,
            rng: mix(seed),
        }
    }

    pub fn average(&self) -> f64 {
        self.avg
    }

    /// A uniform draw in [0, 1): splitmix64's next value, top 53 bits.
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e3779b97f4a7c15);
        (mix(self.rng) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The EWMA step of an arrival that finds `backlog` bytes queued, the link idle for
    /// `idle_ns` before it (0 when the link was busy).
    fn update_average(&mut self, backlog: u64, idle_ns: u64) {
        let w = self.params.w_q;
        if idle_ns > 0 {
            let m = idle_ns as f64 / self.params.idle_packet_ns as f64;
            self.avg *= (1.0 - w).powf(m);
        }
        self.avg += w * (backlog as f64 - self.avg);
    }

    /// Decides on an arrival that finds `backlog` bytes queued (`idle_ns` as above).
    pub fn on_arrival(&mut self, backlog: u64, idle_ns: u64) -> Verdict {
        self.update_average(backlog, idle_ns);
        let p_b = self.params.drop_probability(self.avg);
        if p_b <= 0.0 {
            self.count = 0;
            return Verdict::Accept;
        }
        if p_b >= 1.0 {
            self.count = 0;
            return Verdict::ForcedDrop;
        }
        let spaced = self.count as f64 * p_b;
        let p_a = if spaced >= 1.0 {
            1.0
        } else {
            p_b / (1.0 - spaced)
        };
        if self.uniform() < p_a {
            self.count = 0;
            Verdict::EarlyDrop
        } else {
            self.count += 1;
            Verdict::Accept
        }
    }

    /// A packet the byte limit dropped: it restarts the count as any drop does.
    pub fn on_overflow(&mut self) {
        self.count = 0;
    }

    #[cfg(test)]
    pub fn with_average(params: RedParams, avg: f64, seed: u64) -> Red {
        Red {
            avg,
            ..Red::new(params, seed)
        }
    }

    #[cfg(test)]
    fn set_average(&mut self, avg: f64) {
        self.avg = avg;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults of a 100 Mbit/s link (testbed.py's Aqm): 2.5 and 7.5 ms of line rate.
    fn params() -> RedParams {
        RedParams {
            min_th_bytes: 31_250.0,
            max_th_bytes: 93_750.0,
            max_p: 0.1,
            w_q: 1.2e-4,
            idle_packet_ns: 120_000,
            gentle: true,
        }
    }

    /// A RED whose average stays where it is: w_q so small that a million arrivals move it
    /// by less than a byte.
    fn held_at(avg: f64, seed: u64) -> Red {
        let p = RedParams {
            w_q: 1e-15,
            ..params()
        };
        Red::with_average(p, avg, seed)
    }

    /// Gaps between drops (arrivals from one drop to the next) over `arrivals` arrivals.
    fn drop_gaps(red: &mut Red, arrivals: usize) -> Vec<u64> {
        let backlog = red.average() as u64;
        let mut gaps = vec![];
        let mut since = 0;
        for _ in 0..arrivals {
            since += 1;
            if red.on_arrival(backlog, 0) != Verdict::Accept {
                gaps.push(since);
                since = 0;
            }
        }
        gaps
    }

    #[test]
    fn drop_probability_follows_the_published_profile() {
        let p = params();
        assert_eq!(p.drop_probability(0.0), 0.0);
        assert_eq!(p.drop_probability(31_249.9), 0.0);
        assert_eq!(p.drop_probability(31_250.0), 0.0);
        // Linear to max_p at max_th: halfway, max_p / 2.
        assert!((p.drop_probability(62_500.0) - 0.05).abs() < 1e-12);
        assert!((p.drop_probability(93_749.999) - 0.1).abs() < 1e-6);
        // Gentle: max_p at max_th, then linear to 1 at 2 max_th.
        assert!((p.drop_probability(93_750.0) - 0.1).abs() < 1e-12);
        assert!((p.drop_probability(1.5 * 93_750.0) - 0.55).abs() < 1e-12);
        assert_eq!(p.drop_probability(2.0 * 93_750.0), 1.0);
        let abrupt = RedParams {
            gentle: false,
            ..params()
        };
        assert_eq!(abrupt.drop_probability(93_750.0), 1.0);
    }

    #[test]
    fn no_drop_below_min_th() {
        let mut red = held_at(31_000.0, 1);
        assert!(drop_gaps(&mut red, 200_000).is_empty());
    }

    /// Between the thresholds the count-spaced p_a of the paper makes a gap of n arrivals,
    /// for n = 1..K (K = floor(1/p_b)), p_b likely each, and the rest K + 1: no gap is longer,
    /// the first packet after a drop goes with p_b, and the drop fraction is 1/E[gap], with
    /// E[gap] = sum over n = 0..K of (1 - n p_b) (= (1/p_b + 1)/2 when 1/p_b is whole).
    fn check_spacing(avg: f64, p_b: f64) {
        let mut red = held_at(avg, 7);
        let arrivals = 1_000_000;
        let gaps = drop_gaps(&mut red, arrivals);
        let k = (1.0 / p_b).floor() as u64;
        assert!(
            gaps.iter().all(|g| (1..=k + 1).contains(g)),
            "a gap > 1/p_b + 1"
        );
        let mean_gap: f64 = (0..=k).map(|n| 1.0 - n as f64 * p_b).sum();
        let fraction = gaps.len() as f64 / arrivals as f64;
        assert!(
            (fraction * mean_gap - 1.0).abs() < 0.02,
            "drop fraction {fraction} against {} at p_b {p_b}",
            1.0 / mean_gap
        );
        for length in [1, k.div_ceil(2), k] {
            let share = gaps.iter().filter(|g| **g == length).count() as f64 / gaps.len() as f64;
            assert!(
                (share / p_b - 1.0).abs() < 0.2,
                "gap {length}: {share} of gaps, p_b is {p_b}"
            );
        }
    }

    #[test]
    fn between_the_thresholds_drops_follow_max_p_linearly_with_count_spacing() {
        let p = params();
        for avg in [40_000.0, 62_500.0, 90_000.0] {
            let p_b = p.max_p * (avg - p.min_th_bytes) / (p.max_th_bytes - p.min_th_bytes);
            check_spacing(avg, p_b);
        }
    }

    #[test]
    fn gentle_region_rises_from_max_p_to_one() {
        // 1.2 max_th: p_b = 0.1 + 0.9 * 0.2 = 0.28; 1.5 max_th: 0.55.
        check_spacing(1.2 * 93_750.0, 0.28);
        check_spacing(1.5 * 93_750.0, 0.55);
    }

    #[test]
    fn the_count_restarts_below_min_th() {
        // After 1000 arrivals below min_th, the first one between the thresholds is dropped
        // with p_b (the paper's count = -1 below min_th), not with a p_a grown by that count.
        let p_b = 0.1 * (40_000.0 - 31_250.0) / 62_500.0;
        let trials = 4000;
        let dropped = (0..trials)
            .filter(|seed| {
                let mut red = held_at(20_000.0, *seed);
                drop_gaps(&mut red, 1000);
                red.set_average(40_000.0);
                red.on_arrival(40_000, 0) != Verdict::Accept
            })
            .count();
        let share = dropped as f64 / trials as f64;
        assert!((share / p_b - 1.0).abs() < 0.3, "{share} against {p_b}");
    }

    #[test]
    fn every_arrival_is_dropped_at_or_above_twice_max_th() {
        let mut red = held_at(2.0 * 93_750.0 + 1.0, 3);
        for _ in 0..1000 {
            assert_eq!(red.on_arrival(200_000, 0), Verdict::ForcedDrop);
        }
    }

    #[test]
    fn average_converges_with_w_q() {
        // From 0 under a constant backlog Q: avg_n = Q (1 - (1 - w_q)^n).
        let mut red = Red::new(params(), 1);
        let q = 50_000u64;
        for n in 1..=20_000u32 {
            red.on_arrival(q, 0);
            let expected = q as f64 * (1.0 - (1.0 - 1.2e-4f64).powi(n as i32));
            assert!(
                (red.average() - expected).abs() < 1e-6 * q as f64,
                "arrival {n}"
            );
        }
        // 1/w_q arrivals: 1 - 1/e of the way.
        assert!((red.average() / q as f64 - (1.0 - (-20_000.0 * 1.2e-4f64).exp())).abs() < 1e-3);
    }

    #[test]
    fn idle_time_decays_the_average_as_if_packets_had_been_sent() {
        let mut red = held_at(80_000.0, 1);
        red.params.w_q = 1.2e-4;
        // 120 ms idle = 1000 typical packets: (1 - w_q)^1000, then the arrival's own step.
        red.on_arrival(0, 120_000_000);
        let expected = 80_000.0 * (1.0 - 1.2e-4f64).powi(1000) * (1.0 - 1.2e-4);
        assert!((red.average() - expected).abs() < 1e-6, "{}", red.average());
        // A busy link (idle 0) takes one step only.
        let before = red.average();
        red.on_arrival(0, 0);
        assert!((red.average() - before * (1.0 - 1.2e-4)).abs() < 1e-9);
    }

    #[test]
    fn bad_parameters_are_named() {
        let inverted = RedParams {
            min_th_bytes: 10.0,
            max_th_bytes: 5.0,
            ..params()
        };
        assert!(inverted.check().unwrap_err().contains("min_th"));
        let p = RedParams {
            max_p: 0.0,
            ..params()
        };
        assert!(p.check().unwrap_err().contains("max_p"));
        assert!(params().check().is_ok());
    }
}
