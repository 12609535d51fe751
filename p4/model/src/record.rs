//! What the pipeline emits (SPEC §3–§7): the records the exporter takes from the data plane,
//! with link indices into the port → link table instead of link ids.

use std::io::{self, Write};
use std::net::Ipv4Addr;

/// A flow's 5-tuple (protocol 6) in its data direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
}

impl Flow {
    pub fn from_key(key: &crate::parse::FlowKey) -> Flow {
        Flow {
            src: u32::from_be_bytes([key[0], key[1], key[2], key[3]]),
            dst: u32::from_be_bytes([key[4], key[5], key[6], key[7]]),
            sport: u16::from_be_bytes([key[8], key[9]]),
            dport: u16::from_be_bytes([key[10], key[11]]),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowEventKind {
    Start,
    End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowEventReason {
    Threshold,
    Window,
    IdleTimeout,
    Fin,
    Rst,
}

impl FlowEventKind {
    pub fn name(self) -> &'static str {
        match self {
            FlowEventKind::Start => "start",
            FlowEventKind::End => "end",
        }
    }
}

impl FlowEventReason {
    pub fn name(self) -> &'static str {
        match self {
            FlowEventReason::Threshold => "threshold",
            FlowEventReason::Window => "window",
            FlowEventReason::IdleTimeout => "idle_timeout",
            FlowEventReason::Fin => "fin",
            FlowEventReason::Rst => "rst",
        }
    }
}

/// Per-link counters over one export interval (SPEC §7): `packets`/`bytes` at the before
/// tap (the offered load), `after_packets`/`after_bytes` at the after tap (what the link
/// carried), both in the data direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    pub packets: u64,
    pub bytes: u64,
    pub after_packets: u64,
    pub after_bytes: u64,
    pub data_packets: u64,
    pub data_bytes: u64,
    pub retransmissions: u64,
    pub queue_delay_samples: u64,
    pub queue_delay_sum_ns: u64,
}

impl LinkCounters {
    /// Each counter with its field name in the `LinkCounters` schema, in the schema's order.
    pub fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("packets", self.packets),
            ("bytes", self.bytes),
            ("after_packets", self.after_packets),
            ("after_bytes", self.after_bytes),
            ("data_packets", self.data_packets),
            ("data_bytes", self.data_bytes),
            ("retransmissions", self.retransmissions),
            ("queue_delay_samples", self.queue_delay_samples),
            ("queue_delay_sum_ns", self.queue_delay_sum_ns),
        ]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Rtt {
        link: u16,
        ts_ns: u64,
        flow: Flow,
        rtt_ns: u64,
    },
    FlowEvent {
        link: u16,
        ts_ns: u64,
        kind: FlowEventKind,
        reason: FlowEventReason,
        flow: Flow,
        packets: u64,
    },
    Counters {
        link: u16,
        ts_ns: u64,
        interval_ns: u64,
        seq: u64,
        counters: LinkCounters,
        queue_delay_ewma_ns: u64,
    },
    /// One queueing-delay sample: not a Kafka stream (the counters carry sum, count and
    /// EWMA), but `p4bs analyze` shows them.
    QueueDelay {
        link: u16,
        ts_ns: u64,
        flow: Flow,
        delay_ns: u64,
    },
}

impl Record {
    pub fn link(&self) -> u16 {
        match self {
            Record::Rtt { link, .. }
            | Record::FlowEvent { link, .. }
            | Record::Counters { link, .. }
            | Record::QueueDelay { link, .. } => *link,
        }
    }
}

fn write_flow(out: &mut impl Write, flow: &Flow) -> io::Result<()> {
    write!(
        out,
        r#","src_ip":"{}","src_port":{},"dst_ip":"{}","dst_port":{},"protocol":6"#,
        Ipv4Addr::from(flow.src),
        flow.sport,
        Ipv4Addr::from(flow.dst),
        flow.dport
    )
}

/// One JSON object per line, field names as in the Avro schemas plus `"kind"`
/// (`rtt_sample`, `long_flow`, `link_counters`, `queue_delay`). Link ids are plain text
/// from the config, escaped as JSON strings.
pub fn write_json_line(out: &mut impl Write, record: &Record, link_id: &str) -> io::Result<()> {
    let link_json = serde_json::to_string(link_id).map_err(io::Error::other)?;
    match record {
        Record::Rtt {
            ts_ns,
            flow,
            rtt_ns,
            ..
        } => {
            write!(
                out,
                r#"{{"kind":"rtt_sample","link_id":{link_json},"ts_ns":{ts_ns}"#
            )?;
            write_flow(out, flow)?;
            writeln!(out, r#","rtt_ns":{rtt_ns}}}"#)
        }
        Record::FlowEvent {
            ts_ns,
            kind,
            reason,
            flow,
            packets,
            ..
        } => {
            write!(
                out,
                r#"{{"kind":"long_flow","link_id":{link_json},"ts_ns":{ts_ns},"event":"{}","reason":"{}""#,
                kind.name(),
                reason.name()
            )?;
            write_flow(out, flow)?;
            writeln!(out, r#","packets":{packets}}}"#)
        }
        Record::Counters {
            ts_ns,
            interval_ns,
            seq,
            counters: c,
            queue_delay_ewma_ns,
            ..
        } => {
            write!(
                out,
                r#"{{"kind":"link_counters","link_id":{link_json},"ts_ns":{ts_ns},"interval_ns":{interval_ns},"seq":{seq}"#
            )?;
            for (name, value) in c.named() {
                write!(out, r#","{name}":{value}"#)?;
            }
            writeln!(out, r#","queue_delay_ewma_ns":{queue_delay_ewma_ns}}}"#)
        }
        Record::QueueDelay {
            ts_ns,
            flow,
            delay_ns,
            ..
        } => {
            write!(
                out,
                r#"{{"kind":"queue_delay","link_id":{link_json},"ts_ns":{ts_ns}"#
            )?;
            write_flow(out, flow)?;
            writeln!(out, r#","queue_delay_ns":{delay_ns}}}"#)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_carry_the_schema_field_names() {
        let flow = Flow {
            src: u32::from(Ipv4Addr::new(10, 201, 1, 10)),
            dst: u32::from(Ipv4Addr::new(10, 201, 2, 2)),
            sport: 40000,
            dport: 5201,
        };
        let mut out = Vec::new();
        let rtt = Record::Rtt {
            link: 0,
            ts_ns: 5,
            flow,
            rtt_ns: 20_000_000,
        };
        write_json_line(&mut out, &rtt, "r1:\"eth1\"").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kind"], "rtt_sample");
        assert_eq!(v["link_id"], "r1:\"eth1\"");
        assert_eq!(v["src_ip"], "10.201.1.10");
        assert_eq!(v["dst_port"], 5201);
        assert_eq!(v["rtt_ns"], 20_000_000);
    }
}
