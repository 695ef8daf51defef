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
use crate::limit::{Consistency, LimitSpec, Quota};
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
    /// default there, or the largest grant it held there if larger. Under an eventual limit its
    /// view, not its default, sets what it admits: up to that configuration's whole quota.
    pub fn held(&self, version: u64, limit: &LimitId, region: &RegionId) -> Held {
        let Some(c) = self.configs.iter().rev().find(|c| c.version == version) else {
            return Held::UnknownVersion;
        };
        match c.limits.get(limit) {
            Some(spec) if spec.enabled => match spec.quota {
                Quota::Units { units, .. } if spec.consistency == Consistency::Eventual => {
                    Held::Units(units)
                }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rebalance::table::TableCommand;

    fn kept(spec: LimitSpec) -> KeptConfigs {
        let mut table = AllowanceTable::new();
        let regions: Vec<RegionId> = ["a", "b"].into_iter().map(RegionId::from).collect();
        let outcome = table.apply(TableCommand::SetConfig {
            version: 1,
            limits: vec![spec],
            regions,
        });
        assert!(outcome.is_applied(), "{outcome:?}");
        let mut kept = KeptConfigs::default();
        kept.remember(&table);
        kept
    }

    #[test]
    fn a_region_on_an_older_strict_version_holds_its_default_there() {
        let k = kept(LimitSpec::simple("api", 268, Duration::from_secs(3)));
        assert_eq!(
            k.held(1, &LimitId::from("api"), &RegionId::from("a")),
            Held::Units(134)
        );
    }

    #[test]
    fn a_region_on_an_older_eventual_version_may_admit_up_to_its_quota() {
        let eventual = LimitSpec {
            consistency: Consistency::Eventual,
            ..LimitSpec::simple("api", 268, Duration::from_secs(3))
        };
        let k = kept(eventual);
        assert_eq!(
            k.held(1, &LimitId::from("api"), &RegionId::from("a")),
            Held::Units(268),
            "its view, not its default, sets what it admits"
        );
        assert_eq!(
            k.held(2, &LimitId::from("api"), &RegionId::from("a")),
            Held::UnknownVersion
        );
    }
}
