//! Errors need no privilege; the sockets themselves need CAP_NET_RAW, so those tests say they
//! were skipped and pass without it. They use the loopback interface `lo` only, where other
//! programs' traffic goes too: each test's frames carry a mark of their own.

use super::*;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MISSING: &str = "p4bs-none0";

#[test]
fn a_missing_interface_is_not_found() {
    assert_eq!(unsafe { libc::if_nametoindex(c"p4bs-none0".as_ptr()) }, 0);
    for result in [
        interface_index(MISSING).map(|_| ()),
        PacketSocket::open(MISSING).map(|_| ()),
        PacketSocket::open_nonblocking(MISSING).map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(err.to_string(), "no such interface");
    }
}

#[test]
fn a_name_with_a_nul_byte_is_refused() {
    let err = PacketSocket::open("lo\0x").map(|_| ()).unwrap_err();
    assert_eq!(err.to_string(), "bad interface name");
}

#[test]
fn loopback_has_an_index() {
    assert!(interface_index("lo").unwrap() > 0);
}

#[test]
fn a_failed_call_names_its_step() {
    let ret = unsafe { libc::close(-1) };
    let err = check(ret, "close").unwrap_err();
    assert!(err.to_string().starts_with("close: "), "{err}");
    assert!(err.to_string().contains("os error 9"), "{err}");
    assert_eq!(check(3, "close").unwrap(), 3);
}

#[test]
fn realtime_is_the_wall_clock() {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(realtime_ns().abs_diff(wall) < 1_000_000_000);
}

/// A socket on `lo`, or None (and a note) when this process may not open one.
fn loopback(nonblocking: bool) -> Option<PacketSocket> {
    let opened = if nonblocking {
        PacketSocket::open_nonblocking("lo")
    } else {
        PacketSocket::open("lo")
    };
    match opened {
        Ok(socket) => Some(socket),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            eprintln!("skipped: AF_PACKET sockets need CAP_NET_RAW ({e})");
            None
        }
        Err(e) => panic!("opening a socket on lo: {e}"),
    }
}

/// A broadcast-free Ethernet frame of the local experimental EtherType, carrying `mark`.
fn frame(mark: &str) -> Vec<u8> {
    let mut frame = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x88, 0xb5];
    frame.extend_from_slice(mark.as_bytes());
    frame.resize(frame.len().max(60), 0);
    frame
}

/// Every copy of `expected` that `socket` receives within `wait`: its receive time, and the
/// time `recv` returned it.
fn copies_of(socket: &PacketSocket, expected: &[u8], wait: Duration) -> Vec<(u64, u64)> {
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; 65_600];
    let mut stamps = vec![];
    while Instant::now() < deadline {
        if socket.wait_readable(10_000_000) {
            while let Some((len, ts)) = socket.recv(&mut buf) {
                if buf[..len] == *expected {
                    stamps.push((ts, realtime_ns()));
                }
            }
        }
    }
    stamps
}

#[test]
fn frames_go_out_and_come_back_on_loopback_with_their_time() {
    let Some(tx) = loopback(false) else { return };
    let rx = loopback(true).unwrap();
    let rx_all = loopback(true).unwrap();
    assert!(tx.ifindex() > 0 && tx.ifindex() == rx.ifindex());
    assert!(tx.as_raw_fd() >= 0);
    let mark = format!(
        "af-packet round trip {} {}",
        std::process::id(),
        realtime_ns()
    );
    let sent = frame(&mark);

    // Unbound, a socket has no interface to send from.
    assert!(!tx.send(&sent));
    tx.bind().unwrap();
    // The wire's socket: its own frames ignored, kernel timestamps, promiscuous.
    rx.ignore_outgoing().unwrap();
    rx.enable_timestamps().unwrap();
    rx.bind().unwrap();
    rx.set_promiscuous().unwrap();
    rx_all.bind().unwrap();
    assert_eq!(rx.take_kernel_drops(), 0);

    let before = realtime_ns();
    assert!(tx.send(&sent));
    let copies = copies_of(&rx, &sent, Duration::from_millis(300));
    // On lo a frame passes the taps twice: going out, then coming in. The socket that ignores
    // outgoing frames sees it once, stamped after it was sent and before it was read.
    assert_eq!(copies.len(), 1, "copies received");
    let (stamp, read) = copies[0];
    assert!(before <= stamp && stamp <= read, "{before} {stamp} {read}");
    assert_eq!(
        copies_of(&rx_all, &sent, Duration::from_millis(50)).len(),
        2
    );
}

#[test]
fn promiscuous_mode_lasts_while_the_socket_is_open() {
    let Some(socket) = loopback(true) else { return };
    let flags = || {
        let text = std::fs::read_to_string("/sys/class/net/lo/flags").unwrap();
        u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).unwrap()
    };
    socket.bind().unwrap();
    socket.set_promiscuous().unwrap();
    assert_ne!(flags() & libc::IFF_PROMISC as u32, 0);
    // When it is dropped the kernel undoes it (unless another program holds lo promiscuous,
    // so that is not checked here).
}

#[test]
fn a_bad_option_names_itself() {
    let Some(socket) = loopback(true) else { return };
    let err = socket
        .set_option(libc::SOL_PACKET, 0x7fff, &1i32, "made-up option")
        .unwrap_err();
    assert!(err.to_string().starts_with("made-up option: "), "{err}");
}
