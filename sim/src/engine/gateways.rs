//! Traffic and gateways: arrivals, attempts and retries, spends at the gateways, their trips to the
//! agent, sweeps and settles. The hot path.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::gateway::{Gateway, Spend, ToAgent};
use allot_core::ids::LeaseId;
use allot_core::limit::FailureMode;
use allot_core::time::Timestamp;

use crate::clock::{ClockSpec, RegionClock};
use crate::error::Result;
use crate::node::{LeaseAnswer, NodeFactory, RegionNode};
use crate::traffic::Cost;

use super::faults::persist;
use super::{Engine, Event, LeaseReading, MAX_PENDING_RETRIES_PER_SOURCE, PendingSettle, Served};

/// A region's gateways' clock: their agent's clock read through the scenario's
/// `gateway_clock` (an offset and a drift relative to the agent's clock), as a gateway host's
/// clock differs from its agent host's.
#[derive(Clone, Copy, Debug)]
pub(super) struct GatewayClock {
    agent: RegionClock,
    /// From the agent's clock to the gateways'; `None` when they are the same (the default).
    relative: Option<RegionClock>,
}

impl GatewayClock {
    pub(super) fn new(run_start: Timestamp, agent: RegionClock, spec: ClockSpec) -> Self {
        // The relative drift accumulates from the agent's reading of the run's start.
        let relative =
            (spec != ClockSpec::default()).then(|| RegionClock::new(agent.local(run_start), spec));
        GatewayClock { agent, relative }
    }

    /// What the gateways' clock reads at true time `t`. Never decreases as `t` grows.
    #[inline]
    pub(super) fn local(&self, t: Timestamp) -> Timestamp {
        let agent = self.agent.local(t);
        self.relative.map_or(agent, |c| c.local(agent))
    }

    /// The earliest true time at which the gateways' clock reads `local` or later.
    pub(super) fn true_time_of(&self, local: Timestamp) -> Timestamp {
        let agent = self.relative.map_or(local, |c| c.true_time_of(local));
        self.agent.true_time_of(agent)
    }
}

/// Fallback tallies a gateway keeps before forgetting those of windows a report can no
/// longer fall in.
const FALLBACK_TALLIES_KEPT: usize = 4_096;

/// Lease readings kept per region before those of leases granted long ago are forgotten.
const LEASE_READINGS_KEPT: usize = 65_536;

/// How long after its grant a lease's reading is kept past [`LEASE_READINGS_KEPT`]: longer than
/// any lease lives.
const LEASE_READING_HORIZON: Duration = Duration::from_secs(600);

/// Remembers `lease`'s grant; past [`LEASE_READINGS_KEPT`], forgets those granted more than
/// [`LEASE_READING_HORIZON`] ago each time the count reaches a power of two (so the forgetting
/// stays linear overall however many are recent).
fn note_lease_reading(
    readings: &mut BTreeMap<LeaseId, LeaseReading>,
    lease: LeaseId,
    grant: LeaseReading,
) {
    readings.insert(lease, grant);
    if readings.len() > LEASE_READINGS_KEPT && readings.len().is_power_of_two() {
        let horizon = grant.granted_at.saturating_sub(LEASE_READING_HORIZON);
        readings.retain(|_, g| g.granted_at >= horizon);
    }
}

impl<'s, F: NodeFactory> Engine<'s, F> {
    pub(super) fn arrival(&mut self, s: usize) -> Result<()> {
        let start = self.scenario.start.as_unix_nanos();
        let src = &mut self.sources[s];
        let t = self.now.as_unix_nanos() - start;
        if let Some(next) = src.arrivals.next_after(t, &mut src.arrival_rng) {
            self.arrivals
                .push(Reverse((Timestamp::from_unix_nanos(start + next), s)));
        }
        let cost = src.cost.sample(&mut src.client_rng);
        let cost = self.held_to_settle_cap(s, cost);
        self.attempt(s, cost, 0, true)
    }

