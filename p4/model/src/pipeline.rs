//! The whole pipeline of SPEC §1–§7 for many links: one call per captured packet, records out.

use crate::config::{Direction, PipelineConfig, Prefix, Tap};
use crate::hash::CRC32;
use crate::longflow::{LongFlows, Verdict};
use crate::loss::{LossTracker, Segment};
use crate::parse::{parse, ParseCounters, Skip, Tcp, ACK, FIN, RST, SYN};
use crate::qdelay::{ewma_update, Departure, QueueDelayTable, QueueKey};
use crate::record::{Flow, FlowEventKind, FlowEventReason, LinkCounters, Record};
use crate::rtt::{Lookup, RttKey, RttTable, Stored};

/// A gap in packet time longer than this many export intervals (a capture paused for hours,
/// a clock step) is exported as one long interval instead of one record per interval.
const MAX_CATCH_UP_INTERVALS: u64 = 10_000;

#[derive(Clone, Copy)]
struct Port {
    link: u16,
    tap: Tap,
    direction: Direction,
}

struct Link {
    id: String,
    output_prefixes: Vec<Prefix>,
    counters: LinkCounters,
    queue_delay_ewma_ns: u64,
    seq: u64,
}

macro_rules! pipeline_counters {
    ($($name:ident),* $(,)?) => {
        /// The pipeline's own counters (SPEC §2–§6): exported beside the records.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct PipelineCounters {
            pub parse: ParseCounters,
            $(pub $name: u64,)*
        }

        impl PipelineCounters {
            /// Every counter by name, the parser's skip reasons included.
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                let mut all = vec![
                    ("packets", self.parse.packets),
                    ("tcp_packets", self.parse.tcp_packets),
                ];
                all.extend(Skip::ALL.iter().map(|s| (s.name(), self.parse.skipped(*s))));
                all.extend([$((stringify!($name), self.$name)),*]);
                all
            }
        }
    };
}

pipeline_counters!(
    unmapped_port,
    rtt_samples,
    rtt_table_full,
    rtt_expired,
    rtt_duplicate,
    rtt_rate_limited,
    long_flow_starts,
    long_flow_ends,
    long_flow_table_full,
    retransmissions,
    queue_delay_samples,
    queue_delay_overwritten,
    queue_delay_expired,
    time_backwards,
    clock_jumps,
);

pub struct Pipeline {
    ports: Vec<Port>,
    port_names: Vec<String>,
    links: Vec<Link>,
    rtt: RttTable,
    rtt_min_interval_ns: u64,
    rtt_last_emitted: Vec<u64>,
    loss: LossTracker,
    long_flows: LongFlows,
    queue: QueueDelayTable,
    interval_ns: u64,
    next_export: Option<u64>,
    now: u64,
    /// Emit each queueing-delay sample as a record (the exporter only wants the counters).
    pub queue_delay_records: bool,
    pub counters: PipelineCounters,
}

const RATE_LIMIT_SLOTS_LOG2: u32 = 16;

fn rtt_key(flow: &crate::parse::FlowKey, eack: u32) -> RttKey {
    let mut k = [0u8; 17];
    k[..13].copy_from_slice(flow);
    k[13..].copy_from_slice(&eack.to_be_bytes());
    k
}

fn queue_key(tcp: &Tcp, flow: &crate::parse::FlowKey) -> QueueKey {
    let mut k = [0u8; 19];
    k[..13].copy_from_slice(flow);
    k[13..17].copy_from_slice(&tcp.seq.to_be_bytes());
    k[17..].copy_from_slice(&tcp.ip_id.to_be_bytes());
    k
}

