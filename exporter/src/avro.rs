//! Schemaless Avro binary of the three exported records, byte for byte what
//! `p4bs_schemas.codec.codec(NAME).encode(record)` writes: fields in schema order, `int` and
//! `long` as zigzag varints, strings as a varint length and UTF-8 bytes, an array as one
//! block (its item count, the items, then 0). Nothing allocates once warm: every record is
//! appended to a caller's buffer, and an RTT batch's columns keep their capacity between
//! batches.

use std::collections::HashMap;

use p4bs_model::record::{Flow, Record};

/// The fields (path, Avro type) each encoder writes, in order; a nested record's fields follow
/// their array as `array[].field`, an array of numbers' item type as `array[]`. The run spec
/// carries the schemas' own field lists and the exporter refuses to start if they differ.
pub const RTT_SAMPLE_BATCH: &[(&str, &str)] = &[
    ("link_id", "string"),
    ("ts_ns", "long"),
    ("interval_ns", "long"),
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

pub const FLOW_EVENT: &[(&str, &str)] = &[
    ("link_id", "string"),
    ("ts_ns", "long"),
    ("kind", "string"),
    ("reason", "string"),
    ("src_ip", "string"),
    ("dst_ip", "string"),
    ("src_port", "int"),
    ("dst_port", "int"),
    ("protocol", "int"),
    ("packets", "long"),
];

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
];

/// TCP: the only protocol the data plane measures.
const PROTOCOL_TCP: i64 = 6;

/// A value the schema cannot carry (a `long` above 2^63 - 1): the record is not sent.
#[derive(Debug, PartialEq, Eq)]
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

/// Which stream a record goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    RttSamples = 0,
    FlowEvents = 1,
    LinkCounters = 2,
}

impl Stream {
    pub const ALL: [Stream; 3] = [Stream::RttSamples, Stream::FlowEvents, Stream::LinkCounters];

    pub fn name(self) -> &'static str {
        match self {
            Stream::RttSamples => "rtt_samples",
            Stream::FlowEvents => "flow_events",
            Stream::LinkCounters => "link_counters",
        }
    }

    pub fn schema(self) -> &'static str {
        match self {
            Stream::RttSamples => "io.p4bs.RttSampleBatch",
            Stream::FlowEvents => "io.p4bs.FlowEvent",
            Stream::LinkCounters => "io.p4bs.LinkCounters",
        }
    }

    pub fn fields(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Stream::RttSamples => RTT_SAMPLE_BATCH,
            Stream::FlowEvents => FLOW_EVENT,
            Stream::LinkCounters => LINK_COUNTERS,
        }
    }
}

/// The columns of an open `RttSampleBatch`, encoded as its samples come: each flow once, in
/// the order of its first sample, and per sample its flow's index, its offset in the
/// interval and its RTT. Cleared, the buffers and the flow table keep their capacity, so a
/// link's batches stop allocating once it has had its busiest one.
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
    pub fn samples(&self) -> u32 {
        self.samples
    }

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

/// Writes an `RttSampleBatch` to `buf` (cleared first): the samples of `columns`, for the
/// interval `[end_ns - interval_ns, end_ns)`.
pub fn put_rtt_batch(
    buf: &mut Vec<u8>,
    link_id: &[u8],
    end_ns: u64,
    interval_ns: u64,
    columns: &RttColumns,
) -> Result<(), OutOfRange> {
    buf.clear();
    buf.extend_from_slice(link_id);
    put_u64(buf, end_ns, "ts_ns")?;
    put_u64(buf, interval_ns, "interval_ns")?;
    put_array(buf, columns.index_of.len() as u32, &columns.flows);
    for column in [&columns.flow_index, &columns.offset_ns, &columns.rtt_ns] {
        put_array(buf, columns.samples, column);
    }
    Ok(())
}