    /// A reservation's spender stops at the most its limit lets a settle charge (for an LLM
    /// call, `max_tokens`): the `settle_overage` term is stated on that assumption. What the
    /// drawn count wanted beyond it is counted, not used.
    fn held_to_settle_cap(&mut self, s: usize, mut cost: Cost) -> Cost {
        if let Some(settle) = cost.settle.as_mut() {
            let limit = &self.measure.keys[self.sources[s].key].limit;
            let max_use = self.factory.max_use_units(limit, cost.reserve_units);
            let beyond = settle.actual_units.saturating_sub(max_use);
            settle.actual_units -= beyond;
            self.stats.settle_units_beyond_cap += beyond;
        }
        cost
    }

    pub(super) fn attempt(
        &mut self,
        s: usize,
        cost: Cost,
        retries: u32,
        fresh: bool,
    ) -> Result<()> {
        let (key, region) = (self.sources[s].key, self.sources[s].region);
        let units = cost.reserve_units;
        // Demand is what the client will really use: for a reservation, its actual count.
        let demand_units = cost.settle.map_or(units, |s| s.actual_units);
        self.measure
            .request(key, region, self.now, demand_units, fresh);
        self.stats.requests += 1;
        match self.serve(region, key, units)? {
            Served::Admitted {
                gateway,
                receipt,
                local,
            } => {
                self.stats.admitted += 1;
                // Judged per window index on the clock the agent reads windows on.
                let lease = receipt.map(|r| r.lease);
                let corrects = self.factory.corrects_clocks();
                let local = self.regions[region].spend_clock(lease, local, self.now, corrects);
                self.measure.admitted(key, region, self.now, local, units);
                if let Some(settle) = cost.settle {
                    let incarnation = self.regions[region].gateways[gateway].incarnation;
                    let pending = PendingSettle {
                        source: s,
                        gateway,
                        incarnation,
                        receipt,
                        admitted_at: (self.now, local),
                        reserved_units: units,
                        actual_units: settle.actual_units,
                    };
                    self.push(self.now + settle.after, Event::Settle(pending))?;
                }
                Ok(())
            }
            Served::Denied { retry_after } => {
                self.stats.denials += 1;
                self.measure.denied(key, region, self.now, units);
                self.schedule_retry(s, cost, retries, retry_after)
            }
        }
    }

    pub(super) fn schedule_retry(
        &mut self,
        s: usize,
        cost: Cost,
        retries: u32,
        retry_after: Option<Duration>,
    ) -> Result<()> {
        let src = &mut self.sources[s];
        let Some(delay) = src
            .retry
            .next_delay(retries, retry_after, &mut src.client_rng)
        else {
            return Ok(());
        };
        if src.pending_retries >= MAX_PENDING_RETRIES_PER_SOURCE {
            self.stats.retries_dropped += 1;
            return Ok(());
        }
        src.pending_retries += 1;
        let event = Event::Retry {
            source: s,
            retries: retries + 1,
            cost,
        };
        self.push(self.now + delay, event)
    }

    /// Picks the region's next gateway that is up (clients fail over between gateways).
    pub(super) fn pick_gateway(&mut self, region: usize) -> Option<usize> {
        let r = &mut self.regions[region];
        let n = r.gateways.len();
        (0..n)
            .map(|i| (r.next_gateway + i) % n)
            .find(|&g| r.gateways[g].gateway.is_some())
            .inspect(|&g| r.next_gateway = (g + 1) % n)
    }

    pub(super) fn serve(&mut self, region: usize, key: usize, units: u64) -> Result<Served> {
        let Some(g) = self.pick_gateway(region) else {
            self.stats.unserved += 1;
            return Ok(Served::Denied { retry_after: None });
        };
        let local = self.regions[region].agent_clock.local(self.now);
        let at_gateway = self.regions[region].gateway_clock.local(self.now);
        let mut outcome = self.spend(region, g, key, at_gateway, units);
        if outcome == Spend::Wait {
            self.pump_gateway(region, g, local)?;
            outcome = self.spend(region, g, key, at_gateway, units);
        }
        self.pump_gateway(region, g, local)?;
        self.arm_gateway_timer(region, g)?;
        Ok(match outcome {
            Spend::Spent(receipt) => Served::Admitted {
                gateway: g,
                receipt: Some(receipt),
                local,
            },
            Spend::Denied { retry_after } => Served::Denied {
                retry_after: Some(retry_after),
            },
            Spend::Unavailable if self.envoy_fallback(region, g, key, local, units) => {
                Served::Admitted {
                    gateway: g,
                    receipt: None,
                    local,
                }
            }
            Spend::Unavailable if self.failure_modes[key] == FailureMode::Open => {
                self.stats.fail_open_admits += 1;
                Served::Admitted {
                    gateway: g,
                    receipt: None,
                    local,
                }
            }
            Spend::Unavailable | Spend::Wait | Spend::UnknownKey => {
                Served::Denied { retry_after: None }
            }
        })
    }

