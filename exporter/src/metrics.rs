//! The exporter's Prometheus endpoint (issue 40): its counters in the OpenMetrics text format
//! (the Prometheus project's `prometheus-client` crate) at `http://<metrics_address>/metrics`,
//! served by one thread on a plain `TcpListener` (a scrape every few seconds needs no async
//! runtime). The values are those of the stats file, brought up to date when it is written
//! (every `stats.interval_s`), so a scrape is at most that old.
//!
//! The metrics, the same names as the Tofino target's (Python, `p4bs_exporter.metrics`):
//! `p4bs_exporter_records_total{topic}` records handed to Kafka;
//! `p4bs_exporter_records_dropped_total{reason}` records lost: `queue_full` (a live source
//! outran the local queue), `invalid` (the schema cannot carry it, or librdkafka refused it),
//! `delivery_failed` (the broker never took it); `p4bs_exporter_in_flight` records produced
//! and not yet acknowledged; `p4bs_exporter_digests_total` what a Tofino sends as digests (RTT
//! samples, long-flow starts and ends), here made by the software data plane;
//! `p4bs_exporter_register_reads_total` register reads (0 here: the model's counters are read
//! in-process).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabel {
    topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The exporter's totals at one moment (absolute counts since start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub records: u64,
    pub queue_full: u64,
    pub invalid: u64,
    pub delivery_failed: u64,
    pub in_flight: u64,
    pub digests: u64,
    pub register_reads: u64,
}

/// The registry and the handles that update it.
pub struct Metrics {
    registry: Arc<Registry>,
    topic: TopicLabel,
    records: Family<TopicLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    in_flight: Gauge,
    digests: Counter,
    register_reads: Counter,
    /// What the counters say: a new total adds its difference.
    last: Totals,
}

const DROP_REASONS: [&str; 3] = ["queue_full", "invalid", "delivery_failed"];

impl Metrics {
    pub fn new(topic: &str) -> Metrics {
        let mut registry = Registry::with_prefix("p4bs_exporter");
        let records = Family::<TopicLabel, Counter>::default();
        let dropped = Family::<ReasonLabel, Counter>::default();
        let (in_flight, digests, register_reads) =
            (Gauge::default(), Counter::default(), Counter::default());
        registry.register("records", "Records handed to Kafka", records.clone());
        registry.register(
            "records_dropped",
            "Records lost, by reason: queue_full, invalid, delivery_failed",
            dropped.clone(),
        );
        registry.register(
            "in_flight",
            "Records produced and not yet acknowledged by Kafka",
            in_flight.clone(),
        );
        registry.register(
            "digests",
            "Digests (RTT samples, long-flow starts and ends) from the data plane",
            digests.clone(),
        );
        registry.register(
            "register_reads",
            "Register reads from the data plane",
            register_reads.clone(),
        );
        let topic = TopicLabel {
            topic: topic.to_string(),
        };
        // Every series from the start, at 0: a rate over a counter that appears late is lost.
        drop(records.get_or_create(&topic));
        for reason in DROP_REASONS {
            drop(dropped.get_or_create(&ReasonLabel { reason }));
        }
        Metrics {
            registry: Arc::new(registry),
            topic,
            records,
            dropped,
            in_flight,
            digests,
            register_reads,
            last: Totals::default(),
        }
    }

    /// Brings the metrics to `now`'s totals.
    pub fn update(&mut self, now: &Totals) {
        let added = |new: u64, old: u64| new.saturating_sub(old);
        self.records
            .get_or_create(&self.topic)
            .inc_by(added(now.records, self.last.records));
        for (reason, new, old) in [
            ("queue_full", now.queue_full, self.last.queue_full),
            ("invalid", now.invalid, self.last.invalid),
            (
                "delivery_failed",
                now.delivery_failed,
                self.last.delivery_failed,
            ),
        ] {
            self.dropped
                .get_or_create(&ReasonLabel { reason })
                .inc_by(added(new, old));
        }
        self.in_flight
            .set(i64::try_from(now.in_flight).unwrap_or(i64::MAX));
        self.digests.inc_by(added(now.digests, self.last.digests));
        self.register_reads
            .inc_by(added(now.register_reads, self.last.register_reads));
        self.last = now.clone();
    }

