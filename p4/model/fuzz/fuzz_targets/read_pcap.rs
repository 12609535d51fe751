//! `PcapReader` on arbitrary bytes as a capture file (classic pcap, or pcapng when the bytes
//! start with a section header), read to its end or its first error. Beyond "never panics", it
//! checks that an error names the record where the file broke, that the reader never allocates
//! more than a record's size limit for a corrupt length, that short or interrupted reads (a
//! pipe) give the same records, and for classic pcap that the reader accounts for every byte.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};

use libfuzzer_sys::fuzz_target;
use p4bs_model::parse::parse;
use p4bs_model::pcap::{PcapError, PcapReader, MAX_RECORD as RECORD_LIMIT};
use p4bs_model::pcapng::SECTION_HEADER;

const MAX_RECORD: usize = RECORD_LIMIT as usize;
const FILE_HEADER: usize = 24;
const RECORD_HEADER: usize = 16;

/// The system allocator, noting the largest single allocation since `LARGEST` was reset.
struct Watched;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Watched = Watched;

/// How a read of the whole file ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Complete,
    Truncated {
        index: u64,
    },
    TooLarge {
        index: u64,
        length: u32,
    },
    /// `new` refused the file header.
    Header,
    /// pcapng: the file ends inside a block.
    TruncatedBlock,
    /// pcapng: a block breaks the format, or a packet's interface is not Ethernet.
    Refused,
}

/// Every record's timestamp and bytes, and how the file ended.
#[derive(Debug, PartialEq, Eq)]
struct Reading {
    records: Vec<(u64, Vec<u8>)>,
    end: End,
}

/// A reader giving at most `chunk` bytes a call, and `Interrupted` before every other call.
struct Pipe<'a> {
    data: &'a [u8],
    chunk: usize,
    interrupt: bool,
}

impl Read for Pipe<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let n = buf.len().min(self.chunk).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = read_all(data, true);
    if data.get(0..4) != Some(&SECTION_HEADER.to_le_bytes()[..]) {
        check_accounting(data, &whole);
    }
    // The same file through a pipe, one to seven bytes at a time (the count taken from the
    // file's last byte, so the fuzzer varies it too), with a fresh buffer for each record.
    let chunk = usize::from(data.last().copied().unwrap_or(0) % 7) + 1;
    let piped = Pipe {
        data,
        chunk,
        interrupt: false,
    };
    assert_eq!(read_all(piped, false), whole);
});

/// Reads every record, checking that no single allocation exceeds what the record needs.
fn read_all<R: Read>(input: R, reuse_buffer: bool) -> Reading {
    let mut records = Vec::new();
    let mut reader = match PcapReader::new(input) {
        Ok(reader) => reader,
        Err(PcapError::Io(e)) => panic!("the input cannot fail: {e}"),
        Err(_) => {
            return Reading {
                records,
                end: End::Header,
            }
        }
    };
    let mut buf = Vec::new();
    let end = loop {
        if !reuse_buffer {
            buf = Vec::new();
        }
        LARGEST.store(0, Ordering::Relaxed);
        let next = reader.next_into(&mut buf);
        let largest = LARGEST.load(Ordering::Relaxed);
        // A fresh buffer is grown once, to the record's length; a reused one may at most
        // double a capacity that was itself within the limit (Vec's amortised growth).
        let limit = if reuse_buffer {
            2 * MAX_RECORD
        } else {
            MAX_RECORD
        };
        assert!(largest <= limit, "one allocation of {largest} B");
        assert!(buf.len() <= MAX_RECORD);
        match next {
            Ok(Some(ts)) => {
                let _ = parse(&buf);
                records.push((ts, buf.clone()));
            }
            Ok(None) => break End::Complete,
            Err(PcapError::Truncated { index }) => break End::Truncated { index },
            Err(PcapError::RecordTooLarge { index, length }) => {
                assert!(length as usize > MAX_RECORD);
                break End::TooLarge { index, length };
            }
            Err(PcapError::TruncatedBlock { records: n, .. }) => {
                assert_eq!(
                    n,
                    records.len() as u64,
                    "the error counts the packets before it"
                );
                break End::TruncatedBlock;
            }
            Err(e @ (PcapError::Malformed { .. } | PcapError::InterfaceNotEthernet { .. })) => {
                assert!(e.to_string().starts_with("pcapng block "));
                break End::Refused;
            }
            Err(e) => panic!("after {} records: {e}", records.len()),
        }
    };
    if let End::Truncated { index } | End::TooLarge { index, .. } = end {
        assert_eq!(
            index,
            records.len() as u64,
            "the error names the record it broke in"
        );
    }
    Reading { records, end }
}

/// The records and the way the file ended account for its bytes exactly.
fn check_accounting(data: &[u8], reading: &Reading) {
    if reading.end == End::Header {
        assert!(reading.records.is_empty());
        return;
    }
    let used: usize = FILE_HEADER
        + reading
            .records
            .iter()
            .map(|(_, bytes)| RECORD_HEADER + bytes.len())
            .sum::<usize>();
    assert!(used <= data.len());
    let rest = &data[used..];
    match reading.end {
        End::Complete => assert!(rest.is_empty(), "{} bytes left unread", rest.len()),
        // The next record's header, or its data, is cut short.
        End::Truncated { .. } => {
            assert!(!rest.is_empty());
            if rest.len() >= RECORD_HEADER {
                let length = record_word(data, &rest[8..12]);
                assert!(rest.len() < RECORD_HEADER + length as usize);
            }
        }
        End::TooLarge { length, .. } => {
            assert!(rest.len() >= RECORD_HEADER);
            assert_eq!(record_word(data, &rest[8..12]), length);
        }
        End::Header | End::TruncatedBlock | End::Refused => unreachable!("classic pcap"),
    }
    // Each record's bytes are the file's, right after its header, and its timestamp is the
    // header's seconds and fraction (µs or ns, as the magic number says) in ns.
    let nanos = data[0..4] == [0x4d, 0x3c, 0xb2, 0xa1] || data[0..4] == [0xa1, 0xb2, 0x3c, 0x4d];
    let scale = if nanos { 1 } else { 1_000 };
    let mut at = FILE_HEADER;
    for (ts, bytes) in &reading.records {
        let seconds = u64::from(record_word(data, &data[at..at + 4]));
        let fraction = u64::from(record_word(data, &data[at + 4..at + 8]));
        assert_eq!(*ts, seconds * 1_000_000_000 + fraction * scale);
        at += RECORD_HEADER;
        assert_eq!(&data[at..at + bytes.len()], &bytes[..]);
        at += bytes.len();
    }
}

/// A record header's word, in the byte order the file's magic number says.
fn record_word(data: &[u8], word: &[u8]) -> u32 {
    let word: [u8; 4] = word.try_into().unwrap();
    if data[0] == 0xa1 {
        u32::from_be_bytes(word)
    } else {
        u32::from_le_bytes(word)
    }
}
