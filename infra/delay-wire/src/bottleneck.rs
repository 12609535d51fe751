//! The wire's own bottleneck (AQM mode): a byte-limited queue served at the link's rate, with
//! RED deciding at each arrival or CoDel at each dequeue which packets to drop.
//!
//! Time is virtual: a frame arrives at its kernel receive stamp and starts its transmission at
//! max(its arrival, the end of the previous frame's), which takes len * 8 / rate. The loop
//! that drives it (main.rs) only decides when a served frame is handed on: a late wake-up
//! sends frames late (the wire's lateness says so), but changes neither what the queue holds
//! nor the link's rate. An idle link earns no credit: after idling, frames go at line rate.

use std::collections::VecDeque;

use crate::codel::Codel;
use crate::red::{Red, Verdict};

pub struct Queued<T> {
    pub item: T,
    pub len: u64,
    pub arrival_ns: u64,
}

/// A FIFO that knows how many bytes it holds.
pub struct ByteFifo<T> {
    packets: VecDeque<Queued<T>>,
    bytes: u64,
}

impl<T> ByteFifo<T> {
    pub fn new() -> Self {
        ByteFifo {
            packets: VecDeque::new(),
            bytes: 0,
        }
    }

    pub fn push(&mut self, packet: Queued<T>) {
        self.bytes += packet.len;
        self.packets.push_back(packet);
    }

    pub fn pop(&mut self) -> Option<Queued<T>> {
        let packet = self.packets.pop_front()?;
        self.bytes -= packet.len;
        Some(packet)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    fn front(&self) -> Option<&Queued<T>> {
        self.packets.front()
    }
}

pub enum Aqm {
    Red(Red),
    Codel(Codel),
}

impl Aqm {
    pub fn kind(&self) -> &'static str {
        match self {
            Aqm::Red(_) => "red",
            Aqm::Codel(_) => "codel",
        }
    }
}

/// The queue's counters since it was made (what the wire's samples and summary report).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueStats {
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Dropped by the AQM: RED's early and forced drops, CoDel's.
    pub aqm_drops: u64,
    /// Dropped because the byte limit (the buffer) was full.
    pub overflow_drops: u64,
    /// Sum and maximum of the sent packets' sojourn (arrival to start of transmission).
    pub sojourn_sum_ns: u64,
    pub sojourn_max_ns: u64,
}

/// A frame leaving the queue: its transmission runs from `start_ns` to `done_ns`.
pub struct Departure<T> {
    pub item: T,
    pub start_ns: u64,
    pub done_ns: u64,
}

pub struct Bottleneck<T> {
    rate_bps: u64,
    pub limit_bytes: u64,
    fifo: ByteFifo<T>,
    pub aqm: Aqm,
    /// When the frame on the link has left it (the link is idle from then on).
    link_free_ns: u64,
    /// The latest time the queue has been brought to: arrivals are never earlier.
    clock_ns: u64,
    pub stats: QueueStats,
}

impl<T> Bottleneck<T> {
    pub fn new(rate_bps: u64, limit_bytes: u64, aqm: Aqm) -> Self {
        Bottleneck {
            rate_bps,
            limit_bytes,
            fifo: ByteFifo::new(),
            aqm,
            link_free_ns: 0,
            clock_ns: 0,
            stats: QueueStats::default(),
        }
    }

    pub fn backlog_bytes(&self) -> u64 {
        self.fifo.bytes()
    }

    pub fn backlog_packets(&self) -> usize {
        self.fifo.len()
    }

    /// The time `len` bytes take on the link, to the nearest ns.
    pub fn transmission_ns(&self, len: u64) -> u64 {
        let rate = u128::from(self.rate_bps);
        ((u128::from(len) * 8_000_000_000 + rate / 2) / rate) as u64
    }

    /// When the head of the queue starts its transmission (None: the queue is empty).
    pub fn next_service_ns(&self) -> Option<u64> {
        self.fifo
            .front()
            .map(|head| head.arrival_ns.max(self.link_free_ns))
    }