    /// Envoy's fallback (`regions[].envoy_fallback_units`): a gateway with no lease whose
    /// agent is down admits up to that many units of a key in a window (on the agent's clock,
    /// the one admissions are judged on) on its own, and tells its agent once it is back
    /// ([`Engine::report_fallback`]). A model of the operator's statement kept exactly: the
    /// rule's `rlqs_fallback_units` is what the scenario states for it.
    fn envoy_fallback(
        &mut self,
        region: usize,
        g: usize,
        key: usize,
        local: Timestamp,
        units: u64,
    ) -> bool {
        let allowance = self.scenario.regions[region].envoy_fallback_units;
        if allowance == 0 {
            return false;
        }
        let limit = &self.scenario.limits.limits[self.measure.keys[key].limit_index];
        let window = limit
            .window
            .index(self.regions[region].window_clock(local, None));
        let rt = &mut self.regions[region].gateways[g];
        if rt.fallback_used.len() >= FALLBACK_TALLIES_KEPT {
            // Only the windows a report can still fall in matter.
            rt.fallback_used.retain(|(_, w), _| w.0 + 1 >= window.0);
        }
        let used = rt.fallback_used.entry((key, window)).or_insert(0);
        if used.saturating_add(units) > allowance {
            return false;
        }
        *used += units;
        *rt.fallback_unreported.entry(key).or_insert(0) += units;
        self.stats.envoy_fallback_admits += 1;
        true
    }

    /// Gateway `g` tells its agent, up again, what it admitted on its own while it was down:
    /// the agent charges it in the window of the report, as the daemon does with the usage
    /// an RLQS stream reports after it reconnects.
    /// Whether it told its agent anything.
    fn report_fallback(&mut self, region: usize, g: usize, local: Timestamp) -> bool {
        let r = &mut self.regions[region];
        let Some(node) = r.node.as_mut() else {
            return false;
        };
        let reports = std::mem::take(&mut r.gateways[g].fallback_unreported);
        if reports.is_empty() {
            return false;
        }
        for (key, units) in reports {
            let meta = &self.measure.keys[key];
            node.handle_gateway_fallback(local, &meta.limit, &meta.key, units);
            self.stats.envoy_fallback_units_reported += units;
        }
        persist(node, &mut r.store, r.keeps_store);
        true
    }

    /// One spend at gateway `g` at `local` on the gateway's clock, looking the key up (again)
    /// when needed.
    #[inline]
    pub(super) fn spend(
        &mut self,
        region: usize,
        g: usize,
        key: usize,
        local: Timestamp,
        units: u64,
    ) -> Spend {
        let rt = &mut self.regions[region].gateways[g];
        let Some(gateway) = rt.gateway.as_mut() else {
            return Spend::Unavailable;
        };
        for _ in 0..2 {
            let handle = match rt.handles[key] {
                Some(h) => h,
                None => {
                    let meta = &self.measure.keys[key];
                    match gateway.key(local, &meta.limit, &meta.key) {
                        Ok(h) => *rt.handles[key].insert(h),
                        // Too many keys at this gateway: it cannot lease, as if unreachable.
                        Err(_) => return Spend::Unavailable,
                    }
                }
            };
            match gateway.try_spend(local, handle, units) {
                Spend::UnknownKey => rt.handles[key] = None,
                outcome => return outcome,
            }
        }
        Spend::UnknownKey
    }

