//! One limit's state in a region: its resolved parameters, its keys and its statistics.
//!
//! Keys live in a `BTreeMap<Box<str>, KeyState>`: ordered (deterministic sweeps and eviction,
//! no hash seed to choose or attack) and compact (a boxed key text is 16 bytes plus the text,
//! where a shared `KeyId` would add a 16-byte reference count header per key).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Duration;

use super::config::{BudgetConfig, EVICTION_SCAN_KEYS};
use super::key::{Keep, KeyState, OtherRegions};
use super::stats::LimitStats;
use super::watch::WatchedKeys;
use crate::algo::concurrency::Concurrency;
use crate::algo::gcra::Gcra;
use crate::error::{Error, Result};
use crate::ids::{KeyId, LimitId, RegionId};
use crate::limit::{ConcurrencyCap, Consistency, LimitSpec, PartitionPolicy, Quota};
use crate::time::{Timestamp, Window, WindowIndex};

/// A limit's parameters, derived once from its spec.
#[derive(Clone, Debug)]
pub(crate) struct LimitParams {
    pub spec: LimitSpec,
    /// `L` and `W`; `None` for an unlimited limit.
    pub quota: Option<(u64, Window)>,
    /// `floor(w_r * L)`, or `L` for a single region.
    pub default_units: u64,
    /// Eventual limits: the other regions' default shares.
    pub others: OtherRegions,
    pub rate: Option<Gcra>,
    pub open_rate: Option<Gcra>,
    pub concurrency: Option<Concurrency>,
    /// Sliding window (D54): the first window whose use this region holds for every key, so
    /// that a key it holds no count of the window before for used none of it there; for a
    /// window before this one, such a key's use is unknown. Set to the window of the first
    /// call after the parameters were made (a start, a restart, a reload that changed the
    /// algorithm): keys restored or rolled before it remember no window before theirs.
    pub prev_known_from: Option<WindowIndex>,
}

impl LimitParams {
    pub fn new(spec: LimitSpec, cfg: &BudgetConfig) -> Self {
        let quota = match spec.quota {
            Quota::Unlimited => None,
            Quota::Units { units, window } => Some((units, window)),
        };
        let quota_units = quota.map_or(0, |(l, _)| l);
        let default_units = if cfg.coordinated {
            spec.weights
                .default_allowance(&cfg.region, &cfg.regions, quota_units)
        } else {
            quota_units
        };
        let others = if cfg.coordinated {
            other_regions(&spec, cfg, quota_units)
        } else {
            OtherRegions::default()
        };
        let open_rate = match spec.partition_policy {
            PartitionPolicy::Open { rate } => Some(Gcra::new(rate)),
            _ => None,
        };
        LimitParams {
            rate: spec.rate_cap.map(Gcra::new),
            open_rate,
            concurrency: spec
                .concurrency
                .map(|cap| Concurrency::new(regional_slots(&spec, cfg, cap))),
            quota,
            default_units,
            others,
            spec,
            prev_known_from: None,
        }
    }

    /// Counts by the sliding window estimate (D54).
    pub fn is_sliding(&self) -> bool {
        self.spec.is_sliding() && !self.is_unmetered()
    }

    /// What a roll keeps of the window it ends.
    pub fn keep(&self) -> Keep<'_> {
        match (self.is_sliding(), self.is_eventual()) {
            (false, _) => Keep::Band,
            (true, false) => Keep::Use,
            (true, true) => Keep::UseAndView(&self.others),
        }
    }

    /// Note that the region counts from `window` on (see [`LimitParams::prev_known_from`]).
    pub(crate) fn counting_from(&mut self, window: WindowIndex) {
        self.prev_known_from.get_or_insert(window);
    }

    /// Whether the region holds every key's use of the window before `window`: a key with
    /// no count of it kept (`HotState::prev`) used none of it.
    pub fn holds_previous_window(&self, window: WindowIndex) -> bool {
        self.prev_known_from.is_some_and(|from| {
            window
                .0
                .checked_sub(1)
                .is_some_and(|before| before >= from.0)
        })
    }

    /// Counts nothing: disabled, or no quota.
    pub fn is_unmetered(&self) -> bool {
        !self.spec.enabled || self.quota.is_none()
    }

    pub fn quota_units(&self) -> u64 {
        self.quota.map_or(0, |(l, _)| l)
    }

    pub fn is_eventual(&self) -> bool {
        self.spec.consistency == Consistency::Eventual
    }

    /// The window of `now`; windows of an unlimited limit are all index 0.
    pub fn window_index(&self, now: Timestamp) -> WindowIndex {
        self.quota.map_or(WindowIndex(0), |(_, w)| w.index(now))
    }

    pub fn window_end(&self, window: WindowIndex) -> Timestamp {
        self.quota.map_or(Timestamp::MAX, |(_, w)| w.end(window))
    }

    pub fn window_start(&self, window: WindowIndex) -> Timestamp {
        self.quota.map_or(Timestamp::ZERO, |(_, w)| w.start(window))
    }

    pub fn window_len(&self) -> Duration {
        self.quota.map_or(Duration::MAX, |(_, w)| w.len())
    }
}

