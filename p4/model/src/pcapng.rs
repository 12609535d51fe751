//! Reading pcapng files (RFC draft-ietf-opsawg-pcapng), what Wireshark, dumpcap and tshark
//! write by default: several sections (each with its own byte order), several interfaces per
//! section (each with its link type, snapshot length, timestamp resolution `if_tsresol` and
//! offset `if_tsoffset`), enhanced, simple and obsolete packet blocks; other blocks (name
//! resolution, statistics, decryption secrets, custom) are skipped. A damaged file ends with an
//! error naming the block, never a panic, and no allocation exceeds a record's size limit.
//!
//! A file is one capture point: the packets of all its interfaces come out in file order, as
//! dumpcap wrote them. A simple packet block has no timestamp: it takes the one of the packet
//! before it in the file (0 at the start), so the stream's time never goes backwards for it.

use std::io::{self, Read};

use crate::pcap::{read_full, PcapError, LINKTYPE_ETHERNET, MAX_RECORD};

/// A section header block's type, the first four bytes of every pcapng file.
pub const SECTION_HEADER: u32 = 0x0a0d_0d0a;
const INTERFACE_DESCRIPTION: u32 = 0x0000_0001;
const OBSOLETE_PACKET: u32 = 0x0000_0002;
const SIMPLE_PACKET: u32 = 0x0000_0003;
const ENHANCED_PACKET: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
const OPT_END: u16 = 0;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_IF_TSOFFSET: u16 = 14;
/// Interfaces one section may describe: far beyond a capture host's, and it bounds the table.
const MAX_INTERFACES: usize = 4096;

/// Timestamp units per second: 10^k or 2^k (`if_tsresol`; default microseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resolution {
    Pow10(u8),
    Pow2(u8),
}

impl Resolution {
    fn from_option(value: u8) -> Resolution {
        if value & 0x80 == 0 {
            Resolution::Pow10(value)
        } else {
            Resolution::Pow2(value & 0x7f)
        }
    }

    /// `units` of this resolution in ns (finer resolutions truncated); None past u64.
    fn to_ns(self, units: u64) -> Option<u64> {
        match self {
            Resolution::Pow10(k) if k <= 9 => units.checked_mul(10u64.pow(u32::from(9 - k))),
            // 10^20 > u64::MAX: any count of 10^-29 s units or finer is below 1 ns.
            Resolution::Pow10(k) => {
                Some(10u64.checked_pow(u32::from(k - 9)).map_or(0, |d| units / d))
            }
            Resolution::Pow2(k) => u64::try_from((u128::from(units) * 1_000_000_000) >> k).ok(),
        }
    }
}

#[derive(Debug)]
struct Interface {
    linktype: u16,
    snaplen: u32,
    resolution: Resolution,
    offset_s: i64,
}

pub(crate) struct PcapngReader<R: Read> {
    input: R,
    big_endian: bool,
    interfaces: Vec<Interface>,
    /// The block being read (0-based over the file), for errors.
    block: u64,
    /// Packets returned so far.
    records: u64,
    last_ts: u64,
    /// A non-packet block's body (interface descriptions, section headers' fixed part).
    scratch: Vec<u8>,
}

impl<R: Read> PcapngReader<R> {
    /// After the file's first four bytes, which were `SECTION_HEADER`: reads that section's
    /// header.
    pub(crate) fn new(input: R) -> Result<Self, PcapError> {
        let mut reader = PcapngReader {
            input,
            big_endian: false,
            interfaces: Vec::new(),
            block: 0,
            records: 0,
            last_ts: 0,
            scratch: Vec::new(),
        };
        let mut raw_length = [0u8; 4];
        reader.fill(&mut raw_length)?;
        reader.section_header(&raw_length)?;
        reader.block += 1;
        Ok(reader)
    }

