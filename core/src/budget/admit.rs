//! Admission: the allowance a key has now, what a request or lease may be granted against it,
//! charging the counters, and escalation.
//!
//! One function decides both acquires (all or nothing) and leases (as much as is available,
//! down to 1), so the two can never disagree about the allowance, the rate cap, the partition
//! policy or shadow mode.

use std::time::Duration;

use super::api::Reason;
use super::config::DEMAND_WARMUP_DIVISOR;
use super::key::KeyState;
use super::limits::LimitParams;
use super::restore::RestoreGate;
use super::sliding;
use super::stats::{GRANT_RATE_BUCKET, LimitStats, WindowStats};
use crate::algo::gcra::{Gcra, GcraDecision, GcraState};
use crate::limit::{PartitionPolicy, RateCap};
use crate::sync::MICRO_UNITS_PER_UNIT;
use crate::time::{Timestamp, WindowIndex, duration_nanos};

/// The region-wide inputs of an admission.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub coordinated: bool,
    /// Contact with the coordinator is older than `view_ttl` (or never happened).
    pub view_expired: bool,
    /// Answers to SyncUps sent before this instant are older than `view_ttl`: a counter whose
    /// entries came last in such an answer has a view too old to use.
    pub fresh_since: Timestamp,
    pub view_ttl: Duration,
    pub sync_interval: Duration,
    /// The timebase's edge band (docs/budget.md, edge band): strict admissions keep this far
    /// from every window edge, `Duration::MAX` for none at all. `None`: no timebase in force.
    pub edge_band: Option<Duration>,
    /// The view has been expired since this instant, and the time since is not yet in the
    /// statistics' time open (`None` while fresh).
    pub open_from: Option<Timestamp>,
    /// A restored start's limits on admission (none for a normal start).
    pub restore: RestoreGate,
    /// The region switched configuration versions and has had no answer at its new one yet
    /// ([`super::view::View::version_unheard`]): a closed strict key holds as if its view
    /// had expired.
    pub version_unheard: bool,
    /// The last version change skipped one and no answer at the version now in force has
    /// come ([`super::view::View::version_skipped_from`]): a closed strict key holds at its
    /// use within its explicit allowance, or else its default.
    pub version_skipped: bool,
    /// The last answer left rows below the default for later ones
    /// ([`super::view::View::below_default_left`]): every strict key holds as if closed, and
    /// no higher than its explicit allowance, whatever its partition policy.
    pub below_default_left: bool,
    /// The region reads windows on a timebase and knows no correction of its clock (none read
    /// back from its store, none measured since): where its clock stands against the one an
    /// earlier copy of its state read windows on is unknown.
    pub clock_unknown: bool,
}

/// The allowance `a_r` in force for a key, and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allowance {
    pub units: u64,
    pub reason: Reason,
    /// Open partition policy: beyond `units`, its rate cap may still admit (fail-open).
    pub open: bool,
    /// Eventual mode's view: `units` is the quota less the other regions' assumed use, not
    /// a share of the quota, so a sliding window's weight is taken off it rather than scaling
    /// it (D83).
    pub from_view: bool,
}

/// The open policy's two limits on what it lets in beyond the allowance: its GCRA (no more
/// than the rate and burst over any interval) and the window's budget (no more than the rate
/// over the time open in the window, plus one burst: the bound's fail-open term).
#[derive(Clone, Copy, Debug)]
struct OpenCap {
    gcra: Gcra,
    rate: RateCap,
    /// Fail-open units the window may still take.
    left_units: u64,
}

impl OpenCap {
    /// When the window's budget, growing at the open rate while the region stays open, will
    /// have `short_units` more than it has left.
    fn budget_retry(&self, short_units: u64) -> Option<Duration> {
        let nanos = u128::from(short_units) * self.rate.per.as_nanos();
        let wait = nanos.div_ceil(u128::from(self.rate.units.max(1)));
        Some(Duration::from_nanos(
            u64::try_from(wait).unwrap_or(u64::MAX),
        ))
    }
}

