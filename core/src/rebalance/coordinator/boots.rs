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

impl RegionBoots {
    /// Whether `self` and `other` say the same of the region's boots.
    pub fn same_boots(&self, other: &RegionBoots) -> bool {
        self.boot == other.boot && self.retired == other.retired && self.restored == other.restored
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
