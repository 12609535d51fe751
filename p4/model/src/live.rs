//! Live capture: one AF_PACKET socket (crate `af-packet`) with a TPACKET_V3 receive ring per
//! interface, frames handed to the pipeline in timestamp order across interfaces (a packet's
//! copy after the router must follow its copy before it, though the two rings are read one
//! after the other).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{fence, Ordering};

pub use af_packet::realtime_ns;
use af_packet::PacketSocket;

const BLOCK_SIZE: u32 = 1 << 20;
const BLOCKS: u32 = 64;
const FRAME_SIZE: u32 = 2048;
/// A block not yet full is handed over after this long, bounding the reorder delay.
const BLOCK_TIMEOUT_MS: u32 = 10;
/// The pipeline reads only headers: frames are kept up to here while being reordered.
const KEPT_BYTES: usize = 256;

struct Ring {
    /// Closed when the ring is dropped, after the ring is unmapped.
    socket: PacketSocket,
    map: *mut u8,
    current: u32,
    port: u16,
}

impl Drop for Ring {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.map.cast(), (BLOCK_SIZE * BLOCKS) as usize) };
    }
}

impl Ring {
    fn open(interface: &str, port: u16) -> io::Result<Ring> {
        // Blocking (frames are read from the ring, never with recv); the ring goes before bind.
        let socket = PacketSocket::open(interface)?;
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        let ring_req = libc::tpacket_req3 {
            tp_block_size: BLOCK_SIZE,
            tp_block_nr: BLOCKS,
            tp_frame_size: FRAME_SIZE,
            tp_frame_nr: BLOCK_SIZE / FRAME_SIZE * BLOCKS,
            tp_retire_blk_tov: BLOCK_TIMEOUT_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        socket.set_option(
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &version,
            "PACKET_VERSION",
        )?;
        socket.set_option(
            libc::SOL_PACKET,
            libc::PACKET_RX_RING,
            &ring_req,
            "PACKET_RX_RING",
        )?;
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                (BLOCK_SIZE * BLOCKS) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                socket.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            return Err(io::Error::new(err.kind(), format!("mmap ring: {err}")));
        }
        let ring = Ring {
            socket,
            map: map.cast(),
            current: 0,
            port,
        };
        ring.socket.bind()?;
        Ok(ring)
    }

    /// Hands every frame of every block the kernel has filled to `f`, then returns the blocks.
    fn drain(&mut self, mut f: impl FnMut(u64, &[u8])) {
        loop {
            let block = unsafe { self.map.add((self.current * BLOCK_SIZE) as usize) };
            let desc = block.cast::<libc::tpacket_block_desc>();
            let status = unsafe { ptr::read_volatile(ptr::addr_of!((*desc).hdr.bh1.block_status)) };
            if status & libc::TP_STATUS_USER == 0 {
                return;
            }
            fence(Ordering::Acquire);
            let (count, first) = unsafe {
                let h = &(*desc).hdr.bh1;
                (h.num_pkts, h.offset_to_first_pkt)
            };
            let mut offset = first as usize;
            for _ in 0..count {
                let hdr = unsafe { &*block.add(offset).cast::<libc::tpacket3_hdr>() };
                let ts = u64::from(hdr.tp_sec) * 1_000_000_000 + u64::from(hdr.tp_nsec);
                let frame = unsafe {
                    std::slice::from_raw_parts(
                        block.add(offset + hdr.tp_mac as usize),
                        hdr.tp_snaplen as usize,
                    )
                };
                f(ts, frame);
                offset += hdr.tp_next_offset as usize;
            }
            fence(Ordering::Release);
            unsafe {
                ptr::write_volatile(
                    ptr::addr_of_mut!((*desc).hdr.bh1.block_status),
                    libc::TP_STATUS_KERNEL,
                )
            };
            self.current = (self.current + 1) % BLOCKS;
        }
    }

    /// Frames the kernel dropped because the ring was full, since the last call.
    fn drops(&self) -> u64 {
        self.socket.take_kernel_drops()
    }
}

/// A frame waiting for its turn: (time, arrival order, port, first bytes).
type Pending = Reverse<(u64, u64, u16, Vec<u8>)>;

pub struct LiveCapture {
    rings: Vec<Ring>,
    pending: BinaryHeap<Pending>,
    arrivals: u64,
    reorder_ns: u64,
    pub kernel_drops: u64,
}

impl LiveCapture {
    /// Opens a ring on each `(port, interface)`; frames are held `reorder_ns` to be merged.
    pub fn open(interfaces: &[(u16, &str)], reorder_ns: u64) -> io::Result<LiveCapture> {
        let rings = interfaces
            .iter()
            .map(|(port, name)| {
                Ring::open(name, *port)
                    .map_err(|e| io::Error::new(e.kind(), format!("{name}: {e}")))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(LiveCapture {
            rings,
            pending: BinaryHeap::new(),
            arrivals: 0,
            reorder_ns,
            kernel_drops: 0,
        })
    }

    /// Waits up to `timeout_ms` for frames, then hands `f` every frame older than the
    /// reorder window, in timestamp order, as `(port, ts_ns, frame)`.
    pub fn poll(&mut self, timeout_ms: i32, f: impl FnMut(u16, u64, &[u8])) -> io::Result<()> {
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .iter()
            .map(|r| libc::pollfd {
                fd: r.socket.as_raw_fd(),
                events: libc::POLLIN | libc::POLLERR,
                revents: 0,
            })
            .collect();
        let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        for ring in &mut self.rings {
            let port = ring.port;
            let (pending, arrivals) = (&mut self.pending, &mut self.arrivals);
            ring.drain(|ts, frame| {
                let kept = frame[..frame.len().min(KEPT_BYTES)].to_vec();
                pending.push(Reverse((ts, *arrivals, port, kept)));
                *arrivals += 1;
            });
            self.kernel_drops += ring.drops();
        }
        self.release(realtime_ns().saturating_sub(self.reorder_ns), f);
        Ok(())
    }

    /// Hands over every frame still held (at the end of a capture).
    pub fn flush(&mut self, f: impl FnMut(u16, u64, &[u8])) {
        self.release(u64::MAX, f);
    }

    fn release(&mut self, until: u64, mut f: impl FnMut(u16, u64, &[u8])) {
        while let Some(Reverse((ts, _, _, _))) = self.pending.peek() {
            if *ts > until {
                break;
            }
            let Reverse((ts, _, port, frame)) = self.pending.pop().expect("peeked");
            f(port, ts, &frame);
        }
    }
}