/// How much a request wants: an acquire is all or nothing, a lease takes what there is but
/// no less than `min_units`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    Exact(u64),
    UpTo { units: u64, min_units: u64 },
}

/// The result of one admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    pub allowed: bool,
    /// Units charged to the key (0 when refused).
    pub units: u64,
    pub shadow_denied: bool,
    pub reason: Reason,
    pub retry_after: Option<Duration>,
    /// The allowance the request was judged against.
    pub allowance: Allowance,
    /// The key escalated because of this request.
    pub escalated: bool,
}

/// `a_r` for `ks` in `window` (the key's own window, or a later one it has not rolled to).
/// A restored start holds at what the key admitted from allowances (its use less the excess
/// policy let in beyond them) while its gate shuts the window, never above what it holds once
/// its grants are back: the lost copy of its state may have admitted the rest. Before its
/// first answer that use may be above what it holds (its own entries can come back first,
/// its grants not yet): it was admitted under an allowance at least as large. A window it
/// closes for good is not reopened by the open partition policy either, nor, while it waits,
/// is a window the lost copy may have used (`RestoreGate::opens`).
pub(crate) fn allowance(
    p: &LimitParams,
    ks: &KeyState,
    window: WindowIndex,
    ctx: &Ctx,
) -> Allowance {
    let a = held_allowance(p, ks, window, ctx);
    let start = p.window_start(window);
    if !ctx.restore.shuts(start) {
        return a;
    }
    let used = match ks.hot.as_deref() {
        _ if ks.window != window => 0,
        Some(h) => ks.net_units().saturating_sub(h.excess_units),
        None => ks.net_units(),
    };
    // Until the first answer what it holds is the old copy's (its grants come back with the
    // answer, its own entries may come first); after it, what it holds is current.
    let units = if ctx.restore.is_awaiting() {
        used
    } else {
        used.min(a.units)
    };
    Allowance {
        units,
        reason: Reason::Restoring,
        open: a.open && ctx.restore.opens(start, ctx.clock_unknown),
        from_view: false,
    }
}

/// [`allowance`] without a restore's gate: what the region holds.
fn held_allowance(p: &LimitParams, ks: &KeyState, window: WindowIndex, ctx: &Ctx) -> Allowance {
    let quota = p.quota_units();
    let default = Allowance {
        units: p.default_units,
        reason: Reason::Allowance,
        open: false,
        from_view: false,
    };
    if !ctx.coordinated {
        return Allowance {
            units: quota,
            ..default
        };
    }
    if !p.is_eventual() {
        let explicit = ks.explicit_allowance(window);
        // A row below the default still to come may be any key's, in any window, and may
        // be below a grant held from before (a reclaimed window's pre-issued grant): every
        // key holds at what it used, within its grant or else its default, and a later
        // window at nothing. So does a closed key after a skipped version, whose rows the
        // table may have lowered at the version the region never saw.
        let closed_skip = ctx.version_skipped && p.spec.partition_policy == PartitionPolicy::Closed;
        if ctx.below_default_left || closed_skip {
            let closed = closed_allowance(p, ks, window);
            let held = |grant: u64| {
                if ks.window == window {
                    grant.min(ks.net_units())
                } else {
                    0
                }
            };
            return Allowance {
                units: explicit.map_or(closed.units, held),
                ..closed
            };
        }
        // Strict: an explicit grant holds whatever happens to contact.
        if let Some(units) = explicit {
            return Allowance { units, ..default };
        }
        // The table's rows for the new version may hold this region below its default (the
        // zeroes of windows others were grown into while it was silent or removed); they
        // come only with an answer at that version, so until then closed means closed.
        if ctx.version_unheard && p.spec.partition_policy == PartitionPolicy::Closed {
            return closed_allowance(p, ks, window);
        }
    } else if !ctx.view_expired {
        let hot = ks.hot.as_deref().filter(|_| ks.window == window);
        return match hot.filter(|h| h.known_to_coordinator) {
            // Answers have left this counter's entries out (more counters than one answer
            // holds) for longer than `view_ttl`: its view is too old to use, and the others
            // count this region at its reported use, so it holds at what it uses until the
            // entries come again.
            Some(h) if h.entries_at.is_none_or(|t| t < ctx.fresh_since) => Allowance {
                units: ks.net_units(),
                ..default
            },
            // In view mode the default share is no longer a floor: the others count this
            // region at its reported use, so it may only take what the view leaves.
            Some(h) => {
                let units = quota.saturating_sub(h.assumed_remote_units(&p.others));
                Allowance {
                    units,
                    reason: if units > p.default_units {
                        Reason::GlobalView
                    } else {
                        Reason::Allowance
                    },
                    open: false,
                    from_view: true,
                }
            }
            // The coordinator has not yet answered for this counter: the default share only.
            None => default,
        };
    }
    if !ctx.view_expired {
        return default;
    }
    match p.spec.partition_policy {
        PartitionPolicy::Floor => default,
        PartitionPolicy::Closed => closed_allowance(p, ks, window),
        PartitionPolicy::Open { .. } => Allowance {
            open: true,
            ..default
        },
    }
}

