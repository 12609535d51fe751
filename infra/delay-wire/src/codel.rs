//! CoDel, Controlled Delay (RFC 8289), as its section 5 pseudo-code has it: the sojourn time
//! of each packet is measured at dequeue; once it has stayed at or above `target` for a whole
//! `interval` (and the queue holds more than one MTU), CoDel drops the head and enters the
//! dropping state, where the next drop comes interval/sqrt(count) after the previous one's
//! schedule; the first packet below target ends it. Re-entering soon after (within 16
//! intervals of the last scheduled drop) starts from the last cycle's drop rate: count =
//! count - lastcount when that is more than 1 (the Linux variant the RFC adopts).

use crate::bottleneck::{ByteFifo, Queued};

#[derive(Clone, Debug)]
pub struct CodelParams {
    pub target_ns: u64,
    pub interval_ns: u64,
    /// No drop while the queue holds at most this many bytes (after the dequeue).
    pub mtu_bytes: u64,
}

impl CodelParams {
    pub fn check(&self) -> Result<(), String> {
        if self.target_ns == 0 || self.target_ns >= self.interval_ns {
            return Err(format!(
                "CoDel: target ({} ns) must be > 0 and below interval ({} ns)",
                self.target_ns, self.interval_ns
            ));
        }
        Ok(())
    }
}

pub struct Codel {
    pub params: CodelParams,
    /// When the sojourn time will have been above target for an interval (None: it is not).
    first_above_ns: Option<u64>,
    drop_next_ns: u64,
    count: u64,
    lastcount: u64,
    dropping: bool,
}

impl Codel {
    pub fn new(params: CodelParams) -> Codel {
        Codel {
            params,
            first_above_ns: None,
            drop_next_ns: 0,
            count: 0,
            lastcount: 0,
            dropping: false,
        }
    }

    pub fn dropping(&self) -> bool {
        self.dropping
    }

    fn control_law(&self, t: u64, count: u64) -> u64 {
        t + (self.params.interval_ns as f64 / (count as f64).sqrt()) as u64
    }

    /// The head of the queue, and whether CoDel may drop it (RFC 8289 `dodequeue`).
    fn dodequeue<T>(&mut self, now: u64, fifo: &mut ByteFifo<T>) -> (Option<Queued<T>>, bool) {
        let Some(packet) = fifo.pop() else {
            self.first_above_ns = None;
            return (None, false);
        };
        let sojourn = now.saturating_sub(packet.arrival_ns);
        let mut ok_to_drop = false;
        if sojourn < self.params.target_ns || fifo.bytes() <= self.params.mtu_bytes {
            self.first_above_ns = None;
        } else {
            match self.first_above_ns {
                None => self.first_above_ns = Some(now + self.params.interval_ns),
                Some(at) => ok_to_drop = now >= at,
            }
        }
        (Some(packet), ok_to_drop)
    }