/// The region's part of a concurrency cap. Slots are held per region and never rebalanced,
/// so a coordinated region takes its default share `max(1, floor(w_r * max_slots))`: the
/// parts add up to at most `max_slots`, plus one for every region whose share rounds to
/// zero (a region is never left without a slot). A region alone holds all of them
/// (docs/decisions.md, D16).
fn regional_slots(spec: &LimitSpec, cfg: &BudgetConfig, cap: ConcurrencyCap) -> ConcurrencyCap {
    if !cfg.coordinated {
        return cap;
    }
    let share = spec
        .weights
        .default_allowance(&cfg.region, &cfg.regions, u64::from(cap.max_slots));
    // At most `max_slots`, so it fits.
    let max_slots = u32::try_from(share.max(1)).unwrap_or(cap.max_slots);
    ConcurrencyCap { max_slots, ..cap }
}

/// One limit in a region.
#[derive(Debug)]
pub(crate) struct LimitState {
    pub params: LimitParams,
    pub keys: BTreeMap<Box<str>, KeyState>,
    pub stats: LimitStats,
    /// Where the next sweep or eviction scan resumes, so every key gets its turn.
    pub sweep_cursor: Option<Box<str>>,
    /// Keys an operator watches, with their last windows' final counts.
    pub watched: WatchedKeys,
}

impl LimitState {
    pub fn new(params: LimitParams) -> Self {
        LimitState {
            params,
            keys: BTreeMap::new(),
            stats: LimitStats::default(),
            sweep_cursor: None,
            watched: WatchedKeys::default(),
        }
    }

    pub fn id(&self) -> &LimitId {
        &self.params.spec.id
    }

    /// Run `f` on the key's state, created if new and rolled to the window of `now`. A new
    /// key in a full limit evicts an idle one or is refused; other keys changed on the way
    /// (evicted, or rolled while looking for one) are pushed on `touched`.
    pub fn with_key<R>(
        &mut self,
        now: Timestamp,
        key: &KeyId,
        max_keys: usize,
        touched: &mut Vec<Box<str>>,
        f: impl FnOnce(&LimitParams, &mut KeyState, &mut LimitStats) -> R,
    ) -> Result<R> {
        let window = self.params.window_index(now);
        self.params.counting_from(window);
        if let Some(ks) = self.keys.get_mut(key.as_str()) {
            let closed = ks.roll_closing(window, self.params.keep());
            self.watched.closed(key.as_str(), closed);
            return Ok(f(&self.params, ks, &mut self.stats));
        }
        if self.keys.len() >= max_keys {
            match self.find_idle(now, EVICTION_SCAN_KEYS, touched) {
                Some(idle) => {
                    self.keys.remove(&idle);
                    touched.push(idle);
                }
                None => {
                    return Err(Error::TooManyKeys {
                        limit: self.id().clone(),
                        key: key.clone(),
                        max_keys,
                    });
                }
            }
        }
        let mut ks = KeyState::new(window);
        let out = f(&self.params, &mut ks, &mut self.stats);
        self.keys.insert(key.as_str().into(), ks);
        debug_assert!(self.keys.len() <= max_keys);
        Ok(out)
    }

