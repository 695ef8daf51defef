//! What a swarm run found, over all its seeds.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use super::run::SeedOutcome;

/// Figures over every seed run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// `A..B` of the seeds actually run.
    pub seeds: String,
    pub runs: u64,
    pub failing_seeds: u64,
    pub violations: u64,
    /// Per violation kind: seeds that showed it, and the violations described.
    pub kinds: BTreeMap<String, KindCount>,
    pub windows_judged: u64,
    /// Windows that admitted more than their quota, within their bound or not.
    pub windows_over_quota: u64,
    /// Windows whose stated bound was the quota or more: a bound that promises little.
    pub windows_bound_at_least_quota: u64,
    pub requests: u64,
    /// Worlds containing each feature (modes, policies, fault kinds; see `run::features`).
    pub worlds_with: BTreeMap<String, u64>,
    /// The failing seeds, in order.
    pub failing: Vec<SeedOutcome>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindCount {
    pub seeds: u64,
    pub violations: u64,
    /// The smallest seed that showed it.
    pub first_seed: u64,
}

impl Summary {
    pub fn build(outcomes: &[SeedOutcome]) -> Self {
        let mut s = Summary {
            seeds: match (outcomes.first(), outcomes.last()) {
                (Some(a), Some(b)) => format!("{}..{}", a.seed, b.seed.saturating_add(1)),
                _ => "none".to_string(),
            },
            runs: outcomes.len() as u64,
            ..Summary::default()
        };
        for o in outcomes {
            s.windows_judged += o.windows_judged;
            s.windows_over_quota += o.windows_over_quota;
            s.windows_bound_at_least_quota += o.windows_bound_at_least_quota;
            s.requests += o.requests;
            s.violations += o.violations;
            for f in &o.features {
                *s.worlds_with.entry(f.clone()).or_insert(0) += 1;
            }
            for (kind, count) in &o.kinds {
                let k = s.kinds.entry(kind.clone()).or_insert(KindCount {
                    first_seed: o.seed,
                    ..KindCount::default()
                });
                k.seeds += 1;
                k.violations += count;
            }
            if o.failed() {
                s.failing_seeds += 1;
                s.failing.push(o.clone());
            }
        }
        s
    }

    pub fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(out, "swarm: seeds {} ({} worlds)", self.seeds, self.runs)?;
        writeln!(
            out,
            "  failing seeds         {} ({} violations)",
            self.failing_seeds, self.violations
        )?;
        for (kind, k) in &self.kinds {
            writeln!(
                out,
                "    {kind:<40} {:>6} seeds {:>8} described  first seed {}",
                k.seeds, k.violations, k.first_seed
            )?;
        }
        writeln!(out, "  windows judged        {}", self.windows_judged)?;
        writeln!(
            out,
            "    over their quota    {} (bound of L or more: {})",
            self.windows_over_quota, self.windows_bound_at_least_quota
        )?;
        writeln!(out, "  requests              {}", self.requests)?;
        writeln!(out, "  worlds with")?;
        for (feature, n) in &self.worlds_with {
            writeln!(out, "    {feature:<40} {n:>6}")?;
        }
        Ok(())
    }
}