/// Appends `record` to `buf` (cleared first) with `link_id` already Avro-encoded (see
/// `put_bytes`). Returns its stream, or None for records that are not sent one by one: RTT
/// samples travel in batches (`put_rtt_batch`), queue-delay samples not at all.
pub fn encode(
    buf: &mut Vec<u8>,
    record: &Record,
    link_id: &[u8],
) -> Result<Option<Stream>, OutOfRange> {
    buf.clear();
    match record {
        Record::FlowEvent {
            ts_ns,
            kind,
            reason,
            flow,
            packets,
            ..
        } => {
            buf.extend_from_slice(link_id);
            put_u64(buf, *ts_ns, "ts_ns")?;
            put_bytes(buf, kind.name().as_bytes());
            put_bytes(buf, reason.name().as_bytes());
            put_flow(buf, flow);
            put_u64(buf, *packets, "packets")?;
            Ok(Some(Stream::FlowEvents))
        }
        Record::Counters {
            ts_ns,
            interval_ns,
            seq,
            counters: c,
            queue_delay_ewma_ns,
            ..
        } => {
            buf.extend_from_slice(link_id);
            put_u64(buf, *ts_ns, "ts_ns")?;
            put_u64(buf, *interval_ns, "interval_ns")?;
            put_u64(buf, *seq, "seq")?;
            for (field, value) in c.named() {
                put_u64(buf, value, field)?;
            }
            put_u64(buf, *queue_delay_ewma_ns, "queue_delay_ewma_ns")?;
            Ok(Some(Stream::LinkCounters))
        }
        Record::Rtt { .. } | Record::QueueDelay { .. } => Ok(None),
    }
}

