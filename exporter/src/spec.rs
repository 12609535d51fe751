//! The run spec (JSON written by `p4bs_exporter.run_spec`): the pipeline, Kafka, the
//! `link_counters` stream, how many RTT samples a record holds, the source and the stats
//! file. Every problem is reported at once, each as `field.path: what is wrong`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use p4bs_model::config::PipelineConfig;
use serde_json::{Map, Value};

use crate::avro;

#[derive(Debug)]
pub struct StreamSpec {
    pub topic: String,
    pub schema: String,
    pub fingerprint: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// As fast as Kafka takes the records.
    Max,
    /// At the capture's own pace: a frame is processed when its time since the first frame
    /// has passed on the wall clock.
    Realtime,
}

#[derive(Debug)]
pub enum Source {
    Pcap {
        files: Vec<(String, PathBuf)>,
        pace: Pace,
    },
    /// The pipeline's ports are interfaces, opened in the network namespace `netns`.
    Live { netns: Option<String> },
}

/// An interval's RTT samples per record unless the spec says otherwise: a busier interval
/// comes in several records (the config's `max_rtt_samples_per_record`, whose default this is).
const DEFAULT_MAX_RTT_SAMPLES_PER_RECORD: u32 = 8192;
/// The config's bound too. A record of 65,536 samples of as many flows is about 2.7 MB, above
/// Kafka's default 1 MB message size (librdkafka refuses it: counted in `invalid`).
const MAX_RTT_SAMPLES_PER_RECORD: u64 = 16_384;

/// A credential read from where the spec names it; never printed.
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(hidden)")
    }
}

#[derive(Debug)]
pub struct RunSpec {
    pub pipeline: PipelineConfig,
    pub bootstrap: String,
    pub client_id: String,
    /// librdkafka properties that override the exporter's defaults.
    pub properties: Vec<(String, String)>,
    /// librdkafka properties whose values are credentials (`sasl.password`), read at start
    /// from the environment variable or the file the spec names, so the spec holds none.
    pub secret_properties: Vec<(String, Secret)>,
    /// The `link_counters` stream.
    pub stream: StreamSpec,
    pub max_rtt_samples_per_record: u32,
    pub source: Source,
    pub stats_path: PathBuf,
    pub stats_interval: Duration,
    pub flush_timeout: Duration,
    pub startup_timeout: Duration,
    /// Where `/metrics` is served (the config's `metrics_address`); None: not served.
    pub metrics_address: Option<SocketAddr>,
}

struct Reader {
    problems: Vec<String>,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Reader {
    fn problem(&mut self, path: &str, what: impl std::fmt::Display) {
        self.problems.push(format!("{path}: {what}"));
    }

    fn object<'a>(&mut self, v: Option<&'a Value>, path: &str) -> Option<&'a Map<String, Value>> {
        match v {
            None => self.problem(path, "is required"),
            Some(Value::Object(m)) => return Some(m),
            Some(other) => self.problem(path, format!("must be an object, got {}", kind(other))),
        }
        None
    }

    fn unknown(&mut self, m: &Map<String, Value>, path: &str, known: &[&str]) {
        for key in m.keys().filter(|k| !known.contains(&k.as_str())) {
            self.problem(
                &format!("{path}.{key}"),
                format!("unknown field (known: {})", known.join(", ")),
            );
        }
    }

    fn text(&mut self, m: &Map<String, Value>, key: &str, path: &str) -> Option<String> {
        let path = format!("{path}.{key}");
        match m.get(key) {
            None => self.problem(&path, "is required"),
            Some(Value::String(s)) if !s.trim().is_empty() => return Some(s.clone()),
            Some(other) => self.problem(
                &path,
                format!("must be a non-empty string, got {}", kind(other)),
            ),
        }
        None
    }

    /// A positive number of seconds, `default` when absent.
    fn seconds(
        &mut self,
        m: &Map<String, Value>,
        key: &str,
        path: &str,
        default: f64,
    ) -> Option<Duration> {
        let value = match m.get(key) {
            None => default,
            Some(v) => match v.as_f64() {
                Some(s) if s > 0.0 && s < 1e9 => s,
                _ => {
                    let path = format!("{path}.{key}");
                    self.problem(
                        &path,
                        format!("must be a positive number of seconds, got {v}"),
                    );
                    return None;
                }
            },
        };
        Some(Duration::from_secs_f64(value))
    }
}

