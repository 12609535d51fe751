//! The Kafka side: one idempotent librdkafka producer (acks=all, lz4, large batches, no
//! message timeout, so records wait out a broker restart instead of failing), the records'
//! keys and headers, the data plane's records assembled into one `LinkCounters` record per
//! link and interval (`intervals`), and the counters of what was produced, delivered, failed
//! and dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::ffi::CString;

use p4bs_model::record::Record;
use rdkafka::bindings as rd;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::avro::{self, OutOfRange};
use crate::intervals::{Assembler, Encoded};
use crate::spec::RunSpec;

/// What to do with a record when librdkafka's local queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Serve delivery reports until there is room (files: back-pressure, nothing is lost).
    Wait,
    /// Count it in `dropped` and move on (live capture cannot wait).
    Drop,
}

/// The producer's defaults; the run spec's `kafka.properties` override them. The
/// credential properties are added by `Sink::new`, so this list can be shown.
pub fn producer_properties(spec: &RunSpec) -> Vec<(String, String)> {
    let mut props: Vec<(String, String)> = [
        ("bootstrap.servers", spec.bootstrap.as_str()),
        ("client.id", spec.client_id.as_str()),
        ("enable.idempotence", "true"),
        ("acks", "all"),
        ("compression.type", "lz4"),
        ("linger.ms", "10"),
        ("batch.num.messages", "100000"),
        ("batch.size", "1000000"),
        // 0 = no timeout: a record is retried until the broker takes it, however long it is
        // away. Only a fatal error (or the flush timeout at exit) leaves records undelivered.
        ("message.timeout.ms", "0"),
        ("queue.buffering.max.messages", "1000000"),
        ("queue.buffering.max.kbytes", "1048576"),
        ("reconnect.backoff.ms", "100"),
        ("reconnect.backoff.max.ms", "1000"),
        ("retry.backoff.ms", "100"),
        ("retry.backoff.max.ms", "1000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in &spec.properties {
        props.retain(|(name, _)| name != k);
        props.push((k.clone(), v.clone()));
    }
    props
}

/// Shared with librdkafka's callbacks (delivery reports arrive during `poll`; logs and
/// errors may come from librdkafka's own threads).
#[derive(Default)]
pub struct Context {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
    pub fatal: AtomicBool,
    last_error: Mutex<Option<String>>,
    last_printed: Mutex<String>,
}

impl Context {
    fn note_error(&self, text: String) {
        let mut printed = self.last_printed.lock().unwrap_or_else(|e| e.into_inner());
        if *printed != text {
            eprintln!("p4bs-exporter: kafka: {text}");
            printed.clone_from(&text);
        }
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if (level as i32) <= (RDKafkaLogLevel::Warning as i32) {
            self.note_error(format!("{fac}: {message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            self.fatal.store(true, Ordering::Relaxed);
        }
        self.note_error(format!("{error}: {reason}"));
    }
}

impl ProducerContext for Context {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.note_error(format!("delivery failed: {e}"));
            }
        }
    }
}

/// The topic handle and header prototype as librdkafka objects, so that producing a record
/// needs no topic lookup by name and builds no strings.
struct Topic {
    name: String,
    rkt: *mut rd::rd_kafka_topic_t,
    headers: *mut rd::rd_kafka_headers_t,
}

pub struct Sink {
    producer: BaseProducer<Context>,
    topic: Topic,
    /// Per link, in the pipeline's link order: the link id as the Kafka key.
    keys: Vec<Vec<u8>>,
    assembler: Assembler,
    /// What the assembler made of the records taken so far, not produced yet.
    encoded: Encoded,
    since_poll: u32,
    /// Records handed to librdkafka.
    pub produced: u64,
    /// RTT samples inside the produced records.
    pub rtt_samples_produced: u64,
    /// Records not produced because the local queue was full (live sources only).
    pub dropped: u64,
    /// RTT samples inside the dropped records.
    pub rtt_samples_dropped: u64,
    /// Records (or single RTT samples) the schema cannot carry (a value above 2^63 - 1), or
    /// records librdkafka refused.
    pub invalid: u64,
    /// Times a full local queue made the exporter wait (back-pressure).
    pub waits: u64,
    /// When the first record was handed to librdkafka.
    pub first_produce: Option<Instant>,
}

/// Delivery reports are served every this many records, besides every wait.
const POLL_EVERY: u32 = 256;

