//! AF_PACKET sockets bound to one interface: every frame of every protocol, received with its
//! kernel timestamp, sent out unchanged. Shared by `delay-wire` and `p4bs-model` (README.md).
//!
//! `open` makes the socket and resolves the interface; the user sets its options and `bind`s
//! it in the order it needs (a TPACKET ring, for one, goes before `bind`).

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, RawFd};

/// CLOCK_REALTIME in ns since the epoch: the clock of the kernel's receive timestamps.
pub fn realtime_ns() -> u64 {
    let mut ts: libc::timespec = unsafe { zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A failed call's error, as `what: <the OS error>` with the OS error's kind.
fn check(ret: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if ret < 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
    }
    Ok(ret)
}

/// The index of the interface `name`.
pub fn interface_index(name: &str) -> io::Result<u32> {
    let name = CString::new(name).map_err(|_| io::Error::other("bad interface name"))?;
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no such interface"));
    }
    Ok(ifindex)
}

/// A raw AF_PACKET socket for every protocol (ETH_P_ALL) on one interface; closed on drop.
pub struct PacketSocket {
    fd: libc::c_int,
    ifindex: u32,
}

/// ETH_P_ALL in network byte order, as `socket` and `sockaddr_ll` take it.
fn all_protocols() -> u16 {
    (libc::ETH_P_ALL as u16).to_be()
}

impl PacketSocket {
    /// A blocking socket for `interface` (close-on-exec), not yet bound.
    pub fn open(interface: &str) -> io::Result<PacketSocket> {
        Self::open_with(interface, libc::SOCK_CLOEXEC)
    }

    /// A non-blocking socket for `interface` (close-on-exec), not yet bound.
    pub fn open_nonblocking(interface: &str) -> io::Result<PacketSocket> {
        Self::open_with(interface, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
    }

    fn open_with(interface: &str, flags: libc::c_int) -> io::Result<PacketSocket> {
        let ifindex = interface_index(interface)?;
        let fd = check(
            unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | flags,
                    libc::c_int::from(all_protocols()),
                )
            },
            "socket(AF_PACKET)",
        )?;
        Ok(PacketSocket { fd, ifindex })
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// `setsockopt(level, name, value)`; an error names `what`.
    pub fn set_option<T>(
        &self,
        level: libc::c_int,
        name: libc::c_int,
        value: &T,
        what: &str,
    ) -> io::Result<()> {
        let ret = unsafe {
            libc::setsockopt(
                self.fd,
                level,
                name,
                value as *const T as *const libc::c_void,
                size_of::<T>() as libc::socklen_t,
            )
        };
        check(ret, what).map(|_| ())
    }

    /// Frames this socket sends are not received by it (PACKET_IGNORE_OUTGOING).
    pub fn ignore_outgoing(&self) -> io::Result<()> {
        self.set_option(
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1i32,
            "PACKET_IGNORE_OUTGOING",
        )
    }

    /// `recv` gets the kernel's receive time of each frame (SO_TIMESTAMPNS).
    pub fn enable_timestamps(&self) -> io::Result<()> {
        self.set_option(
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &1i32,
            "SO_TIMESTAMPNS",
        )
    }

    /// Binds the socket to its interface: from now on it receives that interface's frames.
    pub fn bind(&self) -> io::Result<()> {
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = all_protocols();
        addr.sll_ifindex = self.ifindex as i32;
        check(
            unsafe {
                libc::bind(
                    self.fd,
                    &addr as *const _ as *const libc::sockaddr,
                    size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            },
            "bind",
        )
        .map(|_| ())
    }

    /// Puts the interface in promiscuous mode while the socket is open (PACKET_MR_PROMISC).
    pub fn set_promiscuous(&self) -> io::Result<()> {
        let mut mreq: libc::packet_mreq = unsafe { zeroed() };
        mreq.mr_ifindex = self.ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        self.set_option(
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
            "promiscuous mode",
        )
    }

    /// Waits up to `timeout_ns` for a frame; true if one is there.
    pub fn wait_readable(&self, timeout_ns: u64) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as i64,
            tv_nsec: (timeout_ns % 1_000_000_000) as i64,
        };
        unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) > 0 }
    }

    /// One frame into `buf` and its receive time (ns, realtime: the kernel's stamp after
    /// `enable_timestamps`, else the time of this call); None when none is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> Option<(usize, u64)> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut control = [0u8; 64];
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.len();
        let n = unsafe { libc::recvmsg(self.fd, &mut msg, 0) };
        if n <= 0 {
            return None;
        }
        let mut stamp = None;
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET
                    && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
                {
                    let ts =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::timespec);
                    stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        Some((n as usize, stamp.unwrap_or_else(realtime_ns)))
    }

    /// Sends `frame` (Ethernet header included) out of the interface; true if all of it went.
    pub fn send(&self, frame: &[u8]) -> bool {
        let n = unsafe {
            libc::send(
                self.fd,
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        n == frame.len() as isize
    }

    /// Frames the kernel dropped for this socket since the last call (its buffer or ring was
    /// full); 0 if it cannot tell.
    pub fn take_kernel_drops(&self) -> u64 {
        // tpacket_stats_v3 begins with tpacket_stats: the kernel fills what the socket's
        // TPACKET version has, and tp_drops is in both.
        let mut stats: libc::tpacket_stats_v3 = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        let ret = unsafe {
            libc::getsockopt(
                self.fd,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut stats as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if ret == 0 {
            u64::from(stats.tp_drops)
        } else {
            0
        }
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests;
