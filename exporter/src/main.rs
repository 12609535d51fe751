//! `p4bs-exporter`: runs the software data plane (p4bs-model) on pcap files or live
//! interfaces and produces, per link and export interval, one `LinkCounters` record (its
//! counters, long-flow events and RTT samples; several when the samples are many) to Kafka as
//! Avro, keyed by link id, with the same headers as the Python producer. Its counters go to a
//! stats JSON file every interval.
//!
//! Exit codes: 0 done (every record delivered), 1 runtime failure, 2 bad spec or arguments.

mod avro;
mod intervals;
mod kafka;
mod metrics;
mod spec;
mod stats;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use p4bs_model::live::{realtime_ns, LiveCapture};
use p4bs_model::pipeline::Pipeline;
use p4bs_model::record::Record;
use p4bs_model::source::PcapMerge;

use kafka::{Full, Sink};
use metrics::Metrics;
use spec::{Pace, RunSpec, Source};
use stats::Monitor;

const USAGE: &str = "usage: p4bs-exporter --spec RUN.json [--check]

RUN.json (written by `p4bs exporter run`, see exporter/README.md): the pipeline spec, Kafka,
the link_counters topic and schema, the source (pcap files or live interfaces), the stats
file and the metrics endpoint (metrics_address: GET /metrics, Prometheus). --check validates it and exits. Exit codes: 0 ok, 1 runtime failure, 2 bad spec.";

/// Live frames are held this long so the taps' copies merge in time order (as p4bs-model).
const LIVE_REORDER_NS: u64 = 50_000_000;
/// Records are handed to Kafka in chunks of about this many.
const CHUNK: usize = 1024;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Joins the network namespace in `fd` (this thread only; threads started later inherit it).
fn setns(fd: &File, what: &str) -> Result<(), String> {
    // SAFETY: setns on a valid descriptor; it changes only this thread's namespace.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("{what}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Opens the capture rings, inside network namespace `netns` if given, and comes back to the
/// namespace it started in (packet sockets stay bound to the interfaces they were opened on),
/// so that Kafka is reached from the root namespace.
fn open_live(ports: &[(u16, &str)], netns: Option<&str>) -> Result<LiveCapture, String> {
    let open = || {
        LiveCapture::open(ports, LIVE_REORDER_NS).map_err(|e| {
            let names: Vec<&str> = ports.iter().map(|(_, n)| *n).collect();
            format!("live capture on {}: {e}", names.join(", "))
        })
    };
    let Some(name) = netns else {
        return open();
    };
    let home = File::open("/proc/self/ns/net")
        .map_err(|e| format!("own network namespace (/proc/self/ns/net): {e}"))?;
    let path = Path::new("/var/run/netns").join(name);
    let target = File::open(&path)
        .map_err(|e| format!("network namespace {name:?} ({}): {e}", path.display()))?;
    setns(&target, &format!("entering network namespace {name:?}"))?;
    let capture = open();
    setns(&home, "returning to the exporter's network namespace")?;
    capture.map_err(|e| format!("{e} (in network namespace {name:?})"))
}

enum Input {
    Pcap(PcapMerge, Pace),
    Live(LiveCapture),
}

fn open_input(spec: &RunSpec, pipeline: &Pipeline) -> Result<Input, String> {
    match &spec.source {
        Source::Pcap { files, pace } => {
            let indexed: Vec<(u16, &Path)> = files
                .iter()
                .map(|(port, file)| (pipeline.port(port).expect("checked spec"), file.as_path()))
                .collect();
            Ok(Input::Pcap(PcapMerge::open(&indexed)?, *pace))
        }
        Source::Live { netns } => {
            let ports: Vec<(u16, &str)> = spec
                .pipeline
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u16, p.port.as_str()))
                .collect();
            Ok(Input::Live(open_live(&ports, netns.as_deref())?))
        }
    }
}

/// New input problems go to the stats and to stderr.
fn note_problems(monitor: &mut Monitor, problems: &[String]) {
    for p in &problems[monitor.problems.len().min(problems.len())..] {
        eprintln!("p4bs-exporter: input problem: {p}");
        monitor.problems.push(p.clone());
    }
}

fn run_pcap(
    merge: &mut PcapMerge,
    pace: Pace,
    pipeline: &mut Pipeline,
    sink: &mut Sink,
    monitor: &mut Monitor,
    records: &mut Vec<Record>,
) {
    let mut clock: Option<(u64, Instant)> = None;
    let mut frames: u32 = 0;
    while let Some((port, ts, frame)) = merge.next() {
        if pace == Pace::Realtime {
            let (t0, w0) = *clock.get_or_insert((ts, Instant::now()));
            let due = w0 + Duration::from_nanos(ts.saturating_sub(t0));
            loop {
                let now = Instant::now();
                if now >= due || stopped() {
                    break;
                }
                sink.poll((due - now).min(Duration::from_millis(5)));
                monitor.tick(sink, pipeline);
            }
        }
        pipeline.process(port, ts, frame, records);
        if records.len() >= CHUNK || (pace == Pace::Realtime && !records.is_empty()) {
            sink.send_all(records, Full::Wait, |s| monitor.tick(s, pipeline));
        }
        frames = frames.wrapping_add(1);
        if frames.is_multiple_of(4096) || pace == Pace::Realtime {
            note_problems(monitor, merge.problems());
            monitor.tick(sink, pipeline);
            if stopped() || sink.fatal().is_some() {
                break;
            }
        }
    }
    note_problems(monitor, merge.problems());
}

