"""The control-plane contract of p4/tofino: every name, code and width the `tofino` target
(tofino.py) takes from the P4 program, here and nowhere else (p4/tofino/README.md,
"Control-plane contract"; names as bfrt_grpc shows them, "<control>.<object>").
tests/unit/test_tofino_contract.py reads each one back from p4/tofino/*.p4 and fails, naming
it, when the program and this module disagree; tests/unit/test_tofino_bfrt_schema.py checks
them against the bf-rt schema the compiler writes."""

from __future__ import annotations

PROGRAM = "p4bs"  # p4/tofino/p4bs.p4, built with -DP4_NAME=p4bs
LINK_INDEX_BITS = 8  # link_index_t: the program's default LINK_INDEX_BITS
MAX_LINKS = 1 << LINK_INDEX_BITS  # per-link register size, MAX_LINKS
TCP = 6  # IP_PROTO_TCP: the only protocol the program measures

# Ingress.port_to_link: ingress port (exact) -> Ingress.set_link(link, tap, direction).
PORT_TABLE = "Ingress.port_to_link"
PORT_KEY = "ig_intr_md.ingress_port"
SET_LINK = "Ingress.set_link"
SET_LINK_PARAMS = ("link", "tap", "direction")
TAP_BEFORE, TAP_AFTER = 0, 1
DIR_OUT, DIR_BACK, DIR_BOTH = 0, 1, 2
TAP_CODES = {"before": TAP_BEFORE, "after": TAP_AFTER}
DIRECTION_CODES = {"out": DIR_OUT, "back": DIR_BACK, "both": DIR_BOTH}
# Ingress.output_prefixes: (PORT_KEY exact, PREFIX_KEY lpm) -> Ingress.dst_is_output().
PREFIX_TABLE = "Ingress.output_prefixes"
PREFIX_KEY = "hdr.ipv4.dst_addr"
DST_IS_OUTPUT = "Ingress.dst_is_output"
# Ingress.config, keyless: default entry Ingress.set_config(cms_epoch), a 16-bit epoch.
CONFIG_TABLE = "Ingress.config"
SET_CONFIG = "Ingress.set_config"
CMS_EPOCH = "cms_epoch"
CMS_EPOCH_BITS = 16
# RegisterParam Ingress.rtt_min_interval, in the units of md.now_us (2^10 ns).
RTT_MIN_INTERVAL = "Ingress.rtt_min_interval"
RTT_MIN_INTERVAL_UNIT_NS = 1024
# Ingress.long_flows: exact on LONG_FLOW_KEYS (a FlowKey's order), action
# Ingress.long_flow_hit(), idle timeout on.
LONG_FLOWS = "Ingress.long_flows"
LONG_FLOW_KEYS = (
    "md.link",
    "hdr.ipv4.src_addr",
    "hdr.ipv4.dst_addr",
    "hdr.tcp.src_port",
    "hdr.tcp.dst_port",
)
LONG_FLOW_HIT = "Ingress.long_flow_hit"

# Digests (learn objects): (field, width in bits) in the order of the P4 struct.
RTT_DIGEST = "IngressDeparser.rtt_digest"
RTT_DIGEST_LAYOUT = (
    ("link", LINK_INDEX_BITS),
    ("ts", 48),
    ("src_addr", 32),
    ("dst_addr", 32),
    ("src_port", 16),
    ("dst_port", 16),
    ("rtt", 32),
)
FLOW_DIGEST = "IngressDeparser.flow_digest"
FLOW_DIGEST_LAYOUT = (
    ("link", LINK_INDEX_BITS),
    ("event", 8),
    ("ts", 48),
    ("src_addr", 32),
    ("dst_addr", 32),
    ("src_port", 16),
    ("dst_port", 16),
    ("count0", 16),
    ("count1", 16),
    ("count2", 16),
    ("count3", 16),
)
RTT_FIELDS = tuple(name for name, _ in RTT_DIGEST_LAYOUT)
FLOW_FIELDS = tuple(name for name, _ in FLOW_DIGEST_LAYOUT)
# flow_digest_t.event: the P4's FLOW_<KIND>_<REASON> codes.
FLOW_START_THRESHOLD, FLOW_START_WINDOW, FLOW_END_FIN, FLOW_END_RST = 1, 2, 3, 4
FLOW_REASONS = {
    FLOW_START_THRESHOLD: ("start", "threshold"),
    FLOW_START_WINDOW: ("start", "window"),
    FLOW_END_FIN: ("end", "fin"),
    FLOW_END_RST: ("end", "rst"),
}

