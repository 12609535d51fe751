//! The software model of the p4bs data plane, following `p4/SPEC.md`.
//!
//! So far: the packet parser (SPEC §2) and a pcap reader for captures made in the testbed.

pub mod parse;
pub mod pcap;