/// Closed policy, view expired: nothing more than is used. A strict region also stays within
/// the default share its table allowance is (settle overage can take use past it); an
/// eventual region's use may rightly be past its share, which is no ceiling in view mode.
/// What a closed region holds in `window`: in its current window what it used, up to its
/// default (strict); in a later one nothing.
fn closed_allowance(p: &LimitParams, ks: &KeyState, window: WindowIndex) -> Allowance {
    Allowance {
        units: if ks.window == window {
            closed_units(p, ks)
        } else {
            0
        },
        reason: Reason::PartitionClosed,
        open: false,
        from_view: false,
    }
}

fn closed_units(p: &LimitParams, ks: &KeyState) -> u64 {
    if p.is_eventual() {
        ks.net_units()
    } else {
        ks.net_units().min(p.default_units)
    }
}

/// Decide `want` for the key at `now` and charge what is granted. The key must already be
/// rolled to the window of `now`.
pub(crate) fn admit(
    p: &LimitParams,
    ks: &mut KeyState,
    stats: &mut LimitStats,
    ctx: &Ctx,
    now: Timestamp,
    want: Want,
) -> Admission {
    let held = allowance(p, ks, ks.window, ctx);
    // A sliding window admits only the share of its allowance the window before leaves
    // (D54; an eventual view less the window before's weight, D83); the allowance itself,
    // what the table and the invariants hold, is unchanged.
    let weight = sliding::weight(p, ks, ctx, now);
    let a = Allowance {
        units: weight.map_or(held.units, |w| w.weigh(&held)),
        ..held
    };
    let band = edge_band(p, ctx, ks.window, now);
    let want = match band {
        None => Some(want),
        Some((side, _)) => within_band_room(want, band_room(p, ks, ctx, side)),
    };
    let (Some(want), band) = (want, band) else {
        // Neither charged nor counted as demand: the units are refused for where the clock
        // stands, not for want of allowance. With nothing left, the allowance's own reason
        // (a closed partition's) stands: the agent's negative cache keeps a refusal with
        // nothing remaining to the window's end, and the band must not hide it that long.
        let wait = band.map_or(ctx.sync_interval, |(_, wait)| wait);
        let reason = if a.units <= ks.net_units() {
            a.reason
        } else {
            Reason::Allowance
        };
        return Admission {
            allowed: false,
            units: 0,
            shadow_denied: false,
            reason,
            retry_after: Some(wait),
            allowance: a,
            escalated: false,
        };
    };
    let head = a.units.saturating_sub(ks.net_units());
    let open = open_cap(p, ks, stats, ctx, now).filter(|_| a.open);
    let (mut plan, wanted) = match want {
        Want::Exact(cost) => (plan_exact(p, ks, &a, open, now, cost), cost),
        Want::UpTo { units, min_units } => {
            let range = LeaseRange { units, min_units };
            (plan_up_to(p, ks, &a, open, now, range), units)
        }
    };
    if let (Some(w), Some((reason, retry))) = (weight, plan.refusal.as_mut())
        && *reason == a.reason
    {
        // Refused by the weight, the units may fit before the window's end as it fades.
        let least = match want {
            Want::Exact(cost) => cost,
            Want::UpTo { min_units, .. } => min_units.max(1),
        };
        let needed = ks.net_units().saturating_add(least);
        if let Some(at) = w.retry_at(&held, needed) {
            let fade = at.saturating_duration_since(now);
            *retry = retry.map(|r| r.min(fade));
        }
    }
    let mut window_stats = stats.window_mut(ks.window);
    let mut out = Admission {
        allowed: true,
        units: plan.units,
        shadow_denied: false,
        reason: plan.reason,
        retry_after: None,
        allowance: a,
        escalated: false,
    };
    let rate_bucket = GRANT_RATE_BUCKET.min(p.window_len());
    match plan.refusal {
        None => {
            if let Some(s) = window_stats.as_deref_mut() {
                s.record_grant(now, rate_bucket, plan.units);
            }
            charge(ks, &a, &plan, window_stats);
            if let Some((side, _)) = band {
                count_in_band(ks, side, plan.units);
            }
        }
        Some((reason, retry_after)) if p.spec.shadow_mode => {
            // Let it through and count it, so the counters stay true; record the excess.
            let excess = wanted.saturating_sub(head);
            ks.granted_units = ks.granted_units.saturating_add(wanted);
            ks.hot_mut().excess_units += excess;
            if let Some(s) = window_stats {
                s.shadow_denials += 1;
                s.shadow_excess_units += excess;
                s.record_grant(now, rate_bucket, wanted);
            }
            out = Admission {
                units: wanted,
                shadow_denied: true,
                reason,
                retry_after,
                ..out
            };
        }
        Some((reason, retry_after)) => {
            let hot = ks.hot_mut();
            hot.denied_units += wanted;
            hot.refused_this_window = true;
            if let Some(s) = window_stats {
                s.denials += 1;
                s.denied_units += wanted;
            }
            out = Admission {
                allowed: false,
                units: 0,
                reason,
                retry_after,
                ..out
            };
        }
    }
    let denied = !out.allowed;
    out.escalated = escalate_if_needed(p, ks, &a, ctx, now, denied);
    out
}

