//! Reading capture files: classic pcap (microsecond or nanosecond, either byte order) as the
//! testbed's tcpdump writes it, and pcapng (`crate::pcapng`) as Wireshark, dumpcap and tshark
//! write by default, told apart by their first four bytes. A damaged file ends with an error
//! saying where, never a panic.

use std::fmt;
use std::io::{self, Read};

use crate::pcapng::{PcapngReader, SECTION_HEADER};

const MAGIC_US: u32 = 0xa1b2_c3d4;
const MAGIC_NS: u32 = 0xa1b2_3c4d;
pub(crate) const LINKTYPE_ETHERNET: u32 = 1;
/// Larger records are corrupt headers, not frames (tcpdump's own limit is 256 KiB).
pub const MAX_RECORD: u32 = 262_144;

#[derive(Debug)]
pub enum PcapError {
    Io(io::Error),
    BadMagic(u32),
    NotEthernet(u32),
    /// The file ends inside record `index` (0-based).
    Truncated {
        index: u64,
    },
    RecordTooLarge {
        index: u64,
        length: u32,
    },
    /// pcapng: the file ends inside block `block` (0-based), after `records` packets.
    TruncatedBlock {
        block: u64,
        records: u64,
    },
    /// pcapng: block `block` breaks the format, as `reason` says.
    Malformed {
        block: u64,
        reason: String,
    },
    /// pcapng: a packet block on an interface whose link type is not Ethernet.
    InterfaceNotEthernet {
        block: u64,
        interface: u32,
        linktype: u16,
    },
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PcapError::Io(e) => write!(f, "read error: {e}"),
            PcapError::BadMagic(m) => {
                write!(f, "not a pcap or pcapng file (magic {m:#010x})")
            }
            PcapError::NotEthernet(l) => write!(f, "link type {l} is not Ethernet"),
            PcapError::Truncated { index } => write!(f, "file ends inside record {index}"),
            PcapError::RecordTooLarge { index, length } => {
                write!(f, "record {index} claims {length} bytes: corrupt")
            }
            PcapError::TruncatedBlock { block, records } => {
                write!(
                    f,
                    "file ends inside block {block} (after {records} packets)"
                )
            }
            PcapError::Malformed { block, reason } => write!(f, "pcapng block {block}: {reason}"),
            PcapError::InterfaceNotEthernet {
                block,
                interface,
                linktype,
            } => write!(
                f,
                "pcapng block {block}: interface {interface}'s link type {linktype} is not \
                 Ethernet"
            ),
        }
    }
}

impl std::error::Error for PcapError {}

/// A capture file of either format, read record by record.
pub struct PcapReader<R: Read> {
    format: Format<R>,
}

enum Format<R: Read> {
    Classic(ClassicReader<R>),
    Pcapng(PcapngReader<R>),
}

impl<R: Read> PcapReader<R> {
    /// Reads the file's header (pcap) or first section header (pcapng).
    pub fn new(mut input: R) -> Result<Self, PcapError> {
        let mut magic = [0u8; 4];
        match read_full(&mut input, &mut magic) {
            Ok(true) => {}
            Ok(false) => return Err(PcapError::Truncated { index: 0 }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(PcapError::Truncated { index: 0 })
            }
            Err(e) => return Err(PcapError::Io(e)),
        }
        let format = if u32::from_le_bytes(magic) == SECTION_HEADER {
            Format::Pcapng(PcapngReader::new(input)?)
        } else {
            Format::Classic(ClassicReader::new(input, magic)?)
        };
        Ok(PcapReader { format })
    }

    /// The next record's timestamp (ns since the epoch) and its captured bytes, in `buf`.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<u64>, PcapError> {
        match &mut self.format {
            Format::Classic(reader) => reader.next_into(buf),
            Format::Pcapng(reader) => reader.next_into(buf),
        }
    }
}

struct ClassicReader<R: Read> {
    input: R,
    nanos: bool,
    swapped: bool,
    index: u64,
}

/// Fills `buf` completely; Ok(false) if the input ended before its first byte.
pub(crate) fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