    /// Delivers gateway `g`'s messages to its agent and the answers back. `local` is the
    /// agent's clock; the gateway reads its own.
    pub(super) fn pump_gateway(&mut self, region: usize, g: usize, local: Timestamp) -> Result<()> {
        let reported = self.report_fallback(region, g, local);
        let r = &mut self.regions[region];
        let at_gateway = r.gateway_clock.local(self.now);
        let Some(gateway) = r.gateways[g].gateway.as_mut() else {
            return Ok(());
        };
        let mut touched = reported;
        while let Some(msg) = gateway.poll_transmit(at_gateway) {
            touched |= r.node.is_some();
            match (msg, r.node.as_mut()) {
                (ToAgent::LeaseWanted(w), Some(node)) => {
                    self.stats.lease_requests += 1;
                    let answer = node.handle_lease_wanted(local, &w);
                    persist(node, &mut r.store, r.keeps_store);
                    match answer {
                        LeaseAnswer::Granted(grant) => {
                            if w.refill == Some(grant.lease) {
                                self.stats.lease_refills += 1;
                            }
                            let reading = LeaseReading {
                                reading: node.window_clock(local, Some(grant.lease)),
                                granted_at: self.now,
                                start: r.starts,
                            };
                            note_lease_reading(&mut r.lease_readings, grant.lease, reading);
                            gateway.handle_lease_granted(at_gateway, w.ticket, grant)
                        }
                        LeaseAnswer::Denied(denial) => {
                            gateway.handle_lease_denied(at_gateway, w.ticket, denial)
                        }
                    }
                }
                (ToAgent::LeaseWanted(w), None) => {
                    gateway.handle_agent_unavailable(at_gateway, w.ticket)
                }
                (ToAgent::Release(release), Some(node)) => {
                    node.handle_release(local, &release);
                    persist(node, &mut r.store, r.keeps_store);
                }
                (ToAgent::Settle(settle), Some(node)) => {
                    node.handle_settle(local, &settle);
                    persist(node, &mut r.store, r.keeps_store);
                }
                (ToAgent::Release(_) | ToAgent::Settle(_), None) => {
                    self.stats.gateway_messages_lost += 1;
                }
            }
        }
        if touched {
            self.after_region_input(region)?;
        }
        Ok(())
    }

    /// Arms the gateway's sweep timer when its deadline changed. Called after every request,
    /// so the common case (unchanged) is one comparison on the gateway's own clock.
    pub(super) fn arm_gateway_timer(&mut self, region: usize, g: usize) -> Result<()> {
        let r = &mut self.regions[region];
        let rt = &mut r.gateways[g];
        let wanted_local = rt.gateway.as_ref().and_then(Gateway::poll_timeout);
        if wanted_local == rt.timer_local {
            return Ok(());
        }
        rt.timer_local = wanted_local;
        let wanted = wanted_local.map(|local| r.gateway_clock.true_time_of(local).max(self.now));
        rt.timer = wanted;
        match wanted {
            Some(at) => self.push(
                at,
                Event::GatewayTimer {
                    region,
                    gateway: g,
                    at,
                },
            ),
            None => Ok(()),
        }
    }

    pub(super) fn gateway_timer(&mut self, region: usize, g: usize, at: Timestamp) -> Result<()> {
        let rt = &mut self.regions[region].gateways[g];
        if rt.timer != Some(at) {
            return Ok(());
        }
        rt.timer = None;
        rt.timer_local = None;
        let local = self.regions[region].agent_clock.local(self.now);
        let at_gateway = self.regions[region].gateway_clock.local(self.now);
        if let Some(gateway) = self.regions[region].gateways[g].gateway.as_mut() {
            gateway.handle_timeout(at_gateway);
        }
        self.pump_gateway(region, g, local)?;
        self.arm_gateway_timer(region, g)
    }

    pub(super) fn settle(&mut self, s: PendingSettle) -> Result<()> {
        let (key, region) = (self.sources[s.source].key, self.sources[s.source].region);
        // The tokens were used whatever happens to the settle: measure what was consumed.
        self.measure.settled(
            key,
            region,
            s.admitted_at,
            s.reserved_units,
            s.actual_units,
            self.now,
        );
        let local = self.regions[region].agent_clock.local(self.now);
        let at_gateway = self.regions[region].gateway_clock.local(self.now);
        let rt = &mut self.regions[region].gateways[s.gateway];
        let incarnation = rt.incarnation;
        let Some(receipt) = s.receipt else {
            return Ok(());
        };
        let gateway = rt.gateway.as_mut().filter(|_| incarnation == s.incarnation);
        let Some(gateway) = gateway else {
            self.stats.settles_lost += 1;
            return Ok(());
        };
        gateway.settle(at_gateway, receipt, s.actual_units);
        self.pump_gateway(region, s.gateway, local)
    }
}