fn pipeline(r: &mut Reader, v: Option<&Value>) -> Option<PipelineConfig> {
    let v = v.or_else(|| {
        r.problem("pipeline", "is required");
        None
    })?;
    let text = v.to_string();
    match PipelineConfig::from_json(&text) {
        Ok(config) => Some(config),
        Err(e) => {
            for p in e.0 {
                r.problem("pipeline", p);
            }
            None
        }
    }
}

/// bootstrap, client id, librdkafka properties, the credential properties.
type KafkaSpec = (String, String, Vec<(String, String)>, Vec<(String, Secret)>);

/// A credential named `{"env": VAR}` or `{"file": PATH}` (its content, trimmed as the
/// Python side's `SecretRef` trims it). A problem names where it was looked for, never a value.
fn secret(r: &mut Reader, v: &Value, path: &str) -> Option<Secret> {
    let source = match v {
        Value::Object(m) if m.len() == 1 => m.iter().next(),
        _ => None,
    };
    match source {
        Some((kind, Value::String(name))) if kind == "env" => match std::env::var(name) {
            Ok(value) => return Some(Secret(value)),
            Err(_) => r.problem(path, format!("environment variable ${name} is not set")),
        },
        Some((kind, Value::String(name))) if kind == "file" => {
            match std::fs::read_to_string(name) {
                Ok(text) => return Some(Secret(text.trim().to_string())),
                Err(e) => r.problem(path, format!("credential file {name}: {e}")),
            }
        }
        _ => r.problem(
            path,
            r#"must be {"env": "VAR"} or {"file": "/path"}"#.to_string(),
        ),
    }
    None
}

fn kafka(r: &mut Reader, v: Option<&Value>) -> Option<KafkaSpec> {
    let m = r.object(v, "kafka")?;
    r.unknown(
        m,
        "kafka",
        &["bootstrap", "client_id", "properties", "secret_properties"],
    );
    let bootstrap = r.text(m, "bootstrap", "kafka");
    let client_id = match m.get("client_id") {
        None => Some("p4bs-exporter".to_string()),
        Some(_) => r.text(m, "client_id", "kafka"),
    };
    let mut properties = Vec::new();
    if let Some(p) = m.get("properties") {
        match p {
            Value::Object(p) => {
                for (k, v) in p {
                    match v {
                        Value::String(s) => properties.push((k.clone(), s.clone())),
                        Value::Number(n) => properties.push((k.clone(), n.to_string())),
                        Value::Bool(b) => properties.push((k.clone(), b.to_string())),
                        other => r.problem(
                            &format!("kafka.properties.{k}"),
                            format!("must be a string, number or boolean, got {}", kind(other)),
                        ),
                    }
                }
            }
            other => r.problem(
                "kafka.properties",
                format!("must be an object, got {}", kind(other)),
            ),
        }
    }
    let mut secrets = Vec::new();
    match m.get("secret_properties") {
        None => {}
        Some(Value::Object(p)) => {
            for (k, v) in p {
                if let Some(value) = secret(r, v, &format!("kafka.secret_properties.{k}")) {
                    secrets.push((k.clone(), value));
                }
            }
        }
        Some(other) => r.problem(
            "kafka.secret_properties",
            format!("must be an object, got {}", kind(other)),
        ),
    }
    Some((bootstrap?, client_id?, properties, secrets))
}