impl Pipeline {
    /// `config` must have passed `PipelineConfig::check`.
    pub fn new(config: &PipelineConfig) -> Pipeline {
        let links: Vec<Link> = config
            .links
            .iter()
            .map(|l| Link {
                id: l.id.clone(),
                output_prefixes: l
                    .output_prefixes
                    .iter()
                    .map(|p| Prefix::parse(p).expect("checked config"))
                    .collect(),
                counters: LinkCounters::default(),
                queue_delay_ewma_ns: 0,
                seq: 0,
            })
            .collect();
        let link_index = |id: &str| links.iter().position(|l| l.id == id).expect("checked") as u16;
        let ports = config
            .ports
            .iter()
            .map(|p| Port {
                link: link_index(&p.link),
                tap: p.tap,
                direction: p.direction,
            })
            .collect();
        let rate_limited = config.rtt.min_interval_ns > 0;
        Pipeline {
            ports,
            port_names: config.ports.iter().map(|p| p.port.clone()).collect(),
            rtt: RttTable::new(config.rtt.slots_log2, config.rtt.max_age_ns),
            rtt_min_interval_ns: config.rtt.min_interval_ns,
            rtt_last_emitted: if rate_limited {
                vec![0; 1 << RATE_LIMIT_SLOTS_LOG2]
            } else {
                Vec::new()
            },
            loss: LossTracker::new(config.loss.slots_log2),
            long_flows: LongFlows::new(&config.long_flows),
            queue: QueueDelayTable::new(config.qdelay.slots_log2, config.qdelay.max_age_ns),
            interval_ns: config.export.interval_ns,
            next_export: None,
            now: 0,
            queue_delay_records: false,
            counters: PipelineCounters::default(),
            links,
        }
    }

    /// The index of a named capture point in the port → link table.
    pub fn port(&self, name: &str) -> Option<u16> {
        self.port_names
            .iter()
            .position(|p| p == name)
            .map(|i| i as u16)
    }

    pub fn link_id(&self, link: u16) -> &str {
        &self.links[usize::from(link)].id
    }

    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// Long flows listed now.
    pub fn long_flows(&self) -> usize {
        self.long_flows.len()
    }

    /// One captured frame from `port` at `ts` (ns since the epoch).
    pub fn process(&mut self, port: u16, ts: u64, frame: &[u8], out: &mut Vec<Record>) {
        let ts = ts.max(1); // 0 marks an empty table slot
        if ts < self.now {
            self.counters.time_backwards += 1;
        } else {
            self.advance(ts, out);
        }
        let parsed = parse(frame);
        self.counters.parse.count(&parsed);
        let Ok(tcp) = parsed else { return };
        let Some(&p) = self.ports.get(usize::from(port)) else {
            self.counters.unmapped_port += 1;
            return;
        };
        // Which directions the packet counts in: a `both` tap of a link without output
        // prefixes cannot tell, so its packets count in both (SPEC §1).
        let (out_dir, back_dir) = match p.direction {
            Direction::Out => (true, false),
            Direction::Back => (false, true),
            Direction::Both => {
                let prefixes = &self.links[usize::from(p.link)].output_prefixes;
                if prefixes.is_empty() {
                    (true, true)
                } else {
                    let out = prefixes.iter().any(|x| x.contains(tcp.dst));
                    (out, !out)
                }
            }
        };
        match p.tap {
            Tap::Before if out_dir => self.before(p.link, &tcp, ts, out),
            Tap::Before => {}
            Tap::After => {
                if back_dir && tcp.flags & ACK != 0 {
                    self.match_ack(p.link, &tcp, ts, out);
                }
                if out_dir {
                    self.after(p.link, &tcp, ts, out);
                }
            }
        }
    }

    /// Data direction, entering the router: counters, loss, long flows, queue arrivals.
    fn before(&mut self, link: u16, tcp: &Tcp, ts: u64, out: &mut Vec<Record>) {
        let key = tcp.flow_key();
        let data = tcp.payload > 0;
        let c = &mut self.links[usize::from(link)].counters;
        c.packets += 1;
        c.bytes += u64::from(tcp.ip_len);
        if data {
            c.data_packets += 1;
            c.data_bytes += u64::from(tcp.ip_len);
            if self.loss.observe(&key, tcp.seq, tcp.payload) == Segment::Retransmission {
                c.retransmissions += 1;
                self.counters.retransmissions += 1;
            }
            if self.queue.arrive(&queue_key(tcp, &key), ts) {
                self.counters.queue_delay_overwritten += 1;
            }
        }
        self.long_flow(link, &key, tcp, ts, data, out);
    }

