//! Property tests: one region fed random interleavings of gateway calls (with retried request
//! ids), timeouts and SyncDowns (random grants and release requests with random epochs,
//! duplicated, reordered, dropped), checked against a plain model after every step.

use std::collections::{BTreeMap, BTreeSet};

use crdts::{CmRDT, CvRDT, Dot, VClock};
use proptest::prelude::*;

use super::*;
use crate::budget::persist::PersistRecord;
use crate::budget::{LeaseOutcome, Outcome};
use crate::error::Error;
use crate::ids::LeaseId;
use crate::limit::Consistency;
use crate::sync::CounterEntry;

const KEYS: [&str; 3] = ["a", "b", "c"];
/// Default share of L = 400 over four regions.
const DEFAULT_UNITS: u64 = 100;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        key: usize,
        cost: u64,
        rid: Option<u128>,
    },
    Lease {
        key: usize,
        units: u64,
        ttl_ms: u64,
        rid: Option<u128>,
    },
    Renew {
        pick: usize,
        ttl_ms: u64,
        rid: Option<u128>,
    },
    Release {
        pick: usize,
        unused_pct: u64,
        rid: Option<u128>,
    },
    Settle {
        pick: usize,
        actual: u64,
        rid: Option<u128>,
    },
    Advance {
        ms: u64,
    },
    Sync {
        answer: Answer,
    },
    Deliver {
        pick: usize,
        keep: bool,
    },
}

/// What the coordinator puts in its answer; windows are the SyncUp's window or the next.
#[derive(Clone, Debug)]
struct Answer {
    grants: Vec<(usize, u64, u64, bool)>,
    releases: Vec<(usize, u64, u64, bool)>,
    entries: Vec<(usize, bool, u64, u64)>,
}

/// Request ids from a small pool per kind, so that retries happen often and never cross kinds.
fn rid(kind: u128) -> impl Strategy<Value = Option<u128>> {
    prop::option::of((0u128..4).prop_map(move |r| kind * 100 + r))
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let answer = (
        prop::collection::vec((0..3usize, 0..300u64, 0..6u64, any::<bool>()), 0..3),
        prop::collection::vec((0..3usize, 0..150u64, 0..6u64, any::<bool>()), 0..3),
        prop::collection::vec((0..3usize, any::<bool>(), 0..200u64, 0..50u64), 0..3),
    )
        .prop_map(|(grants, releases, entries)| Answer {
            grants,
            releases,
            entries,
        });
    prop_oneof![
        4 => (key.clone(), 1..60u64, rid(1)).prop_map(|(key, cost, rid)| Op::Acquire { key, cost, rid }),
        4 => (key, 1..80u64, 1..20_000u64, rid(2))
            .prop_map(|(key, units, ttl_ms, rid)| Op::Lease { key, units, ttl_ms, rid }),
        1 => (any::<usize>(), 1..20_000u64, rid(3)).prop_map(|(pick, ttl_ms, rid)| Op::Renew { pick, ttl_ms, rid }),
        2 => (any::<usize>(), 0..=100u64, rid(4))
            .prop_map(|(pick, unused_pct, rid)| Op::Release { pick, unused_pct, rid }),
        2 => (any::<usize>(), 0..120u64, rid(5)).prop_map(|(pick, actual, rid)| Op::Settle { pick, actual, rid }),
        3 => (0..8_000u64).prop_map(|ms| Op::Advance { ms }),
        1 => (50_000..130_000u64).prop_map(|ms| Op::Advance { ms }),
        2 => answer.prop_map(|answer| Op::Sync { answer }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, keep)| Op::Deliver { pick, keep }),
    ]
}

#[derive(Clone, Copy, Debug)]
struct ModelLease {
    id: LeaseId,
    key: usize,
    window: WindowIndex,
    units: u64,
}

