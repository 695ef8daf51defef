//! Regions' boots across leaders.
//!
//! A leader tells a region's boots apart by number, except that a restored boot may be
//! numbered below the boot it superseded (its clock read behind, its copy was older), so the
//! leader keeps the boots it retired (`RegionView::retired_boots`). A new leader that knew
//! none of them would take a late message of a dead boot for a restart, and the live boot's
//! messages for old ones from then on: it would read the dead boot's clock and reading for the
//! region's, and take none of the live boot's demand again. So the leader replicates each
//! region's boots (the driver commits them before it answers a message that changed them), and
//! a new leader starts from the last it finds, as it does from the clock frame (D78).

use serde::{Deserialize, Serialize};

use crate::ids::RegionId;
use crate::rebalance::views::{RETIRED_BOOTS_KEPT, RegionView};

use super::Coordinator;

/// A region's boots as a leader last heard them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionBoots {
    pub region: RegionId,
    /// The newest boot heard (never 0).
    pub boot: u64,
    /// The boots it superseded, the latest last (at most [`RETIRED_BOOTS_KEPT`] are kept).
    pub retired: Vec<u64>,
    /// The newest boot's SyncUps said `restored`: it had no answer yet, and no clock sample of
    /// its own (a sample the leader replicated for it then is of a boot before).
    pub restored: bool,
}

/// A region's boots as the log replicated them (the coordinator's state keeps them, and the
/// simulator's log the same way): the leader term that recorded them, and whether the region's
/// clock sample of the last frame was taken of the newest boot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedBoots {
    pub leader_term: u64,
    pub boots: RegionBoots,
    /// The last frame was recorded after these boots, and the boot was answered by then (a
    /// restored boot's sample in a frame before its answer is of its boot before). A new
    /// leader adopts any other sample as the region's boot before's.
    pub sample_of_boot: bool,
}

impl RecordedBoots {
    /// Whether boots of the leader of `leader_term` may replace `kept`: not when a later
    /// leader recorded those (a deposed leader's entry, committed late).
    pub fn may_replace(kept: Option<&RecordedBoots>, leader_term: u64) -> bool {
        kept.is_none_or(|k| k.leader_term <= leader_term)
    }

    /// `boots` recorded over `kept`: the sample stays of the newest boot only while the boot,
    /// and whether it was restored, are unchanged.
    pub fn after(kept: Option<&RecordedBoots>, leader_term: u64, boots: RegionBoots) -> Self {
        let sample_of_boot = kept.is_some_and(|k| {
            k.sample_of_boot && k.boots.boot == boots.boot && k.boots.restored == boots.restored
        });
        RecordedBoots {
            leader_term,
            boots,
            sample_of_boot,
        }
    }

    /// A clock frame was recorded, holding a sample of the region or not.
    pub fn framed(&mut self, holds_sample: bool) {
        self.sample_of_boot = !self.boots.restored && holds_sample;
    }
}

impl Coordinator {
    /// What this leader knows of `region`'s boots, once it has heard or adopted one.
    pub fn region_boots(&self, region: &RegionId) -> Option<RegionBoots> {
        let view = self.regions.get(region).filter(|v| v.boot != 0)?;
        Some(RegionBoots {
            region: region.clone(),
            boot: view.boot,
            retired: view
                .retired_boots
                .iter()
                .copied()
                .filter(|&b| b != 0)
                .collect(),
            restored: view.restored,
        })
    }

    /// Before its first input, the boots an earlier leader replicated, each with whether the
    /// clock sample adopted for the region (`adopt_clocks`) was taken of that boot: one taken
    /// before it (the frame was recorded before the boot, or while it had no answer) is of a
    /// boot before, which is what a restored boot's reach is computed from. A region this
    /// leader heard already, or that is not in the table, is left out.
    pub fn adopt_boots(&mut self, boots: impl IntoIterator<Item = (RegionBoots, bool)>) {
        let started_at = self.started_at;
        for (record, sample_of_boot) in boots {
            if record.boot == 0 || self.table.regions().binary_search(&record.region).is_err() {
                continue;
            }
            let view = self
                .regions
                .entry(record.region)
                .or_insert_with(|| RegionView::new(started_at));
            if view.last_seq.is_some() {
                continue;
            }
            view.boot = record.boot;
            view.restored = record.restored;
            let kept = record.retired.len().min(RETIRED_BOOTS_KEPT);
            let newest = &record.retired[record.retired.len() - kept..];
            view.retired_boots = [0; RETIRED_BOOTS_KEPT];
            view.retired_boots[RETIRED_BOOTS_KEPT - kept..].copy_from_slice(newest);
            if !sample_of_boot {
                view.retire_clock(started_at);
            }
        }
    }
}
