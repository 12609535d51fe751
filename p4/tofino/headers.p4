/* p4bs for Tofino (TNA): constants, header types and metadata.
 *
 * Every size, hash, threshold and timeout below is the one p4/SPEC.md names; the ones SPEC
 * marks *config* that the data plane needs at compile time are #defines that a build can
 * override with -D (bf-p4c passes -D through to the preprocessor). tests/test_p4_program.py
 * reads these values back and checks them against the spec, so change both together.
 */
#ifndef _P4BS_HEADERS_P4_
#define _P4BS_HEADERS_P4_

/* ------------------------------------------------------------------------------------------
 * Sizes and thresholds (SPEC section in brackets)
 * ---------------------------------------------------------------------------------------- */

/* [1] One switch serves many links: per-link registers are indexed by a link index that the
 * port -> link table assigns. 2^8 links per pipe by default. */
#ifndef LINK_INDEX_BITS
#define LINK_INDEX_BITS 8
#endif
#define MAX_LINKS (1 << LINK_INDEX_BITS)
#define PORT_TABLE_SIZE 512             /* every PortId_t value of a Tofino 1 pipe set */
#define OUTPUT_PREFIXES_SIZE 4096       /* (port, IPv4 prefix) entries for `both` taps */

/* [3] Per-flow RTT (after tap): 2 stages x 2^16 slots {signature, ts}; records live at most
 * 1 s. RTT slots keep time in units of 2^RTT_TS_SHIFT ns (64 ns) with the top bit set: an
 * empty slot (ts = 0) then always reads as older than any live record, which lets the
 * record action decide empty/stale, duplicate or busy with the two comparisons a Tofino 1
 * stateful ALU has (README, "Timestamps"). */
#define RTT_SLOTS_LOG2 16
#define RTT_SLOTS (1 << RTT_SLOTS_LOG2)
#ifndef RTT_MAX_AGE_NS
#define RTT_MAX_AGE_NS 1000000000
#endif
#define RTT_TS_SHIFT 6
#define RTT_MAX_AGE_UNITS (RTT_MAX_AGE_NS >> RTT_TS_SHIFT)
/* [3] Sampling limit: last emission time per flow, 2^16 slots. The limit itself
 * (rtt.min_interval, default 0 = off) is a run-time RegisterParam in units of 1024 ns. */
#define RTT_LIMIT_SLOTS_LOG2 16
#define RTT_LIMIT_SLOTS (1 << RTT_LIMIT_SLOTS_LOG2)
#define RTT_MIN_INTERVAL_DEFAULT 0

/* [4] Count-min sketch: 4 rows x 2^16 cells, reset every 10 s, threshold 2000 packets. */
#define CMS_ROWS 4
#define CMS_WIDTH_LOG2 16
#define CMS_WIDTH (1 << CMS_WIDTH_LOG2)
#ifndef CMS_THRESHOLD
#define CMS_THRESHOLD 2000
#endif
#define CMS_RESET_NS 10000000000        /* control plane bumps the sketch epoch this often */
#if CMS_THRESHOLD > 65535
#error "CMS_THRESHOLD must fit the 16-bit saturating cell count"
#endif

/* [4] Long-flow table: exact match, idle timeout; the TTL is per entry ($ENTRY_TTL, ms). */
#define LONG_FLOW_TABLE_SIZE 65536
#define LONG_FLOW_TTL_MS 2000
/* Start digests of one flow (hash slot) are at most one per 10 ms: enough for the control
 * plane to insert the entry, so a flow crossing the threshold does not flood the digest
 * channel while its entry is on its way. Not in SPEC (see README, deviations). */
#define LF_REPORT_SLOTS_LOG2 14
#define LF_REPORT_SLOTS (1 << LF_REPORT_SLOTS_LOG2)
#define LF_REPORT_GAP_NS 10000000

/* [4] GLOBECOM Algorithm 1 (compile with -DLONG_FLOW_WINDOW instead of the sketch). */
#define WINDOW_SLOTS_LOG2 16
#define WINDOW_SLOTS (1 << WINDOW_SLOTS_LOG2)
#ifndef WINDOW_T_THRESH_NS
#define WINDOW_T_THRESH_NS 1000000000
#endif
#ifndef WINDOW_C_THRESH
#define WINDOW_C_THRESH 1000
#endif

