//! Free loopback ports that outgoing connections cannot take.
//!
//! Asking the kernel for port 0 hands out a port from its ephemeral range, the same range it
//! gives the local end of every outgoing connection. A test that picks such a port, lets it go
//! and binds it again later (a server restarted on its port, a port handed to a child process)
//! can find it taken by some client's connection in between. These ports come from below that
//! range, where the kernel never puts a connection's local end, and are checked free by binding.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ports below the kernel's ephemeral range that tests draw from.
const LOW: u32 = 15_000;

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .filter(|&p: &u32| p > LOW + 1_000)
        .unwrap_or(32_768)
}

/// A port on 127.0.0.1 that nothing listens on now, outside the ephemeral range. Different
/// test processes start at different points (by process id) and each walks its own sequence,
/// so two of them rarely try the same port, and a bind check skips any that is taken.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = ephemeral_start() - LOW;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = u16::try_from(port).expect("ports fit in u16");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 below the ephemeral range");
}
