//! The software model of the p4bs data plane, following `p4/SPEC.md`: the same tables,
//! hashes, thresholds and timeouts as the Tofino program, over capture files (pcap,
//! pcapng) or live interfaces.

pub mod config;
pub mod hash;
pub mod live;
pub mod longflow;
pub mod loss;
pub mod parse;
pub mod pcap;
pub mod pcapng;
pub mod pipeline;
pub mod qdelay;
pub mod record;
pub mod rtt;
pub mod sketch;
pub mod source;