    /// Data direction, leaving the router: what the link carried, queueing delay, and the
    /// segment's time for RTT.
    fn after(&mut self, link: u16, tcp: &Tcp, ts: u64, out: &mut Vec<Record>) {
        let key = tcp.flow_key();
        let c = &mut self.links[usize::from(link)].counters;
        c.after_packets += 1;
        c.after_bytes += u64::from(tcp.ip_len);
        if tcp.payload > 0 {
            self.departure(link, tcp, &key, ts, out);
        }
        let syn_fin = u32::from(tcp.flags & SYN != 0) + u32::from(tcp.flags & FIN != 0);
        if tcp.payload > 0 || syn_fin > 0 {
            let eack = tcp.seq.wrapping_add(tcp.payload).wrapping_add(syn_fin);
            // A segment seen twice here is a retransmission whose original also got through:
            // the table forgets both (Karn's rule). One lost in the router passes here once.
            match self.rtt.record(&rtt_key(&key, eack), ts) {
                Stored::Yes => {}
                Stored::TableFull => self.counters.rtt_table_full += 1,
                Stored::Duplicate => self.counters.rtt_duplicate += 1,
            }
        }
    }

    fn match_ack(&mut self, link: u16, tcp: &Tcp, ts: u64, out: &mut Vec<Record>) {
        let data_key = tcp.reverse_key();
        let rtt_ns = match self.rtt.lookup(&rtt_key(&data_key, tcp.ack), ts) {
            Lookup::Miss => return,
            Lookup::Expired => {
                self.counters.rtt_expired += 1;
                return;
            }
            Lookup::Sample(rtt) => rtt,
        };
        if self.rtt_min_interval_ns > 0 {
            let mask = self.rtt_last_emitted.len() - 1;
            let last = &mut self.rtt_last_emitted[CRC32.hash(&data_key) as usize & mask];
            if *last != 0 && ts.saturating_sub(*last) < self.rtt_min_interval_ns {
                self.counters.rtt_rate_limited += 1;
                return;
            }
            *last = ts;
        }
        self.counters.rtt_samples += 1;
        out.push(Record::Rtt {
            link,
            ts_ns: ts,
            flow: Flow::from_key(&data_key),
            rtt_ns,
        });
    }

    fn long_flow(
        &mut self,
        link: u16,
        key: &crate::parse::FlowKey,
        tcp: &Tcp,
        ts: u64,
        data: bool,
        out: &mut Vec<Record>,
    ) {
        let closing = if tcp.flags & RST != 0 {
            Some(FlowEventReason::Rst)
        } else if tcp.flags & FIN != 0 {
            Some(FlowEventReason::Fin)
        } else {
            None
        };
        let (kind, reason, packets) = match self.long_flows.observe(link, key, ts, data, closing) {
            Verdict::None => return,
            Verdict::TableFull => {
                self.counters.long_flow_table_full += 1;
                return;
            }
            Verdict::Start { reason, packets } => {
                self.counters.long_flow_starts += 1;
                (FlowEventKind::Start, reason, packets)
            }
            Verdict::End { reason, packets } => {
                self.counters.long_flow_ends += 1;
                (FlowEventKind::End, reason, packets)
            }
        };
        out.push(Record::FlowEvent {
            link,
            ts_ns: ts,
            kind,
            reason,
            flow: Flow::from_key(key),
            packets,
        });
    }

    fn departure(
        &mut self,
        link: u16,
        tcp: &Tcp,
        key: &crate::parse::FlowKey,
        ts: u64,
        out: &mut Vec<Record>,
    ) {
        let delay = match self.queue.depart(&queue_key(tcp, key), ts) {
            Departure::Miss => return,
            Departure::Expired => {
                self.counters.queue_delay_expired += 1;
                return;
            }
            Departure::Sample(delay) => delay,
        };
        self.counters.queue_delay_samples += 1;
        let l = &mut self.links[usize::from(link)];
        l.counters.queue_delay_samples += 1;
        l.counters.queue_delay_sum_ns += delay;
        l.queue_delay_ewma_ns = ewma_update(l.queue_delay_ewma_ns, delay);
        if self.queue_delay_records {
            out.push(Record::QueueDelay {
                link,
                ts_ns: ts,
                flow: Flow::from_key(key),
                delay_ns: delay,
            });
        }
    }