/// The `streams` object: `link_counters`, the only stream, with the schema's own fields,
/// which the hand-written encoder must write exactly.
fn stream(r: &mut Reader, v: Option<&Value>) -> Option<StreamSpec> {
    let m = r.object(v, "streams")?;
    r.unknown(m, "streams", &[avro::STREAM]);
    let path = format!("streams.{}", avro::STREAM);
    let s = r.object(m.get(avro::STREAM), &path)?;
    r.unknown(s, &path, &["topic", "schema", "fingerprint", "fields"]);
    let topic = r.text(s, "topic", &path);
    let schema = r.text(s, "schema", &path);
    let fingerprint = r.text(s, "fingerprint", &path);
    if let Some(schema) = &schema {
        if schema != avro::SCHEMA {
            r.problem(
                &format!("{path}.schema"),
                format!("this exporter writes {}, not {schema}", avro::SCHEMA),
            );
        }
    }
    match s.get("fields") {
        None => r.problem(&format!("{path}.fields"), "is required"),
        Some(fields) => {
            let expected: Vec<Value> = avro::LINK_COUNTERS
                .iter()
                .map(|(n, t)| Value::from(vec![*n, *t]))
                .collect();
            if fields != &Value::Array(expected) {
                let layout: Vec<String> = avro::LINK_COUNTERS
                    .iter()
                    .map(|(n, t)| format!("{n}:{t}"))
                    .collect();
                r.problem(
                    &format!("{path}.fields"),
                    format!(
                        "the schema's fields {fields} differ from what this exporter \
                         encodes ({}): rebuild the exporter for the new schema",
                        layout.join(", ")
                    ),
                );
            }
        }
    }
    Some(StreamSpec {
        topic: topic?,
        schema: schema?,
        fingerprint: fingerprint?,
    })
}

fn max_rtt_samples_per_record(r: &mut Reader, v: Option<&Value>) -> Option<u32> {
    let Some(v) = v else {
        return Some(DEFAULT_MAX_RTT_SAMPLES_PER_RECORD);
    };
    match v.as_u64() {
        Some(n) if (1..=MAX_RTT_SAMPLES_PER_RECORD).contains(&n) => Some(n as u32),
        _ => {
            r.problem(
                "spec.max_rtt_samples_per_record",
                format!("must be an integer in [1, {MAX_RTT_SAMPLES_PER_RECORD}], got {v}"),
            );
            None
        }
    }
}

/// The pipeline's port names as written, even when the rest of the pipeline has problems.
fn port_names(pipeline: Option<&Value>) -> Option<Vec<String>> {
    let ports = pipeline?.get("ports")?.as_array()?;
    ports
        .iter()
        .map(|p| Some(p.get("port")?.as_str()?.to_string()))
        .collect()
}

