/* p4bs for Tofino (TNA): ingress — port -> link, lengths, long flows and retransmission
 * detection at the before tap, per-flow RTT at the after tap (SPEC sections 1-5). Queueing
 * delay and the per-link counters are in egress.p4, which packets reach with a bridge header.
 *
 * Tofino rules this control is written around:
 *  - a register is read-modified-written at most once per packet, by one of at most four
 *    RegisterActions, each with at most two comparisons (Tofino 1 stateful ALU);
 *  - a register cell is 32 bits or a pair of 32-bit halves;
 *  - no loops; every dependency (hash -> register -> compare -> register) costs a stage,
 *    and 12 stages is all Tofino 1 has per direction (README, resource note).
 */
#ifndef _P4BS_INGRESS_P4_
#define _P4BS_INGRESS_P4_

/* Header lengths for every legal (IHL, data offset): 11 x 11 const entries, negated (mod
 * 2^32) because an ALU subtraction cannot take its second operand from action data. */
#define HL_ENTRY(I, D) (I, D) : set_lengths(32w0 - 4 * I, 32w0 - 4 * (I + D));
#define HL_ROW(I) HL_ENTRY(I, 5) HL_ENTRY(I, 6) HL_ENTRY(I, 7) HL_ENTRY(I, 8) \
    HL_ENTRY(I, 9) HL_ENTRY(I, 10) HL_ENTRY(I, 11) HL_ENTRY(I, 12) HL_ENTRY(I, 13) \
    HL_ENTRY(I, 14) HL_ENTRY(I, 15)

control Ingress(inout ig_headers_t hdr,
                inout ig_md_t md,
                in ingress_intrinsic_metadata_t ig_intr_md,
                in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    /* ---------------------------------------------------------------------------------
     * Counters (read by the exporter as its own metrics; no stateful ALU needed)
     * ------------------------------------------------------------------------------- */
    Counter<bit<64>, PortId_t>(PORT_TABLE_SIZE, CounterType_t.PACKETS_AND_BYTES) port_packets;
    Counter<bit<64>, bit<4>>(16, CounterType_t.PACKETS) parse_stats;   /* SKIP_* index */
    /* parsed TCP packets on ports port_to_link does not know (unmapped_port) */
    Counter<bit<64>, PortId_t>(PORT_TABLE_SIZE, CounterType_t.PACKETS) unmapped_packets;
    Counter<bit<64>, bit<3>>(8, CounterType_t.PACKETS) rtt_stats;      /* RTT_* index */
    Counter<bit<64>, bit<2>>(4, CounterType_t.PACKETS) flow_stats;     /* FLOW_STAT_* */

    /* ---------------------------------------------------------------------------------
     * Hashes (SPEC section 2): CRC-32 variants over the big-endian key fields in order
     * ------------------------------------------------------------------------------- */
    CRCPolynomial<bit<32>>(CRC32_POLY, true, false, false, CRC_INIT_INDEX, CRC_XOR_OUT) crc32;
    CRCPolynomial<bit<32>>(CRC32C_POLY, true, false, false, CRC_INIT_INDEX, CRC_XOR_OUT) crc32c;
    CRCPolynomial<bit<32>>(CRC32_POLY, true, false, false, CRC_INIT_SIGNATURE, CRC_XOR_OUT)
        crc32_sig;
    /* own flow key: loss, window and report-gap index, CMS row 0 */
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32) hash_flow;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32_sig) hash_flow_sig;
    /* RTT key (flow key + number): stage indices and signature */
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32) hash_rtt_idx0;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32c) hash_rtt_idx1;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32_sig) hash_rtt_sig;
    /* data-direction flow key of an ACK: sampling limit */
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32) hash_rtt_flow;
    /* queue key (flow key, seq, IPv4 id): computed here, used in egress */
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32) hash_qdelay_idx;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32_sig) hash_qdelay_sig;
#ifndef LONG_FLOW_WINDOW
    CRCPolynomial<bit<32>>(CRC32D_POLY, true, false, false, CRC_INIT_INDEX, CRC_XOR_OUT) crc32d;
    CRCPolynomial<bit<32>>(CRC32Q_POLY, true, false, false, CRC_INIT_INDEX, CRC_XOR_OUT) crc32q;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32c) hash_cms1;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32d) hash_cms2;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, crc32q) hash_cms3;
