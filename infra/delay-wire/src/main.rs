//! delay-wire: joins two interfaces like a cable that is `delay` long.
//!
//! Every frame read on one interface is sent out of the other at its due time: the kernel's
//! receive timestamp plus half the flow's round-trip delay (see `delay.rs`). The wire has no
//! rate limit of its own, so it must never become a hidden queue: it reports how late each
//! frame left (lateness percentiles) and every frame it dropped, to a JSON stats file.
//!
//! With `--aqm red|codel` the left-to-right direction first goes through a bottleneck of its
//! own (`bottleneck.rs`): a byte-limited queue served at `--rate-bps`, RED or CoDel deciding
//! its drops; each frame's delay then runs from the end of its transmission. A copy of each
//! frame leaving that queue goes out of `--aqm-tap` (what left the queue, for the taps), and
//! the queue's counters are appended to `--aqm-log` as JSON lines, `--aqm-sample-hz` a second.

mod bottleneck;
mod codel;
mod delay;
mod red;
mod socket;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bottleneck::{Aqm, Bottleneck, Departure, QueueStats};
use codel::{Codel, CodelParams};
use delay::{flow_of, DelayPolicy, Group};
use red::{Red, RedParams};
use socket::{realtime_ns, PacketSocket};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const USAGE: &str = "usage: delay-wire --left IF --right IF [--delay-ns N] [--extra-max-ns N]
                  [--seed S] [--group CIDR=NS ...] [--max-queued N] [--stats FILE]
                  [--stats-interval-ms N]
                  [--aqm red|codel --rate-bps N --limit-bytes N [--aqm-tap IF]
                   [--aqm-log FILE] [--aqm-sample-hz N] [--aqm-seed S]
                   [--red-min-th-bytes N] [--red-max-th-bytes N] [--red-max-p P]
                   [--red-w-q W] [--red-mean-packet-bytes N] [--red-gentle true|false]
                   [--codel-target-ns N] [--codel-interval-ns N] [--codel-mtu-bytes N]]
  Adds round-trip delay N (+ a per-flow extra in [0, extra-max] from the 5-tuple hash, or with
  --seed from S's sequence in the order flows appear, or a group's fixed delay) between two
  interfaces, half in each direction. With --aqm, left to right first crosses a queue of
  --limit-bytes served at --rate-bps, RED or CoDel dropping.";

/// The AQM bottleneck's settings (`--aqm ...`).
struct AqmArgs {
    kind: String,
    rate_bps: u64,
    limit_bytes: u64,
    tap: Option<String>,
    log: Option<String>,
    sample_hz: u64,
    seed: u64,
    red: RedParams,
    red_mean_packet_bytes: u64,
    codel: CodelParams,
}

impl AqmArgs {
    fn defaults() -> AqmArgs {
        AqmArgs {
            kind: String::new(),
            rate_bps: 0,
            limit_bytes: 0,
            tap: None,
            log: None,
            sample_hz: 50,
            seed: 1,
            // testbed.py's Aqm passes every parameter; these are its defaults at 100 Mbit/s.
            red: RedParams {
                min_th_bytes: 31_250.0,
                max_th_bytes: 93_750.0,
                max_p: 0.1,
                w_q: 1.2e-4,
                idle_packet_ns: 0,
                gentle: true,
            },
            red_mean_packet_bytes: 1500,
            codel: CodelParams {
                target_ns: 5_000_000,
                interval_ns: 100_000_000,
                mtu_bytes: 1514,
            },
        }
    }

