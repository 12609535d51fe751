//! Schemaless Avro binary of the exported record, `LinkCounters` v3, byte for byte what
//! `p4bs_schemas.codec.codec("LinkCounters").encode(record)` writes: fields in schema order,
//! `int` and `long` as zigzag varints, a boolean as one byte, strings as a varint length and
//! UTF-8 bytes, an array as one block (its item count, the items, then 0). Nothing allocates
//! once warm: records are appended to a caller's buffer, and the RTT columns keep their
//! capacity between records.

use std::collections::HashMap;

use p4bs_model::record::{Flow, FlowEventKind, FlowEventReason, LinkCounters};

/// The stream (`[kafka.topics]` key) and the schema this exporter writes.
pub const STREAM: &str = "link_counters";
pub const SCHEMA: &str = "io.p4bs.LinkCounters";

/// The fields (path, Avro type) `put_link_counters` writes, in order; a nested record's fields
/// follow their array as `array[].field`, an array of numbers' item type as `array[]`. The run
/// spec carries the schema's own field list and the exporter refuses to start if it differs.
pub const LINK_COUNTERS: &[(&str, &str)] = &[
    ("link_id", "string"),
    ("ts_ns", "long"),
    ("interval_ns", "long"),
    ("seq", "long"),
    ("packets", "long"),
    ("bytes", "long"),
    ("after_packets", "long"),
    ("after_bytes", "long"),
    ("data_packets", "long"),
    ("data_bytes", "long"),
    ("retransmissions", "long"),
    ("queue_delay_samples", "long"),
    ("queue_delay_sum_ns", "long"),
    ("queue_delay_ewma_ns", "long"),
    ("part", "int"),
    ("complete", "boolean"),
    ("flow_events", "array"),
    ("flow_events[].ts_ns", "long"),
    ("flow_events[].kind", "string"),
    ("flow_events[].reason", "string"),
    ("flow_events[].src_ip", "string"),
    ("flow_events[].dst_ip", "string"),
    ("flow_events[].src_port", "int"),
    ("flow_events[].dst_port", "int"),
    ("flow_events[].protocol", "int"),
    ("flow_events[].packets", "long"),
    ("flows", "array"),
    ("flows[].src_ip", "string"),
    ("flows[].dst_ip", "string"),
    ("flows[].src_port", "int"),
    ("flows[].dst_port", "int"),
    ("flows[].protocol", "int"),
    ("flow_index", "array"),
    ("flow_index[]", "int"),
    ("offset_ns", "array"),
    ("offset_ns[]", "long"),
    ("rtt_ns", "array"),
    ("rtt_ns[]", "long"),
];

/// TCP: the only protocol the data plane measures.
const PROTOCOL_TCP: i64 = 6;

/// A value the schema cannot carry (a `long` above 2^63 - 1): the record is not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfRange(pub &'static str);

/// Appends `v` as a zigzag varint (Avro `int` and `long` alike).
#[inline]
pub fn put_long(buf: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

#[inline]
pub fn put_bytes(buf: &mut Vec<u8>, s: &[u8]) {
    put_long(buf, s.len() as i64);
    buf.extend_from_slice(s);
}

#[inline]
fn put_u64(buf: &mut Vec<u8>, v: u64, field: &'static str) -> Result<(), OutOfRange> {
    let v = i64::try_from(v).map_err(|_| OutOfRange(field))?;
    put_long(buf, v);
    Ok(())
}

/// An IPv4 address (host order) as a dotted-quad Avro string, as `Ipv4Addr`'s Display.
#[inline]
fn put_ipv4(buf: &mut Vec<u8>, addr: u32) {
    let mut text = [0u8; 15];
    let mut len = 0;
    for (i, octet) in addr.to_be_bytes().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            text[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            text[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        text[len] = b'0' + octet % 10;
        len += 1;
    }
    put_bytes(buf, &text[..len]);
}

#[inline]
fn put_flow(buf: &mut Vec<u8>, flow: &Flow) {
    put_ipv4(buf, flow.src);
    put_ipv4(buf, flow.dst);
    put_long(buf, i64::from(flow.sport));
    put_long(buf, i64::from(flow.dport));
    put_long(buf, PROTOCOL_TCP);
}

/// A record's counts: the interval's counters on its complete record, zero on earlier parts
/// and on intervals whose counters never came.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub counters: LinkCounters,
    pub queue_delay_ewma_ns: u64,
}

/// A long flow starting or ending (the schema's `LongFlowChange`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongFlowChange {
    pub ts_ns: u64,
    pub kind: FlowEventKind,
    pub reason: FlowEventReason,
    pub flow: Flow,
    pub packets: u64,
}