/// Which edge band of its window an admission is in (docs/budget.md, edge band).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BandSide {
    /// Within `e` of the window's start: on the coordinator's clock the unit may be in the
    /// window before, so it counts against that window too.
    Start,
    /// Within `e` of the window's end: it may be in the next one, so it counts against that
    /// one too (carried into its counter).
    End,
    /// The band covers the whole window (`2e` at least a window, or no band to keep): nothing.
    Whole,
}

/// The edge band of a strict limit at `now`, if `now` is in one: a unit admitted within the
/// uncertainty `e` of an edge of `window` might be inside the neighbouring window on the
/// coordinator's clock, where the region's own counter of that window must count it too. With
/// it, how long until admissions leave the band (the next window's start plus `e`, or, with no
/// band to keep, a sync interval, when a new clock sample may bring one): the wait of a
/// refusal the neighbouring window has no room for.
/// Whether an edge band of `e` covers every instant of a window of `window_len` (its start
/// and end bands meet): strict keys admit nothing new then.
pub(crate) fn band_covers_window(e: Duration, window_len: Duration) -> bool {
    e.saturating_mul(2) >= window_len
}

pub(crate) fn edge_band(
    p: &LimitParams,
    ctx: &Ctx,
    window: WindowIndex,
    now: Timestamp,
) -> Option<(BandSide, Duration)> {
    let e = ctx.edge_band?;
    if p.is_eventual() || p.spec.shadow_mode || p.is_unmetered() {
        return None;
    }
    let (start, end) = (p.window_start(window), p.window_end(window));
    if band_covers_window(e, p.window_len()) {
        return Some((BandSide::Whole, ctx.sync_interval));
    }
    if now < start + e {
        return Some((BandSide::Start, (start + e).saturating_duration_since(now)));
    }
    if now + e >= end {
        return Some((BandSide::End, (end + e).saturating_duration_since(now)));
    }
    None
}