# Per-link registers (Egress, index = link index): (register, [(bfrt data field,
# LinkCounters field)]); a bit<N> cell's field is "f1". Counters are COUNTER_BITS wide, wrap
# and are exported as differences; the queueing-delay sum is {sum_lo, sum_hi}, 64 bits.
COUNTER_REGISTERS = (
    ("Egress.link_traffic", (("packets", "packets"), ("bytes", "bytes"))),
    ("Egress.link_after", (("packets", "after_packets"), ("bytes", "after_bytes"))),
    ("Egress.link_data", (("packets", "data_packets"), ("bytes", "data_bytes"))),
    ("Egress.link_retx", (("f1", "retransmissions"),)),
    ("Egress.link_qdelay_samples", (("f1", "queue_delay_samples"),)),
)
COUNTER_BITS = 32
QDELAY_SUM = "Egress.link_qdelay_sum"
QDELAY_SUM_LO, QDELAY_SUM_HI = "sum_lo", "sum_hi"
QDELAY_SUM_LO_BITS = 32
QDELAY_SUM_BITS = 64
QDELAY_EWMA = "Egress.link_qdelay_ewma"
QDELAY_EWMA_FIELD = "f1"
# Lpf Egress.link_qdelay_lpf (index = link index) computes that EWMA; SPEC §6 gives each new
# sample the weight 2^-QDELAY_EWMA_SHIFT.
QDELAY_LPF = "Egress.link_qdelay_lpf"
QDELAY_EWMA_SHIFT = 3

# bfrt_grpc's own names (not in the P4; the README's contract documents them).
ENTRY_TTL = "$ENTRY_TTL"
REGISTER_INDEX = "$REGISTER_INDEX"
# The pipeline counter of register reads (one Sync and read of one register each): the
# endpoint's p4bs_exporter_register_reads_total (p4bs_exporter.metrics).
REGISTER_READS = "register_reads"
REGISTER_PARAM_VALUE = "value"
REGISTER_SYNC = "Sync"  # operations_execute: copy a register table from the hardware at once
LPF_INDEX = "$LPF_INDEX"
LPF_SPEC_TYPE = "$LPF_SPEC_TYPE"  # str_val: "SAMPLE" filters the input's value, "RATE" its rate
LPF_SAMPLE = "SAMPLE"
LPF_GAIN_TIME_CONSTANT = "$LPF_SPEC_GAIN_TIME_CONSTANT_NS"  # float_val, ns, input above output
LPF_DECAY_TIME_CONSTANT = "$LPF_SPEC_DECAY_TIME_CONSTANT_NS"  # float_val, ns, input below
LPF_OUT_SCALE_DOWN = "$LPF_SPEC_OUT_SCALE_DOWN_FACTOR"  # val: the output is shifted right by it
ENTRY_SCOPE = "EntryScope"  # the table attribute attribute_entry_scope_set writes
# google.rpc codes of a failed entry, as the bf_rt server maps the driver's status
# (bf_rt_server_impl.hpp, to_grpc_status).
RPC_ALREADY_EXISTS = 6  # BF_ALREADY_EXISTS
RPC_RESOURCE_EXHAUSTED = 8  # BF_NO_SPACE, BF_NO_SYS_RESOURCES: the table is full
RPC_UNAVAILABLE = 14  # BF_NOT_READY, BF_TABLE_LOCKED, BF_DEVICE_LOCKED, BF_IN_USE; or no server