/* [5] Loss: per-flow {signature, next_seq}, 2^16 slots. */
#define LOSS_SLOTS_LOG2 16
#define LOSS_SLOTS (1 << LOSS_SLOTS_LOG2)

/* [6] Queueing delay: 2^16 slots {signature, ts}; samples older than 1 s do not count;
 * the EWMA gives the new sample weight 2^-QDELAY_EWMA_SHIFT. */
#define QDELAY_SLOTS_LOG2 16
#define QDELAY_SLOTS (1 << QDELAY_SLOTS_LOG2)
#ifndef QDELAY_MAX_AGE_NS
#define QDELAY_MAX_AGE_NS 1000000000
#endif
#define QDELAY_EWMA_SHIFT 3

/* A 32-bit value against a constant as range-match entries: p4c takes at most 20 bits (5
 * nibbles) in one range key, so the value is matched as (bits 31..20, bits 19..0); e.g.
 * "age <= LIMIT" is (high < HIGH12(LIMIT), any low) or (high = HIGH12(LIMIT), low <=
 * LOW20(LIMIT)). */
#define HIGH12(X) ((X) >> 20)
#define LOW20(X) ((X) & 0xFFFFF)
#if HIGH12(QDELAY_MAX_AGE_NS) < 1
#error "the queueing-delay age limit's range entries assume QDELAY_MAX_AGE_NS >= 1.05 ms"
#endif
#if WINDOW_C_THRESH < 1 || HIGH12(WINDOW_C_THRESH) > 0
#error "the window threshold's range entries assume 1 <= WINDOW_C_THRESH < 2^20"
#endif

/* [2] Hashes: reflected CRC-32 variants, final XOR 0xFFFFFFFF, differing in polynomial and
 * initial value. Polynomials in their usual MSB-first form, as CRCPolynomial takes them. */
#define CRC32_POLY  32w0x04C11DB7   /* CRC-32: RTT stage 0, CMS row 0, loss, qdelay */
#define CRC32C_POLY 32w0x1EDC6F41   /* CRC-32C: RTT stage 1, CMS row 1 */
#define CRC32D_POLY 32w0xA833982B   /* CRC-32D: CMS row 2 */
#define CRC32Q_POLY 32w0x814141AB   /* CRC-32Q polynomial: CMS row 3 */
#define CRC_INIT_INDEX 32w0xFFFFFFFF
#define CRC_INIT_SIGNATURE 32w0x00000000
#define CRC_XOR_OUT 32w0xFFFFFFFF

/* ------------------------------------------------------------------------------------------
 * Codes shared with the control plane. The exporter's copy of these, of the digests below
 * and of the control-plane names is checked against this program by
 * tests/unit/test_tofino_contract.py: change both together.
 * ---------------------------------------------------------------------------------------- */

/* port_to_link action parameters */
const bit<1> TAP_BEFORE = 0;
const bit<1> TAP_AFTER = 1;
const bit<2> DIR_OUT = 0;
const bit<2> DIR_BACK = 1;
const bit<2> DIR_BOTH = 2;

/* Index of Ingress.parse_stats: why a packet was passed over (SPEC section 2); 0 counts the
 * parsed TCP packets (tcp_packets). Every packet counts here once, mapped port or not. */
const bit<4> SKIP_NONE = 0;
const bit<4> SKIP_TRUNCATED = 1;
const bit<4> SKIP_VLAN_TOO_DEEP = 2;
const bit<4> SKIP_IPV6 = 3;
const bit<4> SKIP_OTHER_L3 = 4;
const bit<4> SKIP_BAD_IPV4 = 5;
const bit<4> SKIP_FRAGMENT = 6;
const bit<4> SKIP_NON_TCP = 7;
const bit<4> SKIP_BAD_TCP = 8;

/* Index of Ingress.rtt_stats */
const bit<3> RTT_STORED = 0;
const bit<3> RTT_TABLE_FULL = 1;
const bit<3> RTT_DUPLICATE = 2;     /* segment seen twice: record cleared (Karn) */
const bit<3> RTT_SAMPLE = 3;
const bit<3> RTT_EXPIRED = 4;
const bit<3> RTT_RATE_LIMITED = 5;

