//! `p4bs-model`: the software data plane on capture files, pcap or pcapng (`analyze`), or
//! live interfaces (`live`), writing its records as JSON lines (or per-link totals with
//! `--summary`).

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use p4bs_model::config::PipelineConfig;
use p4bs_model::live::{realtime_ns, LiveCapture};
use p4bs_model::pipeline::Pipeline;
use p4bs_model::record::{write_json_line, FlowEventKind, Record};
use p4bs_model::source::PcapMerge;

const USAGE: &str = "usage:
  p4bs-model analyze --config SPEC.json --pcap PORT=FILE [--pcap PORT=FILE ...]
                     [--summary] [--queue-delay-samples]
  p4bs-model live --config SPEC.json [--duration-s SECONDS] [--queue-delay-samples]

SPEC.json: links, ports (capture points: pcap ports named by --pcap, or interfaces for
live) and the pipeline's settings (p4/SPEC.md). Records go to stdout as JSON lines.";

/// Frames are held this long in live mode so the taps' copies merge in time order.
const LIVE_REORDER_NS: u64 = 50_000_000;

struct Args {
    command: String,
    config: Option<String>,
    pcaps: Vec<(String, String)>,
    summary: bool,
    queue_delay_samples: bool,
    duration_s: Option<f64>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let command = it.next().ok_or("missing command")?;
    let mut args = Args {
        command,
        config: None,
        pcaps: Vec::new(),
        summary: false,
        queue_delay_samples: false,
        duration_s: None,
    };
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match flag.as_str() {
            "--config" => args.config = Some(value("--config")?),
            "--pcap" => {
                let v = value("--pcap")?;
                let (port, file) = v
                    .split_once('=')
                    .ok_or(format!("--pcap takes PORT=FILE, got {v:?}"))?;
                args.pcaps.push((port.to_string(), file.to_string()));
            }
            "--summary" => args.summary = true,
            "--queue-delay-samples" => args.queue_delay_samples = true,
            "--duration-s" => {
                let v = value("--duration-s")?;
                args.duration_s = Some(
                    v.parse()
                        .ok()
                        .filter(|d: &f64| *d > 0.0)
                        .ok_or(format!("--duration-s must be a positive number, got {v:?}"))?,
                );
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// Per-link totals for `--summary`.
#[derive(Default)]
struct LinkTotals {
    rtt_samples: u64,
    rtt_sum_ns: u64,
    long_flow_starts: u64,
    long_flow_ends: u64,
    counters: BTreeMap<&'static str, u64>,
    queue_delay_ewma_ns: u64,
}

enum Output {
    Lines(BufWriter<io::Stdout>),
    Summary(Vec<LinkTotals>),
}

impl Output {
    fn take(&mut self, pipeline: &Pipeline, records: &mut Vec<Record>) -> io::Result<()> {
        match self {
            Output::Lines(out) => {
                for r in records.iter() {
                    write_json_line(out, r, pipeline.link_id(r.link()))?;
                }
            }
            Output::Summary(totals) => {
                for r in records.iter() {
                    let t = &mut totals[usize::from(r.link())];
                    match r {
                        Record::Rtt { rtt_ns, .. } => {
                            t.rtt_samples += 1;
                            t.rtt_sum_ns += rtt_ns;
                        }
                        Record::FlowEvent { kind, .. } => match kind {
                            FlowEventKind::Start => t.long_flow_starts += 1,
                            FlowEventKind::End => t.long_flow_ends += 1,
                        },
                        Record::Counters {
                            counters: c,
                            queue_delay_ewma_ns,
                            ..
                        } => {
                            for (name, v) in c.named() {
                                *t.counters.entry(name).or_default() += v;
                            }
                            t.queue_delay_ewma_ns = *queue_delay_ewma_ns;
                        }
                        Record::QueueDelay { .. } => {}
                    }
                }
            }
        }
        records.clear();
        Ok(())
    }

    fn finish(self, pipeline: &Pipeline, problems: &[String]) -> io::Result<()> {
        let mut out = match self {
            Output::Lines(mut out) => return out.flush(),
            Output::Summary(totals) => {
                let mut links = serde_json::Map::new();
                for (i, t) in totals.iter().enumerate() {
                    let mut o = serde_json::Map::new();
                    for (k, v) in &t.counters {
                        o.insert(k.to_string(), (*v).into());
                    }
                    o.insert("rtt_samples".into(), t.rtt_samples.into());
                    o.insert(
                        "rtt_mean_ns".into(),
                        t.rtt_sum_ns.checked_div(t.rtt_samples).into(),
                    );
                    o.insert("long_flow_starts".into(), t.long_flow_starts.into());
                    o.insert("long_flow_ends".into(), t.long_flow_ends.into());
                    o.insert("queue_delay_ewma_ns".into(), t.queue_delay_ewma_ns.into());
                    links.insert(pipeline.link_id(i as u16).to_string(), o.into());
                }
                let counters: serde_json::Map<_, _> = pipeline
                    .counters
                    .named()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.into()))
                    .collect();
                serde_json::json!({
                    "links": links,
                    "long_flows_listed_at_end": pipeline.long_flows(),
                    "counters": counters,
                    "problems": problems,
                })
            }
        };
        let stdout = io::stdout();
        let mut lock = stdout.lock();
        serde_json::to_writer_pretty(&mut lock, &out.take()).map_err(io::Error::other)?;
        writeln!(lock)
    }
}

fn report(pipeline: &Pipeline, seconds: f64, problems: &[String]) {
    let packets = pipeline.counters.parse.packets;
    let nonzero: Vec<String> = pipeline
        .counters
        .named()
        .into_iter()
        .filter(|(k, v)| *v > 0 && !matches!(*k, "packets" | "tcp_packets"))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    eprintln!(
        "p4bs-model: {packets} packets in {seconds:.2} s ({:.2} Mpps); {}",
        packets as f64 / seconds.max(1e-9) / 1e6,
        nonzero.join(", ")
    );
    for p in problems {
        eprintln!("p4bs-model: input problem: {p}");
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn run(args: Args) -> Result<(), String> {
    let path = args
        .config
        .as_deref()
        .ok_or("--config SPEC.json is required")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let config = PipelineConfig::from_json(&text).map_err(|e| format!("{path}: {e}"))?;
    let mut pipeline = Pipeline::new(&config);
    pipeline.queue_delay_records = args.queue_delay_samples;
    let mut output = if args.summary {
        Output::Summary(
            (0..pipeline.link_count())
                .map(|_| LinkTotals::default())
                .collect(),
        )
    } else {
        Output::Lines(BufWriter::with_capacity(1 << 16, io::stdout()))
    };
    let mut records = Vec::with_capacity(1024);
    let began = Instant::now();
    let mut problems = Vec::new();
    let io_err = |e: io::Error| format!("writing records: {e}");
    match args.command.as_str() {
        "analyze" => {
            if args.pcaps.is_empty() {
                return Err("analyze needs at least one --pcap PORT=FILE".into());
            }
            let mut files = Vec::new();
            for (port, file) in &args.pcaps {
                let index = pipeline
                    .port(port)
                    .ok_or(format!("--pcap {port}={file}: no port {port:?} in {path}"))?;
                files.push((index, Path::new(file.as_str())));
            }
            let mut merge = PcapMerge::open(&files)?;
            while let Some((port, ts, frame)) = merge.next() {
                pipeline.process(port, ts, frame, &mut records);
                if records.len() >= 1024 {
                    output.take(&pipeline, &mut records).map_err(io_err)?;
                }
            }
            problems.extend_from_slice(merge.problems());
        }
        "live" => {
            let interfaces: Vec<(u16, &str)> = config
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u16, p.port.as_str()))
                .collect();
            let mut capture = LiveCapture::open(&interfaces, LIVE_REORDER_NS)
                .map_err(|e| format!("live capture: {e}"))?;
            let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            unsafe {
                libc::signal(libc::SIGINT, handler);
                libc::signal(libc::SIGTERM, handler);
            }
            let deadline = args
                .duration_s
                .map(|d| began + std::time::Duration::from_secs_f64(d));
            while !STOP.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
                capture
                    .poll(20, |port, ts, frame| {
                        pipeline.process(port, ts, frame, &mut records)
                    })
                    .map_err(|e| format!("live capture: {e}"))?;
                // Intervals end on time even when the taps are quiet.
                pipeline.advance(realtime_ns().saturating_sub(LIVE_REORDER_NS), &mut records);
                output.take(&pipeline, &mut records).map_err(io_err)?;
                if let Output::Lines(out) = &mut output {
                    out.flush().map_err(io_err)?;
                }
            }
            capture.flush(|port, ts, frame| pipeline.process(port, ts, frame, &mut records));
            if capture.kernel_drops > 0 {
                problems.push(format!(
                    "the kernel dropped {} frames (capture ring full)",
                    capture.kernel_drops
                ));
            }
        }
        other => return Err(format!("unknown command {other:?}")),
    }
    pipeline.finish(&mut records);
    output.take(&pipeline, &mut records).map_err(io_err)?;
    output.finish(&pipeline, &problems).map_err(io_err)?;
    report(&pipeline, began.elapsed().as_secs_f64(), &problems);
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("p4bs-model: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.starts_with("writing records") && e.contains("Broken pipe") => {
            ExitCode::SUCCESS // the reader stopped early (e.g. `| head`)
        }
        Err(e) => {
            eprintln!("p4bs-model: {e}");
            ExitCode::FAILURE
        }
    }
}
