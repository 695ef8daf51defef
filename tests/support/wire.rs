//! What the hostile-input tests share (`tests/hostile.rs` against an agent,
//! `tests/hostile_coordinator.rs` against a coordinator): raw gRPC message bytes, slow HTTP
//! clients, a process's resident memory and latency percentiles.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Sends and receives raw message bytes, to put bytes no generated type would write.
pub struct RawCodec;
pub struct RawEncoder;
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// `clients` connections to `addr` that send the start of a request (`head`, without the
/// blank line that ends its header) and then a byte now and then, until `stop`.
pub fn slow_clients(addr: &str, clients: usize, head: &[u8], stop: &AtomicBool) {
    let mut conns: Vec<TcpStream> = (0..clients)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    for c in &mut conns {
        let _ = c.write_all(head);
    }
    while !stop.load(Ordering::Relaxed) {
        for c in &mut conns {
            let _ = c.write_all(b"X");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `p` quantile of `sorted` (0..=1).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}
