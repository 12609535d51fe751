//! A link's export interval as one `LinkCounters` record — or several, when it has more RTT
//! samples than a record holds: what `p4bs_schemas.intervals.IntervalAssembler` makes of the
//! same data-plane records, in the same order, byte for byte.
//!
//! RTT samples and long-flow events wait in the grid interval (`interval_ns` long, aligned
//! to multiples of it since the epoch, as the data plane's) their time falls in, until the
//! link's counters close it. A grid interval that reaches `max_samples` samples sends them
//! at once as a part (`complete = false`, counts 0). The counters of `[end - interval, end)`
//! send the grid intervals that ended by its start first (their counters never came: records
//! of their own, counts 0), then the samples and events before `end` in records of at most
//! `max_samples` samples, the last complete, with the counts and the events; a grid interval
//! it takes from (the last, short interval at exit ends inside one) numbers its later records
//! after these. The data plane stamps an idle-timeout end with the end of the interval that
//! found it, so it falls in the next one. `seq` counts a link's records.
//!
//! Nothing allocates once warm: the waiting samples and events are kept in vectors that are
//! cleared, not freed, and emptied grid intervals go to a pool.

use std::ops::Range;

use p4bs_model::record::{Flow, Record};

use crate::avro::{self, Counts, LongFlowChange, OutOfRange, RecordHead, RttColumns};

#[derive(Clone, Copy)]
struct RttSample {
    ts_ns: u64,
    flow: Flow,
    rtt_ns: u64,
}

/// What has come of one of a link's grid intervals and not been sent.
#[derive(Default)]
struct OpenInterval {
    end_ns: u64,
    samples: Vec<RttSample>,
    events: Vec<LongFlowChange>,
    /// Parts sent already.
    parts: u32,
}

struct Link {
    /// The link id as the Avro string its records start with.
    field: Vec<u8>,
    seq: u64,
    /// Ascending by `end_ns`.
    open: Vec<OpenInterval>,
}

/// One record ready for Kafka (its bytes in `Encoded::bytes`), or one the schema cannot
/// carry.
pub struct EncodedRecord {
    /// The link's index (the pipeline's link order).
    pub link: usize,
    /// RTT samples in it.
    pub samples: u32,
    pub value: Result<Range<usize>, OutOfRange>,
}

/// Records to send, in order; cleared (not freed) once sent.
#[derive(Default)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub records: Vec<EncodedRecord>,
}

impl Encoded {
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.records.clear();
    }
}

pub struct Assembler {
    interval_ns: u64,
    max_samples: usize,
    /// In the pipeline's link order.
    links: Vec<Link>,
    /// Emptied grid intervals, kept for their vectors' capacity.
    spare: Vec<OpenInterval>,
    /// The samples and events of the records being written; empty between calls.
    samples: Vec<RttSample>,
    events: Vec<LongFlowChange>,
    columns: RttColumns,
}

impl Assembler {
    /// `link_ids` in the pipeline's link order; `interval_ns` the data plane's export
    /// interval; `max_samples` > 0.
    pub fn new(link_ids: &[&str], interval_ns: u64, max_samples: u32) -> Assembler {
        assert!(interval_ns > 0 && max_samples > 0, "checked by the spec");
        Assembler {
            interval_ns,
            max_samples: max_samples as usize,
            links: link_ids
                .iter()
                .map(|id| Link {
                    field: avro::link_field(id),
                    seq: 0,
                    open: Vec::new(),
                })
                .collect(),
            spare: Vec::new(),
            samples: Vec::new(),
            events: Vec::new(),
            columns: RttColumns::default(),
        }
    }