fn source(r: &mut Reader, v: Option<&Value>, ports: Option<&[String]>) -> Option<Source> {
    let m = r.object(v, "source")?;
    match (m.get("pcap"), m.get("live")) {
        (Some(_), Some(_)) => {
            r.problem("source", "either pcap or live, not both");
            None
        }
        (None, None) => {
            r.problem("source", "needs pcap (files) or live");
            None
        }
        (Some(files), None) => {
            r.unknown(m, "source", &["pcap", "pace"]);
            let pace = match m.get("pace") {
                None => Some(Pace::Max),
                Some(Value::String(s)) if s == "max" => Some(Pace::Max),
                Some(Value::String(s)) if s == "realtime" => Some(Pace::Realtime),
                Some(other) => {
                    r.problem(
                        "source.pace",
                        format!("must be \"max\" or \"realtime\", got {other}"),
                    );
                    None
                }
            };
            let mut out = Vec::new();
            match files {
                Value::Array(items) if !items.is_empty() => {
                    for (i, item) in items.iter().enumerate() {
                        let path = format!("source.pcap[{i}]");
                        let pair = item.as_array().filter(|a| a.len() == 2);
                        let Some((port, file)) = pair.and_then(|a| {
                            Some((a[0].as_str()?.to_string(), a[1].as_str()?.to_string()))
                        }) else {
                            r.problem(&path, format!("must be [PORT, FILE], got {item}"));
                            continue;
                        };
                        if file.is_empty() {
                            r.problem(&path, "the file name is empty");
                        }
                        if out.iter().any(|(p, _)| p == &port) {
                            r.problem(&path, format!("port {port:?} is given twice"));
                        }
                        if let Some(known) = ports {
                            if !known.contains(&port) {
                                r.problem(
                                    &path,
                                    format!(
                                        "no port {port:?} in the pipeline (ports: {})",
                                        known.join(", ")
                                    ),
                                );
                            }
                        }
                        out.push((port, PathBuf::from(file)));
                    }
                }
                other => r.problem(
                    "source.pcap",
                    format!("must be a non-empty array of [PORT, FILE], got {other}"),
                ),
            }
            Some(Source::Pcap {
                files: out,
                pace: pace?,
            })
        }
        (None, Some(live)) => {
            r.unknown(m, "source", &["live", "netns"]);
            if live != &Value::Bool(true) {
                r.problem("source.live", format!("must be true, got {live}"));
            }
            let netns = match m.get("netns") {
                None | Some(Value::Null) => None,
                Some(Value::String(s))
                    if !s.is_empty() && !s.contains('/') && s != "." && s != ".." =>
                {
                    Some(s.clone())
                }
                Some(other) => {
                    r.problem(
                        "source.netns",
                        format!("must be a network namespace name or null, got {other}"),
                    );
                    None
                }
            };
            if ports.is_some_and(|p| p.is_empty()) {
                r.problem(
                    "pipeline.ports",
                    "live capture needs at least one interface",
                );
            }
            Some(Source::Live { netns })
        }
    }
}