    /// The packet to send at `now`, the ones CoDel drops on the way passed to `drop`
    /// (RFC 8289 `dequeue`).
    pub fn dequeue<T>(
        &mut self,
        now: u64,
        fifo: &mut ByteFifo<T>,
        drop: &mut impl FnMut(Queued<T>),
    ) -> Option<Queued<T>> {
        let (mut packet, ok_to_drop) = self.dodequeue(now, fifo);
        let Some(mut head) = packet.take() else {
            self.dropping = false;
            return None;
        };
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
            }
            while self.dropping && now >= self.drop_next_ns {
                drop(head);
                self.count += 1;
                let (next, ok) = self.dodequeue(now, fifo);
                if !ok {
                    self.dropping = false;
                } else {
                    self.drop_next_ns = self.control_law(self.drop_next_ns, self.count);
                }
                match next {
                    Some(next) => head = next,
                    None => return None,
                }
            }
        } else if ok_to_drop {
            drop(head);
            let (next, _) = self.dodequeue(now, fifo);
            self.dropping = true;
            let delta = self.count - self.lastcount;
            // Signed, as Linux's codel_time_before: a drop_next still ahead counts as recent.
            let since_ns = now as i128 - self.drop_next_ns as i128;
            self.count = if delta > 1 && since_ns < 16 * self.params.interval_ns as i128 {
                delta
            } else {
                1
            };
            self.drop_next_ns = self.control_law(now, self.count);
            self.lastcount = self.count;
            return next;
        }
        Some(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bottleneck::{Aqm, Bottleneck, Departure};

    const MTU: u64 = 1514;
    const TARGET: u64 = 5_000_000;
    const INTERVAL: u64 = 100_000_000;

    fn link(rate_bps: u64, mtu_bytes: u64) -> Bottleneck<u64> {
        let codel = Codel::new(CodelParams {
            target_ns: TARGET,
            interval_ns: INTERVAL,
            mtu_bytes,
        });
        Bottleneck::new(rate_bps, 10_000_000, Aqm::Codel(codel))
    }

    /// Frames numbered in arrival order, sent and dropped, with each one's sojourn and
    /// each drop's time (drops take no link time: the next frame sent starts then).
    struct Run {
        sent: Vec<Departure<u64>>,
        arrivals: Vec<u64>,
        drops: Vec<u64>,
    }

    impl Run {
        fn sojourn(&self, d: &Departure<u64>) -> u64 {
            d.start_ns - self.arrivals[d.item as usize]
        }
    }

    /// Feeds MTU frames arriving at `arrivals` (sorted) through `link` to the end.
    fn run(mut link: Bottleneck<u64>, arrivals: Vec<u64>) -> (Run, Bottleneck<u64>) {
        let mut sent = vec![];
        for (i, at) in arrivals.iter().enumerate() {
            link.arrive(i as u64, MTU, *at, &mut sent);
        }
        link.serve_until(u64::MAX / 2, &mut sent);
        let mut drops = vec![];
        let mut next = 0;
        for d in &sent {
            drops.extend((next..d.item).map(|_| d.start_ns));
            next = d.item + 1;
        }
        (
            Run {
                sent,
                arrivals,
                drops,
            },
            link,
        )
    }

    /// A burst of `standing` frames at 1 s, then one frame per transmission time (line rate)
    /// until `end`: a standing queue of `standing` - 1 frames that only drops shrink.
    fn standing_queue(standing: u64, end: u64) -> Vec<u64> {
        let tx = 121_120;
        let mut at = vec![1_000_000_000; standing as usize];
        at.extend(
            (1..)
                .map(|k| 1_000_000_000 + k * tx)
                .take_while(|t| *t < end),
        );
        at
    }

    #[test]
    fn no_drop_while_the_sojourn_stays_below_target() {
        // 33 frames: a standing queue of 32 * 121.12 us = 3.9 ms, for 10 s.
        let (r, link) = run(link(100_000_000, MTU), standing_queue(33, 11_000_000_000));
        assert!(r.drops.is_empty());
        let late = r.sent.iter().map(|d| r.sojourn(d)).max().unwrap();
        assert!((3_800_000..TARGET).contains(&late), "{late}");
        assert_eq!(link.stats.aqm_drops, 0);
    }

    #[test]
    fn drops_start_an_interval_after_the_sojourn_exceeds_target_then_speed_up() {
        // 100 frames: a standing queue of ~12 ms, for 1 s.
        let (r, link) = run(link(100_000_000, MTU), standing_queue(100, 2_000_000_000));
        let grid = 121_120;
        let above = r.sent.iter().find(|d| r.sojourn(d) >= TARGET).unwrap();
        assert!(r.drops.len() >= 15, "{} drops", r.drops.len());
        assert_eq!(r.drops.len() as u64, link.stats.aqm_drops);
        // The first drop: the first dequeue at or after one interval above target.
        let first = r.drops[0];
        assert!(first >= above.start_ns + INTERVAL && first < above.start_ns + INTERVAL + grid);
        // Then each at the first dequeue at or after the control law's schedule:
        // drop_next = d1 + interval, then drop_next + interval / sqrt(count).
        let mut scheduled = first + INTERVAL;
        for (k, drop) in r.drops.iter().enumerate().skip(1) {
            assert!(
                *drop >= scheduled && *drop < scheduled + grid,
                "drop {k} at {drop}, scheduled {scheduled}"
            );
            scheduled += (INTERVAL as f64 / ((k + 1) as f64).sqrt()) as u64;
        }
        // Every drop happened while the sojourn was above target.
        let lowest = r.sent.iter().filter(|d| d.start_ns >= first);
        assert!(lowest.map(|d| r.sojourn(d)).min().unwrap() >= TARGET);
    }

    #[test]
    fn dropping_ends_when_the_sojourn_falls_below_target() {
        // The standing 12 ms queue of the test above for 1.3 s (3 drops and more), then no
        // arrival for 9 ms, then line rate again: what arrives after waits ~3 ms.
        let mut arrivals = standing_queue(100, 2_300_000_000);
        let resume = 2_309_000_000;
        arrivals.extend((0..20_000).map(|k| resume + k * 121_120));
        let (r, link) = run(link(100_000_000, MTU), arrivals);
        assert!(r.drops.len() >= 3);
        let below = r
            .sent
            .iter()
            .find(|d| d.start_ns > 2_000_000_000 && r.sojourn(d) < TARGET)
            .unwrap();
        assert!(r.drops.iter().all(|t| *t < below.start_ns));
        let Aqm::Codel(codel) = &link.aqm else {
            panic!()
        };
        assert!(!codel.dropping());
    }

    /// The drops of two episodes: a standing queue of ~12 ms until `first_end`, a pause of
    /// 9 ms that ends the dropping state, line rate for `calm_ns` (a queue of ~3 ms), then a
    /// burst of 100 frames; split at the first frame sent below target after `first_end`.
    fn two_episodes(first_end: u64, calm_ns: u64) -> (Vec<u64>, Vec<u64>) {
        let mut arrivals = standing_queue(100, first_end);
        let resume = first_end + 9_000_000;
        let calm = calm_ns / 121_120;
        arrivals.extend((0..calm).map(|k| resume + k * 121_120));
        let burst = resume + calm * 121_120;
        arrivals.extend(std::iter::repeat_n(burst, 100));
        arrivals.extend((1..20_000).map(|k| burst + k * 121_120));
        let (r, _) = run(link(100_000_000, MTU), arrivals);
        let calm_from = r
            .sent
            .iter()
            .find(|d| d.start_ns > first_end && r.sojourn(d) < TARGET)
            .unwrap()
            .start_ns;
        r.drops.iter().partition(|t| **t < calm_from)
    }

    #[test]
    fn re_entering_soon_after_reuses_the_last_drop_rate() {
        // The first episode ends with count = its drops, lastcount = 1.
        let first_end = 1_500_000_000;
        let (first, second) = two_episodes(first_end, 200_000_000);
        let delta = first.len() as f64 - 1.0;
        assert!(delta > 1.0, "{first:?}");
        // Back within 16 intervals: count = delta, the second drop interval/sqrt(delta) on.
        let gap = second[1] - second[0];
        let expected = INTERVAL as f64 / delta.sqrt();
        assert!(
            (gap as f64 - expected).abs() < 121_120.0,
            "{gap} against {expected}"
        );
        // Back after more than 16 intervals: count starts at 1 again, one interval.
        let (_, second) = two_episodes(first_end, 1_800_000_000);
        let gap = second[1] - second[0];
        assert!(gap.abs_diff(INTERVAL) < 121_120, "{gap}");
    }

    #[test]
    fn no_drop_while_the_queue_holds_at_most_one_mtu() {
        // 1 Mbit/s: a frame takes 12.1 ms, above target. Two frames at 1 s, then one just
        // before each dequeue: every frame waits one transmission (12.1 ms) behind one other.
        let tx = 12_112_000;
        let mut arrivals = vec![1_000_000_000, 1_000_000_000];
        arrivals.extend((1..400).map(|k| 1_000_000_000 + k * tx - 1_000));
        let (r, _) = run(link(1_000_000, MTU), arrivals.clone());
        assert!(r.sent[2..].iter().all(|d| r.sojourn(d) > TARGET));
        assert!(r.drops.is_empty(), "{:?}", r.drops);
        // The same traffic with a smaller "MTU" is dropped: the rule is what spares it.
        let (r, _) = run(link(1_000_000, 1000), arrivals);
        assert!(!r.drops.is_empty());
    }
}