    /// The bottleneck these settings describe, or what is wrong with them.
    fn bottleneck(&self) -> Result<Bottleneck<Vec<u8>>, String> {
        if self.rate_bps == 0 || self.limit_bytes == 0 {
            return Err("--aqm needs --rate-bps and --limit-bytes (> 0)".into());
        }
        let aqm = match self.kind.as_str() {
            "red" => {
                let mut params = self.red.clone();
                params.idle_packet_ns = self.red_mean_packet_bytes * 8_000_000_000 / self.rate_bps;
                params.check()?;
                Aqm::Red(Red::new(params, self.seed))
            }
            "codel" => {
                self.codel.check()?;
                Aqm::Codel(Codel::new(self.codel.clone()))
            }
            other => return Err(format!("--aqm: {other:?} is neither red nor codel")),
        };
        Ok(Bottleneck::new(self.rate_bps, self.limit_bytes, aqm))
    }
}

struct Args {
    left: String,
    right: String,
    policy: Arc<DelayPolicy>,
    max_queued: usize,
    stats: Option<String>,
    stats_interval: Duration,
    aqm: Option<AqmArgs>,
}

fn parse_args() -> Result<Args, String> {
    let mut argv = std::env::args().skip(1);
    let (mut left, mut right, mut stats) = (None, None, None);
    let (mut base_ns, mut extra_max_ns, mut groups, mut seed) = (0, 0, vec![], None);
    let mut max_queued = 200_000;
    let mut interval_ms = 1000u64;
    let mut aqm = AqmArgs::defaults();
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v:?}"))
        };
        let real = |v: String| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag}: not a number: {v:?}"))
        };
        let boolean = |v: String| {
            v.parse::<bool>()
                .map_err(|_| format!("{flag}: true or false, not {v:?}"))
        };
        match flag.as_str() {
            "--left" => left = Some(value()?),
            "--right" => right = Some(value()?),
            "--delay-ns" => base_ns = number(value()?)?,
            "--extra-max-ns" => extra_max_ns = number(value()?)?,
            "--seed" => seed = Some(number(value()?)?),
            "--group" => groups.push(Group::parse(&value()?)?),
            "--max-queued" => max_queued = number(value()?)? as usize,
            "--stats" => stats = Some(value()?),
            "--stats-interval-ms" => interval_ms = number(value()?)?.max(10),
            "--aqm" => aqm.kind = value()?,
            "--rate-bps" => aqm.rate_bps = number(value()?)?,
            "--limit-bytes" => aqm.limit_bytes = number(value()?)?,
            "--aqm-tap" => aqm.tap = Some(value()?),
            "--aqm-log" => aqm.log = Some(value()?),
            "--aqm-sample-hz" => aqm.sample_hz = number(value()?)?.clamp(1, 1000),
            "--aqm-seed" => aqm.seed = number(value()?)?,
            "--red-min-th-bytes" => aqm.red.min_th_bytes = number(value()?)? as f64,
            "--red-max-th-bytes" => aqm.red.max_th_bytes = number(value()?)? as f64,
            "--red-max-p" => aqm.red.max_p = real(value()?)?,
            "--red-w-q" => aqm.red.w_q = real(value()?)?,
            "--red-mean-packet-bytes" => aqm.red_mean_packet_bytes = number(value()?)?,
            "--red-gentle" => aqm.red.gentle = boolean(value()?)?,
            "--codel-target-ns" => aqm.codel.target_ns = number(value()?)?,
            "--codel-interval-ns" => aqm.codel.interval_ns = number(value()?)?,
            "--codel-mtu-bytes" => aqm.codel.mtu_bytes = number(value()?)?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        left: left.ok_or("--left is required")?,
        right: right.ok_or("--right is required")?,
        policy: Arc::new(DelayPolicy::new(base_ns, extra_max_ns, groups, seed)),
        max_queued,
        stats,
        stats_interval: Duration::from_millis(interval_ms),
        aqm: (!aqm.kind.is_empty()).then_some(aqm),
    })
}

/// Lateness histogram with 1 µs buckets up to 100 ms; later frames count in the last bucket.
const BUCKETS: usize = 100_000;

/// The AQM queue as last published: its counters, what it holds, the copies sent to the tap.
#[derive(Clone, Default)]
struct QueueSummary {
    kind: &'static str,
    limit_bytes: u64,
    backlog_bytes: u64,
    backlog_packets: usize,
    stats: QueueStats,
    tap_copies: u64,
    tap_send_errors: u64,
    serve_late_sum_ns: u64,
    serve_late_max_ns: u64,
}

