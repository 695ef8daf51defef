//! The sync stream's messages (`allot.sync.v1`): a SyncUp or SyncDown decoded from the input
//! and converted into core types (`allot_proto::sync_convert`), encoded again and decoded back
//! to the same value, then handled by the machine that receives it: a SyncUp by the leader's
//! `Coordinator` (ingest, a proposal round committed, the answer to the region), a SyncDown by
//! a region's `RegionBudget`.
//!
//! Input: the first byte's low bit picks the message (0 SyncUp, 1 SyncDown); the rest is its
//! protobuf encoding. The machines run the limits of `examples/limits/llm_tokens.yaml`, whose
//! regions are us-east, eu-west and ap-south.

#![no_main]

use std::time::Duration;

use allot_core::budget::{BudgetConfig, RegionBudget};
use allot_core::config::{LimitsConfig, LoadOptions, SourceFile};
use allot_core::ids::RegionId;
use allot_core::limit::LimitSpec;
use allot_core::rebalance::{AllowanceTable, Coordinator, CoordinatorConfig, TableCommand};
use allot_core::time::Timestamp;
use allot_proto::sync_convert::{
    decode_sync_down, decode_sync_up, encode_sync_down, encode_sync_up,
};
use libfuzzer_sys::fuzz_target;

const LIMITS: &str = include_str!("../../examples/limits/llm_tokens.yaml");
const REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];

/// 2026-01-01T00:00:00Z: the machines' clock for every run.
const NOW: Timestamp = Timestamp::from_unix_nanos(1_767_225_600_000_000_000);

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    if which & 1 == 0 {
        let Ok(up) = decode_sync_up(bytes) else {
            return;
        };
        assert_eq!(decode_sync_up(&encode_sync_up(up.clone())), Ok(up.clone()));
        let mut table = AllowanceTable::new();
        table.apply(TableCommand::SetConfig {
            version: 1,
            limits: specs(),
            regions: regions(),
        });
        let mut leader = Coordinator::new(CoordinatorConfig::default(), table, NOW, 1);
        let from = up.region.clone();
        let seq = up.seq;
        if leader.handle_sync_up(NOW, up).is_err() {
            return;
        }
        let later = NOW + Duration::from_millis(250);
        for cmd in leader.poll_proposals(later) {
            leader.handle_committed(later, &cmd);
        }
        let _ = leader.poll_sync_down(later, &from, seq);
    } else {
        let Ok(down) = decode_sync_down(bytes) else {
            return;
        };
        assert_eq!(
            decode_sync_down(&encode_sync_down(down.clone())),
            Ok(down.clone())
        );
        let cfg = BudgetConfig::new(RegionId::from(REGIONS[0]), regions());
        let Ok(mut budget) = RegionBudget::new(cfg, specs()) else {
            return;
        };
        budget.handle_sync_down(NOW, down);
        let _ = budget.drain_dirty();
    }
});

fn specs() -> Vec<LimitSpec> {
    let file = SourceFile::new("llm_tokens.yaml", LIMITS);
    LimitsConfig::load(&[file], &LoadOptions::default())
        .expect("the example limits load")
        .rules()
        .map(|r| r.spec.clone())
        .collect()
}

fn regions() -> Vec<RegionId> {
    REGIONS.iter().map(|r| RegionId::from(*r)).collect()
}
