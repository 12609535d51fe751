//! The software model of the p4bs data plane, following `p4/SPEC.md`.
//!
//! So far: the packet parser (SPEC §2), a pcap reader for captures made in the testbed, the
//! hash functions (SPEC §2), the per-flow RTT table (SPEC §3), the count-min sketch (SPEC §4)
//! and retransmission detection (SPEC §5).

pub mod hash;
pub mod loss;
pub mod parse;
pub mod pcap;
pub mod rtt;
pub mod sketch;