#endif

    /* ---------------------------------------------------------------------------------
     * Section 1: ports, links and taps
     * ------------------------------------------------------------------------------- */
    action set_link(link_index_t link, bit<1> tap, bit<2> direction) {
        md.link = link;
        md.tap = tap;
        md.dir_mode = direction;
    }

    action unmapped_port() {
    }

    table port_to_link {
        key = { ig_intr_md.ingress_port : exact; }
        actions = { set_link; @defaultonly unmapped_port; }
        const default_action = unmapped_port;
        size = PORT_TABLE_SIZE;
    }

    /* For a `both` tap the direction is `out` iff the destination is in the link's
     * output_prefixes. Keyed on the port, not the link index, so that it runs in the same
     * stage as port_to_link instead of the next one; the control plane installs each
     * link's prefixes for each of its `both` ports. */
    action dst_is_output() {
        md.dst_is_output = 1;
    }

    table output_prefixes {
        key = {
            ig_intr_md.ingress_port : exact;
            hdr.ipv4.dst_addr : lpm;
        }
        actions = { dst_is_output; @defaultonly NoAction; }
        const default_action = NoAction;
        size = OUTPUT_PREFIXES_SIZE;
    }

    /* Run-time settings that are not per link. cms_epoch: the sketch's reset (below). */
    action set_config(bit<16> cms_epoch) {
        md.cms_epoch = cms_epoch;
    }

    table config {
        actions = { set_config; }
        default_action = set_config(0);
        size = 1;
    }

    /* ---------------------------------------------------------------------------------
     * Section 2: lengths. The payload comes from the IPv4 total length, never the frame
     * length (Ethernet pads short frames). 32-bit arithmetic so that a header longer than
     * the total length shows as bit 31.
     * ------------------------------------------------------------------------------- */
    action set_lengths(bit<32> minus_ip_hl, bit<32> minus_hl) {
        md.l4_len = (bit<32>)hdr.ipv4.total_len + minus_ip_hl;
        md.payload = (bit<32>)hdr.ipv4.total_len + minus_hl;
    }

    /* eACK = seq + SYN + FIN + payload. In a table's action so that the compiler does not
     * fold seq_sf into a three-operand sum, which one stage's ALU cannot do. */
    action set_sequence_ends() {
        md.eack = md.seq_sf + md.payload;
        md.seg_end = hdr.tcp.seq_no + md.payload;
    }

    table sequence_ends {
        actions = { set_sequence_ends; }
        const default_action = set_sequence_ends;
        size = 1;
    }

    table header_lengths {
        key = {
            hdr.ipv4.ihl : exact;
            hdr.tcp.data_offset : exact;
        }
        actions = { set_lengths; @defaultonly NoAction; }
        const default_action = NoAction;   /* non-TCP packets: lengths stay 0, unused */
        const entries = {
            HL_ROW(5) HL_ROW(6) HL_ROW(7) HL_ROW(8) HL_ROW(9) HL_ROW(10)
            HL_ROW(11) HL_ROW(12) HL_ROW(13) HL_ROW(14) HL_ROW(15)
        }
        size = 128;
    }

    /* ---------------------------------------------------------------------------------
     * Section 5: loss (before tap, out). Per flow {signature, next_seq}; a data segment
     * ending at or before next_seq is a retransmission (serial arithmetic). The stateful
     * ALU only has two comparisons and 64 bits of packet input (signature + segment end),
     * so the test is on the segment's end rather than its start; with a one-byte payload
     * the end may equal next_seq (a keep-alive: seq = next_seq - 1) without it being a
     * retransmission.
     * next_seq advances exactly as in SPEC (to the end of any segment that goes beyond it).
     * ------------------------------------------------------------------------------- */
    Register<loss_slot_t, loss_index_t>(LOSS_SLOTS) loss_table;

    RegisterAction<loss_slot_t, loss_index_t, bit<1>>(loss_table) loss_judge = {
        void apply(inout loss_slot_t s, out bit<1> retx) {
            retx = 0;
            if (s.sig == md.flow_sig) {
                if ((int<32>)(md.seg_end - s.next_seq) <= 0) {
                    retx = 1;
                } else {
                    s.next_seq = md.seg_end;
                }
            } else {
                s.sig = md.flow_sig;           /* taken over: this segment is not judged */
                s.next_seq = md.seg_end;
            }
        }
    };

    RegisterAction<loss_slot_t, loss_index_t, bit<1>>(loss_table) loss_judge_one_byte = {
        void apply(inout loss_slot_t s, out bit<1> retx) {
            retx = 0;
            if (s.sig == md.flow_sig) {
                if ((int<32>)(md.seg_end - s.next_seq) < 0) {
                    retx = 1;
                } else {
                    s.next_seq = md.seg_end;   /* unchanged for a keep-alive */
                }
            } else {
                s.sig = md.flow_sig;
                s.next_seq = md.seg_end;
            }
        }
    };

    /* ---------------------------------------------------------------------------------
     * Section 3: per-flow RTT (after tap). Two stages of {signature, ts} slots keyed by
     * (flow, eACK). Slot times are md.rtt_now (64 ns units, top bit set), so an empty slot
     * (ts = 0) is always older than RTT_MAX_AGE_UNITS: "live" is a single comparison, and
     * with the signature comparison that is all a record needs:
     *   live, same signature  -> the segment passed twice: clear, store nothing (Karn);
     *   not live (empty/old)  -> store;
     *   live, other signature -> busy, try the next stage.
     * "take" returns the time of a slot with the signature and empties it (ACK lookup).
     * ------------------------------------------------------------------------------- */
    Register<sig_ts_t, rtt_index_t>(RTT_SLOTS) rtt_stage0;
    Register<sig_ts_t, rtt_index_t>(RTT_SLOTS) rtt_stage1;

    RegisterAction<sig_ts_t, rtt_index_t, bit<4>>(rtt_stage0) rtt0_record = {
        void apply(inout sig_ts_t s, out bit<4> result) {
            result = this.predicate(md.rtt_now - s.ts <= RTT_MAX_AGE_UNITS,
                                    s.sig == md.rtt_sig);
            if (md.rtt_now - s.ts <= RTT_MAX_AGE_UNITS) {
                if (s.sig == md.rtt_sig) {
                    s.sig = 0;
                    s.ts = 0;
                }
            } else {
                s.sig = md.rtt_sig;
                s.ts = md.rtt_now;
            }
        }
    };

    RegisterAction<sig_ts_t, rtt_index_t, bit<32>>(rtt_stage0) rtt0_take = {
        void apply(inout sig_ts_t s, out bit<32> ts) {
            ts = 0;
            if (s.sig == md.rtt_sig) {
                ts = s.ts;
                s.sig = 0;
                s.ts = 0;
            }
        }
    };

    RegisterAction<sig_ts_t, rtt_index_t, bit<4>>(rtt_stage1) rtt1_record = {
        void apply(inout sig_ts_t s, out bit<4> result) {
            result = this.predicate(md.rtt_now - s.ts <= RTT_MAX_AGE_UNITS,
                                    s.sig == md.rtt_sig);
            if (md.rtt_now - s.ts <= RTT_MAX_AGE_UNITS) {
                if (s.sig == md.rtt_sig) {
                    s.sig = 0;
                    s.ts = 0;
                }
            } else {
                s.sig = md.rtt_sig;
                s.ts = md.rtt_now;
            }
        }
    };

    RegisterAction<sig_ts_t, rtt_index_t, bit<32>>(rtt_stage1) rtt1_take = {
        void apply(inout sig_ts_t s, out bit<32> ts) {
            ts = 0;
            if (s.sig == md.rtt_sig) {
                ts = s.ts;
                s.sig = 0;
                s.ts = 0;
            }
        }
    };

    /* Sampling limit: last emission per flow in 1.024 us units (32 bits span 73 min). The
     * limit is a run-time parameter in the same units; 0 (the default) lets every sample
     * through. The same access judges the sample's age (0 < age <= RTT_MAX_AGE_UNITS, one
     * unsigned comparison of age - 1, which wraps for 0), so that expiry costs no stage of
     * its own: the result is the predicate, bit (fresh + 2 * interval passed). */
    RegisterParam<bit<32>>(RTT_MIN_INTERVAL_DEFAULT) rtt_min_interval;
    Register<bit<32>, rtt_limit_index_t>(RTT_LIMIT_SLOTS) rtt_last_emit;

    RegisterAction<bit<32>, rtt_limit_index_t, bit<4>>(rtt_last_emit) rtt_limit = {
        void apply(inout bit<32> last, out bit<4> verdict) {
            if (md.rtt_age_m1 <= RTT_MAX_AGE_UNITS - 1) {
                if (md.now_us - last >= rtt_min_interval.read()) {
                    last = md.now_us;
                }
            }
            verdict = this.predicate();
        }
    };

    /* The age of the slot taken (and age - 1, for the sampling limit), in a table's action:
     * in the control body the compiler would fold rtt_now's own computation into the
     * subtraction (two ALU operations). rtt_now - 1 is computed stages before. */
    action set_rtt_age() {
        md.rtt_units = md.rtt_now - md.rtt_ts;
        md.rtt_age_m1 = md.rtt_now_m1 - md.rtt_ts;
    }

    table rtt_age {
        actions = { set_rtt_age; }
        const default_action = set_rtt_age;
        size = 1;
    }

    action set_rtt_now_m1() {
        md.rtt_now_m1 = md.rtt_now - 1;
    }

    table rtt_clock_m1 {
        actions = { set_rtt_now_m1; }
        const default_action = set_rtt_now_m1;
        size = 1;
    }

    action rtt_key_data() {
        md.k_src = hdr.ipv4.src_addr;
        md.k_dst = hdr.ipv4.dst_addr;
        md.k_sport = hdr.tcp.src_port;
        md.k_dport = hdr.tcp.dst_port;
        md.k_num = md.eack;
    }

    action rtt_key_ack() {
        md.k_src = hdr.ipv4.dst_addr;
        md.k_dst = hdr.ipv4.src_addr;
        md.k_sport = hdr.tcp.dst_port;
        md.k_dport = hdr.tcp.src_port;
        md.k_num = hdr.tcp.ack_no;
    }

    /* One hash per action: an action takes at most 32 bits from the hash unit. */
    action rtt_hash_idx0() {
        md.rtt_idx0 = hash_rtt_idx0.get({md.k_src, md.k_dst, md.k_sport, md.k_dport,
                                        hdr.ipv4.protocol, md.k_num});
    }

    action rtt_hash_idx1() {
        md.rtt_idx1 = hash_rtt_idx1.get({md.k_src, md.k_dst, md.k_sport, md.k_dport,
                                        hdr.ipv4.protocol, md.k_num});
    }

    action rtt_hash_sig() {
        md.rtt_sig = hash_rtt_sig.get({md.k_src, md.k_dst, md.k_sport, md.k_dport,
                                      hdr.ipv4.protocol, md.k_num});
    }

    action rtt_hash_flow() {
        md.rtt_flow_crc32 = hash_rtt_flow.get({md.k_src, md.k_dst, md.k_sport, md.k_dport,
                                              hdr.ipv4.protocol});
    }

    action flow_hash_index() {
        md.flow_crc32 = hash_flow.get({hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
                                       hdr.tcp.src_port, hdr.tcp.dst_port,
                                       hdr.ipv4.protocol});
    }

    action flow_hash_sig() {
        md.flow_sig = hash_flow_sig.get({hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
                                         hdr.tcp.src_port, hdr.tcp.dst_port,
                                         hdr.ipv4.protocol});
    }
