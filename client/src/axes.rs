//! Several axes of one request decided as one call: requests and tokens per minute, input
//! and output tokens, a tenant's and its user's budgets. Every axis is spent or none is.
//!
//! The shards of the call's keys are locked together, in index order (so two calls never
//! wait on each other in a cycle), every axis is checked with `Gateway::can_spend`, and only
//! then is each spent: a concurrent spender sees all of the call's units taken or none. An
//! axis that cannot pay asks for its lease as a single spend would; the call waits for it and
//! tries again. Nothing here allocates: axes live in fixed arrays.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Duration;

use allot_core::gateway::{Gateway, KeyHandle, Spend};
use allot_core::time::Timestamp;

use crate::client::{Client, Decision, Key, Reservation, SPEND_WAIT_TIMEOUTS};
use crate::error::{Error, Result};

/// Most axes in one call: a bound on the locks one call holds at once.
pub const MAX_AXES: usize = 8;

/// The axes of one request: a key and its units each, at most [`MAX_AXES`], no key twice.
#[derive(Clone, Copy, Debug)]
pub struct Axes<'a> {
    axes: [Option<(&'a Key, u64)>; MAX_AXES],
    len: usize,
}

impl Default for Axes<'_> {
    fn default() -> Self {
        Axes::new()
    }
}

impl<'a> Axes<'a> {
    pub fn new() -> Self {
        Axes {
            axes: [None; MAX_AXES],
            len: 0,
        }
    }

