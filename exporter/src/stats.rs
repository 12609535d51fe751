//! The exporter's own counters: rewritten atomically (temp file + rename) into the stats JSON
//! file every interval, with one short line on stderr, and brought to the Prometheus metrics
//! (`crate::metrics`) at the same time. Field names are those of the Python
//! `p4bs_exporter.ExporterStats`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use p4bs_model::pipeline::Pipeline;
use serde_json::{json, Map, Value};

use crate::avro;
use crate::kafka::Sink;
use crate::metrics::{Metrics, Totals};

pub struct Monitor {
    path: PathBuf,
    interval: Duration,
    started: Instant,
    next: Instant,
    last: Instant,
    last_produced: u64,
    last_delivered: u64,
    pub state: &'static str,
    pub source_done: bool,
    pub kernel_drops: u64,
    pub problems: Vec<String>,
    /// Seconds from the first produced record to the end of the final flush.
    pub active_s: Option<f64>,
    pub undelivered_at_exit: Option<u64>,
    metrics: Metrics,
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Monitor {
    pub fn new(path: PathBuf, interval: Duration, metrics: Metrics) -> Monitor {
        let now = Instant::now();
        Monitor {
            path,
            interval,
            started: now,
            next: now + interval,
            last: now,
            last_produced: 0,
            last_delivered: 0,
            state: "starting",
            source_done: false,
            kernel_drops: 0,
            problems: Vec::new(),
            active_s: None,
            undelivered_at_exit: None,
            metrics,
        }
    }

    /// Writes the stats if an interval has passed since the last time.
    #[inline]
    pub fn tick(&mut self, sink: &Sink, pipeline: &Pipeline) {
        if Instant::now() >= self.next {
            self.write(sink, pipeline, true);
        }
    }

    /// Writes the stats now; `log` adds the stderr line.
    pub fn write(&mut self, sink: &Sink, pipeline: &Pipeline, log: bool) {
        let now = Instant::now();
        let produced = sink.produced;
        let delivered = sink.delivered();
        let dt = now.duration_since(self.last).as_secs_f64().max(1e-9);
        let records_per_s = (produced - self.last_produced) as f64 / dt;
        let delivered_per_s = delivered.saturating_sub(self.last_delivered) as f64 / dt;
        self.last = now;
        self.last_produced = produced;
        self.last_delivered = delivered;
        self.next = now + self.interval;
        let uptime_s = now.duration_since(self.started).as_secs_f64();
        let in_flight = sink.in_flight();
        let pipeline_counters = &pipeline.counters;
        self.metrics.update(&Totals {
            records: produced,
            queue_full: sink.dropped,
            invalid: sink.invalid,
            delivery_failed: sink.failed(),
            in_flight,
            digests: pipeline_counters.rtt_samples
                + pipeline_counters.long_flow_starts
                + pipeline_counters.long_flow_ends,
            register_reads: 0,
        });
        let counters: Map<String, Value> = pipeline
            .counters
            .named()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        let stats = json!({
            "target": "model",
            "pid": std::process::id(),
            "state": self.state,
            "uptime_s": uptime_s,
            "produced": Map::from_iter([(avro::STREAM.to_string(), Value::from(produced))]),
            "produced_total": produced,
            "delivered": delivered,
            "failed": sink.failed(),
            "dropped": sink.dropped,
            "rtt_samples_produced": sink.rtt_samples_produced,
            "rtt_samples_dropped": sink.rtt_samples_dropped,
            "invalid": sink.invalid,
            "in_flight": in_flight,
            "waits": sink.waits,
            "records_per_s": records_per_s,
            "delivered_per_s": delivered_per_s,
            "source_done": self.source_done,
            "frames": pipeline.counters.parse.packets,
            "kernel_drops": self.kernel_drops,
            "pipeline": counters,
            "problems": self.problems,
            "last_error": sink.context().last_error(),
            "active_s": self.active_s,
            "undelivered_at_exit": self.undelivered_at_exit,
        });
        if let Err(e) = write_atomically(&self.path, &format!("{stats:#}\n")) {
            eprintln!("p4bs-exporter: stats file {}: {e}", self.path.display());
        }
        if log {
            eprintln!(
                "p4bs-exporter: {uptime_s:.1} s {}: {} records/s, produced {}, delivered {}, \
                 in flight {}, dropped {}, failed {}",
                self.state,
                thousands(records_per_s as u64),
                thousands(produced),
                thousands(delivered),
                thousands(in_flight),
                thousands(sink.dropped),
                thousands(sink.failed()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_file_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("p4bs-exporter-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        write_atomically(&path, "{\"a\": 1}\n").unwrap();
        write_atomically(&path, "{\"a\": 2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\": 2}\n");
        assert!(!dir.join("stats.json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