/// A record's RTT samples as its columns, encoded as the samples come: each flow once, in
/// the order of its first sample, and per sample its flow's index, its offset in the
/// interval and its RTT. Cleared, the buffers and the flow table keep their capacity, so
/// they stop allocating once a link has had its busiest record.
#[derive(Default)]
pub struct RttColumns {
    index_of: HashMap<Flow, u32>,
    flows: Vec<u8>,
    flow_index: Vec<u8>,
    offset_ns: Vec<u8>,
    rtt_ns: Vec<u8>,
    samples: u32,
}

impl RttColumns {
    /// Appends a sample of `flow` seen `offset_ns` after the interval's start. A value the
    /// schema cannot carry leaves the columns as they were.
    pub fn push(&mut self, flow: &Flow, offset_ns: u64, rtt_ns: u64) -> Result<(), OutOfRange> {
        let offset_ns = i64::try_from(offset_ns).map_err(|_| OutOfRange("offset_ns"))?;
        let rtt_ns = i64::try_from(rtt_ns).map_err(|_| OutOfRange("rtt_ns"))?;
        let next = self.index_of.len() as u32;
        let index = *self.index_of.entry(*flow).or_insert_with(|| {
            put_flow(&mut self.flows, flow);
            next
        });
        put_long(&mut self.flow_index, i64::from(index));
        put_long(&mut self.offset_ns, offset_ns);
        put_long(&mut self.rtt_ns, rtt_ns);
        self.samples += 1;
        Ok(())
    }

    pub fn clear(&mut self) {
        self.index_of.clear();
        self.flows.clear();
        self.flow_index.clear();
        self.offset_ns.clear();
        self.rtt_ns.clear();
        self.samples = 0;
    }
}

/// Appends an array of `count` items already encoded in `items`.
fn put_array(buf: &mut Vec<u8>, count: u32, items: &[u8]) {
    if count > 0 {
        put_long(buf, i64::from(count));
        buf.extend_from_slice(items);
    }
    buf.push(0); // end of the array
}

/// Where a record stands: its link, its interval `[end_ns - interval_ns, end_ns)`, its
/// place in the link's records (`seq`) and in its interval's (`part`, `complete`).
pub struct RecordHead<'a> {
    /// The link id as an Avro string (`link_field`).
    pub link_field: &'a [u8],
    pub end_ns: u64,
    pub interval_ns: u64,
    pub seq: u64,
    pub part: u32,
    pub complete: bool,
}

/// Appends a `LinkCounters` record to `buf`. On an error `buf` holds part of it: the caller
/// cuts it off.
pub fn put_link_counters(
    buf: &mut Vec<u8>,
    head: &RecordHead<'_>,
    counts: &Counts,
    events: &[LongFlowChange],
    columns: &RttColumns,
) -> Result<(), OutOfRange> {
    buf.extend_from_slice(head.link_field);
    put_u64(buf, head.end_ns, "ts_ns")?;
    put_u64(buf, head.interval_ns, "interval_ns")?;
    put_u64(buf, head.seq, "seq")?;
    for (field, value) in counts.counters.named() {
        put_u64(buf, value, field)?;
    }
    put_u64(buf, counts.queue_delay_ewma_ns, "queue_delay_ewma_ns")?;
    put_long(buf, i64::from(head.part));
    buf.push(u8::from(head.complete));
    if !events.is_empty() {
        put_long(buf, events.len() as i64);
        for e in events {
            put_u64(buf, e.ts_ns, "flow_events[].ts_ns")?;
            put_bytes(buf, e.kind.name().as_bytes());
            put_bytes(buf, e.reason.name().as_bytes());
            put_flow(buf, &e.flow);
            put_u64(buf, e.packets, "flow_events[].packets")?;
        }
    }
    buf.push(0); // end of flow_events
    put_array(buf, columns.index_of.len() as u32, &columns.flows);
    for column in [&columns.flow_index, &columns.offset_ns, &columns.rtt_ns] {
        put_array(buf, columns.samples, column);
    }
    Ok(())
}