impl<R: Read> ClassicReader<R> {
    /// After the file's first four bytes, `magic`: reads the rest of the file header.
    fn new(mut input: R, magic: [u8; 4]) -> Result<Self, PcapError> {
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&magic);
        match read_full(&mut input, &mut header[4..]) {
            Ok(true) => {}
            Ok(false) => return Err(PcapError::Truncated { index: 0 }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(PcapError::Truncated { index: 0 })
            }
            Err(e) => return Err(PcapError::Io(e)),
        }
        let magic = u32::from_le_bytes(magic);
        let (nanos, swapped) = match magic {
            MAGIC_US => (false, false),
            MAGIC_NS => (true, false),
            m if m.swap_bytes() == MAGIC_US => (false, true),
            m if m.swap_bytes() == MAGIC_NS => (true, true),
            m => return Err(PcapError::BadMagic(m)),
        };
        let reader = ClassicReader {
            input,
            nanos,
            swapped,
            index: 0,
        };
        let linktype = reader.word(&header[20..24]);
        if linktype != LINKTYPE_ETHERNET {
            return Err(PcapError::NotEthernet(linktype));
        }
        Ok(reader)
    }

    fn word(&self, bytes: &[u8]) -> u32 {
        let w = u32::from_le_bytes(bytes.try_into().unwrap());
        if self.swapped {
            w.swap_bytes()
        } else {
            w
        }
    }

    fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<u64>, PcapError> {
        let mut header = [0u8; 16];
        let index = self.index;
        match read_full(&mut self.input, &mut header) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(PcapError::Truncated { index })
            }
            Err(e) => return Err(PcapError::Io(e)),
        }
        let seconds = u64::from(self.word(&header[0..4]));
        let fraction = u64::from(self.word(&header[4..8]));
        let length = self.word(&header[8..12]);
        if length > MAX_RECORD {
            return Err(PcapError::RecordTooLarge { index, length });
        }
        buf.resize(length as usize, 0);
        match read_full(&mut self.input, buf) {
            Ok(true) => {}
            Ok(false) if length == 0 => {}
            Ok(false) => return Err(PcapError::Truncated { index }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(PcapError::Truncated { index })
            }
            Err(e) => return Err(PcapError::Io(e)),
        }
        self.index += 1;
        let scale = if self.nanos { 1 } else { 1000 };
        Ok(Some(seconds * 1_000_000_000 + fraction * scale))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{parse, tests::frame};

    fn pcap(records: &[(u32, u32, Vec<u8>)], nanos: bool) -> Vec<u8> {
        let magic = if nanos { MAGIC_NS } else { MAGIC_US };
        let mut out = Vec::new();
        for w in [magic, 0x0004_0002, 0, 0, 65535, LINKTYPE_ETHERNET] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.truncate(24);
        for (s, frac, data) in records {
            for w in [*s, *frac, data.len() as u32, data.len() as u32] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(data);
        }
        out
    }

    #[test]
    fn reads_records_with_their_timestamps() {
        let file = pcap(
            &[(10, 5, frame(100, 0, 0, 0)), (11, 7, frame(0, 0, 0, 0))],
            true,
        );
        let mut reader = PcapReader::new(&file[..]).unwrap();
        let mut buf = Vec::new();
        assert_eq!(reader.next_into(&mut buf).unwrap(), Some(10_000_000_005));
        assert_eq!(parse(&buf).unwrap().payload, 100);
        assert_eq!(reader.next_into(&mut buf).unwrap(), Some(11_000_000_007));
        assert_eq!(reader.next_into(&mut buf).unwrap(), None);

        let micro = pcap(&[(10, 5, frame(0, 0, 0, 0))], false);
        let mut reader = PcapReader::new(&micro[..]).unwrap();
        assert_eq!(reader.next_into(&mut buf).unwrap(), Some(10_000_005_000));
    }

    #[test]
    fn damaged_files_end_with_a_reason() {
        let file = pcap(
            &[(1, 0, frame(100, 0, 0, 0)), (2, 0, frame(100, 0, 0, 0))],
            true,
        );
        let cut = &file[..file.len() - 10];
        let mut reader = PcapReader::new(cut).unwrap();
        let mut buf = Vec::new();
        assert!(reader.next_into(&mut buf).unwrap().is_some());
        let err = reader.next_into(&mut buf).unwrap_err();
        assert_eq!(err.to_string(), "file ends inside record 1");
        assert!(matches!(
            PcapReader::new(&b"not a pcap file at all!!"[..]),
            Err(PcapError::BadMagic(_))
        ));
        assert!(matches!(
            PcapReader::new(&file[..10]),
            Err(PcapError::Truncated { index: 0 })
        ));
        let mut huge = file.clone();
        huge[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut reader = PcapReader::new(&huge[..]).unwrap();
        assert!(matches!(
            reader.next_into(&mut buf),
            Err(PcapError::RecordTooLarge { index: 0, .. })
        ));
    }
}
