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
use crate::limit::{Consistency, LimitSpec, PartitionPolicy, Quota};
use crate::rebalance::bound::OlderTerms;
use crate::rebalance::table::AllowanceTable;
use crate::time::{Timestamp, Window};

/// Replaced configurations the leader remembers. A rollout that outlasts this many reloads
/// leaves regions on versions it no longer knows: their windows are stated unbounded.
pub const CONFIGS_KEPT: usize = 4;

/// One replaced configuration.
#[derive(Clone, Debug)]
struct KeptConfig {
    version: u64,
    limits: BTreeMap<LimitId, LimitSpec>,
    regions: Vec<RegionId>,
    /// When the leader applied the configuration that replaced it (its clock).
    replaced_at: Timestamp,
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
    /// Remember the table's configuration before a `SetConfig` applied at `now` replaces it.
    pub fn remember(&mut self, table: &AllowanceTable, now: Timestamp) {
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
            replaced_at: now,
            largest_row_units,
        });
    }

    /// The quota of `limit` in force at `at` (our clock) when that was under a configuration
    /// kept here with the same `window`; `None` under the table's own (or a forgotten one), or
    /// where the window length differed (its counters were other ones).
    pub fn quota_units_at(&self, limit: &LimitId, window: Window, at: Timestamp) -> Option<u64> {
        let c = self.configs.iter().find(|c| at < c.replaced_at)?;
        match c.limits.get(limit)?.quota {
            Quota::Units { units, window: w } if w == window => Some(units),
            _ => None,
        }
    }

    /// Whether `version` is one of the replaced configurations kept here.
    pub fn knows(&self, version: u64) -> bool {
        self.configs.iter().any(|c| c.version == version)
    }

    /// The replaced configurations kept here that came after `version`, oldest first: those a
    /// rollout may have taken a region last heard on `version` to while it was not heard.
    pub fn versions_after(&self, version: u64) -> impl Iterator<Item = u64> + '_ {
        self.configs
            .iter()
            .map(|c| c.version)
            .filter(move |v| *v > version)
    }

    /// Whether a region last known on the replaced configuration `version` closes itself when
    /// its view expires, on that version and on every one replaced since (a rollout may have
    /// taken it to any of them while it was silent): the limit strict with the closed
    /// partition policy in each. Only then may the leader reclaim its floor while it is
    /// silent. A version not kept here, or one after it forgotten, does not.
    pub fn closes_when_silent(&self, version: u64, limit: &LimitId) -> bool {
        let Some(from) = self.configs.iter().rposition(|c| c.version == version) else {
            return false;
        };
        self.configs.iter().skip(from).all(|c| {
            c.limits.get(limit).is_some_and(|spec| {
                spec.enabled
                    && spec.consistency == Consistency::Strict
                    && spec.partition_policy == PartitionPolicy::Closed
            })
        })
    }

    /// What the replaced configuration `version` states of `limit` for the terms a region
    /// still on it admits by (fail-open, settles, Envoy's fallback); `None` if it is not kept
    /// or had no such limit.
    pub fn older_terms(&self, version: u64, limit: &LimitId) -> Option<OlderTerms> {
        let c = self.configs.iter().rev().find(|c| c.version == version)?;
        c.limits.get(limit).map(OlderTerms::of)
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

    /// When the kept configuration was replaced, in the tests.
    const REPLACED_AT_NANOS: u64 = 10_000_000_000;

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
        kept.remember(&table, Timestamp::from_unix_nanos(REPLACED_AT_NANOS));
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

    #[test]
    fn the_quota_in_force_before_a_reload_is_the_replaced_one() {
        let k = kept(LimitSpec::simple("api", 268, Duration::from_secs(3)));
        let api = LimitId::from("api");
        let before = Timestamp::from_unix_nanos(REPLACED_AT_NANOS - 1);
        let after = Timestamp::from_unix_nanos(REPLACED_AT_NANOS);
        let w = Window::new(Duration::from_secs(3));
        assert_eq!(k.quota_units_at(&api, w, before), Some(268));
        assert_eq!(k.quota_units_at(&api, w, after), None, "the table's own");
        assert_eq!(k.quota_units_at(&LimitId::from("other"), w, before), None);
        let longer = Window::new(Duration::from_secs(4));
        assert_eq!(
            k.quota_units_at(&api, longer, before),
            None,
            "other counters"
        );
    }

    #[test]
    fn only_a_region_on_a_strict_closed_version_closes_itself() {
        let api = LimitId::from("api");
        let floor = kept(LimitSpec::simple("api", 268, Duration::from_secs(3)));
        assert!(!floor.closes_when_silent(1, &api));
        let closed = kept(LimitSpec {
            partition_policy: PartitionPolicy::Closed,
            ..LimitSpec::simple("api", 268, Duration::from_secs(3))
        });
        assert!(closed.closes_when_silent(1, &api));
        assert!(!closed.closes_when_silent(2, &api), "a version not kept");
        let eventual_closed = kept(LimitSpec {
            partition_policy: PartitionPolicy::Closed,
            consistency: Consistency::Eventual,
            ..LimitSpec::simple("api", 268, Duration::from_secs(3))
        });
        assert!(!eventual_closed.closes_when_silent(1, &api));
    }

    /// Swarm seed 3009566: `r2`, last heard on version 1 (strict, closed), was silent (down,
    /// then removed) through a reload to 2 (eventual, open policy) and one to 3 (strict,
    /// closed again); it restarted under 2 and admitted there. Judged on version 1 alone, its
    /// floor was reclaimed under 3 while it held what it had admitted under 2: 19 units
    /// enforced where the table gave it 0.
    #[test]
    fn a_region_closes_only_if_every_version_it_may_have_reached_closes() {
        let api = LimitId::from("api");
        let closed = LimitSpec {
            partition_policy: PartitionPolicy::Closed,
            ..LimitSpec::simple("api", 268, Duration::from_secs(3))
        };
        let eventual = LimitSpec {
            consistency: Consistency::Eventual,
            ..closed.clone()
        };
        let regions: Vec<RegionId> = ["a", "b"].into_iter().map(RegionId::from).collect();
        let mut table = AllowanceTable::new();
        let mut kept = KeptConfigs::default();
        for (version, spec) in [(1, &closed), (2, &eventual), (3, &closed)] {
            if version > 1 {
                kept.remember(
                    &table,
                    Timestamp::from_unix_nanos(version * REPLACED_AT_NANOS),
                );
            }
            let set = TableCommand::SetConfig {
                version,
                limits: vec![spec.clone()],
                regions: regions.clone(),
            };
            assert!(table.apply(set).is_applied());
        }
        assert!(!kept.closes_when_silent(1, &api), "version 2 came since");
        assert!(!kept.closes_when_silent(2, &api));
        // Without the eventual version between, it closes.
        let mut plain = KeptConfigs::default();
        let mut table = AllowanceTable::new();
        for version in 1..=3 {
            if version > 1 {
                plain.remember(
                    &table,
                    Timestamp::from_unix_nanos(version * REPLACED_AT_NANOS),
                );
            }
            let set = TableCommand::SetConfig {
                version,
                limits: vec![closed.clone()],
                regions: regions.clone(),
            };
            assert!(table.apply(set).is_applied());
        }
        assert!(plain.closes_when_silent(1, &api));
    }
}