#ifndef LONG_FLOW_WINDOW

    action cms_hash_row1() {
        md.cms_idx1 = hash_cms1.get({hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
                                     hdr.tcp.src_port, hdr.tcp.dst_port, hdr.ipv4.protocol});
    }

    action cms_hash_row2() {
        md.cms_idx2 = hash_cms2.get({hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
                                     hdr.tcp.src_port, hdr.tcp.dst_port, hdr.ipv4.protocol});
    }

    action cms_hash_row3() {
        md.cms_idx3 = hash_cms3.get({hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
                                     hdr.tcp.src_port, hdr.tcp.dst_port, hdr.ipv4.protocol});
    }
#endif

    /* ---------------------------------------------------------------------------------
     * Section 4: long flows
     * ------------------------------------------------------------------------------- */

    /* Exact match on (link, flow key), idle timeout: the control plane inserts an entry
     * when a start digest arrives (with $ENTRY_TTL = LONG_FLOW_TTL_MS) and deletes it on an
     * end digest or an idle notification. A hit refreshes the entry. The protocol is not in
     * the key: only TCP gets here. */
    action set_long_enough() {
        md.long_enough = 1;
    }

    action long_flow_hit() {
        md.lf_hit = 1;
    }

    table long_flows {
        key = {
            md.link : exact;
            hdr.ipv4.src_addr : exact;
            hdr.ipv4.dst_addr : exact;
            hdr.tcp.src_port : exact;
            hdr.tcp.dst_port : exact;
        }
        actions = { long_flow_hit; @defaultonly NoAction; }
        const default_action = NoAction;
        size = LONG_FLOW_TABLE_SIZE;
        idle_timeout = true;
    }

    /* At most one start digest per flow slot per LF_REPORT_GAP_NS while the control plane
     * has not yet inserted the flow (the estimate stays above the threshold meanwhile). */
    Register<bit<32>, lf_report_index_t>(LF_REPORT_SLOTS) lf_last_report;

    RegisterAction<bit<32>, lf_report_index_t, bit<1>>(lf_last_report) lf_report = {
        void apply(inout bit<32> last, out bit<1> ok) {
            ok = 0;
            if (md.now - last >= LF_REPORT_GAP_NS) {
                last = md.now;
                ok = 1;
            }
        }
    };