impl Sink {
    /// The producer, the topic and, for each link, its key and its intervals; `link_ids` in
    /// the pipeline's link order, `interval_ns` the pipeline's export interval.
    pub fn new(spec: &RunSpec, link_ids: &[&str], interval_ns: u64) -> Result<Sink, String> {
        let mut config = ClientConfig::new();
        for (k, v) in producer_properties(spec) {
            config.set(k, v);
        }
        for (k, v) in &spec.secret_properties {
            config.set(k, &v.0);
        }
        let producer: BaseProducer<Context> = config
            .create_with_context(Context::default())
            .map_err(|e| format!("kafka producer: {e}"))?;
        let s = &spec.stream;
        let name = CString::new(s.topic.as_str())
            .map_err(|_| format!("topic {:?} contains a NUL byte", s.topic))?;
        // SAFETY: a live client handle and NUL-terminated names; the handles are destroyed in
        // Drop, before the producer.
        let topic = unsafe {
            let rk = producer.client().native_ptr();
            let rkt = rd::rd_kafka_topic_new(rk, name.as_ptr(), std::ptr::null_mut());
            let headers = rd::rd_kafka_headers_new(2);
            for (key, value) in [
                (c"p4bs-schema", s.schema.as_bytes()),
                (c"p4bs-fingerprint", s.fingerprint.as_bytes()),
            ] {
                let size = value.len() as isize;
                rd::rd_kafka_header_add(headers, key.as_ptr(), -1, value.as_ptr().cast(), size);
            }
            Topic {
                name: s.topic.clone(),
                rkt,
                headers,
            }
        };
        if topic.rkt.is_null() {
            // SAFETY: created just above, used nowhere else.
            unsafe { rd::rd_kafka_headers_destroy(topic.headers) };
            return Err(format!("kafka: cannot open topic {:?}", s.topic));
        }
        Ok(Sink {
            producer,
            topic,
            keys: link_ids.iter().map(|id| id.as_bytes().to_vec()).collect(),
            assembler: Assembler::new(link_ids, interval_ns, spec.max_rtt_samples_per_record),
            encoded: Encoded::default(),
            since_poll: 0,
            produced: 0,
            rtt_samples_produced: 0,
            dropped: 0,
            rtt_samples_dropped: 0,
            invalid: 0,
            waits: 0,
            first_produce: None,
        })
    }

