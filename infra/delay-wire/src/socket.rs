//! AF_PACKET sockets bound to one interface: receive every frame with its kernel timestamp,
//! send frames out unchanged.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};

pub fn realtime_ns() -> u64 {
    let mut ts: libc::timespec = unsafe { zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub struct PacketSocket {
    fd: libc::c_int,
}

fn check(ret: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if ret < 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
    }
    Ok(ret)
}

fn set_opt<T>(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
    what: &str,
) -> io::Result<()> {
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(ret, what).map(|_| ())
}

impl PacketSocket {
    pub fn open(interface: &str) -> io::Result<PacketSocket> {
        let name = CString::new(interface).map_err(|_| io::Error::other("bad interface name"))?;
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such interface"));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be() as libc::c_int;
        let fd = check(
            unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    proto,
                )
            },
            "socket",
        )?;
        let sock = PacketSocket { fd };
        // Frames this program sends must not come back to it as received.
        set_opt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1i32,
            "PACKET_IGNORE_OUTGOING",
        )?;
        set_opt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &1i32,
            "SO_TIMESTAMPNS",
        )?;
        set_opt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &(16 << 20i32),
            "SO_RCVBUF",
        )?;
        set_opt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &(16 << 20i32),
            "SO_SNDBUF",
        )?;
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto as u16;
        addr.sll_ifindex = ifindex as i32;
        check(
            unsafe {
                libc::bind(
                    fd,
                    &addr as *const _ as *const libc::sockaddr,
                    size_of::<libc::sockaddr_ll>() as u32,
                )
            },
            "bind",
        )?;
        let mut mreq: libc::packet_mreq = unsafe { zeroed() };
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        set_opt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
            "promiscuous mode",
        )?;
        Ok(sock)
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

    /// One frame and the kernel's receive time (ns, realtime); None when none is waiting.
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

    /// Frames the kernel dropped for this socket since the last call (its buffer was full).
    pub fn take_kernel_drops(&self) -> u64 {
        let mut stats: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
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

impl Drop for PacketSocket {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}
