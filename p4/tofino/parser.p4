/* p4bs for Tofino (TNA): parsers and deparsers (SPEC section 2).
 *
 * The ingress parser never drops: every way a frame can stop being a TCP/IPv4 packet leaves
 * its reason in md.skip, and Ingress counts it in parse_stats. A Tofino parser cannot
 * overwrite a field it has set on the same path, so md.skip is written once, in the state
 * that ends the parse. An extraction that runs past the end of the frame ends it with a
 * parser error instead; md.reached_ipv4 / md.reached_tcp (set when the parse commits to a
 * layer) then tell Ingress which layer was cut short. Ingress reads parser_err (which also
 * tells bf-p4c not to drop errored packets before the match-action stages).
 */
#ifndef _P4BS_PARSER_P4_
#define _P4BS_PARSER_P4_

/* IPv4 options are skipped, not interpreted: one state per IHL, each advancing a constant
 * number of 32-bit words (Tofino parsers cannot advance by a computed amount). */
#define SKIP_IPV4_OPTIONS(WORDS)                       \
    state skip_ipv4_options_##WORDS {                  \
        pkt.advance(32w32 * WORDS);                    \
        transition pre_tcp;                            \
    }

parser IngressParser(packet_in pkt,
                     out ig_headers_t hdr,
                     out ig_md_t md,
                     out ingress_intrinsic_metadata_t ig_intr_md) {

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        /* Metadata that the controls read before (or without) writing it starts at zero:
         * bf-p4c does not guarantee zeroed metadata. */
        md.reached_ipv4 = 0;
        md.reached_tcp = 0;
        md.synfin = 0;
        md.l4_len = 0;
        md.payload = 0;
        md.link = 0;
        md.tap = 0;
        md.dir_mode = 0;
        md.dst_is_output = 0;
        md.is_out = 0;
        md.has_payload = 0;
        md.is_data = 0;
        md.retx = 0;
        md.rtt_op = RTT_OP_NONE;
        md.rtt_result = RTT_REC_BUSY;
        md.rtt_ts = 0;
        md.rtt_verdict = 0;
        md.lf_hit = 0;
        md.long_enough = 0;
        md.count0 = 0;
        md.count1 = 0;
        md.count2 = 0;
        md.count3 = 0;
        md.lf_report_ok = 0;
        md.flow_event = 0;
#ifdef LONG_FLOW_WINDOW
        md.window_continues = 0;
        md.window_count = 0;
#endif
        transition parse_ethernet;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_VLAN: parse_vlan0;
            ETHERTYPE_QINQ: parse_vlan0;
            ETHERTYPE_IPV4: pre_ipv4;
            ETHERTYPE_IPV6: skip_ipv6;
            default: skip_other_l3;
        }
    }

    /* Up to two tags (QinQ); a third is vlan_too_deep. A tag cut short stays `truncated`. */
    state parse_vlan0 {
        pkt.extract(hdr.vlan0);
        transition select(hdr.vlan0.ether_type) {
            ETHERTYPE_VLAN: parse_vlan1;
            ETHERTYPE_QINQ: parse_vlan1;
            ETHERTYPE_IPV4: pre_ipv4;
            ETHERTYPE_IPV6: skip_ipv6;
            default: skip_other_l3;
        }
    }

    state parse_vlan1 {
        pkt.extract(hdr.vlan1);
        transition select(hdr.vlan1.ether_type) {
            ETHERTYPE_VLAN: skip_vlan_too_deep;
            ETHERTYPE_QINQ: skip_vlan_too_deep;
            ETHERTYPE_IPV4: pre_ipv4;
            ETHERTYPE_IPV6: skip_ipv6;
            default: skip_other_l3;
        }
    }

    /* From here on, a header (or its options) that does not fit in the frame is bad_ipv4. */
    state pre_ipv4 {
        md.reached_ipv4 = 1;
        transition parse_ipv4;
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.version, hdr.ipv4.ihl) {
            (4w4, 4w0 &&& 4w0xC): skip_bad_ipv4;   /* IHL 0..3 */
            (4w4, 4w4): skip_bad_ipv4;             /* IHL 4 */
            (4w4, _): check_fragment;
            default: skip_bad_ipv4;                /* not version 4 */
        }
    }

    /* The fixed header is still in the parser's window: select on it before skipping
     * options, so no field has to be saved across an advance. */
    state check_fragment {
        transition select(hdr.ipv4.flag_mf, hdr.ipv4.frag_offset) {
            (1w0, 13w0): check_protocol;
            default: skip_fragment;
        }
    }

    state check_protocol {
        transition select(hdr.ipv4.protocol) {
            IP_PROTO_TCP: skip_ipv4_options;
            default: skip_non_tcp;
        }
    }

    state skip_ipv4_options {
        transition select(hdr.ipv4.ihl) {
            5: pre_tcp;
            6: skip_ipv4_options_1;
            7: skip_ipv4_options_2;
            8: skip_ipv4_options_3;
            9: skip_ipv4_options_4;
            10: skip_ipv4_options_5;
            11: skip_ipv4_options_6;
            12: skip_ipv4_options_7;
            13: skip_ipv4_options_8;
            14: skip_ipv4_options_9;
            15: skip_ipv4_options_10;
        }
    }

    SKIP_IPV4_OPTIONS(1)
    SKIP_IPV4_OPTIONS(2)
    SKIP_IPV4_OPTIONS(3)
    SKIP_IPV4_OPTIONS(4)
    SKIP_IPV4_OPTIONS(5)
    SKIP_IPV4_OPTIONS(6)
    SKIP_IPV4_OPTIONS(7)
    SKIP_IPV4_OPTIONS(8)
    SKIP_IPV4_OPTIONS(9)
    SKIP_IPV4_OPTIONS(10)

    /* From here on, a TCP header that does not fit in the frame is bad_tcp. Whether it fits
     * in the IP packet (total length) is checked by Ingress, which has the lengths. */
    state pre_tcp {
        md.reached_tcp = 1;
        transition parse_tcp;
    }

    /* TCP options are not parsed (nothing after the fixed header is needed). SYN + FIN is
     * taken here, where it is free, so that eACK costs Ingress a single addition. */
    state parse_tcp {
        pkt.extract(hdr.tcp);
        transition select(hdr.tcp.data_offset, hdr.tcp.syn, hdr.tcp.fin) {
            (4w0 &&& 4w0xC, _, _): skip_bad_tcp;  /* data offset 0..3 */
            (4w4, _, _): skip_bad_tcp;            /* data offset 4 */
            (_, 1w0, 1w0): tcp_ok_synfin_0;
            (_, 1w1, 1w1): tcp_ok_synfin_2;
            default: tcp_ok_synfin_1;
        }
    }

    state tcp_ok_synfin_0 {
        md.skip = SKIP_NONE;
        md.synfin = 0;
        transition accept;
    }

    state tcp_ok_synfin_1 {
        md.skip = SKIP_NONE;
        md.synfin = 1;
        transition accept;
    }

    state tcp_ok_synfin_2 {
        md.skip = SKIP_NONE;
        md.synfin = 2;
        transition accept;
    }

    state skip_vlan_too_deep {
        md.skip = SKIP_VLAN_TOO_DEEP;
        transition accept;
    }

    state skip_ipv6 {
        md.skip = SKIP_IPV6;
        transition accept;
    }

    state skip_other_l3 {
        md.skip = SKIP_OTHER_L3;
        transition accept;
    }

    state skip_bad_ipv4 {
        md.skip = SKIP_BAD_IPV4;
        transition accept;
    }

    state skip_bad_tcp {
        md.skip = SKIP_BAD_TCP;
        transition accept;
    }

    state skip_fragment {
        md.skip = SKIP_FRAGMENT;
        transition accept;
    }

    state skip_non_tcp {
        md.skip = SKIP_NON_TCP;
        transition accept;
    }
}