    /// Takes one data-plane record; appends to `out` the records it completes.
    pub fn add(&mut self, record: &Record, out: &mut Encoded) {
        match *record {
            Record::Rtt {
                link,
                ts_ns,
                flow,
                rtt_ns,
            } => self.add_sample(
                usize::from(link),
                RttSample {
                    ts_ns,
                    flow,
                    rtt_ns,
                },
                out,
            ),
            Record::FlowEvent {
                link,
                ts_ns,
                kind,
                reason,
                flow,
                packets,
            } => self.add_event(
                usize::from(link),
                LongFlowChange {
                    ts_ns,
                    kind,
                    reason,
                    flow,
                    packets,
                },
                out,
            ),
            Record::Counters {
                link,
                ts_ns,
                interval_ns,
                counters,
                queue_delay_ewma_ns,
                ..
            } => {
                let counts = Counts {
                    counters,
                    queue_delay_ewma_ns,
                };
                self.close(usize::from(link), ts_ns, interval_ns, &counts, out);
            }
            // Not exported one by one: the counters carry their count, sum and EWMA.
            Record::QueueDelay { .. } => {}
        }
    }

    /// Every grid interval still open, as complete records with zero counts (at exit).
    pub fn close_all(&mut self, out: &mut Encoded) {
        for link in 0..self.links.len() {
            while !self.links[link].open.is_empty() {
                let interval = self.links[link].open.remove(0);
                self.send_whole(link, interval, out);
            }
        }
    }

    /// The end of the grid interval holding `ts_ns`, if a record's `ts_ns` can carry it.
    fn grid_end(&self, ts_ns: u64) -> Option<u64> {
        (ts_ns - ts_ns % self.interval_ns)
            .checked_add(self.interval_ns)
            .filter(|&end| i64::try_from(end).is_ok())
    }

    /// The position in `link`'s open intervals of the one ending at `end_ns`, opened if new.
    fn open(&mut self, link: usize, end_ns: u64) -> usize {
        let open = &mut self.links[link].open;
        match open.binary_search_by_key(&end_ns, |o| o.end_ns) {
            Ok(i) => i,
            Err(i) => {
                let mut interval = self.spare.pop().unwrap_or_default();
                debug_assert!(interval.samples.is_empty() && interval.events.is_empty());
                interval.end_ns = end_ns;
                interval.parts = 0;
                open.insert(i, interval);
                i
            }
        }
    }

    fn refuse(link: usize, field: &'static str, out: &mut Encoded) {
        out.records.push(EncodedRecord {
            link,
            samples: 0,
            value: Err(OutOfRange(field)),
        });
    }

    fn add_sample(&mut self, link: usize, sample: RttSample, out: &mut Encoded) {
        // Checked here so that one absurd sample cannot cost its interval's record.
        if i64::try_from(sample.rtt_ns).is_err() {
            return Self::refuse(link, "rtt_ns", out);
        }
        let Some(end_ns) = self.grid_end(sample.ts_ns) else {
            return Self::refuse(link, "ts_ns", out);
        };
        let i = self.open(link, end_ns);
        let interval = &mut self.links[link].open[i];
        interval.samples.push(sample);
        if interval.samples.len() < self.max_samples {
            return;
        }
        // A full part goes now, in its grid interval.
        let first_part = interval.parts;
        interval.parts += 1;
        std::mem::swap(&mut self.samples, &mut interval.samples);
        self.put_records(link, end_ns, self.interval_ns, first_part, None, out);
        self.samples.clear();
    }

    fn add_event(&mut self, link: usize, event: LongFlowChange, out: &mut Encoded) {
        let Some(end_ns) = self.grid_end(event.ts_ns) else {
            return Self::refuse(link, "flow_events[].ts_ns", out);
        };
        let i = self.open(link, end_ns);
        self.links[link].open[i].events.push(event);
    }