/// Units the neighbouring window can still count for an admission in `side`'s band: the next
/// window's allowance less what earlier end-band admissions carried into it; the window
/// before's allowance less its use and the start band's admissions so far. Nothing where that
/// is not known (a key that kept no state of the window before: compacted, new, restarted).
fn band_room(p: &LimitParams, ks: &KeyState, ctx: &Ctx, side: BandSide) -> u64 {
    let hot = ks.hot.as_deref();
    match side {
        BandSide::Whole => 0,
        BandSide::End => {
            let next = allowance(p, ks, ks.window.next(), ctx).units;
            next.saturating_sub(hot.map_or(0, |h| h.carry_units))
        }
        BandSide::Start => match hot.and_then(|h| h.prev) {
            Some(prev) if ks.window.0 > 0 => {
                let before = WindowIndex(ks.window.0 - 1);
                let held = prev_allowance(p, ctx, before, prev.explicit_units);
                let held = start_band_share(p, ctx, held);
                held.saturating_sub(prev.net_units.saturating_add(prev.band_units))
            }
            _ => 0,
        },
    }
}

/// What the window before may count of a start-band admission. Under a sliding window a unit
/// in the band may lie, on the coordinator's clock, in the last `e` of the window before,
/// where the window before that one still weighs up to `e / W` of the quota: the band counts
/// against the allowance scaled by `1 - e / W`, which that weight can never exceed (D54).
fn start_band_share(p: &LimitParams, ctx: &Ctx, held_units: u64) -> u64 {
    let Some(e) = ctx.edge_band.filter(|_| p.is_sliding()) else {
        return held_units;
    };
    let w = u128::from(duration_nanos(p.window_len()).max(1));
    let kept = w.saturating_sub(u128::from(duration_nanos(e)));
    // At most `held_units`, so it fits.
    u64::try_from(u128::from(held_units) * kept / w).unwrap_or(held_units)
}

/// The allowance the window before held, as [`held_allowance`] would have given it (its
/// explicit grant, else the default share while the view is fresh or the policy keeps it),
/// and nothing where a restored start shuts it.
fn prev_allowance(p: &LimitParams, ctx: &Ctx, before: WindowIndex, explicit: Option<u64>) -> u64 {
    if ctx.restore.shuts(p.window_start(before)) {
        return 0;
    }
    if let Some(units) = explicit {
        return units;
    }
    if !ctx.view_expired {
        return p.default_units;
    }
    match p.spec.partition_policy {
        PartitionPolicy::Floor | PartitionPolicy::Open { .. } => p.default_units,
        // Closed: the window held what it used, no more.
        PartitionPolicy::Closed => 0,
    }
}

/// `want` cut to what the neighbouring window can count (`None`: it cannot count any of it).
fn within_band_room(want: Want, room_units: u64) -> Option<Want> {
    match want {
        Want::Exact(cost) => (cost <= room_units).then_some(want),
        Want::UpTo { units, min_units } => {
            let units = units.min(room_units);
            (units > 0 && units >= min_units).then_some(Want::UpTo { units, min_units })
        }
    }
}

/// Count `units` admitted in `side`'s band against the neighbouring window too.
fn count_in_band(ks: &mut KeyState, side: BandSide, units: u64) {
    if units == 0 {
        return;
    }
    let hot = ks.hot_mut();
    match side {
        BandSide::End => hot.carry_units = hot.carry_units.saturating_add(units),
        BandSide::Start => {
            let prev = hot.prev.as_mut();
            debug_assert!(prev.is_some(), "start-band units admitted with no room");
            if let Some(prev) = prev {
                prev.band_units = prev.band_units.saturating_add(units);
            }
        }
        BandSide::Whole => debug_assert!(false, "nothing is admitted in a whole-window band"),
    }
}