/// The budget under test and a plain model of what it must hold.
struct Harness {
    b: RegionBudget,
    now: Timestamp,
    /// Expected net use per (key, window): acquires plus what each distinct lease charged.
    expected_net: BTreeMap<(usize, WindowIndex), i128>,
    leases: Vec<ModelLease>,
    ended: BTreeSet<LeaseId>,
    /// First outcome of each request id, the request it answered and when: a retry of the
    /// same request within the TTL must return it, another request with the id is refused.
    outcomes: BTreeMap<u128, (Timestamp, String, Outcome)>,
    /// SyncDowns in flight, delivered in any order, possibly twice, possibly never.
    network: Vec<SyncDown>,
    next_release_id: u64,
    release_ids: BTreeSet<u64>,
    /// The epoch-ordered allowance register of each counter, by the contract.
    allowances: BTreeMap<(usize, WindowIndex), (u64, Option<u64>)>,
    largest_grant: BTreeMap<(usize, WindowIndex), u64>,
    last_entry: BTreeMap<(CounterRef, RegionId), (u64, u64)>,
    log: Vec<PersistRecord>,
}

impl Harness {
    fn new() -> Self {
        Harness {
            b: budget(vec![per_minute_settling("api", 400, 100)]),
            now: at(45_000),
            expected_net: BTreeMap::new(),
            leases: Vec::new(),
            ended: BTreeSet::new(),
            outcomes: BTreeMap::new(),
            network: Vec::new(),
            next_release_id: 1,
            release_ids: BTreeSet::new(),
            allowances: BTreeMap::new(),
            largest_grant: BTreeMap::new(),
            last_entry: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    fn window(&self) -> WindowIndex {
        WindowIndex(self.now.as_unix_nanos() / 60_000_000_000)
    }

    fn net_now(&self, k: usize) -> u64 {
        match self.b.counter(&lim("api"), &key(KEYS[k])) {
            Some(c) if c.window == self.window() => c.net_units(),
            _ => 0,
        }
    }

    fn allowance_now(&self, k: usize) -> u64 {
        allowance(&self.b, self.now, "api", KEYS[k])
    }

    fn expect(&mut self, k: usize, window: WindowIndex, delta: i128) {
        *self.expected_net.entry((k, window)).or_default() += delta;
    }

    /// A retried id must get its first outcome back when it repeats its request, and be
    /// refused when it comes with another (until the idempotency TTL ends); returns true if
    /// this call was such a retry (so it changed nothing). `request` names the call and every
    /// parameter of it that the machine fingerprints.
    fn replayed(
        &mut self,
        rid: Option<u128>,
        request: String,
        got: std::result::Result<Outcome, &Error>,
    ) -> bool {
        let Some(r) = rid else { return false };
        let ttl = self.b.config().idempotency_ttl;
        match self.outcomes.get(&r) {
            Some((t, first_request, first)) if self.now < *t + ttl => {
                if *first_request == request {
                    assert_eq!(
                        got.ok().as_ref(),
                        Some(first),
                        "a retry returns the original outcome"
                    );
                } else {
                    assert!(
                        matches!(got, Err(Error::IdempotencyConflict { .. })),
                        "{request} reused the id of {first_request}: {got:?}"
                    );
                }
                true
            }
            _ => {
                if let Ok(out) = got {
                    self.outcomes.insert(r, (self.now, request, out));
                }
                false
            }
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Acquire { key: k, cost, rid } => self.acquire(k, cost, rid),
            Op::Lease {
                key: k,
                units,
                ttl_ms,
                rid,
            } => self.lease(k, units, ttl_ms, rid),
            Op::Renew { pick, ttl_ms, rid } => {
                if let Some(l) = self.pick(pick) {
                    let ttl = std::time::Duration::from_millis(ttl_ms);
                    let got = self.b.renew(self.now, l.id, ttl, rid.map(RequestId));
                    let request = format!("renew {:?} {ttl_ms}", l.id);
                    self.replayed(rid, request, got.as_ref().map(|o| Outcome::Renew(*o)));
                }
            }
            Op::Release {
                pick,
                unused_pct,
                rid,
            } => self.release(pick, unused_pct, rid),
            Op::Settle { pick, actual, rid } => self.settle(pick, actual, rid),
            Op::Advance { ms } => {
                self.now = self.now + std::time::Duration::from_millis(ms);
                self.b.handle_timeout(self.now);
            }
            Op::Sync { answer } => self.sync(answer),
            Op::Deliver { pick, keep } => self.deliver(pick, keep),
        }
        self.log.extend(self.b.drain_dirty());
        self.check();
    }

    fn acquire(&mut self, k: usize, cost: u64, rid: Option<u128>) {
        let a_before = self.allowance_now(k);
        let n_before = self.net_now(k);
        let req = AcquireRequest {
            limit: lim("api"),
            key: key(KEYS[k]),
            cost_units: cost,
            request_id: rid.map(RequestId),
        };
        let got = self.b.acquire(self.now, req);
        let request = format!("acquire {k} {cost}");
        if self.replayed(
            rid,
            request,
            got.as_ref().map(|o| Outcome::Acquire(o.clone())),
        ) {
            assert_eq!(self.net_now(k), n_before, "a retry charges nothing");
            return;
        }
        let d = got.expect("acquire");
        if d.allowed {
            let w = self.window();
            self.expect(k, w, i128::from(cost));
            // Invariant 1 at admission: what it let in fit the allowance.
            assert!(
                self.net_now(k) <= a_before,
                "admitted past a_r = {a_before}"
            );
        } else {
            assert_eq!(self.net_now(k), n_before);
        }
    }

    fn lease(&mut self, k: usize, units: u64, ttl_ms: u64, rid: Option<u128>) {
        let a_before = self.allowance_now(k);
        let n_before = self.net_now(k);
        let mut req = lease_req("api", KEYS[k], units, 1);
        req.ttl = std::time::Duration::from_millis(ttl_ms);
        req.request_id = rid.map(RequestId);
        let got = self.b.lease(self.now, req);
        let request = format!("lease {k} {units} {ttl_ms}");
        if self.replayed(
            rid,
            request,
            got.as_ref().map(|o| Outcome::Lease(o.clone())),
        ) {
            assert_eq!(
                self.net_now(k),
                n_before,
                "a retried grant is not charged twice"
            );
            return;
        }
        if let LeaseOutcome::Granted(g) = got.expect("lease") {
            assert!(g.units >= 1 && g.units <= units);
            self.expect(k, g.window, i128::from(g.units));
            self.leases.push(ModelLease {
                id: g.lease,
                key: k,
                window: g.window,
                units: g.units,
            });
            assert!(self.net_now(k) <= a_before, "leased past a_r = {a_before}");
        }
    }

    fn pick(&self, pick: usize) -> Option<ModelLease> {
        (!self.leases.is_empty()).then(|| self.leases[pick % self.leases.len()])
    }

    fn release(&mut self, pick: usize, unused_pct: u64, rid: Option<u128>) {
        let Some(l) = self.pick(pick) else { return };
        let unused = l.units * unused_pct / 100;
        let got = self.b.release(self.now, l.id, unused, rid.map(RequestId));
        let request = format!("release {:?} {unused}", l.id);
        if self.replayed(rid, request, got.as_ref().map(|o| Outcome::Release(*o))) {
            return;
        }
        let Ok(out) = got else { return };
        assert!(self.ended.insert(l.id), "lease {:?} ended twice", l.id);
        assert_eq!(out.refunded_units, unused);
        self.expect(l.key, l.window, -i128::from(unused));
    }

    fn settle(&mut self, pick: usize, actual: u64, rid: Option<u128>) {
        let Some(l) = self.pick(pick) else { return };
        let got = self.b.settle(self.now, l.id, actual, rid.map(RequestId));
        let request = format!("settle {:?} {actual}", l.id);
        if self.replayed(rid, request, got.as_ref().map(|o| Outcome::Settle(*o))) {
            return;
        }
        let Ok(out) = got else { return };
        assert!(self.ended.insert(l.id), "lease {:?} ended twice", l.id);
        assert_eq!(out.refunded_units, l.units.saturating_sub(actual));
        // The limit lets a settle charge up to its reservation again above it.
        let over = actual.saturating_sub(l.units);
        assert_eq!(out.overage_units, over.min(l.units));
        assert_eq!(out.clamped_units, over - out.overage_units);
        let charged = actual.min(l.units + out.overage_units);
        self.expect(l.key, l.window, i128::from(charged) - i128::from(l.units));
    }

    fn sync(&mut self, answer: Answer) {
        self.b.handle_timeout(self.now);
        let Some(up) = self.b.poll_transmit(self.now) else {
            return;
        };
        for e in &up.entries {
            let slot = (e.counter.clone(), e.region.clone());
            let values = (e.granted_units, e.refunded_units);
            if let Some(prev) = self.last_entry.insert(slot, values) {
                assert!(
                    values.0 >= prev.0 && values.1 >= prev.1,
                    "entries never decrease"
                );
            }
        }
        let w = self.window();
        let window = |next: bool| if next { w.next() } else { w };
        let mut down = super::answer(&up, self.now);
        down.grants = answer
            .grants
            .iter()
            .map(|&(k, units, epoch, next)| grant("api", KEYS[k], window(next), units, epoch))
            .collect();
        for &(k, units, epoch, next) in &answer.releases {
            let id = self.next_release_id;
            self.next_release_id += 1;
            down.release_requests
                .push(release_req(id, "api", KEYS[k], window(next), units, epoch));
        }
        down.entries = answer
            .entries
            .iter()
            .map(|&(k, us, g, r)| CounterEntry {
                counter: counter("api", KEYS[k], w),
                region: RegionId::from(if us { "us" } else { "ap" }),
                granted_units: g + r,
                refunded_units: r,
            })
            .collect();
        self.network.push(down);
    }

    fn deliver(&mut self, pick: usize, keep: bool) {
        if self.network.is_empty() {
            return;
        }
        let i = pick % self.network.len();
        let down = if keep {
            self.network[i].clone()
        } else {
            self.network.remove(i)
        };
        let cur = self.window();
        for g in &down.grants {
            let k = KEYS
                .iter()
                .position(|k| *k == g.counter.key.as_str())
                .unwrap_or(0);
            let w = g.counter.window;
            if w < cur {
                continue;
            }
            let largest = self.largest_grant.entry((k, w)).or_default();
            *largest = (*largest).max(g.allowance_units);
            let reg = self.allowances.entry((k, w)).or_insert((0, None));
            if g.epoch.0 > reg.0 {
                *reg = (g.epoch.0, Some(g.allowance_units));
            }
        }
        for r in &down.release_requests {
            if !self.release_ids.insert(r.id) {
                continue;
            }
            let k = KEYS
                .iter()
                .position(|k| *k == r.counter.key.as_str())
                .unwrap_or(0);
            let w = r.counter.window;
            if w < cur {
                continue;
            }
            let n = if w == cur { self.net_now(k) } else { 0 };
            let reg = self.allowances.entry((k, w)).or_insert((0, None));
            if r.epoch.0 > reg.0 {
                let base = reg.1.unwrap_or(DEFAULT_UNITS);
                let after = base - r.units.min(base.saturating_sub(n));
                *reg = (r.epoch.0, Some(after));
            }
        }
        self.b.handle_sync_down(self.now, down);
    }

    fn check(&self) {
        let w = self.window();
        for (k, name) in KEYS.iter().enumerate() {
            let n = self.net_now(k);
            // Invariant 5: net use is exactly acquires plus each distinct lease's charge.
            let expected = self.expected_net.get(&(k, w)).copied().unwrap_or(0);
            assert_eq!(i128::from(n), expected, "key {}", name);
            let a = self.allowance_now(k);
            let reg = self.allowances.get(&(k, w)).and_then(|r| r.1);
            assert_eq!(a, reg.unwrap_or(DEFAULT_UNITS), "allowance of key {}", name);
            // Never above the largest grant or default it was given.
            let largest = self.largest_grant.get(&(k, w)).copied().unwrap_or(0);
            assert!(a <= largest.max(DEFAULT_UNITS));
            if reg.is_none() || !self.largest_grant.contains_key(&(k, w)) {
                // No grant ever lowered a_r below use: only settle overage may exceed it.
                let overage = self
                    .b
                    .stats(&lim("api"))
                    .and_then(|s| s.window(w))
                    .map_or(0, |s| s.settle_overage_units);
                assert!(
                    n <= a + overage,
                    "invariant 1: n {n} > a {a} + overage {overage}"
                );
            }
        }
    }

    fn check_restore(&self) {
        let restored = RegionBudget::restore(
            cfg(),
            vec![per_minute_settling("api", 400, 100)],
            self.log.clone(),
        )
        .expect("restore");
        // The time written is the latest of a batch that changed something; calls since may
        // have changed nothing.
        assert!(restored.time_floor() <= self.b.time_floor());
        let untimed = |b: &RegionBudget| {
            let mut s = b.snapshot();
            s.retain(|r| !matches!(r, PersistRecord::TimeSeen { .. }));
            s
        };
        assert_eq!(untimed(&restored), untimed(&self.b));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn one_region_keeps_its_invariants_under_any_interleaving(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for op in ops {
            h.step(op);
        }
        h.check_restore();
    }

    #[test]
    fn g_counter_merge_is_commutative_associative_and_idempotent(
        a in vclock(), b in vclock(), c in vclock()
    ) {
        let merged = |x: &VClock<RegionId>, y: &VClock<RegionId>| {
            let mut m = x.clone();
            m.merge(y.clone());
            m
        };
        prop_assert_eq!(merged(&a, &b), merged(&b, &a));
        prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
        prop_assert_eq!(merged(&a, &a), a.clone());
        // And the merge is the element-wise max.
        let m = merged(&a, &b);
        for r in ["eu", "us", "ap"].map(RegionId::from) {
            prop_assert_eq!(m.get(&r), a.get(&r).max(b.get(&r)));
        }
    }

    #[test]
    fn the_remote_view_does_not_depend_on_delivery_order_or_duplicates(
        entries in prop::collection::vec((any::<bool>(), 0..200u64, 0..50u64), 1..12),
        order in prop::collection::vec(any::<usize>(), 1..30),
    ) {
        let in_order = view_after(&entries, (0..entries.len()).collect());
        // Any order, with duplicates, as long as every entry arrives at least once.
        let mut any_order: Vec<usize> = order.iter().map(|i| i % entries.len()).collect();
        any_order.extend((0..entries.len()).rev());
        prop_assert_eq!(view_after(&entries, any_order), in_order);
    }
}

fn vclock() -> impl Strategy<Value = VClock<RegionId>> {
    prop::collection::vec((0..3usize, 0..1_000u64), 0..6).prop_map(|dots| {
        let mut v = VClock::new();
        for (r, n) in dots {
            v.apply(Dot::new(RegionId::from(["eu", "us", "ap"][r]), n));
        }
        v
    })
}

/// The eventual-mode allowance of key "k" after delivering `entries` in `order`, one per
/// SyncDown, each answering a fresh SyncUp.
fn view_after(entries: &[(bool, u64, u64)], order: Vec<usize>) -> u64 {
    let mut spec = per_minute("api", 1_000);
    spec.consistency = Consistency::Eventual;
    let mut b = budget(vec![spec]);
    // At the default share of 1,000 / 4 = 250, and one more refused: escalated.
    acquire(&mut b, at(0), "api", "k", 250);
    acquire(&mut b, at(0), "api", "k", 1);
    let mut now = at(0);
    for i in order {
        let (us, g, r) = entries[i];
        let up = b.poll_transmit(now).expect("sync due");
        let mut down = answer(&up, now);
        down.entries = vec![CounterEntry {
            counter: counter("api", "k", minute_window(0)),
            region: RegionId::from(if us { "us" } else { "ap" }),
            granted_units: g + r,
            refunded_units: r,
        }];
        b.handle_sync_down(now, down);
        now = now + std::time::Duration::from_millis(250);
    }
    allowance(&b, now - std::time::Duration::from_millis(250), "api", "k")
}