/* Index of Ingress.flow_stats */
const bit<2> FLOW_STAT_START = 0;
const bit<2> FLOW_STAT_END = 1;
const bit<2> FLOW_STAT_START_HELD = 2;   /* threshold crossed again within LF_REPORT_GAP_NS */

/* Index of Egress.qdelay_stats */
const bit<3> QD_RECORDED = 0;
const bit<3> QD_OVERWRITTEN = 1;
const bit<3> QD_SAMPLE = 2;
const bit<3> QD_EXPIRED = 3;
const bit<3> QD_UNMATCHED = 4;

/* Digests (ig_dprsr_md.digest_type). Flow events come from before-tap packets and RTT samples
 * from after-tap ones, so a packet never has both. */
const DigestType_t DIGEST_RTT = 1;
const DigestType_t DIGEST_FLOW = 2;

/* flow_digest_t.event: FlowEvent {kind, reason}. end/idle_timeout comes from the idle-timeout
 * notification of Ingress.long_flows, never from a digest. */
const bit<8> FLOW_START_THRESHOLD = 1;
const bit<8> FLOW_START_WINDOW = 2;
const bit<8> FLOW_END_FIN = 3;
const bit<8> FLOW_END_RST = 4;

/* RTT table operation chosen per packet (one access per register per packet). */
const bit<2> RTT_OP_NONE = 0;
const bit<2> RTT_OP_RECORD = 1;    /* out-direction data segment: (flow, eACK) */
const bit<2> RTT_OP_LOOKUP = 2;    /* back-direction ACK: (reverse flow, ack) */

/* What a record action did in one stage: the stateful ALU's one-hot predicate, bit
 * (live + 2 * same signature). Tofino 1 outputs at most one non-zero constant per register
 * action, so the three outcomes come out as the predicate itself; the two values not named
 * here (1, 4: not live) mean stored. */
const bit<4> RTT_REC_BUSY = 2;          /* live record of another key: try the next stage */
const bit<4> RTT_REC_DUPLICATE = 8;     /* live, same signature: cleared (Karn) */

/* What the sampling limit said of a sample, its predicate (fresh + 2 * interval passed);
 * the other two values are expired samples. */
const bit<4> RTT_LIMIT_HELD = 2;        /* fresh, within the interval: not emitted */
const bit<4> RTT_LIMIT_SAMPLE = 8;      /* fresh, interval passed: emitted */

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_IPV6 = 0x86DD;
const bit<16> ETHERTYPE_VLAN = 0x8100;
const bit<16> ETHERTYPE_QINQ = 0x88A8;
const bit<8> IP_PROTO_TCP = 6;

typedef bit<LINK_INDEX_BITS> link_index_t;
typedef bit<RTT_SLOTS_LOG2> rtt_index_t;
typedef bit<RTT_LIMIT_SLOTS_LOG2> rtt_limit_index_t;
typedef bit<CMS_WIDTH_LOG2> cms_index_t;
typedef bit<LF_REPORT_SLOTS_LOG2> lf_report_index_t;
typedef bit<WINDOW_SLOTS_LOG2> window_index_t;
typedef bit<LOSS_SLOTS_LOG2> loss_index_t;
typedef bit<QDELAY_SLOTS_LOG2> qdelay_index_t;

/* ------------------------------------------------------------------------------------------
 * Headers
 * ---------------------------------------------------------------------------------------- */