    /// Adds `units` (0 read as 1) of `key`. A key named twice would be checked twice against
    /// one lease; past [`MAX_AXES`] the call would hold too many locks: both are refused.
    pub fn axis(mut self, key: &'a Key, units: u64) -> Result<Self> {
        if self.len == MAX_AXES {
            return Err(Error::Axes(format!("at most {MAX_AXES} axes per call")));
        }
        if self.iter().any(|(k, _)| k.same_key(key)) {
            return Err(Error::Axes(format!(
                "key {} named twice: one axis per key",
                key.name()
            )));
        }
        self.axes[self.len] = Some((key, units.max(1)));
        self.len += 1;
        Ok(self)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn iter(&self) -> impl Iterator<Item = (&'a Key, u64)> + '_ {
        self.axes[..self.len].iter().flatten().copied()
    }
}

/// The reservations of one call's axes, in the order the axes were named; give them to
/// [`Client::settle_all`]. Dropped unsettled, each counts as used in full.
#[derive(Debug)]
#[must_use = "settle the reservations with the units actually used"]
pub struct Reservations {
    parts: [Option<Reservation>; MAX_AXES],
    len: usize,
}

impl Reservations {
    /// The units reserved on axis `i` (0 past the last).
    pub fn units(&self, i: usize) -> u64 {
        self.parts
            .get(i)
            .and_then(Option::as_ref)
            .map_or(0, Reservation::units)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What one locked attempt at every axis came to.
// Boxing the reservations would allocate on the fast path; the value lives on the stack for
// one call.
#[allow(clippy::large_enum_variant)]
enum Attempt {
    Spent(Reservations),
    Decided(Decision),
    /// An axis waits for its lease: the shard to wait on.
    Wait(usize),
}

impl Client {
    /// Decides one request over every axis of `axes`: `Allowed` when each was spent from its
    /// held lease, otherwise the first refusal and nothing spent on any axis.
    pub async fn spend_all(&self, axes: &Axes<'_>) -> Decision {
        match self.reserve_all(axes).await {
            Ok(r)
                if r.parts
                    .iter()
                    .flatten()
                    .any(|p| p.admitted_by_failure_mode()) =>
            {
                Decision::Unavailable { allowed: true }
            }
            Ok(_) => Decision::Allowed,
            Err(d) => d,
        }
    }

    /// The synchronous fast path of [`Client::spend_all`]: `None` when some axis has no lease
    /// that pays and the caller would have to wait for the agent (nothing is spent then).
    pub fn try_spend_all(&self, axes: &Axes<'_>) -> Option<Decision> {
        match self.attempt_all(axes) {
            Attempt::Spent(r)
                if r.parts
                    .iter()
                    .flatten()
                    .any(|p| p.admitted_by_failure_mode()) =>
            {
                Some(Decision::Unavailable { allowed: true })
            }
            Attempt::Spent(_) => Some(Decision::Allowed),
            Attempt::Decided(d) => Some(d),
            Attempt::Wait(_) => {
                self.shared.wake_driver.notify_one();
                None
            }
        }
    }

    /// Reserves every axis of `axes` or none (an estimate each: input plus the most output
    /// tokens, one request). `Err` is the refusal of some axis; no axis is spent then. An
    /// axis its failure mode admits while the agent is unreachable is reserved unpaid.
    pub async fn reserve_all(&self, axes: &Axes<'_>) -> Result<Reservations, Decision> {
        let wait = self.shared.config.gateway.lease_request_timeout;
        let deadline = tokio::time::Instant::now() + wait * SPEND_WAIT_TIMEOUTS;
        let mut waiting_on = None;
        loop {
            if tokio::time::Instant::now() >= deadline {
                return Err(self.failure_mode_of_axes(axes));
            }
            // Registered before the attempt, so an answer between the two is not missed.
            let answered = waiting_on.map(|s: usize| self.shared.shards[s].answered.notified());
            tokio::pin!(answered);
            if let Some(a) = answered.as_mut().as_pin_mut() {
                a.enable();
            }
            match self.attempt_all(axes) {
                Attempt::Spent(r) => return Ok(r),
                Attempt::Decided(d) => return Err(d),
                Attempt::Wait(shard) if waiting_on == Some(shard) => {
                    self.shared.wake_driver.notify_one();
                    if let Some(a) = answered.as_pin_mut() {
                        // A timeout is not an error: the next attempt sees what was decided.
                        let _ = tokio::time::timeout_at(deadline, a).await;
                    }
                }
                // First wait on this shard: register for its answer, then try again.
                Attempt::Wait(shard) => waiting_on = Some(shard),
            }
        }
    }

    /// Settles each reservation at `actual_units[i]`; an axis with no figure given counts as
    /// used in full (its reservation stands).
    pub fn settle_all(&self, reservations: Reservations, actual_units: &[u64]) {
        for (i, part) in reservations.parts.into_iter().enumerate() {
            if let Some(r) = part {
                let actual = actual_units.get(i).copied().unwrap_or(r.units());
                self.settle(r, actual);
            }
        }
    }

    fn attempt_all(&self, axes: &Axes<'_>) -> Attempt {
        let now = self.shared.now();
        let mut locks = Locks::new(self, axes);
        let mut handles = [KeyHandle::from_bits(0); MAX_AXES];
        for (i, (key, _)) in axes.iter().enumerate() {
            match locks.handle(now, key) {
                Some(h) => handles[i] = h,
                None => return Attempt::Decided(self.key_failure_mode(key)),
            }
        }
        let payable = |locks: &mut Locks<'_>, i: usize, key: &Key, units: u64| {
            locks.gateway(key.shard).can_spend(now, handles[i], units)
        };
        let mut all = true;
        for (i, (key, units)) in axes.iter().enumerate() {
            all &= payable(&mut locks, i, key, units);
        }
        let mut parts: [Option<Reservation>; MAX_AXES] = Default::default();
        if !all {
            // Each axis that cannot pay asks for its lease now (in parallel), and says why.
            let mut wait = None;
            let mut unpaid_ok = [false; MAX_AXES];
            for (i, (key, units)) in axes.iter().enumerate() {
                if payable(&mut locks, i, key, units) {
                    continue;
                }
                match locks.gateway(key.shard).try_spend(now, handles[i], units) {
                    Spend::Denied { retry_after } => return denied(retry_after),
                    Spend::Wait => wait = wait.or(Some(key.shard)),
                    Spend::Unavailable | Spend::UnknownKey => match self.key_failure_mode(key) {
                        Decision::Unavailable { allowed: true } => unpaid_ok[i] = true,
                        d => return Attempt::Decided(d),
                    },
                    Spend::Spent(_) => unreachable_spent(),
                }
            }
            if let Some(shard) = wait {
                return Attempt::Wait(shard);
            }
            // Every axis that could not pay is admitted by its open failure mode.
            for (i, (_, units)) in axes.iter().enumerate() {
                if unpaid_ok[i] {
                    parts[i] = Some(Reservation::unpaid(units));
                }
            }
        }
        for (i, (key, units)) in axes.iter().enumerate() {
            if parts[i].is_some() {
                continue;
            }
            match locks.gateway(key.shard).try_spend(now, handles[i], units) {
                Spend::Spent(receipt) => parts[i] = Some(Reservation::paid(key.shard, receipt)),
                // Checked under the same locks at the same instant: it pays.
                _ => unreachable_unpaid(),
            }
        }
        drop(locks);
        Attempt::Spent(Reservations {
            parts,
            len: axes.len(),
        })
    }

    /// The failure mode's decision for a call none of whose keys could be asked in time: the
    /// strictest of its axes' modes (one closed axis refuses).
    fn failure_mode_of_axes(&self, axes: &Axes<'_>) -> Decision {
        let closed = axes
            .iter()
            .find(|(k, _)| k.failure_mode() == allot_core::limit::FailureMode::Closed);
        let (key, _) = closed
            .or_else(|| axes.iter().next())
            .unwrap_or_else(no_axes);
        self.key_failure_mode(key)
    }
}

fn denied(retry_after: Duration) -> Attempt {
    Attempt::Decided(Decision::Denied { retry_after })
}

/// `try_spend` of an axis `can_spend` said cannot pay, under the same locks at the same
/// instant, cannot spend; were it to, the units would be spent with the others refused.
#[cold]
fn unreachable_spent() -> ! {
    panic!("a lease paid for an axis that could not pay")
}

#[cold]
fn unreachable_unpaid() -> ! {
    panic!("an axis that could pay was refused under the same locks")
}

#[cold]
fn no_axes<'a>() -> (&'a Key, u64) {
    panic!("a call with no axes reached its failure mode")
}

/// The shards of one call's keys, locked in index order; each shard once.
struct Locks<'c> {
    guards: [Option<(usize, MutexGuard<'c, Gateway>)>; MAX_AXES],
}

impl<'c> Locks<'c> {
    fn new(client: &'c Client, axes: &Axes<'_>) -> Self {
        let mut shards = [usize::MAX; MAX_AXES];
        for (i, (key, _)) in axes.iter().enumerate() {
            shards[i] = key.shard;
        }
        shards.sort_unstable();
        let mut guards: [Option<(usize, MutexGuard<'c, Gateway>)>; MAX_AXES] = Default::default();
        let mut n = 0;
        for (i, &s) in shards.iter().enumerate() {
            if s == usize::MAX || (i > 0 && shards[i - 1] == s) {
                continue;
            }
            guards[n] = Some((s, client.shared.shards[s].lock()));
            n += 1;
        }
        Locks { guards }
    }

    fn gateway(&mut self, shard: usize) -> &mut Gateway {
        let guard = self
            .guards
            .iter_mut()
            .flatten()
            .find(|(s, _)| *s == shard)
            .map(|(_, g)| g);
        match guard {
            Some(g) => g,
            None => unreachable_unlocked(),
        }
    }

    /// The key's live handle in its gateway, adding the key again if it was forgotten while
    /// idle (rare, and the only allocation here); `None` when it cannot be added.
    fn handle(&mut self, now: Timestamp, key: &Key) -> Option<KeyHandle> {
        let handle = KeyHandle::from_bits(key.handle.load(Ordering::Relaxed));
        let gateway = self.gateway(key.shard);
        // Its units back in the leases first: an axis decides from the leases alone.
        if let Some(chunk) = &key.chunk {
            chunk.settle(gateway, now);
        }
        if gateway.contains(handle) {
            return Some(handle);
        }
        let h = gateway.key(now, &key.limit, &key.key).ok()?;
        key.handle.store(h.to_bits(), Ordering::Relaxed);
        Some(h)
    }
}

#[cold]
fn unreachable_unlocked() -> ! {
    panic!("every axis's shard is locked by the call")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use allot_core::gateway::{LeaseDenial, LeaseGrant, ToAgent};
    use allot_core::ids::LeaseId;

    use super::*;
    use crate::{ClientConfig, Target};

    /// A client with no driver whose keys are granted by hand, refilling nothing by itself.
    fn client() -> Client {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config.gateway.refill_threshold_percent = 0;
        Client::detached(config).expect("client").0
    }

    fn key(client: &Client, name: &str) -> Key {
        client
            .key(&Target::new("llm").entry(name, "tenant-1"))
            .expect("key")
    }

    /// Answers the key's lease request: a grant of `units`, or a denial when `None`.
    fn answer(client: &Client, key: &Key, units: Option<u64>) {
        let now = client.shared.now();
        let mut gateway = client.shared.shards[key.shard].lock();
        let wanted = std::iter::from_fn(|| gateway.poll_transmit(now)).find_map(|m| match m {
            ToAgent::LeaseWanted(w) => Some(w),
            _ => None,
        });
        let w = wanted.expect("the key asked for a lease");
        match units {
            Some(units) => gateway.handle_lease_granted(
                now,
                w.ticket,
                LeaseGrant {
                    lease: LeaseId(1 + key.shard as u64),
                    units,
                    ttl: Duration::from_secs(60),
                    remaining_units: 1_000_000,
                },
            ),
            None => gateway.handle_lease_denied(
                now,
                w.ticket,
                LeaseDenial {
                    retry_after: Duration::from_secs(5),
                },
            ),
        }
    }

    /// A key with `units` held: asked once, granted by hand.
    fn stocked(client: &Client, name: &str, units: u64) -> Key {
        let k = key(client, name);
        assert_eq!(client.try_spend(&k, units + 1), None, "no lease yet");
        answer(client, &k, Some(units));
        k
    }

    #[test]
    fn axes_are_bounded_and_name_each_key_once() {
        let client = client();
        let a = key(&client, "requests");
        let again = key(&client, "requests");
        let axes = Axes::new().axis(&a, 1).expect("one axis");
        assert!(matches!(axes.axis(&again, 1), Err(Error::Axes(_))));
        let keys: Vec<Key> = (0..=MAX_AXES)
            .map(|i| key(&client, &format!("k{i}")))
            .collect();
        let mut axes = Axes::new();
        for k in &keys[..MAX_AXES] {
            axes = axes.axis(k, 1).expect("within the bound");
        }
        assert!(matches!(axes.axis(&keys[MAX_AXES], 1), Err(Error::Axes(_))));
    }

    /// One axis refused by the agent: the call is refused and the other axis keeps every unit.
    #[tokio::test]
    async fn a_refused_axis_spends_no_other_axis() {
        let client = client();
        let requests = stocked(&client, "requests", 100);
        let tokens = key(&client, "tokens");
        let axes = Axes::new()
            .axis(&requests, 1)
            .and_then(|a| a.axis(&tokens, 500))
            .expect("axes");
        assert_eq!(
            client.try_spend_all(&axes),
            None,
            "tokens have no lease yet"
        );
        assert_eq!(
            client.held_units(&requests),
            100,
            "nothing spent while waiting"
        );
        answer(&client, &tokens, None);
        let refused = client.reserve_all(&axes).await.expect_err("tokens refused");
        assert!(matches!(refused, Decision::Denied { .. }), "{refused:?}");
        assert_eq!(
            client.held_units(&requests),
            100,
            "the requests axis kept its unit"
        );
    }

    /// Reserve input plus the most output on two axes, settle the actual on each.
    #[tokio::test]
    async fn reserved_axes_settle_each_at_its_actual() {
        let client = client();
        let input = stocked(&client, "input_tokens", 1_000);
        let output = stocked(&client, "output_tokens", 1_000);
        let axes = Axes::new()
            .axis(&input, 300)
            .and_then(|a| a.axis(&output, 200))
            .expect("axes");
        let r = client.reserve_all(&axes).await.expect("reserved");
        assert_eq!((r.units(0), r.units(1)), (300, 200));
        assert_eq!(
            (client.held_units(&input), client.held_units(&output)),
            (700, 800)
        );
        client.settle_all(r, &[250, 40]);
        assert_eq!(
            (client.held_units(&input), client.held_units(&output)),
            (750, 960)
        );
    }

    /// Threads spending one request and 7 tokens per call on shared keys: the tokens run out
    /// first, and every call the tokens refused left its request unit in place, so the
    /// requests axis lost exactly one unit per admitted call.
    #[test]
    fn concurrent_spenders_spend_every_axis_or_none() {
        const SPENDERS: usize = 4;
        const TOKENS_PER_CALL: u64 = 7;
        let client = Arc::new(client());
        let requests = Arc::new(stocked(&client, "requests", 1_000));
        let tokens = Arc::new(stocked(&client, "tokens", 5_000));
        let spenders: Vec<_> = (0..SPENDERS)
            .map(|_| {
                let (client, requests, tokens) = (client.clone(), requests.clone(), tokens.clone());
                std::thread::spawn(move || {
                    let axes = Axes::new()
                        .axis(&requests, 1)
                        .and_then(|a| a.axis(&tokens, TOKENS_PER_CALL))
                        .expect("axes");
                    let mut admitted = 0u64;
                    while client.try_spend_all(&axes) == Some(Decision::Allowed) {
                        admitted += 1;
                    }
                    admitted
                })
            })
            .collect();
        let admitted: u64 = spenders
            .into_iter()
            .map(|s| s.join().expect("spender"))
            .sum();
        assert_eq!(admitted, 5_000 / TOKENS_PER_CALL);
        assert_eq!(client.held_units(&tokens), 5_000 % TOKENS_PER_CALL);
        assert_eq!(client.held_units(&requests), 1_000 - admitted);
    }
}