/// The latest expiry a lease of a strict limit granted in `window` may have: the window's end
/// less the edge band, so that every unit of it is spent inside the window on the
/// coordinator's clock too.
pub(crate) fn guarded_window_end(p: &LimitParams, ctx: &Ctx, window: WindowIndex) -> Timestamp {
    let end = p.window_end(window);
    match ctx.edge_band {
        Some(e) if !p.is_eventual() && !p.spec.shadow_mode => end.saturating_sub(e),
        _ => end,
    }
}

/// Charge an admitted plan: counters, fail-open excess, and the GCRA states it moved.
fn charge(ks: &mut KeyState, a: &Allowance, plan: &Plan, stats: Option<&mut WindowStats>) {
    let n_before = ks.net_units();
    ks.granted_units = ks.granted_units.saturating_add(plan.units);
    if plan.fail_open_units > 0 {
        let hot = ks.hot_mut();
        hot.excess_units += plan.fail_open_units;
        hot.fail_open_units += plan.fail_open_units;
        if let Some(s) = stats {
            s.add_fail_open(plan.fail_open_units);
        }
    }
    if let Some(s) = plan.rate_state {
        ks.hot_mut().rate = Some(s);
    }
    if let Some(s) = plan.open_state {
        ks.hot_mut().open_rate = Some(s);
    }
    // Invariant 1: only the recorded fail-open part may exceed the allowance.
    debug_assert!(ks.net_units() <= a.units.max(n_before) + plan.fail_open_units);
}

/// What the checks allow, before anything is charged (GCRA states are copies).
struct Plan {
    units: u64,
    fail_open_units: u64,
    reason: Reason,
    refusal: Option<(Reason, Option<Duration>)>,
    rate_state: Option<GcraState>,
    open_state: Option<GcraState>,
}

impl Plan {
    fn refused(reason: Reason, retry_after: Option<Duration>) -> Plan {
        Plan {
            units: 0,
            fail_open_units: 0,
            reason,
            refusal: Some((reason, retry_after)),
            rate_state: None,
            open_state: None,
        }
    }
}

/// The open policy's caps for the key at `now`, if the limit has that policy. The window's
/// time open is what the statistics hold plus the expired stretch not yet added to them, both
/// on this region's clock: exactly what the region reports as its time open, so the budget is
/// never above the bound's fail-open term for the window.
fn open_cap(
    p: &LimitParams,
    ks: &KeyState,
    stats: &LimitStats,
    ctx: &Ctx,
    now: Timestamp,
) -> Option<OpenCap> {
    let (PartitionPolicy::Open { rate }, Some(gcra)) = (p.spec.partition_policy, p.open_rate)
    else {
        return None;
    };
    let accounted = stats
        .window(ks.window)
        .map_or(Duration::ZERO, |s| s.time_open);
    let pending = ctx.open_from.map_or(Duration::ZERO, |from| {
        now.saturating_duration_since(from.max(p.window_start(ks.window)))
    });
    let spent = ks.hot.as_ref().map_or(0, |h| h.fail_open_units);
    let budget = rate.max_units_over(accounted.saturating_add(pending));
    Some(OpenCap {
        gcra,
        rate,
        left_units: budget.saturating_sub(spent),
    })
}