/// A link id as the Avro string every record of the link starts with.
pub fn link_field(link_id: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(link_id.len() + 2);
    put_bytes(&mut buf, link_id.as_bytes());
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use p4bs_model::record::{FlowEventKind, FlowEventReason, LinkCounters};
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
    fn flow(i: u8) -> Flow {
        Flow {
            src: u32::from(Ipv4Addr::new(10, 201, 1, 10 + i)),
            dst: u32::from(Ipv4Addr::new(10, 201, 2, 2)),
            sport: 40000 + u16::from(i),
            dport: 5201,
        }
    }

    fn encoded(record: &Record) -> (Option<Stream>, Vec<u8>) {
        let mut buf = vec![0xaa; 3]; // cleared by encode
        let stream = encode(&mut buf, record, &link_field("r1:eth1")).unwrap();
        (stream, buf)
    }

    // The expected bytes below were written once by fastavro through
    // `p4bs_schemas.codec.codec(NAME).encode(...)` for the same records, and pinned here.

    /// (flow, offset_ns, rtt_ns): several flows, flow 0 more than once.
    const SAMPLES: [(u8, u64, u64); 5] = [
        (0, 3_456_789, 20_000_000),
        (1, 3_500_000, 23_000_000),
        (0, 5_000_000, 20_100_000),
        (2, 7_000_000, 26_000_000),
        (0, 9_999_999, 1),
    ];

    fn rtt_batch(columns: &RttColumns) -> Vec<u8> {
        let mut buf = vec![0xaa; 3]; // cleared
        let link = link_field("r1:eth1");
        put_rtt_batch(
            &mut buf,
            &link,
            1_700_000_000_130_000_000,
            10_000_000,
            columns,
        )
        .unwrap();
        buf
    }

    fn columns(samples: &[(u8, u64, u64)]) -> RttColumns {
        let mut columns = RttColumns::default();
        for &(i, offset_ns, rtt_ns) in samples {
            columns.push(&flow(i), offset_ns, rtt_ns).unwrap();
        }
        columns
    }

    #[test]
    fn rtt_sample_batch_matches_the_python_codec() {
        let mut reused = columns(&SAMPLES);
        assert_eq!(reused.samples(), 5);
        assert_eq!(rtt_batch(&reused), PY_RTT_SAMPLE_BATCH);
        // Cleared, the columns start the next batch afresh: its first flow gets index 0.
        reused.clear();
        reused.push(&flow(2), 1, 2).unwrap();
        assert_eq!(rtt_batch(&reused), rtt_batch(&columns(&[(2, 1, 2)])));
    }

    #[test]
    fn flow_event_matches_the_python_codec() {
        let (stream, bytes) = encoded(&Record::FlowEvent {
            link: 0,
            ts_ns: 1_700_000_000_000_000_000,
            kind: FlowEventKind::End,
            reason: FlowEventReason::IdleTimeout,
            flow: flow(0),
            packets: 2001,
        });
        assert_eq!(stream, Some(Stream::FlowEvents));
        assert_eq!(bytes, PY_FLOW_EVENT);
    }

    #[test]
    fn link_counters_match_the_python_codec() {
        let (stream, bytes) = encoded(&Record::Counters {
            link: 0,
            ts_ns: 1_700_000_000_100_000_000,
            interval_ns: 100_000_000,
            seq: 7,
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
        });
        assert_eq!(stream, Some(Stream::LinkCounters));
        assert_eq!(bytes, PY_LINK_COUNTERS);
    }

    #[test]
    fn values_above_the_long_range_are_refused_and_leave_no_bytes() {
        let mut refusing = columns(&SAMPLES[..1]);
        for (offset_ns, rtt_ns, field) in [(1, u64::MAX, "rtt_ns"), (u64::MAX, 1, "offset_ns")] {
            assert_eq!(
                refusing.push(&flow(1), offset_ns, rtt_ns),
                Err(OutOfRange(field))
            );
            assert_eq!(refusing.samples(), 1);
            assert_eq!(rtt_batch(&refusing), rtt_batch(&columns(&SAMPLES[..1])));
        }
    }

    #[test]
    fn queue_delay_and_single_rtt_samples_are_not_exported_one_by_one() {
        let record = Record::QueueDelay {
            link: 0,
            ts_ns: 1,
            flow: flow(0),
            delay_ns: 5,
        };
        assert_eq!(encoded(&record).0, None);
        let record = Record::Rtt {
            link: 0,
            ts_ns: 1,
            flow: flow(0),
            rtt_ns: 5,
        };
        assert_eq!(encoded(&record).0, None);
    }

    #[test]
    fn field_lists_are_the_schemas() {
        assert_eq!(Stream::ALL.map(|s| s.fields().len()), [15, 10, 14]);
        assert!(Stream::ALL.iter().all(|s| s.fields()[0].0 == "link_id"));
    }

    const PY_RTT_SAMPLE_BATCH: &[u8] = &[
        0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x92, 0xcd, 0xde, 0xc7, 0xbf, 0xce,
        0x97, 0x2f, 0x80, 0xda, 0xc4, 0x09, 0x06, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
        0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32,
        0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31,
        0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x82,
        0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e,
        0x31, 0x32, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x84, 0xf1,
        0x04, 0xa2, 0x51, 0x0c, 0x00, 0x0a, 0x00, 0x02, 0x00, 0x04, 0x00, 0x00, 0x0a, 0xaa, 0xfc,
        0xa5, 0x03, 0xc0, 0x9f, 0xab, 0x03, 0x80, 0xad, 0xe2, 0x04, 0x80, 0xbf, 0xd6, 0x06, 0xfe,
        0xd9, 0xc4, 0x09, 0x00, 0x0a, 0x80, 0xb4, 0x89, 0x13, 0x80, 0xcf, 0xf7, 0x15, 0xc0, 0xce,
        0x95, 0x13, 0x80, 0xea, 0xe5, 0x18, 0x02, 0x00,
    ];
    const PY_FLOW_EVENT: &[u8] = &[
        0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x80, 0xd0, 0xe2, 0xc6, 0xbf, 0xce,
        0x97, 0x2f, 0x06, 0x65, 0x6e, 0x64, 0x18, 0x69, 0x64, 0x6c, 0x65, 0x5f, 0x74, 0x69, 0x6d,
        0x65, 0x6f, 0x75, 0x74, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31,
        0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04,
        0xa2, 0x51, 0x0c, 0xa2, 0x1f,
    ];
    const PY_LINK_COUNTERS: &[u8] = &[
        0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf, 0xce,
        0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x0e, 0xd0, 0x0f, 0xc0, 0x8d, 0xb7, 0x01, 0x80, 0x0f,
        0xe0, 0xc7, 0xae, 0x01, 0xbc, 0x0f, 0x80, 0xd5, 0xb4, 0x01, 0x06, 0x00, 0x00, 0x80, 0x89,
        0x0f,
    ];
}
