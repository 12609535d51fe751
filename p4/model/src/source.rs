//! Several pcap files (one per capture point, e.g. before and after the router) read as one
//! stream of frames in timestamp order.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use crate::pcap::{PcapError, PcapReader};

struct Input {
    port: u16,
    name: String,
    reader: PcapReader<BufReader<File>>,
    buf: Vec<u8>,
    next_ts: Option<u64>,
}

impl Input {
    fn read(&mut self, problems: &mut Vec<String>) {
        self.next_ts = match self.reader.next_into(&mut self.buf) {
            Ok(ts) => ts,
            Err(e) => {
                problems.push(format!(
                    "{}: {e}; the records before it were used",
                    self.name
                ));
                None
            }
        };
    }
}

pub struct PcapMerge {
    inputs: Vec<Input>,
    /// The input whose frame was handed out last: it moves on at the next call.
    yielded: Option<usize>,
    problems: Vec<String>,
}

const READ_BUFFER: usize = 1 << 20;

impl PcapMerge {
    /// Opens each `(port, file)`; a file that cannot be read as pcap is an error naming it.
    pub fn open(files: &[(u16, &Path)]) -> Result<PcapMerge, String> {
        let mut merge = PcapMerge {
            inputs: Vec::new(),
            yielded: None,
            problems: Vec::new(),
        };
        for (port, path) in files {
            let name = path.display().to_string();
            let file = File::open(path).map_err(|e| format!("{name}: {e}"))?;
            let reader = PcapReader::new(BufReader::with_capacity(READ_BUFFER, file))
                .map_err(|e: PcapError| format!("{name}: {e}"))?;
            let mut input = Input {
                port: *port,
                name,
                reader,
                buf: Vec::with_capacity(2048),
                next_ts: None,
            };
            input.read(&mut merge.problems);
            merge.inputs.push(input);
        }
        Ok(merge)
    }

    /// The next frame of all files by timestamp (ties: the file listed first) as
    /// `(port, ts_ns, frame)`.
    #[allow(clippy::should_implement_trait)] // it lends its buffer: not an Iterator
    pub fn next(&mut self) -> Option<(u16, u64, &[u8])> {
        if let Some(i) = self.yielded.take() {
            self.inputs[i].read(&mut self.problems);
        }
        let mut best: Option<(usize, u64)> = None;
        for (i, input) in self.inputs.iter().enumerate() {
            if let Some(ts) = input.next_ts {
                if best.is_none_or(|(_, b)| ts < b) {
                    best = Some((i, ts));
                }
            }
        }
        let (i, ts) = best?;
        self.yielded = Some(i);
        let input = &self.inputs[i];
        Some((input.port, ts, &input.buf))
    }

    /// Damaged files, each with where it broke.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_pcap(path: &Path, times_us: &[u32]) {
        let mut out = Vec::new();
        for w in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.truncate(24);
        for t in times_us {
            for w in [1u32, *t, 14, 14] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&[0u8; 14]);
        }
        File::create(path).unwrap().write_all(&out).unwrap();
    }

    #[test]
    fn frames_of_two_files_come_out_in_time_order() {
        let dir = std::env::temp_dir().join(format!("p4bs-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.pcap"), dir.join("b.pcap"));
        write_pcap(&a, &[1, 5, 9]);
        write_pcap(&b, &[2, 5, 6, 20]);
        let mut merge = PcapMerge::open(&[(0, &a), (1, &b)]).unwrap();
        let mut seen = Vec::new();
        while let Some((port, ts, frame)) = merge.next() {
            assert_eq!(frame.len(), 14);
            seen.push((port, (ts - 1_000_000_000) / 1000));
        }
        assert_eq!(
            seen,
            vec![(0, 1), (1, 2), (0, 5), (1, 5), (1, 6), (0, 9), (1, 20)]
        );
        assert!(merge.problems().is_empty());

        // A damaged file ends early and says so; the other goes on.
        let bytes = std::fs::read(&a).unwrap();
        std::fs::write(&a, &bytes[..bytes.len() - 5]).unwrap();
        let mut merge = PcapMerge::open(&[(0, &a), (1, &b)]).unwrap();
        let mut count = 0;
        while merge.next().is_some() {
            count += 1;
        }
        assert_eq!(count, 6);
        assert_eq!(merge.problems().len(), 1);
        assert!(merge.problems()[0].contains("file ends inside record 2"));
        assert!(PcapMerge::open(&[(0, &dir.join("missing.pcap"))]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