    /// Serves `/metrics` on `address` from a thread of its own, for the process's life. A
    /// port that cannot be bound is an error naming it.
    pub fn serve(&self, address: SocketAddr) -> Result<SocketAddr, String> {
        let listener =
            TcpListener::bind(address).map_err(|e| format!("metrics_address {address}: {e}"))?;
        let bound = listener
            .local_addr()
            .map_err(|e| format!("metrics_address {address}: {e}"))?;
        let registry = Arc::clone(&self.registry);
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    // One scraper's broken connection is its own problem, not the exporter's.
                    let _ = answer(stream, &registry);
                }
            })
            .map_err(|e| format!("metrics thread: {e}"))?;
        Ok(bound)
    }
}

/// The registry in the text format.
fn render(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).expect("writing to a String cannot fail");
    text
}

/// A request's head is at most this long; a longer one is refused.
const MAX_REQUEST: usize = 8192;
/// A client that sends nothing this long is dropped, so a stuck one cannot hold the thread.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// One HTTP/1.x exchange: GET (or HEAD) /metrics, anything else a 404 or 405; then close.
fn answer(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                false,
            );
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => {
            respond(&mut stream, "200 OK", &render(registry), method == b"HEAD")
        }
        (b"GET" | b"HEAD", _) => respond(&mut stream, "404 Not Found", "see /metrics\n", false),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "GET /metrics\n",
            false,
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, body: &str, head_only: bool) -> io::Result<()> {
    let kind = if status.starts_with("200") {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if !head_only {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(address: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    fn sample<'a>(text: &'a str, series: &str) -> &'a str {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn the_registry_follows_the_totals() {
        let mut metrics = Metrics::new("p4bs.link_counters");
        let text = render(&metrics.registry);
        assert_eq!(
            sample(
                &text,
                "p4bs_exporter_records_total{topic=\"p4bs.link_counters\"}"
            ),
            "0"
        );
        assert_eq!(
            sample(
                &text,
                "p4bs_exporter_records_dropped_total{reason=\"queue_full\"}"
            ),
            "0"
        );
        let mut totals = Totals {
            records: 10,
            queue_full: 2,
            invalid: 1,
            delivery_failed: 0,
            in_flight: 7,
            digests: 300,
            register_reads: 0,
        };
        metrics.update(&totals);
        totals.records = 25;
        totals.in_flight = 3;
        totals.digests = 301;
        metrics.update(&totals);
        let text = render(&metrics.registry);
        assert_eq!(
            sample(
                &text,
                "p4bs_exporter_records_total{topic=\"p4bs.link_counters\"}"
            ),
            "25"
        );
        assert_eq!(
            sample(
                &text,
                "p4bs_exporter_records_dropped_total{reason=\"queue_full\"}"
            ),
            "2"
        );
        assert_eq!(
            sample(
                &text,
                "p4bs_exporter_records_dropped_total{reason=\"invalid\"}"
            ),
            "1"
        );
        assert_eq!(
            sample(
                &text,
                "p4bs_exporter_records_dropped_total{reason=\"delivery_failed\"}"
            ),
            "0"
        );
        assert_eq!(sample(&text, "p4bs_exporter_in_flight"), "3");
        assert_eq!(sample(&text, "p4bs_exporter_digests_total"), "301");
        assert_eq!(sample(&text, "p4bs_exporter_register_reads_total"), "0");
        assert!(text.contains("# TYPE p4bs_exporter_records counter"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn serves_metrics_over_http_on_the_loopback() {
        let mut metrics = Metrics::new("t");
        let address = metrics.serve("127.0.0.1:0".parse().unwrap()).unwrap();
        metrics.update(&Totals {
            records: 42,
            ..Totals::default()
        });
        let reply = get(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("Content-Type: application/openmetrics-text"));
        let body = reply.split("\r\n\r\n").nth(1).unwrap();
        assert_eq!(
            sample(body, "p4bs_exporter_records_total{topic=\"t\"}"),
            "42"
        );
        let reply = get(address, "GET /other HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
        let reply = get(address, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
        // Just past the limit, so that the server has read all of it (no reset) when it answers.
        let long = format!("GET /metrics HTTP/1.1\r\nX: {}", "a".repeat(MAX_REQUEST));
        let long = &long[..MAX_REQUEST + 1];
        assert!(get(address, long).starts_with("HTTP/1.1 431"));
        // A port in use is an error naming the setting.
        let error = metrics.serve(address).unwrap_err();
        assert!(
            error.starts_with(&format!("metrics_address {address}: ")),
            "{error}"
        );
    }
}