#[derive(Clone, Default)]
struct Summary {
    frames: u64,
    bytes: u64,
    queued: usize,
    dropped_queue_full: u64,
    dropped_at_exit: u64,
    send_errors: u64,
    kernel_drops: u64,
    late_p50_ns: u64,
    late_p99_ns: u64,
    late_max_ns: u64,
    aqm: Option<QueueSummary>,
}

/// The AQM bottleneck of a direction, where its copies go and its samples are collected.
struct QueueSide {
    queue: Bottleneck<Vec<u8>>,
    tap: Option<PacketSocket>,
    tap_copies: u64,
    tap_send_errors: u64,
    /// How late frames were handed on after their (virtual) start of transmission.
    serve_late_sum_ns: u64,
    serve_late_max_ns: u64,
    /// JSON lines of the queue's counters, taken every `sample_ns`; main() writes them out.
    samples: Arc<Mutex<Vec<String>>>,
    sample_ns: u64,
}

impl QueueSide {
    fn summary(&self) -> QueueSummary {
        QueueSummary {
            kind: self.queue.aqm.kind(),
            limit_bytes: self.queue.limit_bytes,
            backlog_bytes: self.queue.backlog_bytes(),
            backlog_packets: self.queue.backlog_packets(),
            stats: self.queue.stats.clone(),
            tap_copies: self.tap_copies,
            tap_send_errors: self.tap_send_errors,
            serve_late_sum_ns: self.serve_late_sum_ns,
            serve_late_max_ns: self.serve_late_max_ns,
        }
    }

    /// A copy of `frame` to the tap (what left the queue).
    fn copy_to_tap(&mut self, frame: &[u8]) {
        if let Some(tap) = &self.tap {
            if tap.send(frame) {
                self.tap_copies += 1;
            } else {
                self.tap_send_errors += 1;
            }
        }
    }

    /// One sample, in the shape of the router's qdisc samples (trafficgen's qdisc-log) plus
    /// the AQM's own counters.
    fn sample(&self, ts_ns: u64) {
        let q = &self.queue;
        let s = &q.stats;
        let line = format!(
            "{{\"ts_ns\":{ts_ns},\"handle\":0,\"kind\":\"{}\",\"limit_bytes\":{},\
             \"backlog_bytes\":{},\"qlen\":{},\"drops\":{},\"aqm_drops\":{},\
             \"overflow_drops\":{},\"sent_bytes\":{},\"sent_packets\":{},\
             \"sojourn_sum_ns\":{}{}}}",
            q.aqm.kind(),
            q.limit_bytes,
            q.backlog_bytes(),
            q.backlog_packets(),
            s.aqm_drops + s.overflow_drops,
            s.aqm_drops,
            s.overflow_drops,
            s.sent_bytes,
            s.sent_packets,
            s.sojourn_sum_ns,
            match &q.aqm {
                Aqm::Red(red) => format!(",\"red_avg_bytes\":{:.0}", red.average()),
                Aqm::Codel(codel) => format!(",\"codel_dropping\":{}", codel.dropping()),
            }
        );
        self.samples.lock().unwrap().push(line);
    }
}

/// Frames waiting for their due time: a flow's delay added to when they left the queue.
struct Held {
    /// (due, arrival order) keeps a flow's frames in order: one flow, one delay.
    pending: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>,
    order: u64,
    policy: Arc<DelayPolicy>,
    first_half: bool,
    max_queued: usize,
}

impl Held {
    /// Holds `frame` for its half of its flow's round trip, counted from `from_ns`.
    fn hold(&mut self, frame: Vec<u8>, from_ns: u64, summary: &mut Summary) {
        let rtt = self.policy.round_trip_ns(flow_of(&frame));
        let half = if self.first_half {
            rtt / 2
        } else {
            rtt - rtt / 2
        };
        if self.pending.len() >= self.max_queued {
            summary.dropped_queue_full += 1;
            return;
        }
        self.order += 1;
        self.pending
            .push(Reverse((from_ns + half, self.order, frame)));
    }
}