    fn word(&self, bytes: &[u8]) -> u32 {
        let w: [u8; 4] = bytes.try_into().expect("four bytes");
        if self.big_endian {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    }

    fn half(&self, bytes: &[u8]) -> u16 {
        let h: [u8; 2] = bytes.try_into().expect("two bytes");
        if self.big_endian {
            u16::from_be_bytes(h)
        } else {
            u16::from_le_bytes(h)
        }
    }

    fn malformed(&self, reason: String) -> PcapError {
        PcapError::Malformed {
            block: self.block,
            reason,
        }
    }

    fn truncated(&self) -> PcapError {
        PcapError::TruncatedBlock {
            block: self.block,
            records: self.records,
        }
    }

    /// Fills `buf` from the block being read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), PcapError> {
        match read_full(&mut self.input, buf) {
            Ok(true) => Ok(()),
            Ok(false) if buf.is_empty() => Ok(()),
            Ok(false) => Err(self.truncated()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(self.truncated()),
            Err(e) => Err(PcapError::Io(e)),
        }
    }

    /// Reads and drops `n` bytes of the block being read.
    fn skip(&mut self, n: u64) -> Result<(), PcapError> {
        let copied =
            io::copy(&mut (&mut self.input).take(n), &mut io::sink()).map_err(PcapError::Io)?;
        if copied < n {
            return Err(self.truncated());
        }
        Ok(())
    }

    /// The block's closing copy of its length, which must match the opening one.
    fn trailer(&mut self, length: u32) -> Result<(), PcapError> {
        let mut end = [0u8; 4];
        self.fill(&mut end)?;
        let closing = self.word(&end);
        if closing != length {
            return Err(self.malformed(format!(
                "closing length {closing} differs from the opening {length}"
            )));
        }
        Ok(())
    }

    /// A section header block, its type and `raw_length` (in the section's byte order, not
    /// known yet) already read: sets the byte order, forgets the previous section's
    /// interfaces.
    fn section_header(&mut self, raw_length: &[u8]) -> Result<(), PcapError> {
        let mut magic = [0u8; 4];
        self.fill(&mut magic)?;
        self.big_endian = match u32::from_le_bytes(magic) {
            BYTE_ORDER_MAGIC => false,
            m if m.swap_bytes() == BYTE_ORDER_MAGIC => true,
            m => return Err(self.malformed(format!("byte-order magic {m:#010x}"))),
        };
        let length = self.block_length(raw_length, 28)?;
        let mut version = [0u8; 4];
        self.fill(&mut version)?;
        let (major, minor) = (self.half(&version[0..2]), self.half(&version[2..4]));
        if major != 1 {
            return Err(self.malformed(format!("pcapng version {major}.{minor}, not 1.x")));
        }
        // The section length (8 bytes, often -1) and the options: nothing here needs them.
        self.skip(u64::from(length) - 20)?;
        self.trailer(length)?;
        self.interfaces.clear();
        Ok(())
    }

    /// A block's total length from its header, checked: a multiple of 4, at least `minimum`.
    fn block_length(&self, bytes: &[u8], minimum: u32) -> Result<u32, PcapError> {
        let length = self.word(bytes);
        if !length.is_multiple_of(4) || length < minimum {
            return Err(self.malformed(format!(
                "block length {length} (a multiple of 4, at least {minimum})"
            )));
        }
        Ok(length)
    }

    fn interface_description(&mut self, length: u32) -> Result<(), PcapError> {
        if length < 20 {
            return Err(self.malformed(format!("interface description of {length} bytes")));
        }
        let body = (length - 12) as usize;
        if body > MAX_RECORD as usize {
            return Err(self.malformed(format!("interface description of {length} bytes")));
        }
        if self.interfaces.len() >= MAX_INTERFACES {
            return Err(self.malformed(format!("more than {MAX_INTERFACES} interfaces")));
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(body, 0);
        let parsed = self
            .fill(&mut scratch)
            .and_then(|()| self.parse_interface(&scratch));
        self.scratch = scratch;
        self.interfaces.push(parsed?);
        self.trailer(length)
    }

    fn parse_interface(&self, body: &[u8]) -> Result<Interface, PcapError> {
        let mut interface = Interface {
            linktype: self.half(&body[0..2]),
            snaplen: self.word(&body[4..8]),
            resolution: Resolution::Pow10(6),
            offset_s: 0,
        };
        let mut options = &body[8..];
        while options.len() >= 4 {
            let code = self.half(&options[0..2]);
            let size = usize::from(self.half(&options[2..4]));
            if code == OPT_END {
                break;
            }
            let padded = size.div_ceil(4) * 4;
            if 4 + padded > options.len() {
                return Err(self.malformed(format!("option {code} of {size} bytes overruns")));
            }
            let value = &options[4..4 + size];
            match (code, size) {
                (OPT_IF_TSRESOL, 1) => interface.resolution = Resolution::from_option(value[0]),
                (OPT_IF_TSOFFSET, 8) => {
                    let v: [u8; 8] = value.try_into().expect("eight bytes");
                    interface.offset_s = if self.big_endian {
                        i64::from_be_bytes(v)
                    } else {
                        i64::from_le_bytes(v)
                    };
                }
                (OPT_IF_TSRESOL | OPT_IF_TSOFFSET, _) => {
                    return Err(self.malformed(format!("option {code} of {size} bytes")))
                }
                _ => {}
            }
            options = &options[4 + padded..];
        }
        Ok(interface)
    }

    /// The interface a packet block names, which must be described and carry Ethernet.
    fn interface(&self, id: u32) -> Result<&Interface, PcapError> {
        let interface = self.interfaces.get(id as usize).ok_or_else(|| {
            self.malformed(format!(
                "packet on interface {id}, but the section describes {}",
                self.interfaces.len()
            ))
        })?;
        if u32::from(interface.linktype) != LINKTYPE_ETHERNET {
            return Err(PcapError::InterfaceNotEthernet {
                block: self.block,
                interface: id,
                linktype: interface.linktype,
            });
        }
        Ok(interface)
    }

    /// A timestamp of `interface`'s units since its offset, in ns since the epoch.
    fn timestamp(&self, interface: &Interface, high: u32, low: u32) -> Result<u64, PcapError> {
        let units = u64::from(high) << 32 | u64::from(low);
        let ns = interface.resolution.to_ns(units).and_then(|ns| {
            let offset = i128::from(interface.offset_s) * 1_000_000_000;
            u64::try_from(i128::from(ns) + offset).ok()
        });
        ns.ok_or_else(|| self.malformed(format!("timestamp {units} out of range")))
    }

    /// A packet's captured bytes into `buf` (`length`, checked against the record limit and
    /// the `room` its block has for them), then the rest of the block.
    fn packet_data(
        &mut self,
        buf: &mut Vec<u8>,
        captured: u32,
        room: u32,
        length: u32,
    ) -> Result<(), PcapError> {
        if captured > MAX_RECORD {
            return Err(PcapError::RecordTooLarge {
                index: self.records,
                length: captured,
            });
        }
        if captured > room {
            return Err(self.malformed(format!(
                "captured length {captured} exceeds its block's {room} bytes"
            )));
        }
        buf.resize(captured as usize, 0);
        self.fill(buf)?;
        // Padding and options.
        self.skip(u64::from(room - captured))?;
        self.trailer(length)
    }

    /// The next packet's timestamp (ns since the epoch) and its captured bytes, in `buf`.
    pub(crate) fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<u64>, PcapError> {
        loop {
            let mut head = [0u8; 8];
            match read_full(&mut self.input, &mut head) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(self.truncated()),
                Err(e) => return Err(PcapError::Io(e)),
            }
            // The section header's type reads the same in either byte order.
            let kind = u32::from_le_bytes(head[0..4].try_into().expect("four bytes"));
            let ts = if kind == SECTION_HEADER {
                self.section_header(&head[4..8])?;
                None
            } else {
                let length = self.block_length(&head[4..8], 12)?;
                match self.word(&head[0..4]) {
                    INTERFACE_DESCRIPTION => {
                        self.interface_description(length)?;
                        None
                    }
                    kind @ (ENHANCED_PACKET | OBSOLETE_PACKET) => {
                        Some(self.timed_packet(buf, kind, length)?)
                    }
                    SIMPLE_PACKET => Some(self.simple_packet(buf, length)?),
                    _ => {
                        self.skip(u64::from(length) - 12)?;
                        self.trailer(length)?;
                        None
                    }
                }
            };
            self.block += 1;
            if let Some(ts) = ts {
                self.records += 1;
                self.last_ts = ts;
                return Ok(Some(ts));
            }
        }
    }

    /// An enhanced (or obsolete) packet block: interface, 64-bit timestamp, captured and
    /// original lengths, the data, padding and options.
    fn timed_packet(
        &mut self,
        buf: &mut Vec<u8>,
        kind: u32,
        length: u32,
    ) -> Result<u64, PcapError> {
        if length < 32 {
            return Err(self.malformed(format!("packet block of {length} bytes (at least 32)")));
        }
        let mut fixed = [0u8; 20];
        self.fill(&mut fixed)?;
        // The obsolete block's interface is 16 bits, followed by a 16-bit drop count.
        let id = if kind == OBSOLETE_PACKET {
            u32::from(self.half(&fixed[0..2]))
        } else {
            self.word(&fixed[0..4])
        };
        let interface = self.interface(id)?;
        let ts = self.timestamp(interface, self.word(&fixed[4..8]), self.word(&fixed[8..12]))?;
        let captured = self.word(&fixed[12..16]);
        self.packet_data(buf, captured, length - 32, length)?;
        Ok(ts)
    }

    /// A simple packet block: the original length and the data, from interface 0, captured up
    /// to its snapshot length; no timestamp (the previous packet's is used).
    fn simple_packet(&mut self, buf: &mut Vec<u8>, length: u32) -> Result<u64, PcapError> {
        if length < 16 {
            return Err(self.malformed(format!("simple packet block of {length} bytes")));
        }
        let mut original = [0u8; 4];
        self.fill(&mut original)?;
        let snaplen = self.interface(0)?.snaplen;
        let room = length - 16;
        let mut captured = self.word(&original).min(room);
        if snaplen != 0 {
            captured = captured.min(snaplen);
        }
        self.packet_data(buf, captured, room, length)?;
        Ok(self.last_ts)
    }
}

#[cfg(test)]
mod tests;
