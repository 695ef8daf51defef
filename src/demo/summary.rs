//! The `--json` summary, computed from what the daemons' admin APIs showed ([`Observed`]):
//! per limit each window's admissions (the agents' own counters, summed over regions) against
//! the quota and the bound the leaders stated for it; per region the agent's totals.

use serde_json::{Value, json};

use super::observe::{Observed, Watched};

/// The units admitted in one window of one limit, and what it is judged against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    pub window: u64,
    pub admitted_units: u64,
    /// The bound a leader that watched the window to its end stated, or why there is none.
    pub bound: Result<u64, String>,
    /// Every region's count is final (the agent closed the window, or traffic had stopped).
    pub exact: bool,
}

/// The bound stated for `window` by the leaders seen leading at its end (or at the last
/// read, for a window the run ended in): a leader gone before the end did not watch all of
/// it, and its statement does not cover it (docs/bound.md, "Windows without a leader").
pub fn bound_of(obs: &Observed, w: &Watched, window: u64) -> Result<u64, String> {
    let Some(by_leader) = obs.bounds.get(&(w.limit.clone(), window)) else {
        return Err("no leader stated a bound for it".to_owned());
    };
    let end_ms = (window + 1).saturating_mul(w.window_ms);
    let watched_to_ms = end_ms.min(obs.last_seen_ms);
    let stated: Vec<_> = by_leader
        .iter()
        .filter(|(l, _)| {
            obs.leading_until_ms
                .get(l)
                .is_some_and(|t| *t >= watched_to_ms)
        })
        .map(|(_, s)| s)
        .collect();
    if stated.is_empty() {
        return Err("only leaders gone before its end stated it".to_owned());
    }
    if let Some(why) = stated.iter().find_map(|s| s.unbounded.clone()) {
        return Err(format!("stated unbounded: {why}"));
    }
    Ok(stated.iter().map(|s| s.total_units).max().unwrap_or(0))
}

/// Every window of `w` in which some region counted units, in order.
pub fn judge(obs: &Observed, w: &Watched) -> Vec<Judged> {
    let mut by_window: std::collections::BTreeMap<u64, (u64, bool)> = Default::default();
    for ((limit, window, _), count) in &obs.windows {
        if *limit != w.limit {
            continue;
        }
        let e = by_window.entry(*window).or_insert((0, true));
        e.0 += count.admitted_units();
        e.1 &= count.net_final_units.is_some();
    }
    by_window
        .into_iter()
        .filter(|(_, (admitted, _))| *admitted > 0)
        .map(|(window, (admitted_units, exact))| Judged {
            window,
            admitted_units,
            bound: bound_of(obs, w, window),
            exact,
        })
        .collect()
}

fn limit_json(obs: &Observed, w: &Watched) -> Value {
    let judged = judge(obs, w);
    let over = |j: &Judged| j.admitted_units.saturating_sub(w.quota_units);
    let windows: Vec<Value> = judged
        .iter()
        .map(|j| {
            json!({
                "index": j.window,
                "start_unix_ms": j.window.saturating_mul(w.window_ms),
                "admitted": j.admitted_units,
                "bound": j.bound.as_ref().ok(),
                "unbounded": j.bound.as_ref().err(),
                "overshoot": over(j),
                "exact": j.exact,
            })
        })
        .collect();
    let within = judged.iter().all(|j| match &j.bound {
        Ok(b) => j.admitted_units <= w.quota_units + b,
        Err(_) => true,
    });
    json!({
        "name": w.limit,
        "quota": w.quota_units,
        "window_ms": w.window_ms,
        "windows": windows,
        "admitted_max_window": judged.iter().map(|j| j.admitted_units).max().unwrap_or(0),
        "bound": judged.iter().filter_map(|j| j.bound.as_ref().ok()).max(),
        "overshoot_max": judged.iter().map(over).max().unwrap_or(0),
        "windows_unbounded": judged.iter().filter(|j| j.bound.is_err()).count(),
        "within_bound": within,
    })
}

/// What the demo's own gateway counted in one region (demand, not enforcement).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientFigures {
    pub requests: u64,
    pub admitted: u64,
    pub denied: u64,
    pub unavailable: u64,
}

