//! The pcapng reader on hand-built blocks: both byte orders, resolutions, sections, and
//! truncated or malformed blocks.

use super::*;
use crate::parse::{parse, tests::frame};
use crate::pcap::PcapReader;

/// Blocks of one section, in its byte order.
struct Writer {
    big_endian: bool,
    out: Vec<u8>,
}

impl Writer {
    fn new(big_endian: bool) -> Writer {
        let mut writer = Writer {
            big_endian,
            out: Vec::new(),
        };
        writer.section(big_endian);
        writer
    }

    fn w32(&self, v: u32) -> [u8; 4] {
        if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn w16(&self, v: u16) -> [u8; 2] {
        if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    fn block(&mut self, kind: u32, body: &[u8]) -> &mut Writer {
        let padded = body.len().div_ceil(4) * 4;
        let length = self.w32((12 + padded) as u32);
        self.out.extend_from_slice(&self.w32(kind));
        self.out.extend_from_slice(&length);
        self.out.extend_from_slice(body);
        self.out.resize(self.out.len() + padded - body.len(), 0);
        self.out.extend_from_slice(&length);
        self
    }

    /// A section header (version 1.0, unknown section length) in `big_endian` order, the
    /// order of the blocks written after it.
    fn section(&mut self, big_endian: bool) -> &mut Writer {
        self.big_endian = big_endian;
        let mut body = self.w32(BYTE_ORDER_MAGIC).to_vec();
        body.extend_from_slice(&self.w16(1));
        body.extend_from_slice(&self.w16(0));
        body.extend_from_slice(&[0xff; 8]);
        self.block(SECTION_HEADER, &body)
    }

    fn options(&self, options: &[(u16, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (code, value) in options {
            out.extend_from_slice(&self.w16(*code));
            out.extend_from_slice(&self.w16(value.len() as u16));
            out.extend_from_slice(value);
            out.resize(out.len().div_ceil(4) * 4, 0);
        }
        if !options.is_empty() {
            out.extend_from_slice(&[0; 4]);
        }
        out
    }

    fn interface(&mut self, linktype: u16, snaplen: u32, options: &[(u16, &[u8])]) -> &mut Writer {
        let mut body = self.w16(linktype).to_vec();
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&self.w32(snaplen));
        body.extend(self.options(options));
        self.block(INTERFACE_DESCRIPTION, &body)
    }

    fn enhanced(&mut self, interface: u32, units: u64, data: &[u8]) -> &mut Writer {
        let mut body = Vec::new();
        for w in [
            interface,
            (units >> 32) as u32,
            units as u32,
            data.len() as u32,
            data.len() as u32,
        ] {
            body.extend_from_slice(&self.w32(w));
        }
        body.extend_from_slice(data);
        body.resize(body.len().div_ceil(4) * 4, 0);
        // A comment, which the reader skips.
        body.extend(self.options(&[(1, b"a packet")]));
        self.block(ENHANCED_PACKET, &body)
    }

    fn simple(&mut self, original: u32, data: &[u8]) -> &mut Writer {
        let mut body = self.w32(original).to_vec();
        body.extend_from_slice(data);
        self.block(SIMPLE_PACKET, &body)
    }
}

fn read_all(file: &[u8]) -> Result<Vec<(u64, Vec<u8>)>, PcapError> {
    let mut reader = PcapReader::new(file)?;
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while let Some(ts) = reader.next_into(&mut buf)? {
        out.push((ts, buf.clone()));
    }
    Ok(out)
}

const T0_US: u64 = 1_700_000_000_000_000;

#[test]
fn enhanced_packets_in_either_byte_order() {
    for big_endian in [false, true] {
        let mut file = Writer::new(big_endian);
        file.interface(1, 65535, &[])
            .enhanced(0, T0_US + 5, &frame(100, 0, 0, 0))
            .enhanced(0, T0_US + 9, &frame(0, 0, 0, 1));
        let records = read_all(&file.out).unwrap();
        assert_eq!(records.len(), 2, "big endian: {big_endian}");
        // Microseconds unless the interface says otherwise.
        assert_eq!(records[0].0, (T0_US + 5) * 1000);
        assert_eq!(records[1].0, (T0_US + 9) * 1000);
        assert_eq!(parse(&records[0].1).unwrap().payload, 100);
        assert_eq!(records[1].1, frame(0, 0, 0, 1));
    }
}

#[test]
fn each_interface_has_its_resolution_and_offset() {
    let ns = 1_700_000_000_123_456_789u64;
    let mut file = Writer::new(false);
    file.interface(1, 0, &[(OPT_IF_TSRESOL, &[9])])
        .interface(1, 0, &[(OPT_IF_TSRESOL, &[3])])
        .interface(1, 0, &[(OPT_IF_TSRESOL, &[0x80 | 20])])
        .interface(1, 0, &[(OPT_IF_TSRESOL, &[12]), (2, b"eth0")])
        .interface(1, 0, &[(OPT_IF_TSOFFSET, &1_000i64.to_le_bytes())])
        .enhanced(0, ns, &frame(0, 0, 0, 0))
        .enhanced(1, 1_700_000_000_123, &frame(0, 0, 0, 0))
        .enhanced(2, 3 << 20 | 1 << 19, &frame(0, 0, 0, 0))
        .enhanced(3, 123_456_789_999, &frame(0, 0, 0, 0))
        .enhanced(4, 7, &frame(0, 0, 0, 0));
    let times: Vec<u64> = read_all(&file.out).unwrap().iter().map(|r| r.0).collect();
    assert_eq!(
        times,
        vec![
            ns,
            1_700_000_000_123_000_000,
            3_500_000_000,
            123_456_789,
            1_000_000_007_000
        ]
    );
}

#[test]
fn resolutions_convert_exactly_or_refuse() {
    assert_eq!(Resolution::Pow10(0).to_ns(2), Some(2_000_000_000));
    assert_eq!(Resolution::Pow10(127).to_ns(u64::MAX), Some(0));
    assert_eq!(Resolution::Pow10(28).to_ns(u64::MAX), Some(1));
    assert_eq!(Resolution::Pow2(127).to_ns(u64::MAX), Some(0));
    assert_eq!(
        Resolution::Pow2(0).to_ns(1 << 20),
        Some(1_000_000_000 << 20)
    );
    assert_eq!(Resolution::Pow10(0).to_ns(u64::MAX), None);
    assert_eq!(Resolution::Pow2(0).to_ns(u64::MAX), None);
    assert_eq!(Resolution::from_option(0x8a), Resolution::Pow2(10));
}

#[test]
fn sections_simple_and_obsolete_packets_and_unknown_blocks() {
    let mut file = Writer::new(true);
    file.interface(1, 0, &[(OPT_IF_TSRESOL, &[9])])
        .block(4, &[0, 0, 0, 0]) // name resolution: skipped
        .enhanced(0, 42, &frame(10, 0, 0, 0))
        .simple(200, &frame(10, 0, 0, 0)) // the previous timestamp
        .section(false) // a new section, the other byte order, no interfaces yet
        .interface(1, 60, &[])
        .block(5, &[1; 20]) // interface statistics: skipped
        .block(0x0000_0bad, &[7; 13]) // custom: skipped
        .simple(2000, &frame(100, 0, 0, 0)); // cut to the snapshot length
    let mut obsolete = Vec::new();
    for w in [0u32, 0, 77, 14, 14] {
        obsolete.extend_from_slice(&w.to_le_bytes());
    }
    obsolete.extend_from_slice(&[0xee; 14]);
    obsolete.extend_from_slice(&[0; 2]);
    file.block(OBSOLETE_PACKET, &obsolete);
    let records = read_all(&file.out).unwrap();
    let times: Vec<u64> = records.iter().map(|r| r.0).collect();
    assert_eq!(times, vec![42, 42, 42, 77_000]);
    assert_eq!(records[1].1, frame(10, 0, 0, 0));
    assert_eq!(records[2].1, frame(100, 0, 0, 0)[..60]);
    assert_eq!(records[3].1, [0xee; 14]);
}

/// A file's error, by its message.
#[track_caller]
fn error(file: &[u8]) -> String {
    read_all(file).unwrap_err().to_string()
}

#[test]
fn truncated_files_name_the_block() {
    let mut file = Writer::new(false);
    file.interface(1, 0, &[])
        .enhanced(0, 1, &frame(0, 0, 0, 0))
        .enhanced(0, 2, &frame(0, 0, 0, 0));
    let whole = file.out.clone();
    let second = whole.len() - (whole.len() - 48) / 2;
    for cut in 1..whole.len() {
        let result = read_all(&whole[..cut]);
        match result {
            // Cut between blocks: the blocks before the cut.
            Ok(records) => assert!(
                [28, 48, second].contains(&cut) && records.len() == usize::from(cut == second)
            ),
            Err(PcapError::Truncated { index: 0 }) => assert!(cut < 4),
            Err(PcapError::TruncatedBlock { block, records }) => {
                assert!(cut >= 4);
                assert_eq!(records, block.saturating_sub(2));
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    assert_eq!(
        error(&whole[..second + 3]),
        "file ends inside block 3 (after 1 packets)"
    );
}

#[test]
fn malformed_blocks_are_refused_with_a_reason() {
    let valid = || {
        let mut file = Writer::new(false);
        file.interface(1, 0, &[]).enhanced(0, 1, &frame(0, 0, 0, 0));
        file.out
    };
    let word = |file: &mut Vec<u8>, at: usize, v: u32| {
        file[at..at + 4].copy_from_slice(&v.to_le_bytes());
    };
    // The section header is 28 bytes, the interface description 20.
    let mut file = valid();
    word(&mut file, 8, 0x1122_3344);
    assert_eq!(error(&file), "pcapng block 0: byte-order magic 0x11223344");
    let mut file = valid();
    file[12] = 2;
    assert_eq!(error(&file), "pcapng block 0: pcapng version 2.0, not 1.x");
    let mut file = valid();
    word(&mut file, 28 + 4, 22);
    assert!(error(&file).starts_with("pcapng block 1: block length 22"));
    let mut file = valid();
    word(&mut file, 28 + 16, 24);
    assert_eq!(
        error(&file),
        "pcapng block 1: closing length 24 differs from the opening 20"
    );
    let mut file = valid();
    word(&mut file, 48 + 20, 10_000);
    assert!(error(&file).contains("captured length 10000 exceeds its block's"));
    let mut file = valid();
    word(&mut file, 48 + 20, MAX_RECORD + 1);
    assert_eq!(error(&file), "record 0 claims 262145 bytes: corrupt");
    let mut file = valid();
    word(&mut file, 48 + 8, 1);
    assert_eq!(
        error(&file),
        "pcapng block 2: packet on interface 1, but the section describes 1"
    );
    let mut file = valid();
    file[28 + 8] = 113; // Linux cooked capture
    assert_eq!(
        error(&file),
        "pcapng block 2: interface 0's link type 113 is not Ethernet"
    );
    let mut file = Writer::new(false);
    file.interface(1, 0, &[(OPT_IF_TSRESOL, &[9, 9])]);
    assert_eq!(error(&file.out), "pcapng block 1: option 9 of 2 bytes");
    let mut file = Writer::new(false);
    file.interface(1, 0, &[(2, b"eth0")]);
    let at = file.out.len() - 16; // the option's code and length
    word(&mut file.out, at, 200 << 16 | 2);
    assert_eq!(
        error(&file.out),
        "pcapng block 1: option 2 of 200 bytes overruns"
    );
    let mut file = Writer::new(false);
    file.interface(1, 0, &[(OPT_IF_TSRESOL, &[0])])
        .enhanced(0, u64::MAX, &frame(0, 0, 0, 0));
    assert!(error(&file.out).contains("out of range"));
    let mut file = Writer::new(false);
    file.simple(14, &[0; 14]);
    assert!(error(&file.out).contains("packet on interface 0, but the section describes 0"));
}
