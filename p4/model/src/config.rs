//! The pipeline's settings (SPEC: every value marked *config*, with the spec's defaults) and its
//! port → link table, read from JSON that the Python side derives from the deployment config.

use serde::Deserialize;
use std::fmt;
use std::net::Ipv4Addr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tap {
    Before,
    After,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Out,
    Back,
    Both,
}

/// One capture point (a Tofino port, an interface, a pcap file) and what it carries.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    pub port: String,
    pub link: String,
    pub tap: Tap,
    #[serde(default = "both")]
    pub direction: Direction,
}

fn both() -> Direction {
    Direction::Both
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// router:interface, the key of every record of the link.
    pub id: String,
    /// IPv4 prefixes reached through the output interface ("10.201.2.0/24"): on a `both` tap a
    /// packet towards one of them is in the `out` direction, others `back`. Empty: every
    /// packet counts in both directions.
    #[serde(default)]
    pub output_prefixes: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RttConfig {
    pub slots_log2: u32,
    pub max_age_ns: u64,
    /// At most one sample per flow per this interval; 0 = off.
    pub min_interval_ns: u64,
}

impl Default for RttConfig {
    fn default() -> Self {
        RttConfig {
            slots_log2: 16,
            max_age_ns: 1_000_000_000,
            min_interval_ns: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LongFlowMode {
    /// P4BS: count-min sketch + threshold.
    Sketch,
    /// GLOBECOM 2021 Algorithm 1: packets within a time window.
    Window,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LongFlowConfig {
    pub mode: LongFlowMode,
    pub cms_rows: usize,
    pub cms_width_log2: u32,
    pub cms_reset_ns: u64,
    pub threshold: u32,
    pub ttl_ns: u64,
    pub capacity: usize,
    pub window_slots_log2: u32,
    pub window_ns: u64,
    pub window_packets: u32,
}

impl Default for LongFlowConfig {
    fn default() -> Self {
        LongFlowConfig {
            mode: LongFlowMode::Sketch,
            cms_rows: 4,
            cms_width_log2: 16,
            cms_reset_ns: 10_000_000_000,
            threshold: 2000,
            ttl_ns: 2_000_000_000,
            capacity: 65_536,
            window_slots_log2: 16,
            window_ns: 1_000_000_000,
            window_packets: 1000,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossConfig {
    pub slots_log2: u32,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig { slots_log2: 16 }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueDelayConfig {
    pub slots_log2: u32,
    pub max_age_ns: u64,
}

impl Default for QueueDelayConfig {
    fn default() -> Self {
        QueueDelayConfig {
            slots_log2: 16,
            max_age_ns: 1_000_000_000,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExportConfig {
    pub interval_ns: u64,
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            interval_ns: 100_000_000,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    pub links: Vec<LinkSpec>,
    pub ports: Vec<PortSpec>,
    #[serde(default)]
    pub rtt: RttConfig,
    #[serde(default)]
    pub long_flows: LongFlowConfig,
    #[serde(default)]
    pub loss: LossConfig,
    #[serde(default)]
    pub qdelay: QueueDelayConfig,
    #[serde(default)]
    pub export: ExportConfig,
}

#[derive(Debug)]
pub struct ConfigError(pub Vec<String>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.join("; "))
    }
}

impl std::error::Error for ConfigError {}

/// An IPv4 prefix as (network, mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub network: u32,
    pub mask: u32,
}

impl Prefix {
    pub fn parse(text: &str) -> Result<Prefix, String> {
        let (addr, len) = text.split_once('/').unwrap_or((text, "32"));
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IPv4 prefix"))?;
        let len: u32 = match len.parse() {
            Ok(n) if n <= 32 => n,
            _ => return Err(format!("{text:?}: prefix length must be 0..32")),
        };
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        Ok(Prefix {
            network: u32::from(addr) & mask,
            mask,
        })
    }

    pub fn contains(&self, addr: u32) -> bool {
        addr & self.mask == self.network
    }
}

impl PipelineConfig {
    pub fn from_json(text: &str) -> Result<PipelineConfig, ConfigError> {
        let config: PipelineConfig =
            serde_json::from_str(text).map_err(|e| ConfigError(vec![e.to_string()]))?;
        config.check()?;
        Ok(config)
    }

    /// Every problem at once, as the deployment config does.
    pub fn check(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.links.is_empty() {
            problems.push("links: at least one link is required".to_string());
        }
        if self.links.len() > usize::from(u16::MAX) {
            problems.push("links: at most 65535 links".to_string());
        }
        for (i, link) in self.links.iter().enumerate() {
            if self.links[..i].iter().any(|l| l.id == link.id) {
                problems.push(format!("links[{i}]: link {:?} is listed twice", link.id));
            }
            for p in &link.output_prefixes {
                if let Err(e) = Prefix::parse(p) {
                    problems.push(format!("links[{i}].output_prefixes: {e}"));
                }
            }
        }
        for (i, port) in self.ports.iter().enumerate() {
            if !self.links.iter().any(|l| l.id == port.link) {
                problems.push(format!("ports[{i}]: no link {:?}", port.link));
            }
            if self.ports[..i].iter().any(|p| p.port == port.port) {
                problems.push(format!("ports[{i}]: port {:?} is listed twice", port.port));
            }
        }
        let log2 = |name: &str, v: u32, problems: &mut Vec<String>| {
            if !(1..=24).contains(&v) {
                problems.push(format!("{name}: must be in 1..24 (2^n slots), got {v}"));
            }
        };
        log2("rtt.slots_log2", self.rtt.slots_log2, &mut problems);
        log2(
            "long_flows.cms_width_log2",
            self.long_flows.cms_width_log2,
            &mut problems,
        );
        log2(
            "long_flows.window_slots_log2",
            self.long_flows.window_slots_log2,
            &mut problems,
        );
        log2("loss.slots_log2", self.loss.slots_log2, &mut problems);
        log2("qdelay.slots_log2", self.qdelay.slots_log2, &mut problems);
        if !(1..=4).contains(&self.long_flows.cms_rows) {
            problems.push("long_flows.cms_rows: must be 1..4".to_string());
        }
        for (name, value) in [
            ("rtt.max_age_ns", self.rtt.max_age_ns),
            ("long_flows.cms_reset_ns", self.long_flows.cms_reset_ns),
            ("long_flows.ttl_ns", self.long_flows.ttl_ns),
            ("long_flows.window_ns", self.long_flows.window_ns),
            ("qdelay.max_age_ns", self.qdelay.max_age_ns),
            ("export.interval_ns", self.export.interval_ns),
            ("long_flows.threshold", u64::from(self.long_flows.threshold)),
            (
                "long_flows.window_packets",
                u64::from(self.long_flows.window_packets),
            ),
            ("long_flows.capacity", self.long_flows.capacity as u64),
        ] {
            if value == 0 {
                problems.push(format!("{name}: must be positive"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(problems))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_spec_values() {
        let c = PipelineConfig::from_json(
            r#"{"links": [{"id": "r1:eth1"}], "ports": [{"port": "a", "link": "r1:eth1", "tap": "before"}]}"#,
        )
        .unwrap();
        assert_eq!(c.rtt.slots_log2, 16);
        assert_eq!(c.long_flows.cms_width_log2, 16);
        assert_eq!(c.long_flows.threshold, 2000);
        assert_eq!(c.export.interval_ns, 100_000_000);
        assert_eq!(c.ports[0].direction, Direction::Both);
    }

    #[test]
    fn every_problem_is_reported() {
        let err = PipelineConfig::from_json(
            r#"{"links": [{"id": "a", "output_prefixes": ["10.0.0.0/33"]}, {"id": "a"}],
                "ports": [{"port": "p", "link": "nope", "tap": "after"}],
                "rtt": {"slots_log2": 0}, "export": {"interval_ns": 0}}"#,
        )
        .unwrap_err();
        let text = err.to_string();
        for expected in [
            "prefix length",
            "listed twice",
            "no link \"nope\"",
            "rtt.slots_log2",
            "export.interval_ns",
        ] {
            assert!(text.contains(expected), "{expected} missing from {text}");
        }
        assert!(PipelineConfig::from_json(r#"{"links": [], "bogus": 1}"#).is_err());
    }

    #[test]
    fn prefixes_match_their_addresses() {
        let p = Prefix::parse("10.201.2.0/24").unwrap();
        assert!(p.contains(u32::from(Ipv4Addr::new(10, 201, 2, 2))));
        assert!(!p.contains(u32::from(Ipv4Addr::new(10, 201, 1, 2))));
        assert!(Prefix::parse("0.0.0.0/0").unwrap().contains(12345));
    }
}