    /// The next idle key after the cursor (wrapping), examining at most `scan` keys. Keys
    /// passed over are rolled and compacted on the way (and pushed on `touched` if that
    /// changed them).
    pub fn find_idle(
        &mut self,
        now: Timestamp,
        scan: usize,
        touched: &mut Vec<Box<str>>,
    ) -> Option<Box<str>> {
        let window = self.params.window_index(now);
        self.params.counting_from(window);
        let sliding = self.params.is_sliding();
        let keep = self.params.keep();
        let mut found = None;
        let cursor = self.sweep_cursor.take();
        let watched = &mut self.watched;
        self.sweep_cursor = scan_from(&mut self.keys, cursor.as_deref(), scan, |name, ks| {
            let closed = ks.roll_closing(window, keep);
            watched.closed(name, closed);
            let moved = closed.is_some() | ks.compact(now);
            // A sliding limit keeps a key's use of the window before: without the key, the
            // region would take it as unused there.
            if ks.is_idle(now) && !(sliding && ks.keeps_start_band()) {
                found = Some(name.clone());
            } else if moved {
                touched.push(name.clone());
            }
            found.is_some()
        })
        .or(cursor);
        found
    }

    /// Roll, compact and evict up to `scan` keys from the cursor on. Returns the keys it
    /// changed (evicted, or rolled or compacted and kept).
    pub fn sweep(&mut self, now: Timestamp, scan: usize) -> Vec<Box<str>> {
        let window = self.params.window_index(now);
        self.params.counting_from(window);
        let keep = self.params.keep();
        let mut idle = Vec::new();
        let mut changed = Vec::new();
        let cursor = self.sweep_cursor.take();
        let watched = &mut self.watched;
        self.sweep_cursor = scan_from(&mut self.keys, cursor.as_deref(), scan, |name, ks| {
            let closed = ks.roll_closing(window, keep);
            watched.closed(name, closed);
            let moved = closed.is_some() | ks.compact(now);
            if ks.is_idle(now) && !ks.keeps_start_band() {
                idle.push(name.clone());
            } else if moved {
                changed.push(name.clone());
            }
            false
        })
        .or(cursor);
        for name in &idle {
            self.keys.remove(name);
        }
        changed.extend(idle);
        changed
    }
}

/// Visit up to `scan` keys after `cursor`, wrapping around to the start, each at most once,
/// until `visit` says stop. Returns the last key visited (the next scan's cursor).
fn scan_from(
    keys: &mut BTreeMap<Box<str>, KeyState>,
    cursor: Option<&str>,
    scan: usize,
    mut visit: impl FnMut(&Box<str>, &mut KeyState) -> bool,
) -> Option<Box<str>> {
    let mut budget = scan;
    let mut last = None;
    let tail = match cursor {
        Some(c) => keys.range_mut::<str, _>((Bound::Excluded(c), Bound::Unbounded)),
        None => keys.range_mut::<str, _>(..),
    };
    let mut stopped = false;
    let mut last_ref = None;
    for (name, ks) in tail.take(budget) {
        budget -= 1;
        last_ref = Some(name);
        if visit(name, ks) {
            stopped = true;
            break;
        }
    }
    if let Some(name) = last_ref {
        last = Some(name.clone());
    }
    if let (false, Some(c)) = (stopped, cursor) {
        let mut last_ref = None;
        for (name, ks) in keys
            .range_mut::<str, _>((Bound::Unbounded, Bound::Included(c)))
            .take(budget)
        {
            last_ref = Some(name);
            if visit(name, ks) {
                break;
            }
        }
        if let Some(name) = last_ref {
            last = Some(name.clone());
        }
    }
    last
}

/// The other regions' default shares, and what no region holds by default.
fn other_regions(spec: &LimitSpec, cfg: &BudgetConfig, quota_units: u64) -> OtherRegions {
    let share = |r: &RegionId| spec.weights.default_allowance(r, &cfg.regions, quota_units);
    let assigned = cfg
        .regions
        .iter()
        .map(share)
        .fold(0u64, u64::saturating_add);
    OtherRegions {
        default_units: cfg
            .regions
            .iter()
            .filter(|r| **r != cfg.region)
            .map(|r| (r.clone(), share(r)))
            .collect(),
        unassigned_units: quota_units.saturating_sub(assigned),
    }
}