fn plan_exact(
    p: &LimitParams,
    ks: &KeyState,
    a: &Allowance,
    open: Option<OpenCap>,
    now: Timestamp,
    cost: u64,
) -> Plan {
    let head = a.units.saturating_sub(ks.net_units());
    let mut plan = Plan {
        units: cost,
        fail_open_units: 0,
        reason: a.reason,
        refusal: None,
        rate_state: None,
        open_state: None,
    };
    if cost > head {
        let beyond = cost - head;
        match open {
            Some(o) => {
                if beyond > o.left_units {
                    let retry = o.budget_retry(beyond - o.left_units);
                    return Plan::refused(Reason::PartitionOpen, retry);
                }
                let mut s = open_state(ks);
                if let GcraDecision::Denied { retry_after, .. } = o.gcra.check(&mut s, now, beyond)
                {
                    return Plan::refused(Reason::PartitionOpen, retry_after);
                }
                plan.open_state = Some(s);
                plan.fail_open_units = beyond;
                plan.reason = Reason::PartitionOpen;
            }
            None => return Plan::refused(a.reason, allowance_retry_after(p, ks, now, cost)),
        }
    }
    if let Some(g) = p.rate {
        let mut s = rate_state(ks);
        if let GcraDecision::Denied { retry_after, .. } = g.check(&mut s, now, cost) {
            return Plan::refused(Reason::RateCap, retry_after);
        }
        plan.rate_state = Some(s);
    }
    plan
}

/// What a lease asks for: up to `units`, and nothing at all if fewer than `min_units` fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LeaseRange {
    units: u64,
    min_units: u64,
}

fn plan_up_to(
    p: &LimitParams,
    ks: &KeyState,
    a: &Allowance,
    open: Option<OpenCap>,
    now: Timestamp,
    want: LeaseRange,
) -> Plan {
    let head = a.units.saturating_sub(ks.net_units());
    let min = want.min_units.max(1);
    let mut cap = want.units;
    if let Some(g) = p.rate {
        cap = cap.min(g.remaining(&rate_state(ks), now));
        if cap < min {
            return Plan::refused(Reason::RateCap, gcra_retry(&g, rate_state(ks), now, min));
        }
    }
    let within = cap.min(head);
    let mut beyond = 0;
    if let Some(o) = open {
        let by_rate = o.gcra.remaining(&open_state(ks), now);
        beyond = (cap - within).min(by_rate).min(o.left_units);
        if within + beyond < min {
            // The open caps are what falls short: they must pass what the allowance cannot.
            let short = min - within;
            let retry = if short > o.left_units {
                o.budget_retry(short - o.left_units)
            } else {
                gcra_retry(&o.gcra, open_state(ks), now, short)
            };
            return Plan::refused(Reason::PartitionOpen, retry);
        }
    }
    let units = within + beyond;
    if units < min {
        return Plan::refused(a.reason, allowance_retry_after(p, ks, now, min));
    }
    // Both checks pass by construction (units <= remaining); they move the states.
    let charge = |g: Option<Gcra>, mut s: GcraState, c: u64| {
        g.filter(|_| c > 0).map(|g| {
            let d = g.check(&mut s, now, c);
            debug_assert!(d.is_allowed());
            s
        })
    };
    Plan {
        units,
        fail_open_units: beyond,
        reason: if beyond > 0 {
            Reason::PartitionOpen
        } else {
            a.reason
        },
        refusal: None,
        rate_state: charge(p.rate, rate_state(ks), units),
        open_state: charge(p.open_rate, open_state(ks), beyond),
    }
}

fn rate_state(ks: &KeyState) -> GcraState {
    ks.hot.as_ref().and_then(|h| h.rate).unwrap_or_default()
}

fn open_state(ks: &KeyState) -> GcraState {
    ks.hot
        .as_ref()
        .and_then(|h| h.open_rate)
        .unwrap_or_default()
}

/// When `units` would pass the GCRA, without charging them; `None` when they never can
/// (more than the burst).
fn gcra_retry(g: &Gcra, mut s: GcraState, now: Timestamp, units: u64) -> Option<Duration> {
    match g.check(&mut s, now, units) {
        GcraDecision::Denied { retry_after, .. } => retry_after,
        GcraDecision::Allowed { .. } => Some(Duration::ZERO),
    }
}

/// Retry-after of an allowance refusal: the window's end, when the counters restart. (A
/// coordinated region may be granted more sooner; the hint stays the one certain time.)
/// `None` when the cost is above the whole quota, so no window can ever admit it.
pub(crate) fn allowance_retry_after(
    p: &LimitParams,
    ks: &KeyState,
    now: Timestamp,
    cost: u64,
) -> Option<Duration> {
    if cost > p.quota_units() {
        return None;
    }
    let reset = p.window_end(ks.window).saturating_duration_since(now);
    Some(reset)
}

