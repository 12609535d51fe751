//! delay-wire: joins two interfaces like a cable that is `delay` long.
//!
//! Every frame read on one interface is sent out of the other at its due time: the kernel's
//! receive timestamp plus half the flow's round-trip delay (see `delay.rs`). The wire has no
//! rate limit of its own, so it must never become a hidden queue: it reports how late each
//! frame left (lateness percentiles) and every frame it dropped, to a JSON stats file.

mod delay;
mod socket;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use delay::{flow_of, DelayPolicy, Group};
use socket::{realtime_ns, PacketSocket};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const USAGE: &str = "usage: delay-wire --left IF --right IF [--delay-ns N] [--extra-max-ns N]
                  [--seed S] [--group CIDR=NS ...] [--max-queued N] [--stats FILE]
                  [--stats-interval-ms N]
  Adds round-trip delay N (+ a per-flow extra in [0, extra-max] from the 5-tuple hash, or with
  --seed from S's sequence in the order flows appear, or a group's fixed delay) between two
  interfaces, half in each direction.";

struct Args {
    left: String,
    right: String,
    policy: Arc<DelayPolicy>,
    max_queued: usize,
    stats: Option<String>,
    stats_interval: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut argv = std::env::args().skip(1);
    let (mut left, mut right, mut stats) = (None, None, None);
    let (mut base_ns, mut extra_max_ns, mut groups, mut seed) = (0, 0, vec![], None);
    let mut max_queued = 200_000;
    let mut interval_ms = 1000u64;
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v:?}"))
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
    })
}

/// Lateness histogram with 1 µs buckets up to 100 ms; later frames count in the last bucket.
const BUCKETS: usize = 100_000;

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
}

struct Direction {
    name: &'static str,
    rx: PacketSocket,
    tx: PacketSocket,
    late_us: Vec<u64>,
    summary: Summary,
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
        // (due, arrival order) keeps a flow's frames in order: one flow, one delay.
        let mut pending: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>> = BinaryHeap::new();
        let mut order = 0u64;
        let mut buf = vec![0u8; 65_600];
        let mut last_publish = 0u64;
        while !STOP.load(Ordering::Relaxed) {
            let now = realtime_ns();
            let wait_ns = match pending.peek() {
                Some(Reverse((due, _, _))) => due.saturating_sub(now).min(50_000_000),
                None => 50_000_000,
            };
            if self.rx.wait_readable(wait_ns) {
                while let Some((len, rx_ns)) = self.rx.recv(&mut buf) {
                    let frame = &buf[..len];
                    let rtt = policy.round_trip_ns(flow_of(frame));
                    let hold = if first_half { rtt / 2 } else { rtt - rtt / 2 };
                    if pending.len() >= max_queued {
                        self.summary.dropped_queue_full += 1;
                        continue;
                    }
                    order += 1;
                    pending.push(Reverse((rx_ns + hold, order, frame.to_vec())));
                }
            }
            let mut now = realtime_ns();
            while let Some(Reverse((due, _, _))) = pending.peek() {
                if *due > now {
                    break;
                }
                let Reverse((due, _, frame)) = pending.pop().unwrap();
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
                self.publish(pending.len(), &shared);
                last_publish = now;
            }
        }
        self.summary.dropped_at_exit = pending.len() as u64;
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
    // Separate rx and tx sockets per interface: each direction thread owns its pair.
    let directions = [
        Direction {
            name: "left_to_right",
            rx: open(&args.left),
            tx: open(&args.right),
            late_us: vec![0; BUCKETS],
            summary: Summary::default(),
        },
        Direction {
            name: "right_to_left",
            rx: open(&args.right),
            tx: open(&args.left),
            late_us: vec![0; BUCKETS],
            summary: Summary::default(),
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
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(args.stats_interval.min(Duration::from_millis(100)));
        if let Some(path) = &args.stats {
            write_stats(path, &args, &sides);
        }
    }
    for t in threads {
        let _ = t.join();
    }
    if let Some(path) = &args.stats {
        write_stats(path, &args, &sides);
    }
}