struct Direction {
    name: &'static str,
    rx: PacketSocket,
    tx: PacketSocket,
    late_us: Vec<u64>,
    summary: Summary,
    queue: Option<QueueSide>,
}

impl Direction {
    fn percentile(&self, q: f64) -> u64 {
        let total: u64 = self.late_us.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (us, count) in self.late_us.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return us as u64 * 1000;
            }
        }
        (BUCKETS as u64 - 1) * 1000
    }

    fn publish(&mut self, queued: usize, shared: &Mutex<Summary>) {
        self.summary.queued = queued;
        self.summary.kernel_drops += self.rx.take_kernel_drops();
        self.summary.late_p50_ns = self.percentile(0.50);
        self.summary.late_p99_ns = self.percentile(0.99);
        self.summary.aqm = self.queue.as_ref().map(QueueSide::summary);
        *shared.lock().unwrap() = self.summary.clone();
    }

    /// Moves frames from rx to tx, each at its due time, until STOP.
    fn run(
        mut self,
        policy: Arc<DelayPolicy>,
        first_half: bool,
        max_queued: usize,
        shared: Arc<Mutex<Summary>>,
    ) {
        let mut held = Held {
            pending: BinaryHeap::new(),
            order: 0,
            policy,
            first_half,
            max_queued,
        };
        let pending = &mut held;
        let mut served: Vec<Departure<Vec<u8>>> = vec![];
        let mut buf = vec![0u8; 65_600];
        let mut last_publish = 0u64;
        let mut next_sample = 0u64;
        while !STOP.load(Ordering::Relaxed) {
            let now = realtime_ns();
            let mut wake = now + 50_000_000;
            if let Some(Reverse((due, _, _))) = pending.pending.peek() {
                wake = wake.min(*due);
            }
            if let Some(side) = &self.queue {
                wake = wake.min(next_sample);
                if let Some(start) = side.queue.next_service_ns() {
                    wake = wake.min(start);
                }
            }
            if self.rx.wait_readable(wake.saturating_sub(now)) {
                while let Some((len, rx_ns)) = self.rx.recv(&mut buf) {
                    let frame = buf[..len].to_vec();
                    match &mut self.queue {
                        // ARP and other non-IPv4 frames pass the AQM (as a router's control
                        // traffic does): a dropped ARP request would stall the link for
                        // seconds. The tap still gets their copy, as the mirror gave it.
                        Some(side) if flow_of(&frame).is_some() => {
                            side.queue.arrive(frame, len as u64, rx_ns, &mut served)
                        }
                        Some(side) => {
                            side.copy_to_tap(&frame);
                            pending.hold(frame, rx_ns, &mut self.summary)
                        }
                        None => pending.hold(frame, rx_ns, &mut self.summary),
                    }
                }
            }
            if let Some(side) = &mut self.queue {
                let now = realtime_ns();
                side.queue.serve_until(now, &mut served);
                for departure in served.drain(..) {
                    let late = now.saturating_sub(departure.start_ns);
                    side.serve_late_sum_ns += late;
                    side.serve_late_max_ns = side.serve_late_max_ns.max(late);
                    side.copy_to_tap(&departure.item);
                    pending.hold(departure.item, departure.done_ns, &mut self.summary);
                }
                if now >= next_sample {
                    side.sample(now);
                    next_sample = (now / side.sample_ns + 1) * side.sample_ns;
                }
            }
            let mut now = realtime_ns();
            while let Some(Reverse((due, _, _))) = pending.pending.peek() {
                if *due > now {
                    break;
                }
                let Reverse((due, _, frame)) = pending.pending.pop().unwrap();
                // Lateness counts until the frame is handed on; what the next hops' kernel
                // work costs inside send() is theirs.
                let late = now.saturating_sub(due);
                self.summary.late_max_ns = self.summary.late_max_ns.max(late);
                self.late_us[((late / 1000) as usize).min(BUCKETS - 1)] += 1;
                if self.tx.send(&frame) {
                    self.summary.frames += 1;
                    self.summary.bytes += frame.len() as u64;
                } else {
                    self.summary.send_errors += 1;
                }
                now = realtime_ns();
            }
            if now - last_publish > 100_000_000 {
                self.publish(pending.pending.len(), &shared);
                last_publish = now;
            }
        }
        let in_queue = self.queue.as_ref().map_or(0, |q| q.queue.backlog_packets());
        self.summary.dropped_at_exit = (pending.pending.len() + in_queue) as u64;
        self.publish(0, &shared);
    }
}