    /// Fails unless the broker answers and lists the topic within `timeout` (a topic just
    /// created may take a moment to appear in the broker's metadata).
    pub fn check_topic(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let topic = &self.topic.name;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let problem = match self.producer.client().fetch_metadata(Some(topic), left) {
                Err(e) => format!("kafka: no answer about topic {topic:?}: {e}"),
                Ok(metadata) => match metadata.topics().iter().find(|t| t.name() == topic) {
                    Some(t) if t.error().is_none() && !t.partitions().is_empty() => return Ok(()),
                    Some(t) => match t.error() {
                        Some(e) => format!("kafka: topic {topic:?}: {}", RDKafkaErrorCode::from(e)),
                        None => format!("kafka: topic {topic:?} has no partitions"),
                    },
                    None => format!("kafka: topic {topic:?} does not exist"),
                },
            };
            if Instant::now() >= deadline {
                return Err(problem);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn context(&self) -> &Context {
        self.producer.context()
    }

    pub fn delivered(&self) -> u64 {
        self.context().delivered.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.context().failed.load(Ordering::Relaxed)
    }

    /// Records librdkafka holds: queued, in flight or awaiting their delivery report.
    pub fn in_flight(&self) -> u64 {
        self.producer.in_flight_count().max(0) as u64
    }

    /// A fatal producer error (the idempotent producer cannot go on), with its reason.
    pub fn fatal(&self) -> Option<String> {
        if !self.context().fatal.load(Ordering::Relaxed) {
            return None;
        }
        let detail = self.producer.client().fatal_error();
        Some(detail.map_or_else(|| "fatal error".to_string(), |(c, s)| format!("{c}: {s}")))
    }

    /// Serves delivery reports (and errors) for up to `timeout`.
    pub fn poll(&self, timeout: Duration) {
        self.producer.poll(timeout);
    }

    /// Takes every data-plane record, emptying `records`, and produces the `LinkCounters`
    /// records they complete (a link's counters close its interval; a grid interval's
    /// `max_rtt_samples_per_record`-th sample sends a part). While the local queue is full
    /// with `Full::Wait`, serves delivery reports and calls `idle` between tries.
    pub fn send_all(&mut self, records: &mut Vec<Record>, full: Full, mut idle: impl FnMut(&Sink)) {
        for record in records.iter() {
            self.assembler.add(record, &mut self.encoded);
            if !self.encoded.is_empty() {
                self.produce_encoded(full, &mut idle);
            }
        }
        records.clear();
    }

    /// Produces every interval still open (at exit, after the pipeline's last counters).
    pub fn close_all(&mut self, full: Full, mut idle: impl FnMut(&Sink)) {
        self.assembler.close_all(&mut self.encoded);
        self.produce_encoded(full, &mut idle);
    }

    fn produce_encoded(&mut self, full: Full, idle: &mut impl FnMut(&Sink)) {
        // Taken out for the loop, as `produce_value` needs the whole Sink; its buffers come
        // back cleared, with their capacity.
        let mut encoded = std::mem::take(&mut self.encoded);
        for record in &encoded.records {
            let samples = u64::from(record.samples);
            match &record.value {
                Ok(range) => {
                    let value = &encoded.bytes[range.clone()];
                    if self.produce_value(value, record.link, full, idle) {
                        self.rtt_samples_produced += samples;
                    } else if full == Full::Drop {
                        self.rtt_samples_dropped += samples;
                    }
                }
                Err(OutOfRange(field)) => {
                    self.invalid += 1;
                    let link = String::from_utf8_lossy(&self.keys[record.link]);
                    self.context()
                        .note_error(format!("not sent (link {link}): {field} is above 2^63 - 1"));
                }
            }
        }
        encoded.clear();
        self.encoded = encoded;
    }

    /// Produces `value`, keyed by `link`; true once it is queued. A full local queue is
    /// waited out or counted as a drop, as `full` says.
    fn produce_value(
        &mut self,
        value: &[u8],
        link: usize,
        full: Full,
        idle: &mut impl FnMut(&Sink),
    ) -> bool {
        let queued = loop {
            match self.produce(value, &self.keys[link]) {
                Ok(()) => {
                    self.produced += 1;
                    self.first_produce.get_or_insert_with(Instant::now);
                    break true;
                }
                Err(RDKafkaErrorCode::QueueFull) => match full {
                    Full::Drop => {
                        self.dropped += 1;
                        break false;
                    }
                    Full::Wait => {
                        self.waits += 1;
                        self.producer.poll(Duration::from_millis(1));
                        self.since_poll = 0;
                        idle(self);
                        if self.fatal().is_some() {
                            return false;
                        }
                    }
                },
                Err(e) => {
                    self.invalid += 1;
                    self.context()
                        .note_error(format!("{} record refused: {e}", avro::STREAM));
                    break false;
                }
            }
        };
        self.since_poll += 1;
        if self.since_poll >= POLL_EVERY {
            self.since_poll = 0;
            self.producer.poll(Duration::ZERO);
        }
        queued
    }

    /// Hands an encoded record to librdkafka, which copies it.
    fn produce(&self, value: &[u8], key: &[u8]) -> Result<(), RDKafkaErrorCode> {
        use rd::rd_kafka_vtype_t as V;
        let topic = &self.topic;
        // SAFETY: the client and topic handles live as long as self; key and value are
        // copied (MSG_F_COPY) before produceva returns; the headers copy belongs to
        // librdkafka once the record is queued, and is destroyed here if it is not.
        unsafe {
            let headers = rd::rd_kafka_headers_copy(topic.headers);
            let mut vus: [rd::rd_kafka_vu_t; 6] = std::mem::zeroed();
            vus[0].vtype = V::RD_KAFKA_VTYPE_RKT;
            vus[0].u.rkt = topic.rkt;
            vus[1].vtype = V::RD_KAFKA_VTYPE_PARTITION;
            vus[1].u.i32_ = -1; // librdkafka's partitioner, by key
            vus[2].vtype = V::RD_KAFKA_VTYPE_MSGFLAGS;
            vus[2].u.i = rd::RD_KAFKA_MSG_F_COPY;
            vus[3].vtype = V::RD_KAFKA_VTYPE_VALUE;
            vus[3].u.mem.ptr = value.as_ptr() as *mut _;
            vus[3].u.mem.size = value.len();
            vus[4].vtype = V::RD_KAFKA_VTYPE_KEY;
            vus[4].u.mem.ptr = key.as_ptr() as *mut _;
            vus[4].u.mem.size = key.len();
            vus[5].vtype = V::RD_KAFKA_VTYPE_HEADERS;
            vus[5].u.headers = headers;
            let rk = self.producer.client().native_ptr();
            let error = rd::rd_kafka_produceva(rk, vus.as_ptr(), vus.len());
            if error.is_null() {
                return Ok(());
            }
            let code = RDKafkaErrorCode::from(rd::rd_kafka_error_code(error));
            rd::rd_kafka_error_destroy(error);
            rd::rd_kafka_headers_destroy(headers);
            Err(code)
        }
    }

    /// Waits until every record is delivered, a fatal error, or `timeout`; `idle` is called
    /// between polls. Returns how many records are still undelivered.
    pub fn flush(&self, timeout: Duration, mut idle: impl FnMut(&Sink)) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            self.producer.poll(Duration::from_millis(5));
            let left = self.in_flight();
            if left == 0 || Instant::now() >= deadline || self.fatal().is_some() {
                return left;
            }
            idle(self);
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // SAFETY: created in Sink::new and not used after this; the producer (dropped after
        // this) still holds its own reference to the topic.
        unsafe {
            rd::rd_kafka_topic_destroy(self.topic.rkt);
            rd::rd_kafka_headers_destroy(self.topic.headers);
        }
    }
}