#ifndef LONG_FLOW_WINDOW
    /* Count-min sketch. A cell is {count, epoch}: a cell whose epoch differs from the
     * current one (config table, bumped by the control plane every CMS_RESET_NS) reads as
     * zero, so the whole sketch resets at once without the control plane rewriting 2^19
     * cells. 16-bit saturating counts are enough to compare with CMS_THRESHOLD. */
    Register<cms_cell_t, cms_index_t>(CMS_WIDTH) cms_row0;
    Register<cms_cell_t, cms_index_t>(CMS_WIDTH) cms_row1;
    Register<cms_cell_t, cms_index_t>(CMS_WIDTH) cms_row2;
    Register<cms_cell_t, cms_index_t>(CMS_WIDTH) cms_row3;

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row0) cms_row0_add = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            if (c.epoch == md.cms_epoch) {
                c.count = c.count |+| 1;
            } else {
                c.epoch = md.cms_epoch;
                c.count = 1;
            }
            count = c.count;
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row0) cms_row0_read = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            count = 0;
            if (c.epoch == md.cms_epoch) {
                count = c.count;
            }
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row1) cms_row1_add = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            if (c.epoch == md.cms_epoch) {
                c.count = c.count |+| 1;
            } else {
                c.epoch = md.cms_epoch;
                c.count = 1;
            }
            count = c.count;
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row1) cms_row1_read = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            count = 0;
            if (c.epoch == md.cms_epoch) {
                count = c.count;
            }
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row2) cms_row2_add = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            if (c.epoch == md.cms_epoch) {
                c.count = c.count |+| 1;
            } else {
                c.epoch = md.cms_epoch;
                c.count = 1;
            }
            count = c.count;
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row2) cms_row2_read = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            count = 0;
            if (c.epoch == md.cms_epoch) {
                count = c.count;
            }
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row3) cms_row3_add = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            if (c.epoch == md.cms_epoch) {
                c.count = c.count |+| 1;
            } else {
                c.epoch = md.cms_epoch;
                c.count = 1;
            }
            count = c.count;
        }
    };

    RegisterAction<cms_cell_t, cms_index_t, bit<16>>(cms_row3) cms_row3_read = {
        void apply(inout cms_cell_t c, out bit<16> count) {
            count = 0;
            if (c.epoch == md.cms_epoch) {
                count = c.count;
            }
        }
    };

