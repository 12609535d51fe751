/* p4bs: passive measurement of per-flow RTTs, long flows, retransmissions and queueing
 * delay from the taps before and after legacy routers, for closed-loop buffer sizing.
 * Semantics: p4/SPEC.md. Build, control-plane contract and resources: p4/tofino/README.md.
 *
 * Tofino Native Architecture (TNA, Tofino 1); -DLONG_FLOW_WINDOW selects GLOBECOM's
 * packet-window rule instead of the count-min sketch for long flows.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

#include "headers.p4"
#include "parser.p4"
#include "ingress.p4"
#include "egress.p4"

Pipeline(IngressParser(),
         Ingress(),
         IngressDeparser(),
         EgressParser(),
         Egress(),
         EgressDeparser()) pipe;

Switch(pipe) main;