    /// The interval `[end_ns - interval_ns, end_ns)` is over, with these counts.
    fn close(
        &mut self,
        link: usize,
        end_ns: u64,
        interval_ns: u64,
        counts: &Counts,
        out: &mut Encoded,
    ) {
        let start = end_ns.saturating_sub(interval_ns);
        while self.links[link]
            .open
            .first()
            .is_some_and(|o| o.end_ns <= start)
        {
            let interval = self.links[link].open.remove(0);
            self.send_whole(link, interval, out);
        }
        // The records of a grid interval are numbered on, whichever interval takes its
        // samples (a short last one at exit takes from the grid interval it ends in); one
        // emptied goes, one that keeps something numbers its next records after these.
        let mut parts = 0;
        let mut i = 0;
        // Only the grid interval `end_ns` falls in can be taken from and keep something.
        let mut straddling = None;
        while i < self.links[link].open.len() {
            let interval = &mut self.links[link].open[i];
            let before = self.samples.len() + self.events.len();
            let (samples, events) = (&mut interval.samples, &mut interval.events);
            self.samples
                .extend(samples.iter().filter(|s| s.ts_ns < end_ns));
            samples.retain(|s| s.ts_ns >= end_ns);
            self.events
                .extend(events.iter().filter(|e| e.ts_ns < end_ns));
            events.retain(|e| e.ts_ns >= end_ns);
            let taken = self.samples.len() + self.events.len() > before;
            let ended = interval.end_ns <= end_ns;
            if ended || taken {
                parts = parts.max(interval.parts);
            }
            if ended || (taken && interval.samples.is_empty() && interval.events.is_empty()) {
                let emptied = self.links[link].open.remove(i);
                self.spare.push(emptied);
                continue;
            }
            if taken {
                straddling = Some(i);
            }
            i += 1;
        }
        let sent = out.records.len();
        self.put_records(link, end_ns, interval_ns, parts, Some(counts), out);
        if let Some(i) = straddling {
            self.links[link].open[i].parts = parts + (out.records.len() - sent) as u32;
        }
        self.samples.clear();
        self.events.clear();
    }

    /// A grid interval whose counters never came (or that is open at exit), whole: its last
    /// record complete, counts 0.
    fn send_whole(&mut self, link: usize, mut interval: OpenInterval, out: &mut Encoded) {
        std::mem::swap(&mut self.samples, &mut interval.samples);
        std::mem::swap(&mut self.events, &mut interval.events);
        let (end_ns, parts) = (interval.end_ns, interval.parts);
        self.put_records(
            link,
            end_ns,
            self.interval_ns,
            parts,
            Some(&Counts::default()),
            out,
        );
        self.samples.clear();
        self.events.clear();
        self.spare.push(interval);
    }

    /// The records of `[end_ns - interval_ns, end_ns)` holding `self.samples`, at most
    /// `max_samples` each, parts numbered from `first_part`; with `ending`, the last is
    /// complete and carries those counts and `self.events`.
    fn put_records(
        &mut self,
        link: usize,
        end_ns: u64,
        interval_ns: u64,
        first_part: u32,
        ending: Option<&Counts>,
        out: &mut Encoded,
    ) {
        let mut records = self.samples.len().div_ceil(self.max_samples);
        if ending.is_some() {
            records = records.max(1);
        }
        let no_counts = Counts::default();
        for i in 0..records {
            let from = i * self.max_samples;
            let chunk = &self.samples[from..self.samples.len().min(from + self.max_samples)];
            let complete = ending.is_some() && i == records - 1;
            let (counts, events) = match ending {
                Some(counts) if complete => (counts, &self.events[..]),
                _ => (&no_counts, &[][..]),
            };
            let link_state = &mut self.links[link];
            let head = RecordHead {
                link_field: &link_state.field,
                end_ns,
                interval_ns,
                seq: link_state.seq,
                part: first_part + i as u32,
                complete,
            };
            // A record the schema cannot carry still takes its seq: the gap shows the loss.
            link_state.seq += 1;
            let begin = out.bytes.len();
            let value = encode(
                &mut out.bytes,
                &head,
                counts,
                events,
                chunk,
                &mut self.columns,
            )
            .map(|()| begin..out.bytes.len())
            .inspect_err(|_| out.bytes.truncate(begin));
            out.records.push(EncodedRecord {
                link,
                samples: chunk.len() as u32,
                value,
            });
        }
    }
}