    /// Moves the pipeline's clock to `now`: exports every interval that ended by then and
    /// sweeps idle long flows. Live captures call it when no packet arrives.
    pub fn advance(&mut self, now: u64, out: &mut Vec<Record>) {
        if now < self.now {
            return;
        }
        self.now = now;
        let interval = self.interval_ns;
        let mut next = match self.next_export {
            Some(next) => next,
            None => {
                // Intervals end on multiples of the interval, the same for every link.
                self.next_export = Some(now - now % interval + interval);
                return;
            }
        };
        if now >= next && (now - next) / interval > MAX_CATCH_UP_INTERVALS {
            self.counters.clock_jumps += 1;
            let end = now - now % interval;
            self.export(end, end - (next - interval), out);
            next = end + interval;
        }
        while now >= next {
            self.export(next, interval, out);
            next += interval;
        }
        self.next_export = Some(next);
    }

    /// Ends the capture: exports the last, partial interval up to the last packet.
    pub fn finish(&mut self, out: &mut Vec<Record>) {
        if let Some(next) = self.next_export {
            let start = next - self.interval_ns;
            let end = self.now + 1;
            self.export(end, end - start, out);
            self.next_export = None;
        }
    }

    fn export(&mut self, ts: u64, interval_ns: u64, out: &mut Vec<Record>) {
        let counters = &mut self.counters;
        self.long_flows.expire(ts, |key, entry| {
            counters.long_flow_ends += 1;
            out.push(Record::FlowEvent {
                link: entry.link,
                ts_ns: ts,
                kind: FlowEventKind::End,
                reason: FlowEventReason::IdleTimeout,
                flow: Flow::from_key(key),
                packets: entry.packets,
            });
        });
        for (i, l) in self.links.iter_mut().enumerate() {
            out.push(Record::Counters {
                link: i as u16,
                ts_ns: ts,
                interval_ns,
                seq: l.seq,
                counters: std::mem::take(&mut l.counters),
                queue_delay_ewma_ns: l.queue_delay_ewma_ns,
            });
            l.seq += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::tests::frame;

    const SPEC: &str = r#"{"links": [{"id": "r1:eth1", "output_prefixes": ["10.201.2.0/24"]}],
        "ports": [{"port": "b", "link": "r1:eth1", "tap": "before"},
                  {"port": "a", "link": "r1:eth1", "tap": "after"}],
        "rtt": {"min_interval_ns": 50000000}}"#;

    /// A 1448-byte segment 10.201.1.10:40000 → 10.201.2.2:5201 with `seq`.
    fn data(seq: u32) -> Vec<u8> {
        let mut f = frame(1448, 0, 0, 0);
        f[14 + 24..14 + 28].copy_from_slice(&seq.to_be_bytes());
        f
    }

    /// The receiver's ACK of everything before `ack`.
    fn ack(ack: u32) -> Vec<u8> {
        let mut f = frame(0, 0, 0, 0);
        let (src, dst) = (f[26..30].to_vec(), f[30..34].to_vec());
        f[26..30].copy_from_slice(&dst);
        f[30..34].copy_from_slice(&src);
        let (sport, dport) = ([f[34], f[35]], [f[36], f[37]]);
        f[34..36].copy_from_slice(&dport);
        f[36..38].copy_from_slice(&sport);
        f[14 + 28..14 + 32].copy_from_slice(&ack.to_be_bytes());
        f
    }

    fn pipeline() -> Pipeline {
        Pipeline::new(&PipelineConfig::from_json(SPEC).unwrap())
    }

    #[test]
    fn the_sampling_limit_keeps_one_rtt_sample_per_flow_and_interval() {
        let mut p = pipeline();
        let mut out = Vec::new();
        for k in 0..10u32 {
            let t = 1_000_000_000 + u64::from(k) * 10_000_000;
            p.process(1, t, &data(k * 1448), &mut out);
            p.process(1, t + 20_000_000, &ack((k + 1) * 1448), &mut out);
        }
        let rtts: Vec<u64> = out
            .iter()
            .filter_map(|r| match r {
                Record::Rtt { rtt_ns, .. } => Some(*rtt_ns),
                _ => None,
            })
            .collect();
        assert_eq!(rtts, vec![20_000_000, 20_000_000]); // at 20 ms and 70 ms of 0..110 ms
        assert_eq!(p.counters.rtt_rate_limited, 8);
    }

    #[test]
    fn a_clock_jump_is_one_long_interval_and_old_packets_are_counted() {
        let mut p = pipeline();
        let mut out = Vec::new();
        p.process(0, 1_000_000_000, &data(0), &mut out);
        p.process(0, 1_250_000_000, &data(1448), &mut out);
        assert_eq!(out.len(), 2); // intervals ending at 1.1 s and 1.2 s
        out.clear();
        p.process(0, 1_000_000_000, &data(2896), &mut out);
        assert_eq!(p.counters.time_backwards, 1);
        let day = 86_400_000_000_000;
        p.process(0, day, &data(4344), &mut out);
        assert_eq!(p.counters.clock_jumps, 1);
        match out[..] {
            [Record::Counters {
                ts_ns,
                interval_ns,
                seq,
                counters,
                ..
            }, ..] => {
                assert_eq!(seq, 2);
                assert_eq!(ts_ns, day);
                assert_eq!(interval_ns, day - 1_200_000_000);
                assert_eq!(counters.data_packets, 2);
            }
            _ => panic!("expected the long interval first: {out:?}"),
        }
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn the_after_tap_counts_what_the_router_carried_and_the_before_tap_what_was_offered() {
        // Ten 1448-byte segments (IP length 1488) enter the router; it drops three, so seven
        // leave. A small pure ACK goes out too (it counts at both taps), and the receiver's
        // ACKs come back through both taps (not the data direction: counted at neither).
        let mut p = pipeline();
        let mut out = Vec::new();
        let t = 1_000_000_000;
        for k in 0..10u32 {
            p.process(0, t + u64::from(k) * 1000, &data(k * 1448), &mut out);
        }
        let pure_ack = frame(0, 0, 0, 0);
        p.process(0, t + 20_000, &pure_ack, &mut out);
        for k in [0u32, 1, 2, 4, 6, 7, 9] {
            p.process(
                1,
                t + 2_000_000 + u64::from(k) * 1000,
                &data(k * 1448),
                &mut out,
            );
        }
        p.process(1, t + 2_020_000, &pure_ack, &mut out);
        for k in 1..=3u32 {
            p.process(0, t + 30_000_000, &ack(k * 1448), &mut out);
            p.process(1, t + 30_000_000, &ack(k * 1448), &mut out);
        }
        p.finish(&mut out);
        let counters: Vec<LinkCounters> = out
            .iter()
            .filter_map(|r| match r {
                Record::Counters { counters, .. } => Some(*counters),
                _ => None,
            })
            .collect();
        assert_eq!(counters.len(), 1);
        let c = counters[0];
        assert_eq!((c.packets, c.bytes), (11, 10 * 1488 + 40));
        assert_eq!((c.after_packets, c.after_bytes), (8, 7 * 1488 + 40));
        assert_eq!((c.data_packets, c.data_bytes), (10, 10 * 1488));
        assert_eq!(c.queue_delay_samples, 7);
    }

    #[test]
    fn unknown_ports_are_counted_and_dropped() {
        let mut p = pipeline();
        let mut out = Vec::new();
        p.process(7, 1, &data(0), &mut out);
        assert_eq!(p.counters.unmapped_port, 1);
        assert!(out.is_empty());
    }
}