/// Escalate when refused, when an eventual counter passes its default share, or when the
/// projected use by the window's end exceeds the allowance. Returns true on the transition.
fn escalate_if_needed(
    p: &LimitParams,
    ks: &mut KeyState,
    a: &Allowance,
    ctx: &Ctx,
    now: Timestamp,
    denied: bool,
) -> bool {
    if !ctx.coordinated || p.is_unmetered() || ks.hot.as_ref().is_some_and(|h| h.escalated) {
        return false;
    }
    let n = ks.net_units();
    let hot_eventual = p.is_eventual() && n > p.default_units;
    if denied || hot_eventual || projected_units(p, ks, now, ctx.sync_interval) > a.units {
        ks.hot_mut().escalated = true;
        return true;
    }
    false
}

/// Units requested so far in the key's window (net use plus refused units, less what the
/// window before's end band carried into it: requested there).
fn requested_units(ks: &KeyState) -> u64 {
    let (denied, carried_in) = ks
        .hot
        .as_ref()
        .map_or((0, 0), |h| (h.denied_units, h.carried_in_units));
    ks.net_units()
        .saturating_add(denied)
        .saturating_sub(carried_in)
}

/// Elapsed time the demand estimate divides by: time since the window began, but at least
/// one sync interval and `window / DEMAND_WARMUP_DIVISOR`.
fn demand_elapsed_nanos(
    p: &LimitParams,
    ks: &KeyState,
    now: Timestamp,
    sync_interval: Duration,
) -> u64 {
    let elapsed = duration_nanos(now.saturating_duration_since(p.window_start(ks.window)));
    let warmup = duration_nanos(p.window_len()) / u64::from(DEMAND_WARMUP_DIVISOR);
    elapsed
        .max(warmup)
        .max(duration_nanos(sync_interval))
        .max(1)
}

/// The window has run long enough (one sync interval and `window / DEMAND_WARMUP_DIVISOR`)
/// for its demand estimate to stand on its own, without the warm-up floor.
pub(crate) fn demand_warmed_up(
    p: &LimitParams,
    ks: &KeyState,
    now: Timestamp,
    sync_interval: Duration,
) -> bool {
    let elapsed = duration_nanos(now.saturating_duration_since(p.window_start(ks.window)));
    elapsed >= demand_elapsed_nanos(p, ks, now, sync_interval)
}

/// Demand: units requested this window (refused ones included) per second of the window so
/// far (see [`demand_elapsed_nanos`]), in millionths of a unit (a slow key of a long window
/// asks for less than one unit a second and must not read as no demand). `unspent_units` of outstanding leases are probably not
/// spent yet: gateways lease ahead of their use, and early in a short window what they hold
/// would otherwise read as a rate several times the real one.
pub(crate) fn demand_micro_units_per_sec(
    p: &LimitParams,
    ks: &KeyState,
    now: Timestamp,
    sync_interval: Duration,
    unspent_units: u64,
) -> u64 {
    let elapsed = demand_elapsed_nanos(p, ks, now, sync_interval);
    let requested = requested_units(ks).saturating_sub(unspent_units);
    let rate = u128::from(requested) * MICRO_UNITS_PER_UNIT * 1_000_000_000 / u128::from(elapsed);
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// `n_r + demand rate * time left in the window`.
pub(crate) fn projected_units(
    p: &LimitParams,
    ks: &KeyState,
    now: Timestamp,
    sync_interval: Duration,
) -> u64 {
    let elapsed = demand_elapsed_nanos(p, ks, now, sync_interval);
    let left = duration_nanos(p.window_end(ks.window).saturating_duration_since(now));
    let more = u128::from(requested_units(ks)) * u128::from(left) / u128::from(elapsed);
    ks.net_units()
        .saturating_add(u64::try_from(more).unwrap_or(u64::MAX))
}