#else
    /* GLOBECOM Algorithm 1: per flow the last packet time (with a signature) and a count of
     * packets each within WINDOW_T_THRESH_NS of the previous one. Two registers because the
     * three fields do not fit one 64-bit cell. */
    Register<window_slot_t, window_index_t>(WINDOW_SLOTS) window_last;
    Register<bit<32>, window_index_t>(WINDOW_SLOTS) window_count;

    RegisterAction<window_slot_t, window_index_t, bit<1>>(window_last) window_touch = {
        void apply(inout window_slot_t s, out bit<1> continues) {
            continues = 0;
            if (s.sig == md.flow_sig && md.now - s.last < WINDOW_T_THRESH_NS) {
                continues = 1;
            }
            s.sig = md.flow_sig;
            s.last = md.now;
        }
    };

    RegisterAction<bit<32>, window_index_t, bit<32>>(window_count) window_increment = {
        void apply(inout bit<32> c, out bit<32> count) {
            c = c |+| 1;
            count = c;
        }
    };

    RegisterAction<bit<32>, window_index_t, bit<32>>(window_count) window_restart = {
        void apply(inout bit<32> c, out bit<32> count) {
            c = 0;
            count = 0;
        }
    };
#endif

#ifndef LONG_FLOW_WINDOW
    /* A data segment whose every sketch row reaches CMS_THRESHOLD (a range match: a gateway
     * cannot compare 4 x 16 bits with a constant). */
    table cms_threshold {
        key = {
            md.has_payload : exact;
            md.count0 : range;
            md.count1 : range;
            md.count2 : range;
            md.count3 : range;
        }
        actions = { set_long_enough; @defaultonly NoAction; }
        const default_action = NoAction;
        const entries = {
            (1, CMS_THRESHOLD .. 0xFFFF, CMS_THRESHOLD .. 0xFFFF, CMS_THRESHOLD .. 0xFFFF,
             CMS_THRESHOLD .. 0xFFFF) : set_long_enough();
        }
        size = 1;
    }
