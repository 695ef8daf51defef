//! What the agent-driving targets share: a fresh agent per input and the input's framing.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use allot_agent::clock::Clock;
use allot_agent::settings::Settings;
use allot_agent::state::Agent;
use allot_agent::store::MemoryStore;
use allot_core::ids::RegionId;
use allot_core::time::Timestamp;

/// 2026-01-01T00:00:00Z: where every input's clock starts.
pub const START: Timestamp = Timestamp::from_unix_nanos(1_767_225_600_000_000_000);

/// What one step of an input's clock is.
pub const STEP: Duration = Duration::from_millis(100);

/// A runtime to drive it on, and a fresh agent (in-memory store, manual clock at [`START`],
/// the embedded default limits: domain `default`, keys `remote_address` and `generic_key`),
/// with its clock's cell.
pub fn agent() -> (tokio::runtime::Runtime, Arc<Agent>, Arc<AtomicU64>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (clock, cell) = Clock::manual(START);
    let mut settings = Settings::new(RegionId::from("r1"), PathBuf::from("unused"));
    settings.clock = clock;
    let agent = Arc::new(Agent::open(settings, Arc::new(MemoryStore::new())).expect("an agent"));
    (runtime, agent, cell)
}

/// Up to `most` frames of `data`, each `selector: u8 | len: u16 LE | body` (a length past the
/// input's end takes what is left).
pub fn frames(data: &[u8], most: usize) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut rest = data;
    while out.len() < most {
        let Some((&selector, after)) = rest.split_first() else {
            break;
        };
        let Some((len, after)) = after.split_first_chunk::<2>() else {
            break;
        };
        let len = usize::from(u16::from_le_bytes(*len)).min(after.len());
        let (body, after) = after.split_at(len);
        out.push((selector, body));
        rest = after;
    }
    out
}