impl RunSpec {
    pub fn parse(text: &str) -> Result<RunSpec, Vec<String>> {
        let root: Value = serde_json::from_str(text).map_err(|e| vec![format!("not JSON: {e}")])?;
        let mut r = Reader {
            problems: Vec::new(),
        };
        let Some(m) = r.object(Some(&root), "spec") else {
            return Err(r.problems);
        };
        r.unknown(
            m,
            "spec",
            &[
                "pipeline",
                "kafka",
                "streams",
                "max_rtt_samples_per_record",
                "source",
                "stats",
                "flush_timeout_s",
                "startup_timeout_s",
                "metrics_address",
            ],
        );
        let pipeline = pipeline(&mut r, m.get("pipeline"));
        let kafka = kafka(&mut r, m.get("kafka"));
        let stream = stream(&mut r, m.get("streams"));
        let max_rtt_samples_per_record =
            max_rtt_samples_per_record(&mut r, m.get("max_rtt_samples_per_record"));
        let ports = port_names(m.get("pipeline"));
        let source = source(&mut r, m.get("source"), ports.as_deref());
        let stats = r.object(m.get("stats"), "stats");
        let (stats_path, stats_interval) = match stats {
            Some(s) => {
                r.unknown(s, "stats", &["path", "interval_s"]);
                (
                    r.text(s, "path", "stats"),
                    r.seconds(s, "interval_s", "stats", 1.0),
                )
            }
            None => (None, None),
        };
        let flush_timeout = r.seconds(m, "flush_timeout_s", "spec", 60.0);
        let startup_timeout = r.seconds(m, "startup_timeout_s", "spec", 10.0);
        let metrics_address = match m.get("metrics_address") {
            None => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => match s.parse::<SocketAddr>() {
                Ok(address) => Some(address),
                Err(_) => {
                    r.problem(
                        "spec.metrics_address",
                        format!("must be IP:PORT or \"\" (off), got {s:?}"),
                    );
                    None
                }
            },
            Some(other) => {
                r.problem(
                    "spec.metrics_address",
                    format!("must be a string, got {}", kind(other)),
                );
                None
            }
        };
        match (
            pipeline,
            kafka,
            stream,
            max_rtt_samples_per_record,
            source,
            stats_path,
            stats_interval,
            flush_timeout,
            startup_timeout,
        ) {
            (
                Some(pipeline),
                Some((bootstrap, client_id, properties, secret_properties)),
                Some(stream),
                Some(max_rtt_samples_per_record),
                Some(source),
                Some(stats_path),
                Some(stats_interval),
                Some(flush_timeout),
                Some(startup_timeout),
            ) if r.problems.is_empty() => Ok(RunSpec {
                pipeline,
                bootstrap,
                client_id,
                properties,
                secret_properties,
                stream,
                max_rtt_samples_per_record,
                source,
                stats_path: PathBuf::from(stats_path),
                stats_interval,
                flush_timeout,
                startup_timeout,
                metrics_address,
            }),
            _ => Err(r.problems),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Value {
        Value::Array(
            avro::LINK_COUNTERS
                .iter()
                .map(|(n, t)| Value::from(vec![*n, *t]))
                .collect(),
        )
    }

    fn good() -> Value {
        serde_json::json!({
            "pipeline": {"links": [{"id": "r1:eth1"}],
                         "ports": [{"port": "before", "link": "r1:eth1", "tap": "before"},
                                   {"port": "after", "link": "r1:eth1", "tap": "after"}]},
            "kafka": {"bootstrap": "127.0.0.1:9092"},
            "streams": {"link_counters": {"topic": "t.link_counters", "schema": avro::SCHEMA,
                                          "fingerprint": "123", "fields": fields()}},
            "source": {"pcap": [["before", "/tmp/a.pcap"]], "pace": "realtime"},
            "stats": {"path": "/tmp/stats.json"}
        })
    }

    #[test]
    fn a_good_spec_parses_with_defaults() {
        let spec = RunSpec::parse(&good().to_string()).unwrap();
        assert_eq!(spec.client_id, "p4bs-exporter");
        assert_eq!(spec.stats_interval, Duration::from_secs(1));
        assert_eq!(spec.max_rtt_samples_per_record, 8192);
        assert_eq!(spec.stream.topic, "t.link_counters");
        match spec.source {
            Source::Pcap { files, pace } => {
                assert_eq!(pace, Pace::Realtime);
                assert_eq!(files[0].0, "before");
            }
            Source::Live { .. } => panic!("not live"),
        }
        let mut v = good();
        v["max_rtt_samples_per_record"] = 7.into();
        let spec = RunSpec::parse(&v.to_string()).unwrap();
        assert_eq!(spec.max_rtt_samples_per_record, 7);
    }

    #[test]
    fn every_problem_is_listed() {
        let mut v = good();
        v["kafka"] = serde_json::json!({"bootstrap": 5, "extra": 1});
        v["streams"]["link_counters"]["schema"] = "io.p4bs.Other".into();
        v["streams"]["link_counters"]["fields"] = serde_json::json!([["link_id", "string"]]);
        v["streams"]["rtt_samples"] = serde_json::json!({});
        v["source"] = serde_json::json!({"pcap": [["nope", "/x"], "bad"], "pace": "fast"});
        v["stats"]["interval_s"] = (-1).into();
        v["max_rtt_samples_per_record"] = 70000.into();
        v["rtt_batch"] = serde_json::json!({"interval_ns": 10000000});
        v["bogus"] = true.into();
        let problems = RunSpec::parse(&v.to_string()).unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "kafka.bootstrap: must be a non-empty string",
            "kafka.extra: unknown field",
            "streams.rtt_samples: unknown field (known: link_counters)",
            "streams.link_counters.schema: this exporter writes io.p4bs.LinkCounters",
            "streams.link_counters.fields: the schema's fields",
            "source.pace: must be",
            "source.pcap[0]: no port \"nope\"",
            "source.pcap[1]: must be [PORT, FILE]",
            "stats.interval_s: must be a positive number",
            "spec.max_rtt_samples_per_record: must be an integer in [1, 16384], got 70000",
            "spec.rtt_batch: unknown field",
            "spec.bogus: unknown field",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from\n{text}");
        }
        assert_eq!(problems.len(), 12, "{text}");

        let mut v = good();
        v["streams"] = serde_json::json!({});
        v["max_rtt_samples_per_record"] = 0.into();
        let problems = RunSpec::parse(&v.to_string()).unwrap_err();
        assert_eq!(
            problems,
            [
                "streams.link_counters: is required",
                "spec.max_rtt_samples_per_record: must be an integer in [1, 16384], got 0"
            ]
        );

        let mut v = good();
        v["pipeline"]["rtt"] = serde_json::json!({"slots_log2": 0});
        v["pipeline"]["links"] = serde_json::json!([]);
        let problems = RunSpec::parse(&v.to_string()).unwrap_err();
        assert!(problems
            .iter()
            .any(|p| p.starts_with("pipeline: rtt.slots_log2")));
        assert!(problems.iter().any(|p| p.starts_with("pipeline: links")));
    }

    #[test]
    fn credentials_are_read_from_where_the_spec_names_them_and_never_shown() {
        let file = std::env::temp_dir().join(format!("p4bs-spec-secret-{}", std::process::id()));
        std::fs::write(&file, "from-a-file\n").unwrap();
        // The process's own environment: a variable every test run has.
        let path_value = std::env::var("PATH").unwrap();
        let mut v = good();
        v["kafka"]["secret_properties"] = serde_json::json!({
            "sasl.username": {"file": file.to_str().unwrap()},
            "sasl.password": {"env": "PATH"},
        });
        let spec = RunSpec::parse(&v.to_string()).unwrap();
        std::fs::remove_file(&file).unwrap();
        let found: Vec<(&str, &str)> = spec
            .secret_properties
            .iter()
            .map(|(k, s)| (k.as_str(), s.0.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("sasl.password", path_value.as_str()),
                ("sasl.username", "from-a-file")
            ]
        );
        let shown = format!("{spec:?}");
        assert!(!shown.contains("from-a-file") && !shown.contains(&path_value));

        v["kafka"]["secret_properties"] = serde_json::json!({
            "sasl.username": {"env": "P4BS_NO_SUCH_VARIABLE"},
            "sasl.password": "inline",
            "ssl.key.password": {"file": "/nonexistent/p4bs"},
        });
        let problems = RunSpec::parse(&v.to_string()).unwrap_err().join("\n");
        for expected in [
            "kafka.secret_properties.sasl.username: environment variable $P4BS_NO_SUCH_VARIABLE",
            "kafka.secret_properties.sasl.password: must be {\"env\": \"VAR\"}",
            "kafka.secret_properties.ssl.key.password: credential file /nonexistent/p4bs",
        ] {
            assert!(
                problems.contains(expected),
                "{expected:?} missing from\n{problems}"
            );
        }
        assert!(!problems.contains("inline"));
    }

    #[test]
    fn live_sources_name_a_namespace() {
        let mut v = good();
        v["source"] = serde_json::json!({"live": true, "netns": "p4bs-tap"});
        match RunSpec::parse(&v.to_string()).unwrap().source {
            Source::Live { netns } => assert_eq!(netns.as_deref(), Some("p4bs-tap")),
            Source::Pcap { .. } => panic!("not pcap"),
        }
        v["source"] = serde_json::json!({"live": true, "netns": "../x", "pcap": []});
        let problems = RunSpec::parse(&v.to_string()).unwrap_err();
        assert_eq!(problems, vec!["source: either pcap or live, not both"]);
        assert!(RunSpec::parse("[1]").is_err());
        assert!(RunSpec::parse("{").unwrap_err()[0].starts_with("not JSON"));
    }
}