#else
    /* window_count >= WINDOW_C_THRESH, split like the age limits (HIGH12/LOW20). */
    table window_threshold {
        key = {
            md.window_count[31:20] : range @name("window_count_high12");
            md.window_count[19:0] : range @name("window_count_low20");
        }
        actions = { set_long_enough; @defaultonly NoAction; }
        const default_action = NoAction;
        const entries = {
            (0 .. 0, WINDOW_C_THRESH .. 0xFFFFF) : set_long_enough();
            (1 .. 0xFFF, 0 .. 0xFFFFF) : set_long_enough();
        }
        size = 2;
    }
#endif

    /* ---------------------------------------------------------------------------------
     * The bridge header's flags. All from action data in one action: the flags share a
     * container, and Tofino cannot fill one container from constants and several metadata
     * fields at other offsets at once.
     *   before tap: count what went in (count_traffic), record data for queueing delay;
     *   after tap:  count what the link carried, pure ACKs too (count_after), match data.
     * ------------------------------------------------------------------------------- */
    action set_bridge_flags(bit<1> count_traffic, bit<1> count_after, bit<1> is_data,
                            bit<1> retx, bit<1> qd_write, bit<1> qd_read) {
        hdr.bridge.link = (bit<16>)md.link;
        hdr.bridge.count_traffic = count_traffic;
        hdr.bridge.count_after = count_after;
        hdr.bridge.is_data = is_data;
        hdr.bridge.retx = retx;
        hdr.bridge.qd_write = qd_write;
        hdr.bridge.qd_read = qd_read;
        hdr.bridge._pad = 0;
    }

    /* The queue key's hashes for egress. ip_len goes through the hash unit too: it shares
     * a container with qd_index, and one action cannot fill a container from hash data and
     * a header field at once. */
    action bridge_queue_index() {
        @in_hash { hdr.bridge.ip_len = hdr.ipv4.total_len; }
        hdr.bridge.qd_index = (bit<16>)hash_qdelay_idx.get(
            {hdr.ipv4.src_addr, hdr.ipv4.dst_addr, hdr.tcp.src_port,
             hdr.tcp.dst_port, hdr.ipv4.protocol, hdr.tcp.seq_no,
             hdr.ipv4.identification});
    }

    action bridge_queue_sig() {
        hdr.bridge.qd_sig = hash_qdelay_sig.get(
            {hdr.ipv4.src_addr, hdr.ipv4.dst_addr, hdr.tcp.src_port,
             hdr.tcp.dst_port, hdr.ipv4.protocol, hdr.tcp.seq_no,
             hdr.ipv4.identification});
    }

    /* One entry per (tap, has_payload, retx) that occurs: a retransmission is only judged
     * before the tap, and only for a segment with a payload. */