    /// A frame of `len` bytes arriving at `at_ns`: the queue is first served up to then
    /// (departures into `out`), then the AQM and the byte limit decide on it.
    pub fn arrive(&mut self, item: T, len: u64, at_ns: u64, out: &mut Vec<Departure<T>>) {
        self.serve_until(at_ns, out);
        let at = at_ns.max(self.clock_ns);
        self.clock_ns = at;
        if let Aqm::Red(red) = &mut self.aqm {
            let idle_ns = if self.fifo.len() == 0 {
                at.saturating_sub(self.link_free_ns)
            } else {
                0
            };
            if red.on_arrival(self.fifo.bytes(), idle_ns) != Verdict::Accept {
                self.stats.aqm_drops += 1;
                return;
            }
        }
        if self.fifo.bytes() + len > self.limit_bytes {
            self.stats.overflow_drops += 1;
            if let Aqm::Red(red) = &mut self.aqm {
                red.on_overflow();
            }
            return;
        }
        self.fifo.push(Queued {
            item,
            len,
            arrival_ns: at,
        });
        self.serve_until(at, out);
    }

    /// Serves every frame whose transmission starts at or before `now_ns`, into `out`.
    pub fn serve_until(&mut self, now_ns: u64, out: &mut Vec<Departure<T>>) {
        while let Some(start) = self.next_service_ns() {
            if start > now_ns {
                break;
            }
            self.clock_ns = self.clock_ns.max(start);
            let stats = &mut self.stats;
            let served = match &mut self.aqm {
                Aqm::Red(_) => self.fifo.pop(),
                Aqm::Codel(codel) => {
                    codel.dequeue(start, &mut self.fifo, &mut |_| stats.aqm_drops += 1)
                }
            };
            let Some(packet) = served else { continue };
            let done = start + self.transmission_ns(packet.len);
            let sojourn = start - packet.arrival_ns;
            self.stats.sent_packets += 1;
            self.stats.sent_bytes += packet.len;
            self.stats.sojourn_sum_ns += sojourn;
            self.stats.sojourn_max_ns = self.stats.sojourn_max_ns.max(sojourn);
            self.link_free_ns = done;
            out.push(Departure {
                item: packet.item,
                start_ns: start,
                done_ns: done,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codel::CodelParams;
    use crate::red::RedParams;

    const RATE: u64 = 100_000_000;
    const MTU: u64 = 1514;

    fn codel() -> Aqm {
        Aqm::Codel(Codel::new(CodelParams {
            target_ns: 5_000_000,
            interval_ns: 100_000_000,
            mtu_bytes: MTU,
        }))
    }

    /// A RED that never drops early (thresholds far above the limit): a plain FIFO.
    fn fifo_only() -> Aqm {
        Aqm::Red(Red::new(
            RedParams {
                min_th_bytes: 1e12,
                max_th_bytes: 2e12,
                max_p: 0.1,
                w_q: 0.002,
                idle_packet_ns: 120_000,
                gentle: true,
            },
            1,
        ))
    }

    /// A deterministic mix of frame sizes, 64..=1514 bytes.
    fn size(i: u64) -> u64 {
        64 + crate::delay::mix(i) % (MTU - 63)
    }

    #[test]
    fn a_saturated_link_sends_at_its_rate_exactly() {
        let mut link = Bottleneck::new(RATE, 20_000_000, fifo_only());
        let mut out = vec![];
        // Twice the line rate offered for one second.
        let mut t = 1_000_000_000u64;
        let mut i = 0;
        while t < 2_000_000_000 {
            let len = size(i);
            link.arrive(i, len, t, &mut out);
            t += link.transmission_ns(len) / 2;
            i += 1;
        }
        link.serve_until(4_000_000_000, &mut out);
        // Back to back: each frame starts when the previous one is done.
        for pair in out.windows(2) {
            assert_eq!(pair[1].start_ns, pair[0].done_ns);
        }
        // Bytes sent by time t (frames done by then) are within one frame of rate * elapsed.
        let start = out[0].start_ns;
        let mut sent = 0u64;
        for d in &out {
            sent += size(d.item);
            let ideal = (d.done_ns - start) as f64 * RATE as f64 / 8e9;
            assert!(
                (sent as f64 - ideal).abs() < 1.0,
                "{sent} B by {}",
                d.done_ns
            );
        }
        assert_eq!(link.stats.overflow_drops, 0);
        assert_eq!(link.stats.sent_packets, i);
    }

    #[test]
    fn the_drivers_wake_ups_do_not_change_the_schedule() {
        // The same arrivals served by a loop that wakes every 10 us and by one that stalls
        // for up to 30 ms: the same frames start at the same (virtual) times.
        // 1.25 times the line rate on average, in uneven gaps: CoDel has to drop.
        let arrivals: Vec<(u64, u64)> = (0..40_000)
            .map(|i| {
                (
                    1_000_000_000 + i * 40_000 + crate::delay::mix(i) % 20_000,
                    size(i),
                )
            })
            .collect();
        let run = |wake_ups: &mut dyn Iterator<Item = u64>| {
            let mut link = Bottleneck::new(RATE, 200_000, codel());
            let mut out = vec![];
            let mut next = arrivals.iter().peekable();
            for now in wake_ups {
                while let Some((at, len)) = next.next_if(|(at, _)| *at <= now) {
                    link.arrive(*at, *len, *at, &mut out);
                }
                link.serve_until(now, &mut out);
            }
            (
                out.iter().map(|d| (d.item, d.start_ns)).collect::<Vec<_>>(),
                link.stats,
            )
        };
        let fine = run(&mut (0..300_000).map(|k| 1_000_000_000 + k * 10_000));
        let mut stalls = (0..).scan(1_000_000_000u64, |t, k: u64| {
            *t += 1_000 + crate::delay::mix(k) % 30_000_000;
            Some(*t)
        });
        let stalled = run(&mut stalls.by_ref().take_while(|t| *t < 4_000_000_000));
        assert_eq!(fine, stalled);
        assert!(fine.1.aqm_drops > 0, "the test should make CoDel drop");
    }

    #[test]
    fn an_idle_link_earns_no_credit() {
        let mut link = Bottleneck::new(RATE, 1_000_000, fifo_only());
        let mut out = vec![];
        link.arrive(0, MTU, 1_000_000, &mut out);
        // Long idle, then a burst of ten frames at one instant: still one per 121.12 us.
        for i in 1..=10 {
            link.arrive(i, MTU, 900_000_000, &mut out);
        }
        link.serve_until(u64::MAX / 2, &mut out);
        let starts: Vec<u64> = out[1..].iter().map(|d| d.start_ns).collect();
        let expected: Vec<u64> = (0..10).map(|k| 900_000_000 + k * 121_120).collect();
        assert_eq!(starts, expected);
    }

    #[test]
    fn the_byte_limit_drops_what_does_not_fit() {
        let mut link = Bottleneck::new(RATE, 10 * MTU, fifo_only());
        let mut out = vec![];
        // 20 frames at once: one goes on the link at once, ten fill the buffer, nine overflow.
        for i in 0..20 {
            link.arrive(i, MTU, 1_000, &mut out);
        }
        assert_eq!(link.stats.overflow_drops, 9);
        assert_eq!(link.backlog_bytes(), 10 * MTU);
        assert_eq!(link.stats.aqm_drops, 0);
    }

    #[test]
    fn red_holds_an_overload_below_the_byte_limit() {
        // Defaults for 100 Mbit/s, w_q large enough to follow a one-second test.
        let red = Red::new(
            RedParams {
                min_th_bytes: 31_250.0,
                max_th_bytes: 93_750.0,
                max_p: 0.1,
                w_q: 0.002,
                idle_packet_ns: 121_120,
                gentle: true,
            },
            5,
        );
        let mut link = Bottleneck::new(RATE, 1_000_000, Aqm::Red(red));
        let mut out = vec![];
        // 1.5 times the line rate for a second: RED drops before the buffer is full.
        let mut t = 0;
        for i in 0..12_500 {
            link.arrive(i, MTU, t, &mut out);
            t += 80_747;
        }
        let s = &link.stats;
        assert!(s.aqm_drops > 1000, "{s:?}");
        // Average queue held in the RED region: the queue's mean sojourn between the
        // thresholds' delays (2.5 and 15 ms at this rate).
        let mean_sojourn = s.sojourn_sum_ns / s.sent_packets;
        assert!((2_500_000..15_000_000).contains(&mean_sojourn), "{s:?}");
        assert_eq!(
            s.overflow_drops, 0,
            "RED, not the byte limit, held the queue"
        );
        // It settles where RED drops the excess third: 2 p_b / (1 + p_b) = 1/3, p_b = 0.2, in
        // the gentle region at avg = max_th (1 + 0.1 / 0.9) = 104 kB.
        let Aqm::Red(red) = &link.aqm else { panic!() };
        assert!(
            (red.average() / 104_167.0 - 1.0).abs() < 0.1,
            "{}",
            red.average()
        );
    }
}