fn run_live(
    capture: &mut LiveCapture,
    pipeline: &mut Pipeline,
    sink: &mut Sink,
    monitor: &mut Monitor,
    records: &mut Vec<Record>,
) -> Result<(), String> {
    while !stopped() && sink.fatal().is_none() {
        capture
            .poll(20, |port, ts, frame| {
                pipeline.process(port, ts, frame, records);
                if records.len() >= CHUNK {
                    sink.send_all(records, Full::Drop, |_| {});
                }
            })
            .map_err(|e| format!("live capture: {e}"))?;
        // Intervals end (and their records go) on time even when the taps are quiet.
        let now = realtime_ns().saturating_sub(LIVE_REORDER_NS);
        pipeline.advance(now, records);
        sink.send_all(records, Full::Drop, |_| {});
        sink.poll(Duration::ZERO);
        monitor.kernel_drops = capture.kernel_drops;
        monitor.tick(sink, pipeline);
    }
    capture.flush(|port, ts, frame| pipeline.process(port, ts, frame, records));
    monitor.kernel_drops = capture.kernel_drops;
    if capture.kernel_drops > 0 {
        monitor.problems.push(format!(
            "the kernel dropped {} frames (capture ring full)",
            capture.kernel_drops
        ));
    }
    Ok(())
}

/// A stats file for a run that failed before Kafka was reached.
fn write_early_failure(spec: &RunSpec, problem: &str) {
    let stats = serde_json::json!({
        "target": "model", "pid": std::process::id(), "state": "failed", "problems": [problem],
    });
    let _ = std::fs::write(&spec.stats_path, format!("{stats:#}\n"));
}

fn run(spec: &RunSpec) -> Result<(), String> {
    let mut pipeline = Pipeline::new(&spec.pipeline);
    let mut input = open_input(spec, &pipeline).inspect_err(|e| write_early_failure(spec, e))?;
    let link_ids: Vec<&str> = (0..pipeline.link_count())
        .map(|i| pipeline.link_id(i as u16))
        .collect();
    let mut sink = Sink::new(spec, &link_ids, spec.pipeline.export.interval_ns)
        .inspect_err(|e| write_early_failure(spec, e))?;
    // Served before the broker is checked, so a scraper sees an exporter waiting for Kafka.
    let metrics = Metrics::new(&spec.stream.topic);
    if let Some(address) = spec.metrics_address {
        let bound = metrics
            .serve(address)
            .inspect_err(|e| write_early_failure(spec, e))?;
        eprintln!("p4bs-exporter: metrics on http://{bound}/metrics");
    }
    sink.check_topic(spec.startup_timeout)
        .inspect_err(|e| write_early_failure(spec, e))?;
    install_signal_handlers();
    let mut monitor = Monitor::new(spec.stats_path.clone(), spec.stats_interval, metrics);
    monitor.state = "running";
    monitor.write(&sink, &pipeline, false);
    let mut records = Vec::with_capacity(CHUNK * 2);
    let mut failure = None;
    match &mut input {
        Input::Pcap(merge, pace) => run_pcap(
            merge,
            *pace,
            &mut pipeline,
            &mut sink,
            &mut monitor,
            &mut records,
        ),
        Input::Live(capture) => {
            if let Err(e) = run_live(
                capture,
                &mut pipeline,
                &mut sink,
                &mut monitor,
                &mut records,
            ) {
                failure = Some(e);
            }
        }
    }
    pipeline.finish(&mut records);
    sink.send_all(&mut records, Full::Wait, |s| monitor.tick(s, &pipeline));
    // What is still open after the last counters (an idle-timeout end stamped with their end
    // falls after them) goes in records of its own, counts 0.
    sink.close_all(Full::Wait, |s| monitor.tick(s, &pipeline));
    monitor.source_done = true;
    monitor.state = "flushing";
    let left = sink.flush(spec.flush_timeout, |s| monitor.tick(s, &pipeline));
    monitor.active_s = sink.first_produce.map(|t| t.elapsed().as_secs_f64());
    monitor.undelivered_at_exit = Some(left);
    if let Some(fatal) = sink.fatal() {
        failure.get_or_insert(format!("kafka producer failed: {fatal}"));
    }
    if left > 0 {
        failure.get_or_insert(format!(
            "{left} records still undelivered after the {:.0} s flush timeout",
            spec.flush_timeout.as_secs_f64()
        ));
    }
    if sink.failed() > 0 {
        failure.get_or_insert(format!("{} records failed delivery", sink.failed()));
    }
    if sink.invalid > 0 {
        monitor.problems.push(format!(
            "{} records could not be encoded or were refused",
            sink.invalid
        ));
    }
    monitor.state = if failure.is_some() { "failed" } else { "done" };
    monitor.write(&sink, &pipeline, true);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    let mut spec_path = None;
    let mut check = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--spec" => match args.next() {
                Some(p) => spec_path = Some(p),
                None => return usage("--spec needs a file"),
            },
            "--check" => check = true,
            "-h" | "--help" => return usage(""),
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let Some(path) = spec_path else {
        return usage("--spec RUN.json is required");
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("p4bs-exporter: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let spec = match RunSpec::parse(&text) {
        Ok(spec) => spec,
        Err(problems) => {
            eprintln!("p4bs-exporter: {path}: {} problem(s)", problems.len());
            for p in problems {
                eprintln!("  {p}");
            }
            return ExitCode::from(2);
        }
    };
    if check {
        println!("{path}: ok");
        return ExitCode::SUCCESS;
    }
    match run(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p4bs-exporter: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    if !problem.is_empty() {
        eprintln!("p4bs-exporter: {problem}");
    }
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
