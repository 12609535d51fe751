//! The software model of the p4bs data plane, following `p4/SPEC.md`.
//!
//! So far: the packet parser (SPEC §2), a pcap reader for captures made in the testbed, the
//! hash functions (SPEC §2) and the per-flow RTT table (SPEC §3).

pub mod hash;
pub mod parse;
pub mod pcap;
pub mod rtt;