#define BRIDGE_BEFORE(P, R) (TAP_BEFORE, P, R) : set_bridge_flags(1, 0, P, R, P, 0);
#define BRIDGE_AFTER(P) (TAP_AFTER, P, 0) : set_bridge_flags(0, 1, P, 0, 0, P);

    table bridge_flags {
        key = {
            md.tap : exact;
            md.has_payload : exact;
            md.retx : exact;
        }
        actions = { set_bridge_flags; @defaultonly NoAction; }
        const default_action = NoAction;
        const entries = {
            BRIDGE_BEFORE(0, 0) BRIDGE_BEFORE(1, 0) BRIDGE_BEFORE(1, 1)
            BRIDGE_AFTER(0) BRIDGE_AFTER(1)
        }
        size = 8;
    }

    /* ---------------------------------------------------------------------------------
     * The pipeline
     * ------------------------------------------------------------------------------- */
    apply {
        /* Stages 0-1 run for every packet, before the verdict on it is known: these only
         * write metadata (ignored for packets that are not parsed TCP), and keeping them
         * out of the verdict's branch keeps the dependency chain within 12 stages. */
        md.ts48 = ig_intr_md.ingress_mac_tstamp;
        md.now = ig_intr_md.ingress_mac_tstamp[31:0] | 32w1;
        /* Shifted slices of the timestamp come from the hash unit: in an ALU they would
         * need the timestamp at two alignments at once. */
        @in_hash { md.now_us = ig_intr_md.ingress_mac_tstamp[41:10]; }
        @in_hash { md.rtt_now = ig_intr_md.ingress_mac_tstamp[RTT_TS_SHIFT + 31:RTT_TS_SHIFT]
                                | 32w0x80000000; }
        port_packets.count(ig_intr_md.ingress_port);
        config.apply();
        output_prefixes.apply();
        header_lengths.apply();
        bool mapped = port_to_link.apply().hit;
        /* Refreshes idle time on every hit. Only the flow's own (out-direction) packets
         * carry its key on its link; its after-tap copies refresh it too, harmlessly. */
        long_flows.apply();

        /* Section 1: direction of this packet. */
        if (md.dir_mode == DIR_OUT || (md.dir_mode == DIR_BOTH && md.dst_is_output == 1)) {
            md.is_out = 1;
        }

        /* Lengths and sequence arithmetic (mod 2^32), and the hashes of the own flow key. */
        md.seq_sf = hdr.tcp.seq_no + md.synfin;
        sequence_ends.apply();
        rtt_clock_m1.apply();
        if (md.payload != 0) {
            md.has_payload = 1;
            md.is_data = 1;
        } else if (md.synfin != 0) {
            md.is_data = 1;
        }
        flow_hash_index();
        flow_hash_sig();
#ifndef LONG_FLOW_WINDOW
        cms_hash_row1();
        cms_hash_row2();
        cms_hash_row3();
#endif

        /* Section 2: the parser's verdict, then the two length checks it cannot make. */
        bit<4> verdict = md.skip;
        if (ig_prsr_md.parser_err != PARSER_ERROR_OK) {
            if (md.reached_tcp == 1) {
                verdict = SKIP_BAD_TCP;
            } else if (md.reached_ipv4 == 1) {
                verdict = SKIP_BAD_IPV4;
            } else {
                verdict = SKIP_TRUNCATED;
            }
        } else if (md.skip == SKIP_NONE) {
            if (md.l4_len[31:31] == 1) {
                verdict = SKIP_BAD_IPV4;    /* total length < 4 * IHL */
            } else if (md.payload[31:31] == 1) {
                verdict = SKIP_BAD_TCP;     /* TCP header runs past the total length */
            }
        }
        parse_stats.count(verdict);
        if (!mapped && verdict == SKIP_NONE) {
            unmapped_packets.count(ig_intr_md.ingress_port);
        }

        if (!mapped || verdict != SKIP_NONE) {
            ig_dprsr_md.drop_ctl = 1;
        } else {
            bit<3> rtt_stat = RTT_STORED;
            bit<1> count_rtt_stat = 0;
            bit<2> flow_stat = FLOW_STAT_START;
            bit<1> count_flow_stat = 0;

            if (md.tap == TAP_BEFORE && md.is_out == 1) {
                /* Section 5. */
                if (md.has_payload == 1) {
                    if (md.payload == 1) {
                        md.retx = loss_judge_one_byte.execute((loss_index_t)md.flow_crc32);
                    } else {
                        md.retx = loss_judge.execute((loss_index_t)md.flow_crc32);
                    }
                }

                /* Section 4. */
#ifndef LONG_FLOW_WINDOW
                if (md.has_payload == 1) {
                    md.count0 = cms_row0_add.execute((cms_index_t)md.flow_crc32);
                    md.count1 = cms_row1_add.execute((cms_index_t)md.cms_idx1);
                    md.count2 = cms_row2_add.execute((cms_index_t)md.cms_idx2);
                    md.count3 = cms_row3_add.execute((cms_index_t)md.cms_idx3);
                } else if (hdr.tcp.fin == 1 || hdr.tcp.rst == 1) {
                    /* an end digest reports the estimate too */
                    md.count0 = cms_row0_read.execute((cms_index_t)md.flow_crc32);
                    md.count1 = cms_row1_read.execute((cms_index_t)md.cms_idx1);
                    md.count2 = cms_row2_read.execute((cms_index_t)md.cms_idx2);
                    md.count3 = cms_row3_read.execute((cms_index_t)md.cms_idx3);
                }
                /* The estimate (min of the rows) reaches the threshold iff every row does;
                 * the control plane takes the min from the digest. */
                cms_threshold.apply();
#else
                md.window_continues = window_touch.execute((window_index_t)md.flow_crc32);
                if (md.window_continues == 1) {
                    md.window_count = window_increment.execute((window_index_t)md.flow_crc32);
                } else {
                    md.window_count = window_restart.execute((window_index_t)md.flow_crc32);
                }
                md.count0 = (bit<16>)md.window_count;
                md.count1 = (bit<16>)md.window_count;
                md.count2 = (bit<16>)md.window_count;
                md.count3 = (bit<16>)md.window_count;
                window_threshold.apply();
#endif
                /* A flow that is long only as it closes is not listed (nothing to end). */
                if (md.long_enough == 1 && md.lf_hit == 0 && hdr.tcp.fin == 0 && hdr.tcp.rst == 0) {
                    count_flow_stat = 1;
                    md.lf_report_ok = lf_report.execute((lf_report_index_t)md.flow_crc32);
                    if (md.lf_report_ok == 1) {
#ifndef LONG_FLOW_WINDOW
                        md.flow_event = FLOW_START_THRESHOLD;
#else
                        md.flow_event = FLOW_START_WINDOW;
#endif
                    } else {
                        flow_stat = FLOW_STAT_START_HELD;
                    }
                }
                /* A FIN or RST of a listed flow ends it at once; the control plane deletes
                 * the entry. */
                if (md.lf_hit == 1) {
                    if (hdr.tcp.rst == 1) {
                        md.flow_event = FLOW_END_RST;
                        count_flow_stat = 1;
                        flow_stat = FLOW_STAT_END;
                    } else if (hdr.tcp.fin == 1) {
                        md.flow_event = FLOW_END_FIN;
                        count_flow_stat = 1;
                        flow_stat = FLOW_STAT_END;
                    }
                }
                if (md.flow_event != 0) {
                    ig_dprsr_md.digest_type = DIGEST_FLOW;
                }
            } else if (md.tap == TAP_AFTER) {
                /* Section 3: data segments leaving the router, ACKs coming back. */
                if (md.is_out == 1 && md.is_data == 1) {
                    rtt_key_data();
                    md.rtt_op = RTT_OP_RECORD;
                } else if (md.is_out == 0 && hdr.tcp.ack == 1) {
                    rtt_key_ack();
                    md.rtt_op = RTT_OP_LOOKUP;
                }
                /* unconditional: runs in the stage that decides the op */
                rtt_hash_idx0();
                rtt_hash_idx1();
                rtt_hash_sig();
                rtt_hash_flow();

                if (md.rtt_op == RTT_OP_RECORD) {
                    md.rtt_result = rtt0_record.execute((rtt_index_t)md.rtt_idx0);
                    if (md.rtt_result == RTT_REC_BUSY) {
                        md.rtt_result = rtt1_record.execute((rtt_index_t)md.rtt_idx1);
                    }
                    count_rtt_stat = 1;
                    if (md.rtt_result == RTT_REC_BUSY) {
                        rtt_stat = RTT_TABLE_FULL;
                    } else if (md.rtt_result == RTT_REC_DUPLICATE) {
                        rtt_stat = RTT_DUPLICATE;
                    }
                } else if (md.rtt_op == RTT_OP_LOOKUP) {
                    md.rtt_ts = rtt0_take.execute((rtt_index_t)md.rtt_idx0);
                    if (md.rtt_ts == 0) {
                        md.rtt_ts = rtt1_take.execute((rtt_index_t)md.rtt_idx1);
                    }
                    if (md.rtt_ts != 0) {
                        count_rtt_stat = 1;
                        rtt_age.apply();
                        md.rtt_verdict = rtt_limit.execute((rtt_limit_index_t)md.rtt_flow_crc32);
                        if (md.rtt_verdict == RTT_LIMIT_SAMPLE) {
                            rtt_stat = RTT_SAMPLE;
                            /* ns in a later stage than the difference */
                            md.rtt = md.rtt_units << RTT_TS_SHIFT;
                            ig_dprsr_md.digest_type = DIGEST_RTT;
                        } else if (md.rtt_verdict == RTT_LIMIT_HELD) {
                            rtt_stat = RTT_RATE_LIMITED;
                        } else {
                            rtt_stat = RTT_EXPIRED;
                        }
                    }
                }
            }
            if (count_rtt_stat == 1) {
                rtt_stats.count(rtt_stat);
            }
            if (count_flow_stat == 1) {
                flow_stats.count(flow_stat);
            }

            /* Sections 5-7 continue in egress: per-link counters (both taps, out) and the
             * queueing-delay table (both taps, out, payload > 0). Everything else stops. */
            if (md.is_out == 1) {
                hdr.bridge.setValid();
                bridge_flags.apply();
                hdr.bridge.ts = md.now;
                bridge_queue_index();
                bridge_queue_sig();
                /* Back out of the port it came in on: a tap port's transmit side is idle,
                 * and the egress pipe is then the one holding this link's registers. */
                ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
            } else {
                ig_dprsr_md.drop_ctl = 1;
            }
        }
    }
}

#endif /* _P4BS_INGRESS_P4_ */