fn write_stats(path: &str, args: &Args, sides: &[(&str, Arc<Mutex<Summary>>)]) {
    let seed = args
        .policy
        .seed
        .map_or("null".to_string(), |s| s.to_string());
    let mut json = format!(
        "{{\"left\":\"{}\",\"right\":\"{}\",\"delay_ns\":{},\"extra_max_ns\":{},\"seed\":{seed},\"ts_ns\":{},\"directions\":{{",
        args.left, args.right, args.policy.base_ns, args.policy.extra_max_ns, realtime_ns()
    );
    for (i, (name, shared)) in sides.iter().enumerate() {
        let s = shared.lock().unwrap().clone();
        json +=
            &format!(
            "{}\"{name}\":{{\"frames\":{},\"bytes\":{},\"queued\":{},\"dropped_queue_full\":{},\
             \"dropped_at_exit\":{},\"send_errors\":{},\"kernel_drops\":{},\"late_p50_ns\":{},\
             \"late_p99_ns\":{},\"late_max_ns\":{}}}",
            if i > 0 { "," } else { "" },
            s.frames, s.bytes, s.queued, s.dropped_queue_full, s.dropped_at_exit, s.send_errors,
            s.kernel_drops, s.late_p50_ns, s.late_p99_ns, s.late_max_ns
        );
        if let Some(q) = &s.aqm {
            let st = &q.stats;
            json.pop(); // the direction's closing brace: its queue goes inside
            json += &format!(
                ",\"aqm\":{{\"kind\":\"{}\",\"limit_bytes\":{},\"backlog_bytes\":{},\
                 \"backlog_packets\":{},\"sent_packets\":{},\"sent_bytes\":{},\
                 \"aqm_drops\":{},\"overflow_drops\":{},\"sojourn_sum_ns\":{},\
                 \"sojourn_max_ns\":{},\"tap_copies\":{},\"tap_send_errors\":{},\
                 \"serve_late_sum_ns\":{},\"serve_late_max_ns\":{}}}}}",
                q.kind,
                q.limit_bytes,
                q.backlog_bytes,
                q.backlog_packets,
                st.sent_packets,
                st.sent_bytes,
                st.aqm_drops,
                st.overflow_drops,
                st.sojourn_sum_ns,
                st.sojourn_max_ns,
                q.tap_copies,
                q.tap_send_errors,
                q.serve_late_sum_ns,
                q.serve_late_max_ns
            );
        }
    }
    json += "}}\n";
    let tmp = format!("{path}.tmp");
    if std::fs::write(&tmp, json)
        .and_then(|_| std::fs::rename(&tmp, path))
        .is_err()
    {
        eprintln!("delay-wire: cannot write stats to {path}");
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("delay-wire: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let open = |name: &str| {
        socket::open(name).unwrap_or_else(|e| {
            eprintln!("delay-wire: {name}: {e}");
            std::process::exit(1);
        })
    };
    let samples = Arc::new(Mutex::new(Vec::<String>::new()));
    let queue = args.aqm.as_ref().map(|aqm| {
        let queue = aqm.bottleneck().unwrap_or_else(|e| {
            eprintln!("delay-wire: {e}");
            std::process::exit(2);
        });
        let tap = aqm.tap.as_ref().map(|name| {
            socket::open_sender(name).unwrap_or_else(|e| {
                eprintln!("delay-wire: --aqm-tap {name}: {e}");
                std::process::exit(1);
            })
        });
        QueueSide {
            queue,
            tap,
            tap_copies: 0,
            tap_send_errors: 0,
            serve_late_sum_ns: 0,
            serve_late_max_ns: 0,
            samples: samples.clone(),
            sample_ns: 1_000_000_000 / aqm.sample_hz,
        }
    });
    let mut sample_log = args.aqm.as_ref().and_then(|a| a.log.as_ref()).map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| {
                eprintln!("delay-wire: --aqm-log {path}: {e}");
                std::process::exit(1);
            })
    });
    // Separate rx and tx sockets per interface: each direction thread owns its pair.
    let directions = [
        Direction {
            name: "left_to_right",
            rx: open(&args.left),
            tx: open(&args.right),
            late_us: vec![0; BUCKETS],
            summary: Summary::default(),
            queue,
        },
        Direction {
            name: "right_to_left",
            rx: open(&args.right),
            tx: open(&args.left),
            late_us: vec![0; BUCKETS],
            summary: Summary::default(),
            queue: None,
        },
    ];
    unsafe {
        libc::signal(
            libc::SIGTERM,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGINT,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let mut sides = vec![];
    let mut threads = vec![];
    for (i, d) in directions.into_iter().enumerate() {
        let shared = Arc::new(Mutex::new(Summary::default()));
        sides.push((d.name, shared.clone()));
        let policy = args.policy.clone();
        let max_queued = args.max_queued;
        threads.push(std::thread::spawn(move || {
            d.run(policy, i == 0, max_queued, shared)
        }));
    }
    eprintln!("delay-wire: {} <-> {} ready", args.left, args.right);
    let mut write_samples = || {
        let lines = std::mem::take(&mut *samples.lock().unwrap());
        if let Some(log) = &mut sample_log {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            if log.write_all(text.as_bytes()).is_err() {
                eprintln!("delay-wire: cannot append to the --aqm-log file");
            }
        }
    };
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(args.stats_interval.min(Duration::from_millis(100)));
        if let Some(path) = &args.stats {
            write_stats(path, &args, &sides);
        }
        write_samples();
    }
    for t in threads {
        let _ = t.join();
    }
    if let Some(path) = &args.stats {
        write_stats(path, &args, &sides);
    }
    write_samples();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aqm(kind: &str) -> AqmArgs {
        AqmArgs {
            kind: kind.into(),
            rate_bps: 100_000_000,
            limit_bytes: 2_500_000,
            ..AqmArgs::defaults()
        }
    }

    #[test]
    fn aqm_settings_make_their_bottleneck() {
        let red = aqm("red").bottleneck().unwrap();
        let Aqm::Red(r) = &red.aqm else { panic!() };
        // One 1500-byte packet at 100 Mbit/s: the idle-time correction's unit.
        assert_eq!(r.params.idle_packet_ns, 120_000);
        assert_eq!(red.limit_bytes, 2_500_000);
        assert_eq!(aqm("codel").bottleneck().unwrap().aqm.kind(), "codel");
    }

    #[test]
    fn bad_aqm_settings_are_named() {
        let error = |a: AqmArgs| a.bottleneck().err().unwrap();
        assert!(error(aqm("pie")).contains("neither red nor codel"));
        assert!(error(AqmArgs {
            rate_bps: 0,
            ..aqm("red")
        })
        .contains("--rate-bps"));
        let mut inverted = aqm("red");
        inverted.red.min_th_bytes = 1e6;
        assert!(error(inverted).contains("min_th"));
        let mut slow = aqm("codel");
        slow.codel.target_ns = slow.codel.interval_ns;
        assert!(error(slow).contains("target"));
    }
}