fn encode(
    buf: &mut Vec<u8>,
    head: &RecordHead<'_>,
    counts: &Counts,
    events: &[LongFlowChange],
    samples: &[RttSample],
    columns: &mut RttColumns,
) -> Result<(), OutOfRange> {
    let start = head
        .end_ns
        .checked_sub(head.interval_ns)
        .ok_or(OutOfRange("interval_ns"))?;
    columns.clear();
    for s in samples {
        // Samples come from grid intervals that start at or after `start`.
        let offset_ns = s.ts_ns.checked_sub(start).ok_or(OutOfRange("offset_ns"))?;
        columns.push(&s.flow, offset_ns, s.rtt_ns)?;
    }
    avro::put_link_counters(buf, head, counts, events, columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::tests::flow;
    use p4bs_model::record::{FlowEventKind, FlowEventReason, LinkCounters};

    const MS: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000_000_000_000;
    const INTERVAL_NS: u64 = 100 * MS;

    fn sample(link: u16, ts_ns: u64, i: u8, rtt_ns: u64) -> Record {
        Record::Rtt {
            link,
            ts_ns,
            flow: flow(i),
            rtt_ns,
        }
    }

    fn idle_end(link: u16, ts_ns: u64, i: u8, packets: u64) -> Record {
        Record::FlowEvent {
            link,
            ts_ns,
            kind: FlowEventKind::End,
            reason: FlowEventReason::IdleTimeout,
            flow: flow(i),
            packets,
        }
    }

    /// Counters n, n + 1, ... in the schema's order.
    fn counters(link: u16, ts_ns: u64, interval_ns: u64, n: u64) -> Record {
        Record::Counters {
            link,
            ts_ns,
            interval_ns,
            seq: 99, // the model's count of intervals, not the records' seq
            counters: LinkCounters {
                packets: n,
                bytes: n + 1,
                after_packets: n + 2,
                after_bytes: n + 3,
                data_packets: n + 4,
                data_bytes: n + 5,
                retransmissions: n + 6,
                queue_delay_samples: n + 7,
                queue_delay_sum_ns: n + 8,
            },
            queue_delay_ewma_ns: n + 9,
        }
    }

    /// Each record sent, as (link, RTT samples, bytes).
    fn sent(out: &mut Encoded) -> Vec<(usize, u32, Vec<u8>)> {
        let records = out
            .records
            .iter()
            .map(|r| {
                let range = r.value.clone().expect("encodable");
                (r.link, r.samples, out.bytes[range].to_vec())
            })
            .collect();
        out.clear();
        records
    }

    /// Two links, 3 samples a record: a part sent as the interval fills; an idle-timeout end
    /// stamped with the interval's end, carried by the next; a sample arriving after its
    /// interval's counters (a record of its own, counts 0); a clock jump (one long interval);
    /// the last, partial interval at exit and what is left open after it.
    #[test]
    fn records_are_those_of_the_python_interval_assembler() {
        let last_ns = T0 + 1040 * MS + 1;
        let records = [
            sample(0, T0 + 10 * MS, 0, 20 * MS),
            sample(0, T0 + 20 * MS, 1, 23 * MS),
            sample(0, T0 + 30 * MS, 0, 20 * MS + 1),
            sample(0, T0 + 40 * MS, 2, 26 * MS),
            Record::FlowEvent {
                link: 0,
                ts_ns: T0 + 50 * MS,
                kind: FlowEventKind::Start,
                reason: FlowEventReason::Threshold,
                flow: flow(2),
                packets: 100,
            },
            sample(1, T0 + 60 * MS, 3, 29 * MS),
            idle_end(0, T0 + 100 * MS, 1, 150),
            counters(0, T0 + 100 * MS, INTERVAL_NS, 10),
            counters(1, T0 + 100 * MS, INTERVAL_NS, 20),
            sample(0, T0 + 99 * MS, 0, 21 * MS),
            sample(0, T0 + 150 * MS, 0, 22 * MS),
            counters(0, T0 + 1000 * MS, 900 * MS, 30),
            counters(1, T0 + 1000 * MS, 900 * MS, 40),
            sample(0, T0 + 1010 * MS, 0, 20 * MS),
            sample(0, T0 + 1020 * MS, 1, 21 * MS),
            sample(0, T0 + 1030 * MS, 0, 22 * MS),
            sample(0, T0 + 1040 * MS, 1, 23 * MS),
            idle_end(0, last_ns, 0, 300),
            counters(0, last_ns, last_ns - (T0 + 1000 * MS), 50),
            counters(1, last_ns, last_ns - (T0 + 1000 * MS), 60),
        ];
        let mut assembler = Assembler::new(&["r1:eth1", "r2:eth2"], INTERVAL_NS, 3);
        let mut out = Encoded::default();
        let mut got = Vec::new();
        for record in &records {
            assembler.add(record, &mut out);
            got.extend(sent(&mut out));
        }
        assembler.close_all(&mut out);
        got.extend(sent(&mut out));
        let links: Vec<usize> = got.iter().map(|r| r.0).collect();
        assert_eq!(links, [0, 0, 1, 0, 0, 1, 0, 0, 1, 0]);
        let samples: Vec<u32> = got.iter().map(|r| r.1).collect();
        assert_eq!(samples, [3, 1, 1, 1, 1, 0, 3, 1, 0, 0]);
        assert_eq!(got.len(), PY_SCENARIO.len());
        for (i, ((_, _, bytes), expected)) in got.iter().zip(PY_SCENARIO).enumerate() {
            assert_eq!(bytes, expected, "record {i}");
        }
    }

    #[test]
    fn a_sample_the_schema_cannot_carry_is_refused_alone() {
        let mut assembler = Assembler::new(&["r1:eth1"], INTERVAL_NS, 3);
        let mut out = Encoded::default();
        assembler.add(&sample(0, T0 + MS, 0, u64::MAX), &mut out);
        assembler.add(&sample(0, u64::MAX - 5, 0, MS), &mut out);
        let refused: Vec<_> = out.records.iter().map(|r| r.value.clone()).collect();
        assert_eq!(
            refused,
            [Err(OutOfRange("rtt_ns")), Err(OutOfRange("ts_ns"))]
        );
        out.clear();
        assembler.add(&sample(0, T0 + 2 * MS, 0, MS), &mut out);
        assembler.add(&counters(0, T0 + INTERVAL_NS, INTERVAL_NS, 1), &mut out);
        assert_eq!(out.records.len(), 1);
        assert_eq!(out.records[0].samples, 1);
        assert!(out.records[0].value.is_ok());
    }

    #[test]
    fn a_record_the_schema_cannot_carry_is_refused_and_its_seq_skipped() {
        let mut assembler = Assembler::new(&["r1:eth1"], INTERVAL_NS, 3);
        let mut out = Encoded::default();
        let mut absurd = counters(0, T0 + INTERVAL_NS, INTERVAL_NS, 1);
        if let Record::Counters { counters, .. } = &mut absurd {
            counters.bytes = u64::MAX;
        }
        assembler.add(&absurd, &mut out);
        assembler.add(&counters(0, T0 + 2 * INTERVAL_NS, INTERVAL_NS, 1), &mut out);
        assert_eq!(out.records[0].value, Err(OutOfRange("bytes")));
        let range = out.records[1].value.clone().unwrap();
        assert_eq!(range.start, 0, "nothing of the refused record is left");
        // seq 1: the loss shows.
        let mut second = Vec::new();
        let head = RecordHead {
            link_field: &avro::link_field("r1:eth1"),
            end_ns: T0 + 2 * INTERVAL_NS,
            interval_ns: INTERVAL_NS,
            seq: 1,
            part: 0,
            complete: true,
        };
        let Record::Counters {
            counters: c,
            queue_delay_ewma_ns,
            ..
        } = counters(0, 0, 0, 1)
        else {
            unreachable!()
        };
        let counts = Counts {
            counters: c,
            queue_delay_ewma_ns,
        };
        avro::put_link_counters(&mut second, &head, &counts, &[], &RttColumns::default()).unwrap();
        assert_eq!(out.bytes[range], second);
    }

    // Written once by `p4bs_schemas.intervals.IntervalAssembler(100_000_000, 3)` fed the same
    // records (samples by add_sample, events by add_event, counters by close, then
    // close_all), each record encoded by `p4bs_schemas.codec.codec("LinkCounters")`, and
    // pinned here. Per record: link, ts - T0, interval, seq, part, complete, samples, events:
    //  r1:eth1 100 ms, 100 ms, seq 0, part 0, partial, 3 samples (sent as the 3rd came)
    //  r1:eth1 100 ms, 100 ms, seq 1, part 1, complete, 1 sample, the start
    //  r2:eth2 100 ms, 100 ms, seq 0, part 0, complete, 1 sample
    //  r1:eth1 100 ms, 100 ms, seq 2, part 0, complete, 1 sample (late), counts 0
    //  r1:eth1 1000 ms, 900 ms, seq 3, part 0, complete, 1 sample, the idle end of 100 ms
    //  r2:eth2 1000 ms, 900 ms, seq 1, part 0, complete
    //  r1:eth1 1100 ms, 100 ms, seq 4, part 0, partial, 3 samples
    //  r1:eth1 1040 ms + 1, 40 ms + 1, seq 5, part 1, complete, 1 sample (of the grid's 1100)
    //  r2:eth2 1040 ms + 1, 40 ms + 1, seq 2, part 0, complete
    //  r1:eth1 1100 ms, 100 ms, seq 6, part 2, complete, the idle end of 1040 ms + 1, counts 0
    const PY_SCENARIO: &[&[u8]] = &[
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30,
            0x31, 0x2e, 0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
            0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16, 0x31, 0x30, 0x2e, 0x32,
            0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31,
            0x2e, 0x32, 0x2e, 0x32, 0x82, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x06, 0x00, 0x02,
            0x00, 0x00, 0x06, 0x80, 0xda, 0xc4, 0x09, 0x80, 0xb4, 0x89, 0x13, 0x80, 0x8e, 0xce,
            0x1c, 0x00, 0x06, 0x80, 0xb4, 0x89, 0x13, 0x80, 0xcf, 0xf7, 0x15, 0x82, 0xb4, 0x89,
            0x13, 0x00,
        ],
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x02, 0x14, 0x16, 0x18, 0x1a, 0x1c, 0x1e,
            0x20, 0x22, 0x24, 0x26, 0x02, 0x01, 0x02, 0x80, 0xc2, 0xa7, 0x92, 0xc7, 0xbf, 0xce,
            0x97, 0x2f, 0x0a, 0x73, 0x74, 0x61, 0x72, 0x74, 0x12, 0x74, 0x68, 0x72, 0x65, 0x73,
            0x68, 0x6f, 0x6c, 0x64, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e,
            0x31, 0x32, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x84,
            0xf1, 0x04, 0xa2, 0x51, 0x0c, 0xc8, 0x01, 0x00, 0x02, 0x16, 0x31, 0x30, 0x2e, 0x32,
            0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x32, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31,
            0x2e, 0x32, 0x2e, 0x32, 0x84, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x02, 0x00, 0x00,
            0x02, 0x80, 0xe8, 0x92, 0x26, 0x00, 0x02, 0x80, 0xea, 0xe5, 0x18, 0x00,
        ],
        &[
            0x0e, 0x72, 0x32, 0x3a, 0x65, 0x74, 0x68, 0x32, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x00, 0x28, 0x2a, 0x2c, 0x2e, 0x30, 0x32,
            0x34, 0x36, 0x38, 0x3a, 0x00, 0x01, 0x00, 0x02, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30,
            0x31, 0x2e, 0x31, 0x2e, 0x31, 0x33, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
            0x32, 0x2e, 0x32, 0x86, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x02, 0x00, 0x00, 0x02,
            0x80, 0x9c, 0x9c, 0x39, 0x00, 0x02, 0x80, 0x85, 0xd4, 0x1b, 0x00,
        ],
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30,
            0x31, 0x2e, 0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
            0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x02, 0x00, 0x00, 0x02,
            0x80, 0xfb, 0xb4, 0x5e, 0x00, 0x02, 0x80, 0xbd, 0x83, 0x14, 0x00,
        ],
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0xa8, 0xa6, 0x9c, 0xce, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0xa4, 0xa7, 0xda, 0x06, 0x06, 0x3c, 0x3e, 0x40, 0x42, 0x44,
            0x46, 0x48, 0x4a, 0x4c, 0x4e, 0x00, 0x01, 0x02, 0x80, 0x84, 0xff, 0xc1, 0xc7, 0xbf,
            0xce, 0x97, 0x2f, 0x06, 0x65, 0x6e, 0x64, 0x18, 0x69, 0x64, 0x6c, 0x65, 0x5f, 0x74,
            0x69, 0x6d, 0x65, 0x6f, 0x75, 0x74, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
            0x31, 0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e,
            0x32, 0x82, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0xac, 0x02, 0x00, 0x02, 0x16, 0x31, 0x30,
            0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32,
            0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x02,
            0x00, 0x00, 0x02, 0x80, 0xc2, 0xd7, 0x2f, 0x00, 0x02, 0x80, 0xc6, 0xfd, 0x14, 0x00,
        ],
        &[
            0x0e, 0x72, 0x32, 0x3a, 0x65, 0x74, 0x68, 0x32, 0x80, 0xa8, 0xa6, 0x9c, 0xce, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0xa4, 0xa7, 0xda, 0x06, 0x02, 0x50, 0x52, 0x54, 0x56, 0x58,
            0x5a, 0x5c, 0x5e, 0x60, 0x62, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
        ],
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0xac, 0xd5, 0xfb, 0xce, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30,
            0x31, 0x2e, 0x31, 0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
            0x32, 0x2e, 0x32, 0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x16, 0x31, 0x30, 0x2e, 0x32,
            0x30, 0x31, 0x2e, 0x31, 0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31,
            0x2e, 0x32, 0x2e, 0x32, 0x82, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x06, 0x00, 0x02,
            0x00, 0x00, 0x06, 0x80, 0xda, 0xc4, 0x09, 0x80, 0xb4, 0x89, 0x13, 0x80, 0x8e, 0xce,
            0x1c, 0x00, 0x06, 0x80, 0xb4, 0x89, 0x13, 0x80, 0xbd, 0x83, 0x14, 0x80, 0xc6, 0xfd,
            0x14, 0x00,
        ],
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x82, 0x90, 0xb9, 0xc2, 0xce, 0xbf,
            0xce, 0x97, 0x2f, 0x82, 0xe8, 0x92, 0x26, 0x0a, 0x64, 0x66, 0x68, 0x6a, 0x6c, 0x6e,
            0x70, 0x72, 0x74, 0x76, 0x02, 0x01, 0x00, 0x02, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30,
            0x31, 0x2e, 0x31, 0x2e, 0x31, 0x31, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e,
            0x32, 0x2e, 0x32, 0x82, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0x00, 0x02, 0x00, 0x00, 0x02,
            0x80, 0xe8, 0x92, 0x26, 0x00, 0x02, 0x80, 0xcf, 0xf7, 0x15, 0x00,
        ],
        &[
            0x0e, 0x72, 0x32, 0x3a, 0x65, 0x74, 0x68, 0x32, 0x82, 0x90, 0xb9, 0xc2, 0xce, 0xbf,
            0xce, 0x97, 0x2f, 0x82, 0xe8, 0x92, 0x26, 0x04, 0x78, 0x7a, 0x7c, 0x7e, 0x80, 0x01,
            0x82, 0x01, 0x84, 0x01, 0x86, 0x01, 0x88, 0x01, 0x8a, 0x01, 0x00, 0x01, 0x00, 0x00,
            0x00, 0x00, 0x00,
        ],
        &[
            0x0e, 0x72, 0x31, 0x3a, 0x65, 0x74, 0x68, 0x31, 0x80, 0xac, 0xd5, 0xfb, 0xce, 0xbf,
            0xce, 0x97, 0x2f, 0x80, 0x84, 0xaf, 0x5f, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x04, 0x01, 0x02, 0x82, 0x90, 0xb9, 0xc2, 0xce, 0xbf, 0xce,
            0x97, 0x2f, 0x06, 0x65, 0x6e, 0x64, 0x18, 0x69, 0x64, 0x6c, 0x65, 0x5f, 0x74, 0x69,
            0x6d, 0x65, 0x6f, 0x75, 0x74, 0x16, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x31,
            0x2e, 0x31, 0x30, 0x14, 0x31, 0x30, 0x2e, 0x32, 0x30, 0x31, 0x2e, 0x32, 0x2e, 0x32,
            0x80, 0xf1, 0x04, 0xa2, 0x51, 0x0c, 0xd8, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00,
        ],
    ];
}
