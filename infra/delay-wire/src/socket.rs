//! The wire's AF_PACKET sockets (crate `af-packet`), bound to one interface: receive every
//! frame with its kernel timestamp, send frames out unchanged.

use std::io;

pub use af_packet::{realtime_ns, PacketSocket};

/// A wire end on `interface`: non-blocking, kernel timestamps, 16 MiB buffers each way,
/// promiscuous, and deaf to what it sends itself.
pub fn open(interface: &str) -> io::Result<PacketSocket> {
    let sock = PacketSocket::open_nonblocking(interface)?;
    // Frames this program sends must not come back to it as received.
    sock.ignore_outgoing()?;
    sock.enable_timestamps()?;
    set_buffer(&sock, libc::SO_RCVBUF, "SO_RCVBUF")?;
    set_buffer(&sock, libc::SO_SNDBUF, "SO_SNDBUF")?;
    sock.bind()?;
    sock.set_promiscuous()?;
    Ok(sock)
}

/// A socket that only sends out of `interface` (the AQM's copies to the tap): deaf to what it
/// sends, 16 MiB of send buffer.
pub fn open_sender(interface: &str) -> io::Result<PacketSocket> {
    let sock = PacketSocket::open_nonblocking(interface)?;
    sock.ignore_outgoing()?;
    set_buffer(&sock, libc::SO_SNDBUF, "SO_SNDBUF")?;
    sock.bind()?;
    Ok(sock)
}

/// One of the socket's buffers (`option`: SO_RCVBUF or SO_SNDBUF) at 16 MiB.
fn set_buffer(sock: &PacketSocket, option: libc::c_int, what: &str) -> io::Result<()> {
    sock.set_option(libc::SOL_SOCKET, option, &(16 << 20i32), what)
}
