//! Loopback ports for the harnesses that start daemons as child processes (the demo, the
//! tests, the benchmarks): a port is chosen here and the child binds it next.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most ports tried before giving up.
const TRIES: usize = 200;

/// A loopback port that was free a moment ago, for a child process to bind next.
///
/// Drawn below the kernel's ephemeral range: a port from that range can be taken, between this
/// check and the child's bind, by any outgoing connection on the machine (the daemons dialling
/// each other), which made a node fail to start now and then. Another process could still
/// bind the same port first; the draw spreads callers over 20,000-odd ports.
pub fn free_loopback_port() -> std::io::Result<u16> {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = 10_000u16.min(ephemeral_from.saturating_sub(1_000));
    let span = u64::from(ephemeral_from.saturating_sub(low).max(1));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(20);
    for _ in 0..TRIES {
        // splitmix64 over a counter: distinct draws within this process, spread across them.
        let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
        let mut z = seed.wrapping_add(draw.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let port = low + (z % span) as u16;
        if TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        format!("no free loopback port below {ephemeral_from} after {TRIES} tries"),
    ))
}