control IngressDeparser(packet_out pkt,
                        inout ig_headers_t hdr,
                        in ig_md_t md,
                        in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Digest<rtt_digest_t>(DIGEST_RTT) rtt_digest;
    Digest<flow_digest_t>(DIGEST_FLOW) flow_digest;

    apply {
        if (ig_dprsr_md.digest_type == DIGEST_RTT) {
            rtt_digest.pack({md.link, md.ts48,
                             md.k_src, md.k_dst, md.k_sport, md.k_dport,
                             md.rtt});
        } else if (ig_dprsr_md.digest_type == DIGEST_FLOW) {
            flow_digest.pack({md.link, md.flow_event, md.ts48,
                              hdr.ipv4.src_addr, hdr.ipv4.dst_addr,
                              hdr.tcp.src_port, hdr.tcp.dst_port,
                              md.count0, md.count1, md.count2, md.count3});
        }
        /* Only the bridge header goes on: egress needs nothing else, and dropping the parsed
         * headers keeps the copy that crosses the traffic manager short. */
        pkt.emit(hdr.bridge);
    }
}

parser EgressParser(packet_in pkt,
                    out eg_headers_t hdr,
                    out eg_md_t md,
                    out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        md.ts_inv = 0;
        md.overwritten = 0;
        md.qd_ts = 0;
        md.sample = 0;
        md.sample_inv = 0;
        md.ewma = 0;
        transition accept;
    }
}

/* Egress drops every packet (Egress sets drop_ctl): the switch only observes. */
control EgressDeparser(packet_out pkt,
                       inout eg_headers_t hdr,
                       in eg_md_t md,
                       in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    apply {
    }
}

#endif /* _P4BS_PARSER_P4_ */
