//! The live table the demo prints every second: per region the gateway's demand and what it
//! was answered in the last second, and the agent's allowance and use in the current window;
//! per limit the quota, the use this window summed over regions, the bound the leader states
//! for it, and the largest overshoot of any window so far; the leader.

use std::fmt::Write;

use super::observe::{Observed, Watched};
use super::summary::{ClientFigures, judge};

/// One region's line: its name, what its gateway saw in the last second, whether its link to
/// the coordinators is cut by the demo.
pub struct RegionLine<'a> {
    pub name: &'a str,
    pub last_second: ClientFigures,
    pub cut: bool,
}

pub fn render(
    obs: &Observed,
    elapsed_secs: u64,
    limits: &[Watched],
    regions: &[RegionLine],
) -> String {
    let mut out = String::new();
    let leader = match obs.leader() {
        Some((node, term)) => format!("node {node} (term {term})"),
        None => "none yet".to_owned(),
    };
    let _ = writeln!(out, "--- {elapsed_secs:>4}s  leader {leader}");
    let _ = writeln!(
        out,
        "  {:<10} {:>8} {:>10} {:>8} {:>10} {:>6}  link",
        "region", "demand/s", "admitted/s", "denied/s", "allowance", "used"
    );
    let first = limits.first();
    for r in regions {
        let agent = first.and_then(|w| obs.agents.get(&(w.limit.clone(), r.name.to_owned())));
        let (allowance, used, link) = match agent {
            Some(a) => (
                a.allowance_units.to_string(),
                a.used_units.to_string(),
                if a.connected { "synced" } else { "not synced" },
            ),
            None => ("-".to_owned(), "-".to_owned(), "not read"),
        };
        let cut = if r.cut { " (cut by the demo)" } else { "" };
        let c = r.last_second;
        let _ = writeln!(
            out,
            "  {:<10} {:>8} {:>10} {:>8} {:>10} {:>6}  {link}{cut}",
            r.name,
            c.requests,
            c.admitted,
            c.denied + c.unavailable,
            allowance,
            used
        );
    }
    for w in limits {
        let _ = writeln!(out, "{}", limit_line(obs, w));
    }
    out
}

fn limit_line(obs: &Observed, w: &Watched) -> String {
    let current = obs
        .agents
        .iter()
        .filter(|((limit, _), _)| *limit == w.limit)
        .map(|(_, a)| a.window)
        .max();
    let used: u64 = obs
        .agents
        .iter()
        .filter(|((limit, _), a)| *limit == w.limit && Some(a.window) == current)
        .map(|(_, a)| a.used_units)
        .sum();
    let bound = current
        .and_then(|window| obs.bounds.get(&(w.limit.clone(), window)))
        .and_then(|by_leader| obs.leader().and_then(|l| by_leader.get(&l)))
        .map_or("?".to_owned(), |s| match &s.unbounded {
            Some(_) => "unbounded".to_owned(),
            None => s.total_units.to_string(),
        });
    let overshoot = judge(obs, w)
        .iter()
        .map(|j| j.admitted_units.saturating_sub(w.quota_units))
        .max()
        .unwrap_or(0);
    format!(
        "  limit {}: quota {} per {} s, used {used} this window, bound {bound}, overshoot so far {overshoot}",
        w.limit,
        w.quota_units,
        w.window_ms / 1000
    )
}
