//! Earlier configurations, for the bound while a reload rolls out.
//!
//! Regions reload at different times, so for a while some enforce their allowance under an
//! older configuration than the table's. The leader keeps the last [`CONFIGS_KEPT`] ones it
//! replaced, each with the largest allowance each region held per limit when it was replaced,
//! to state what such a region may enforce (docs/bound.md, reload). Soft state: a new leader
//! knows only the current configuration, and a window in which a region reports a version it
//! does not know is unbounded.

use std::collections::{BTreeMap, VecDeque};

use crate::ids::{LimitId, RegionId};
use crate::limit::{LimitSpec, Quota};
use crate::rebalance::table::AllowanceTable;

/// Replaced configurations the leader remembers. A rollout that outlasts this many reloads
/// leaves regions on versions it no longer knows: their windows are stated unbounded.
pub const CONFIGS_KEPT: usize = 4;

/// One replaced configuration.
#[derive(Clone, Debug)]
struct KeptConfig {
    version: u64,
    limits: BTreeMap<LimitId, LimitSpec>,
    regions: Vec<RegionId>,
    /// Per limit and region, the largest explicit allowance any of its rows held.
    largest_row_units: BTreeMap<(LimitId, RegionId), u64>,
}

/// What a region may enforce for a limit under the version it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    Units(u64),
    /// The limit admits everything under that version (unlimited, disabled or absent).
    Unmetered,
    /// The version is neither the table's nor one of the kept ones.
    UnknownVersion,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct KeptConfigs {
    configs: VecDeque<KeptConfig>,
}

impl KeptConfigs {
    /// Remember the table's configuration before a `SetConfig` replaces it.
    pub fn remember(&mut self, table: &AllowanceTable) {
        if table.limits().next().is_none() {
            return;
        }
        let mut largest_row_units: BTreeMap<(LimitId, RegionId), u64> = BTreeMap::new();
        for (counter, rows) in table.counters() {
            for (region, row) in rows {
                let slot = largest_row_units
                    .entry((counter.limit.clone(), region.clone()))
                    .or_default();
                *slot = (*slot).max(row.allowance_units);
            }
        }
        if self.configs.len() >= CONFIGS_KEPT {
            self.configs.pop_front();
        }
        self.configs.push_back(KeptConfig {
            version: table.config_version(),
            limits: table.limits().map(|l| (l.id.clone(), l.clone())).collect(),
            regions: table.regions().to_vec(),
            largest_row_units,
        });
    }

    /// What `region` may enforce for `limit` under the replaced configuration `version`: its
    /// default there, or the largest grant it held there if larger.
    pub fn held(&self, version: u64, limit: &LimitId, region: &RegionId) -> Held {
        let Some(c) = self.configs.iter().rev().find(|c| c.version == version) else {
            return Held::UnknownVersion;
        };
        match c.limits.get(limit) {
            Some(spec) if spec.enabled => match spec.quota {
                Quota::Units { units, .. } => {
                    let default = spec.weights.default_allowance(region, &c.regions, units);
                    let row = c
                        .largest_row_units
                        .get(&(limit.clone(), region.clone()))
                        .copied()
                        .unwrap_or(0);
                    Held::Units(default.max(row))
                }
                Quota::Unlimited => Held::Unmetered,
            },
            _ => Held::Unmetered,
        }
    }
}