header ethernet_h {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header vlan_tag_h {
    bit<3> pcp;
    bit<1> dei;
    bit<12> vid;
    bit<16> ether_type;
}

header ipv4_h {
    bit<4> version;
    bit<4> ihl;
    bit<8> diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<1> flag_reserved;
    bit<1> flag_df;
    bit<1> flag_mf;
    bit<13> frag_offset;
    bit<8> ttl;
    bit<8> protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header tcp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<32> seq_no;
    bit<32> ack_no;
    bit<4> data_offset;
    bit<4> reserved;
    bit<1> cwr;
    bit<1> ece;
    bit<1> urg;
    bit<1> ack;
    bit<1> psh;
    bit<1> rst;
    bit<1> syn;
    bit<1> fin;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgent_ptr;
}

/* What ingress tells egress (queueing delay and per-link counters live there). Ingress emits
 * only this header, so the copy that crosses the traffic manager is shorter than the packet
 * that arrived and the egress side of the tap port is never oversubscribed. */
header bridge_h {
    bit<16> link;               /* link_index_t, zero-extended */
    bit<1> count_traffic;       /* before tap, out direction: packets/bytes */
    bit<1> count_after;         /* after tap, out direction: after_packets/after_bytes */
    bit<1> is_data;             /* TCP payload > 0: data_packets/data_bytes */
    bit<1> retx;                /* ... and a retransmission */
    bit<1> qd_write;            /* before tap, out, payload > 0: record for queueing delay */
    bit<1> qd_read;             /* after tap, out, payload > 0: match and take the record */
    bit<2> _pad;
    bit<32> ts;                 /* ingress MAC time, low 32 bits, ns, bit 0 forced to 1 */
    bit<16> ip_len;             /* IPv4 total length */
    bit<16> qd_index;           /* CRC-32(queue key) low bits */
    bit<32> qd_sig;             /* signature CRC-32/init 0 (queue key) */
}

struct ig_headers_t {
    bridge_h bridge;
    ethernet_h ethernet;
    vlan_tag_h vlan0;
    vlan_tag_h vlan1;
    ipv4_h ipv4;
    tcp_h tcp;
}

struct eg_headers_t {
    bridge_h bridge;
}

/* ------------------------------------------------------------------------------------------
 * Register cells. Tofino stateful ALUs work on 32-bit cells or pairs of them, so a time
 * kept in a register is 32 bits of the 48-bit ns clock: the low 32 bits (wrapping every
 * 4.29 s; every age compared is <= 1 s), or for RTT slots bits 37..6 (README "Timestamps").
 * ---------------------------------------------------------------------------------------- */

struct sig_ts_t {              /* RTT and queueing-delay slots; ts == 0 means empty */
    bit<32> sig;
    bit<32> ts;
}

struct loss_slot_t {
    bit<32> sig;
    bit<32> next_seq;
}

struct cms_cell_t {            /* 16-bit saturating count tagged with the sketch epoch */
    bit<16> count;
    bit<16> epoch;
}

struct window_slot_t {         /* GLOBECOM Algorithm 1: last packet time of the flow */
    bit<32> sig;
    bit<32> last;
}

struct counter_pair_t {        /* per-link packets and bytes (IPv4 total length) */
    bit<32> packets;
    bit<32> bytes;
}

struct qdelay_sum_t {          /* per-link sum of queueing-delay samples, ns, as 64 bits */
    bit<32> sum_lo;
    bit<32> sum_hi;
}

/* ------------------------------------------------------------------------------------------
 * Digests: field order is the control-plane contract (README "Digests").
 * ---------------------------------------------------------------------------------------- */

struct rtt_digest_t {
    link_index_t link;
    bit<48> ts;                 /* ACK's ingress MAC time, ns (switch clock) */
    bit<32> src_addr;           /* data direction: the sender of the acknowledged segment */
    bit<32> dst_addr;
    bit<16> src_port;
    bit<16> dst_port;
    bit<32> rtt;                /* ns (a multiple of 64), 0 < rtt <= RTT_MAX_AGE_NS */
}

struct flow_digest_t {
    link_index_t link;
    bit<8> event;               /* FLOW_START_* / FLOW_END_* */
    bit<48> ts;
    bit<32> src_addr;           /* data direction (the before tap's out direction) */
    bit<32> dst_addr;
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> count0;             /* sketch rows; packets = min(count0..count3) */
    bit<16> count1;
    bit<16> count2;
    bit<16> count3;
}

/* ------------------------------------------------------------------------------------------
 * Metadata
 * ---------------------------------------------------------------------------------------- */

struct ig_md_t {
    /* parser */
    bit<4> skip;                /* SKIP_*: reason the parse stopped, SKIP_NONE = TCP/IPv4;
                                 * not set when the parser stops on an error */
    bit<1> reached_ipv4;        /* the parse committed to IPv4: a cut is bad_ipv4 */
    bit<1> reached_tcp;         /* the parse committed to TCP: a cut is bad_tcp */
    bit<32> synfin;             /* SYN + FIN, from the parser's select on the flags */
    /* port -> link */
    link_index_t link;
    bit<1> tap;
    bit<2> dir_mode;
    bit<1> dst_is_output;       /* output_prefixes hit (only used for DIR_BOTH ports) */
    bit<1> is_out;              /* resolved direction of this packet is `out` */
    bit<16> cms_epoch;          /* sketch epoch, bumped by the control plane every reset */
    /* lengths */
    bit<32> l4_len;             /* total_len - 4*IHL; negative (bit 31) = bad_ipv4 */
    bit<32> payload;            /* total_len - 4*IHL - 4*data_offset; negative = bad_tcp */
    bit<32> seq_sf;             /* seq + SYN + FIN */
    bit<32> eack;               /* seq + payload + SYN + FIN */
    bit<32> seg_end;            /* seq + payload */
    bit<1> has_payload;
    bit<1> is_data;             /* payload > 0, or SYN, or FIN */
    /* time */
    bit<48> ts48;               /* ingress MAC timestamp, for digests */
    bit<32> now;                /* low 32 bits, bit 0 set so that 0 can mean "empty" */
    bit<32> rtt_now;            /* bits 37..6 (64 ns units), top bit set: RTT slot time */
    bit<32> now_us;             /* bits 41..10: 1.024 us units, for the sampling limit */
    /* per-flow hashes of the packet's own flow key */
    bit<32> flow_crc32;         /* CRC-32: loss / window / report-gap index, CMS row 0 */
    bit<32> flow_sig;           /* CRC-32 init 0: loss / window signature */
#ifndef LONG_FLOW_WINDOW
    bit<32> cms_idx1;           /* CRC-32C, CRC-32D, CRC-32Q of the flow key: CMS rows 1-3 */
    bit<32> cms_idx2;
    bit<32> cms_idx3;
#endif
    /* loss */
    bit<1> retx;
    /* RTT */
    bit<2> rtt_op;
    bit<32> k_src;              /* RTT key: flow (data) or reverse flow (ACK), then number */
    bit<32> k_dst;
    bit<16> k_sport;
    bit<16> k_dport;
    bit<32> k_num;              /* eACK (data) or ack (ACK) */
    bit<32> rtt_idx0;
    bit<32> rtt_idx1;
    bit<32> rtt_sig;
    bit<32> rtt_flow_crc32;     /* CRC-32 of the data-direction flow key: sampling limit */
    bit<4> rtt_result;          /* RTT_REC_* of the last stage visited by a record */
    bit<32> rtt_ts;             /* slot time taken by a lookup, 0 = miss */
    bit<32> rtt_units;          /* sample in 64 ns units */
    bit<32> rtt_now_m1;         /* rtt_now - 1 */
    bit<32> rtt_age_m1;         /* rtt_units - 1: 0 < age <= max in one unsigned comparison */
    bit<32> rtt;                /* sample, ns */
    bit<4> rtt_verdict;         /* RTT_LIMIT_*: the sampling limit's predicate */
    /* long flows */
    bit<1> lf_hit;
    bit<1> long_enough;         /* the flow's packet count reached the long-flow threshold */
    bit<16> count0;
    bit<16> count1;
    bit<16> count2;
    bit<16> count3;
    bit<1> lf_report_ok;
    bit<8> flow_event;
#ifdef LONG_FLOW_WINDOW
    bit<1> window_continues;
    bit<32> window_count;
#endif
}

struct eg_md_t {
    bit<32> ts_inv;             /* ~ts, to compute ~sample without a second subtraction */
    bit<1> overwritten;
    bit<32> qd_ts;              /* before-tap time taken from the table, 0 = miss */
    bit<32> sample;             /* queueing delay, ns */
    bit<32> sample_inv;         /* ~sample: sum_lo + sample carries iff sum_lo > ~sample */
    bit<32> ewma;
}

#endif /* _P4BS_HEADERS_P4_ */