fn region_json(obs: &Observed, region: &str, limits: &[Watched], client: ClientFigures) -> Value {
    let t = obs.totals.get(region).copied().unwrap_or_default();
    let allowance: Option<u64> = limits
        .first()
        .and_then(|w| obs.agents.get(&(w.limit.clone(), region.to_owned())))
        .map(|a| a.allowance_units);
    json!({
        "name": region,
        "admitted": t.lease_granted_units.saturating_sub(t.lease_returned_units),
        "denied": t.denied,
        "allowance_last": allowance,
        "lease_granted_units": t.lease_granted_units,
        "lease_returned_units": t.lease_returned_units,
        "sync_down_s": obs.sync_down_ms.get(region).map_or(0.0, |ms| (*ms / 100) as f64 / 10.0),
        "client": {
            "requests": client.requests,
            "admitted": client.admitted,
            "denied": client.denied,
            "unavailable": client.unavailable,
        },
    })
}

/// The summary: the run, the leaders, per limit its windows, per region its agent's totals.
pub fn summary(
    obs: &Observed,
    duration_s: f64,
    limits: &[Watched],
    regions: &[(&str, ClientFigures)],
) -> Value {
    let leaders: Vec<Value> = obs
        .leaders
        .iter()
        .enumerate()
        .map(|(i, (node, term))| {
            let before_run = i + 1 < obs.leaders_before_run;
            json!({ "node": node, "term": term, "before_run": before_run })
        })
        .collect();
    json!({
        "duration_s": (duration_s * 10.0).round() / 10.0,
        "leader_changes": obs.leader_changes(),
        "leaders": leaders,
        "limits": limits.iter().map(|w| limit_json(obs, w)).collect::<Vec<_>>(),
        "regions": regions
            .iter()
            .map(|(r, c)| region_json(obs, r, limits, *c))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched() -> Watched {
        Watched {
            limit: "demo/tenant=acme".to_owned(),
            domain: "demo".to_owned(),
            descriptor: "tenant=acme".to_owned(),
            quota_units: 100,
            window_ms: 10_000,
        }
    }

    fn status(node: u64, term: u64, window: u64, total: u64) -> Value {
        serde_json::from_str(&format!(
            r#"{{"node":{node},"state":"leader","term":{term},"cluster_clock_offset_nanos":0,
                "limits":[{{"limit":"demo/tenant=acme","bound":{{"window":{window},
                "total_units":{total},"unbounded":null}}}}]}}"#
        ))
        .expect("json")
    }

    fn key(window: u64, net: u64, carried: u64, prev: Option<(u64, u64)>) -> Value {
        let prev = prev.map_or("null".to_owned(), |(w, n)| {
            format!(r#"{{"window":{w},"net_units":{n}}}"#)
        });
        serde_json::from_str(&format!(
            r#"{{"rule":"demo/tenant=acme","window":{window},"net_units":{net},
                "carried_in_units":{carried},"allowance_units":40,"previous_window":{prev},
                "sync":{{"connected":true}}}}"#
        ))
        .expect("json")
    }

    /// Window 5 (50 s to 60 s): node 1 leads and states 10, is replaced at 57 s by node 2
    /// (term 2), which states 12 and is still seen after the end. Two regions: `a` counted 70
    /// (5 carried in), closed at 75 by its agent; `b` was last read at 30 and never closed.
    #[test]
    fn windows_are_judged_from_the_agents_counts_and_the_leader_that_saw_the_end() {
        let w = watched();
        let mut obs = Observed::default();
        // An election before traffic started is no change of the run's.
        obs.take_status(&status(3, 0, 5, 10), 50_000);
        obs.take_status(&status(1, 1, 5, 10), 51_000);
        obs.mark_run_start();
        obs.take_status(&status(1, 1, 5, 10), 52_000);
        obs.take_status(&status(2, 2, 5, 12), 57_000);
        obs.take_key("a", &key(5, 70, 5, None), false);
        obs.take_key("b", &key(5, 30, 0, None), false);
        obs.take_status(&status(2, 2, 6, 3), 61_000);
        obs.take_key("a", &key(6, 9, 0, Some((5, 75))), false);
        let judged = judge(&obs, &w);
        assert_eq!(judged.len(), 2);
        assert_eq!(
            judged[0],
            Judged {
                window: 5,
                // a: 75 closed, less 5 carried in; b: 30 as last read.
                admitted_units: 70 + 30,
                bound: Ok(12),
                exact: false,
            }
        );
        // Window 6 is the last: the leader seen at the last read covers it so far.
        assert_eq!(judged[1].bound, Ok(3));
        let s = summary(&obs, 12.0, &[w], &[("a", ClientFigures::default())]);
        assert_eq!(s["leader_changes"], 1);
        assert_eq!(s["leaders"][0]["before_run"], true);
        assert_eq!(
            s["leaders"][1]["before_run"], false,
            "led as traffic started"
        );
        assert_eq!(s["limits"][0]["admitted_max_window"], 100);
        assert_eq!(s["limits"][0]["overshoot_max"], 0);
        assert_eq!(s["limits"][0]["bound"], 12);
        assert_eq!(s["limits"][0]["within_bound"], true);
        assert_eq!(s["regions"][0]["allowance_last"], 40);
    }

    /// A window whose only statement came from a leader killed before its end has no bound,
    /// and says why; so does one no leader stated.
    #[test]
    fn a_window_no_surviving_leader_watched_to_its_end_is_unbounded() {
        let w = watched();
        let mut obs = Observed::default();
        obs.take_status(&status(1, 1, 5, 10), 55_000);
        obs.take_status(&status(2, 2, 6, 4), 62_000);
        obs.take_key("a", &key(5, 20, 0, None), false);
        obs.take_key("a", &key(7, 20, 0, None), true);
        let judged = judge(&obs, &w);
        assert_eq!(
            judged[0].bound,
            Err("only leaders gone before its end stated it".to_owned())
        );
        assert_eq!(
            judged[1].bound,
            Err("no leader stated a bound for it".to_owned())
        );
        assert!(judged[1].exact, "read after traffic stopped");
    }

    /// A read late enough that the key rolled twice since the one before: the agent's
    /// `closed_windows` still gives both ended windows' final counts.
    #[test]
    fn windows_closed_between_two_reads_are_exact_from_the_agents_memory() {
        let w = watched();
        let mut obs = Observed::default();
        obs.take_key("a", &key(5, 20, 0, None), false);
        let mut late = key(7, 4, 0, None);
        late["closed_windows"] = serde_json::json!([
            {"window": 5, "net_units": 26},
            {"window": 6, "net_units": 11},
        ]);
        obs.take_key("a", &late, false);
        let judged = judge(&obs, &w);
        let exact: Vec<_> = judged
            .iter()
            .map(|j| (j.window, j.admitted_units, j.exact))
            .collect();
        assert_eq!(exact, vec![(5, 26, true), (6, 11, true), (7, 4, false)]);
    }

    #[test]
    fn the_agents_metrics_give_the_regions_totals() {
        let metrics = "# TYPE allot_lease_granted_units_total counter\n\
            allot_lease_granted_units_total{rule=\"demo/tenant=acme\"} 500\n\
            allot_lease_granted_units_total{rule=\"demo/other\"} 20\n\
            allot_lease_returned_units_total{rule=\"demo/tenant=acme\"} 45\n\
            allot_decisions_total{rule=\"demo/tenant=acme\",result=\"denied\"} 7\n\
            allot_decisions_total{rule=\"demo/tenant=acme\",result=\"allowed\"} 3\n";
        let mut obs = Observed::default();
        obs.take_metrics("a", metrics);
        let client = ClientFigures {
            requests: 600,
            admitted: 470,
            denied: 130,
            unavailable: 0,
        };
        let s = summary(&obs, 1.0, &[watched()], &[("a", client)]);
        let r = &s["regions"][0];
        assert_eq!(r["admitted"], 520 - 45);
        assert_eq!(r["denied"], 7);
        assert_eq!(r["client"]["admitted"], 470);
        assert_eq!(r["allowance_last"], Value::Null, "no key read");
        assert_eq!(r["sync_down_s"], 0.0);
    }

    /// Down time is the time between reads that found the link down, from the read before.
    #[test]
    fn sync_down_time_adds_the_spans_ending_in_a_read_that_found_it_down() {
        let mut obs = Observed::default();
        obs.take_link("a", false, 1_000);
        obs.take_link("a", true, 1_250);
        obs.take_link("a", false, 1_500);
        obs.take_link("a", false, 2_750);
        obs.take_link("a", true, 3_000);
        let s = summary(&obs, 1.0, &[watched()], &[("a", ClientFigures::default())]);
        assert_eq!(s["regions"][0]["sync_down_s"], 1.5);
    }
}