/// A link id as the Avro string every record of the link starts with.
pub fn link_field(link_id: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(link_id.len() + 2);
    put_bytes(&mut buf, link_id.as_bytes());
    buf
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn long(v: i64) -> Vec<u8> {
        let mut b = Vec::new();
        put_long(&mut b, v);
        b
    }

    #[test]
    fn longs_are_zigzag_varints() {
        assert_eq!(long(0), [0x00]);
        assert_eq!(long(-1), [0x01]);
        assert_eq!(long(1), [0x02]);
        assert_eq!(long(-64), [0x7f]);
        assert_eq!(long(64), [0x80, 0x01]);
        assert_eq!(long(300), [0xd8, 0x04]);
        assert_eq!(
            long(i64::MAX),
            [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        assert_eq!(
            long(i64::MIN),
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }

    #[test]
    fn addresses_are_dotted_quads() {
        for addr in [
            Ipv4Addr::new(0, 0, 0, 0),
            Ipv4Addr::new(10, 201, 1, 10),
            Ipv4Addr::new(255, 255, 255, 255),
            Ipv4Addr::new(1, 20, 100, 9),
        ] {
            let mut b = Vec::new();
            put_ipv4(&mut b, u32::from(addr));
            let text = addr.to_string();
            assert_eq!(b[0] as usize, text.len() * 2);
            assert_eq!(&b[1..], text.as_bytes());
        }
    }

    /// Flow `i` of the tests: 10.201.1.(10 + i):(40000 + i) > 10.201.2.2:5201.
    pub(crate) fn flow(i: u8) -> Flow {
        Flow {
            src: u32::from(Ipv4Addr::new(10, 201, 1, 10 + i)),
            dst: u32::from(Ipv4Addr::new(10, 201, 2, 2)),
            sport: 40000 + u16::from(i),
            dport: 5201,
        }
    }

    // The expected bytes below were written once by fastavro through
    // `p4bs_schemas.codec.codec("LinkCounters").encode(...)` for the same records, and pinned
    // here.

    const END_NS: u64 = 1_700_000_000_100_000_000;

    /// (flow, offset_ns, rtt_ns): several flows, flow 0 more than once.
    const SAMPLES: [(u8, u64, u64); 5] = [
        (0, 3_456_789, 20_000_000),
        (1, 3_500_000, 23_000_000),
        (0, 5_000_000, 20_100_000),
        (2, 7_000_000, 26_000_000),
        (0, 9_999_999, 1),
    ];

    fn columns(samples: &[(u8, u64, u64)]) -> RttColumns {
        let mut columns = RttColumns::default();
        for &(i, offset_ns, rtt_ns) in samples {
            columns.push(&flow(i), offset_ns, rtt_ns).unwrap();
        }
        columns
    }

    fn record(
        seq: u64,
        part: u32,
        complete: bool,
        counts: &Counts,
        events: &[LongFlowChange],
        columns: &RttColumns,
    ) -> Vec<u8> {
        let link = link_field("r1:eth1");
        let head = RecordHead {
            link_field: &link,
            end_ns: END_NS,
            interval_ns: 100_000_000,
            seq,
            part,
            complete,
        };
        let mut buf = vec![0xaa; 3]; // appended to
        put_link_counters(&mut buf, &head, counts, events, columns).unwrap();
        assert_eq!(buf[..3], [0xaa; 3]);
        buf.split_off(3)
    }

    fn counts() -> Counts {
        Counts {
            counters: LinkCounters {
                packets: 1000,
                bytes: 1_500_000,
                after_packets: 960,
                after_bytes: 1_430_000,
                data_packets: 990,
                data_bytes: 1_480_000,
                retransmissions: 3,
                queue_delay_samples: 0,
                queue_delay_sum_ns: 0,
            },
            queue_delay_ewma_ns: 123_456,
        }
    }

    fn events() -> [LongFlowChange; 2] {
        [
            LongFlowChange {
                ts_ns: END_NS - 100_000_000,
                kind: FlowEventKind::Start,
                reason: FlowEventReason::Threshold,
                flow: flow(1),
                packets: 2001,
            },
            LongFlowChange {
                ts_ns: END_NS - 1,
                kind: FlowEventKind::End,
                reason: FlowEventReason::IdleTimeout,
                flow: flow(0),
                packets: 70_000,
            },
        ]
    }

    #[test]
    fn a_complete_record_matches_the_python_codec() {
        let bytes = record(7, 2, true, &counts(), &events(), &columns(&SAMPLES));
        assert_eq!(bytes, PY_COMPLETE);
    }

    #[test]
    fn a_part_and_an_empty_record_match_the_python_codec() {
        let mut reused = columns(&SAMPLES);
        reused.clear();
        for &(i, offset_ns, rtt_ns) in &SAMPLES[..2] {
            reused.push(&flow(i), offset_ns, rtt_ns).unwrap();
        }
        // Cleared, the columns start afresh: the first flow gets index 0 again.
        assert_eq!(reused.samples, 2);
        let part = record(5, 0, false, &Counts::default(), &[], &reused);
        assert_eq!(part, PY_PART);
        reused.clear();
        let empty = record(0, 0, true, &Counts::default(), &[], &reused);
        assert_eq!(empty, PY_EMPTY);
    }

    #[test]
    fn values_above_the_long_range_are_refused() {
        let mut refusing = columns(&SAMPLES[..1]);
        for (offset_ns, rtt_ns, field) in [(1, u64::MAX, "rtt_ns"), (u64::MAX, 1, "offset_ns")] {
            assert_eq!(
                refusing.push(&flow(1), offset_ns, rtt_ns),
                Err(OutOfRange(field))
            );
            assert_eq!(refusing.samples, 1);
        }
        let link = link_field("r1:eth1");
        let mut too_many = counts();
        too_many.counters.retransmissions = u64::MAX;
        let head = RecordHead {
            link_field: &link,
            end_ns: END_NS,
            interval_ns: 100_000_000,
            seq: 0,
            part: 0,
            complete: true,
        };
        let mut buf = Vec::new();
        let refused = put_link_counters(&mut buf, &head, &too_many, &[], &refusing);
        assert_eq!(refused, Err(OutOfRange("retransmissions")));
    }

    #[test]
    fn the_field_list_is_the_schemas() {
        // 4 head fields, 10 counts, part, complete, 3 arrays of records and 3 of numbers.
        assert_eq!(LINK_COUNTERS.len(), 4 + 10 + 2 + (1 + 9) + (1 + 5) + 3 * 2);
        assert_eq!(LINK_COUNTERS[0], ("link_id", "string"));
    }

    const PY_COMPLETE: &[u8] = &[
        0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf, 0xce,
        0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x0e, 0xd0, 0x0f, 0xc0, 0x8d, 0xb7, 0x01, 0x80, 0x0f,
        0xe0, 0xc7, 0xae, 0x01, 0xbc, 0x0f, 0x80, 0xd5, 0xb4, 0x01, 0x06, 0x00, 0x00, 0x80, 0x89,
        0x0f, 0x04, 0x01, 0x04, 0x80, 0x80, 0xd0, 0xe2, 0xc6, 0xbf, 0xce, 0x97, 0x2f, 0x0a, 0x73,
        0x74, 0x61, 0x72, 0x74, 0x12, 0x74, 0x68, 0x72, 0x65, 0x73, 0x68, 0x6f, 0x6c, 0x64, 0x16,
        0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e,
        0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x82, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0xa2, 0x1f,
        0xfe, 0x83, 0xff, 0xc1, 0xc7, 0xbf, 0xce, 0x97, 0x2f, 0x06, 0x65, 0x6e, 0x64, 0x18, 0x69,
        0x64, 0x6c, 0x65, 0x5f, 0x74, 0x69, 0x6d, 0x65, 0x6f, 0x75, 0x74, 0x16, 0x31, 0x30, 0x2e,
        0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31,
        0x2e, 0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0xe0, 0xc5, 0x08, 0x00, 0x06,
        0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30,
        0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16,
        0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e,
        0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x82, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16, 0x31,
        0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x32, 0x14, 0x31, 0x30, 0x2e, 0x32,
        0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x84, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x0a, 0x00,
        0x02, 0x00, 0x04, 0x00, 0x00, 0x0a, 0xaa, 0xfc, 0xa5, 0x03, 0xc0, 0x9f, 0xab, 0x03, 0x80,
        0xad, 0xe2, 0x04, 0x80, 0xbf, 0xd6, 0x06, 0xfe, 0xd9, 0xc4, 0x09, 0x00, 0x0a, 0x80, 0xb4,
        0x89, 0x13, 0x80, 0xcf, 0xf7, 0x15, 0xc0, 0xce, 0x95, 0x13, 0x80, 0xea, 0xe5, 0x18, 0x02,
        0x00,
    ];
    const PY_PART: &[u8] = &[
        0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf, 0xce,
        0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31,
        0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x80,
        0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e,
        0x31, 0x31, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x82, 0xf1,
        0x04, 0xa2, 0x51, 0x0c, 0x00, 0x04, 0x00, 0x02, 0x00, 0x04, 0xaa, 0xfc, 0xa5, 0x03, 0xc0,
        0x9f, 0xab, 0x03, 0x00, 0x04, 0x80, 0xb4, 0x89, 0x13, 0x80, 0xcf, 0xf7, 0x15, 0x00,
    ];
    const PY_EMPTY: &[u8] = &[
        0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf, 0xce,
        0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
}
