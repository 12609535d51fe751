/* p4bs for Tofino (TNA): egress — queueing delay and the per-link counters (SPEC sections
 * 5-7). Ingress sends here only out-direction TCP packets of either tap, carrying just a
 * bridge header, and every packet is dropped at the end: nothing leaves the switch.
 *
 * Why egress: RTT, sketch and loss already take about 11 of the 12 Tofino 1 ingress stages
 * (README, resource note); this part needs four more, and egress stages are free. A pipe's
 * registers see only its own ports: all ports of a link must be in the same pipe.
 */
#ifndef _P4BS_EGRESS_P4_
#define _P4BS_EGRESS_P4_

control Egress(inout eg_headers_t hdr,
               inout eg_md_t md,
               in egress_intrinsic_metadata_t eg_intr_md,
               in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
               inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
               inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

    Counter<bit<64>, bit<3>>(8, CounterType_t.PACKETS) qdelay_stats;   /* QD_* index */

    /* ---------------------------------------------------------------------------------
     * Per-link counters, index = link index (section 7). Cumulative 32-bit values: the
     * control plane reads them (from_hw) every export interval and either clears them or
     * takes differences mod 2^32 (README, "Per-link registers").
     * ------------------------------------------------------------------------------- */
    Register<counter_pair_t, link_index_t>(MAX_LINKS) link_traffic;   /* packets, bytes */
    Register<counter_pair_t, link_index_t>(MAX_LINKS) link_after;     /* after_packets, _bytes */
    Register<counter_pair_t, link_index_t>(MAX_LINKS) link_data;      /* data_packets, _bytes */
    Register<bit<32>, link_index_t>(MAX_LINKS) link_retx;            /* retransmissions */
    Register<qdelay_sum_t, link_index_t>(MAX_LINKS) link_qdelay_sum;  /* sum of samples, ns */
    Register<bit<32>, link_index_t>(MAX_LINKS) link_qdelay_samples;   /* number of samples */
    Register<bit<32>, link_index_t>(MAX_LINKS) link_qdelay_ewma;      /* EWMA, ns (not reset) */
    Lpf<bit<32>, link_index_t>(MAX_LINKS) link_qdelay_lpf;

    RegisterAction<counter_pair_t, link_index_t, bit<32>>(link_traffic) link_traffic_add = {
        void apply(inout counter_pair_t c) {
            c.packets = c.packets + 1;
            c.bytes = c.bytes + (bit<32>)hdr.bridge.ip_len;
        }
    };

    /* What left the router (after tap, out direction): the load the link carried. */
    RegisterAction<counter_pair_t, link_index_t, bit<32>>(link_after) link_after_add = {
        void apply(inout counter_pair_t c) {
            c.packets = c.packets + 1;
            c.bytes = c.bytes + (bit<32>)hdr.bridge.ip_len;
        }
    };

    RegisterAction<counter_pair_t, link_index_t, bit<32>>(link_data) link_data_add = {
        void apply(inout counter_pair_t c) {
            c.packets = c.packets + 1;
            c.bytes = c.bytes + (bit<32>)hdr.bridge.ip_len;
        }
    };

    RegisterAction<bit<32>, link_index_t, bit<32>>(link_retx) link_retx_add = {
        void apply(inout bit<32> c) {
            c = c + 1;
        }
    };

    /* 64-bit sum in one cell pair: the low word carries into the high word iff
     * sum_lo + sample >= 2^32, i.e. sum_lo > ~sample (computed beforehand). */
    RegisterAction<qdelay_sum_t, link_index_t, bit<32>>(link_qdelay_sum) link_qdelay_add = {
        void apply(inout qdelay_sum_t q) {
            if (q.sum_lo > md.sample_inv) {
                q.sum_hi = q.sum_hi + 1;
            }
            q.sum_lo = q.sum_lo + md.sample;
        }
    };

    RegisterAction<bit<32>, link_index_t, bit<32>>(link_qdelay_samples) link_qdelay_count = {
        void apply(inout bit<32> c) {
            c = c + 1;
        }
    };

    /* A stateful ALU cannot shift, so ewma += (sample - ewma) >> QDELAY_EWMA_SHIFT cannot be
     * done in one register access. The Tofino low-pass filter (SAMPLE mode, configured per
     * link by the control plane) is the EWMA; its output is kept here for the exporter. */
    RegisterAction<bit<32>, link_index_t, bit<32>>(link_qdelay_ewma) link_qdelay_ewma_set = {
        void apply(inout bit<32> e) {
            e = md.ewma;
        }
    };

    /* ---------------------------------------------------------------------------------
     * Section 6: packets matched between the taps. {signature, ts} slots indexed by the
     * queue key's CRC-32; written at the before tap, read and emptied at the after tap.
     * ------------------------------------------------------------------------------- */
    Register<sig_ts_t, qdelay_index_t>(QDELAY_SLOTS) qdelay_table;

    RegisterAction<sig_ts_t, qdelay_index_t, bit<1>>(qdelay_table) qdelay_record = {
        void apply(inout sig_ts_t s, out bit<1> overwritten) {
            overwritten = 0;
            if (s.ts != 0 && hdr.bridge.ts - s.ts <= QDELAY_MAX_AGE_NS) {
                overwritten = 1;               /* a live record whose packet had not come out */
            }
            s.sig = hdr.bridge.qd_sig;
            s.ts = hdr.bridge.ts;
        }
    };

    RegisterAction<sig_ts_t, qdelay_index_t, bit<32>>(qdelay_table) qdelay_take = {
        void apply(inout sig_ts_t s, out bit<32> ts) {
            ts = 0;
            if (s.sig == hdr.bridge.qd_sig) {
                ts = s.ts;
                s.sig = 0;
                s.ts = 0;
            }
        }
    };

    /* The sample in an action of its own table: the low-pass filter reads its input from the
     * PHV, and an assignment in the same block would be propagated into its argument as an
     * expression, which the filter cannot take. */
    action compute_sample() {
        md.sample = hdr.bridge.ts - md.qd_ts;
        md.sample_inv = md.qd_ts + md.ts_inv;   /* = ~(ts - qd_ts) */
    }

    table qdelay_sample {
        actions = { compute_sample; }
        const default_action = compute_sample;
        size = 1;
    }

    /* sample <= QDELAY_MAX_AGE_NS, a range match (HIGH12/LOW20; a gateway compares at most
     * 4 bytes + 12 bits). */
    table qdelay_fresh {
        key = {
            md.sample[31:20] : range @name("sample_high12");
            md.sample[19:0] : range @name("sample_low20");
        }
        actions = { NoAction; }
        const default_action = NoAction;
        const entries = {
            (0 .. HIGH12(QDELAY_MAX_AGE_NS) - 1, 0 .. 0xFFFFF) : NoAction();
            (HIGH12(QDELAY_MAX_AGE_NS) .. HIGH12(QDELAY_MAX_AGE_NS),
             0 .. LOW20(QDELAY_MAX_AGE_NS)) : NoAction();
        }
        size = 2;
    }

    apply {
        eg_dprsr_md.drop_ctl = 1;

        if (hdr.bridge.isValid()) {
            link_index_t link = (link_index_t)hdr.bridge.link;
            md.ts_inv = ~hdr.bridge.ts;

            if (hdr.bridge.count_traffic == 1) {
                link_traffic_add.execute(link);
                if (hdr.bridge.is_data == 1) {
                    link_data_add.execute(link);
                    if (hdr.bridge.retx == 1) {
                        link_retx_add.execute(link);
                    }
                }
            } else if (hdr.bridge.count_after == 1) {
                link_after_add.execute(link);
            }

            if (hdr.bridge.qd_write == 1) {
                md.overwritten = qdelay_record.execute((qdelay_index_t)hdr.bridge.qd_index);
                if (md.overwritten == 1) {
                    qdelay_stats.count(QD_OVERWRITTEN);
                } else {
                    qdelay_stats.count(QD_RECORDED);
                }
            } else if (hdr.bridge.qd_read == 1) {
                md.qd_ts = qdelay_take.execute((qdelay_index_t)hdr.bridge.qd_index);
                if (md.qd_ts == 0) {
                    qdelay_stats.count(QD_UNMATCHED);
                } else {
                    qdelay_sample.apply();
                    if (!qdelay_fresh.apply().hit) {
                        qdelay_stats.count(QD_EXPIRED);
                    } else {
                        qdelay_stats.count(QD_SAMPLE);
                        link_qdelay_add.execute(link);
                        link_qdelay_count.execute(link);
                        md.ewma = link_qdelay_lpf.execute(md.sample, link);
                        link_qdelay_ewma_set.execute(link);
                    }
                }
            }
        }
    }
}

#endif /* _P4BS_EGRESS_P4_ */
