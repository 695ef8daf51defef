//! Short renderings of messages and commands for the event trace of a failure.

use std::fmt::Write as _;

use allot_core::rebalance::TableCommand;
use allot_core::sync::{CounterRef, SyncDown, SyncUp};
use allot_core::time::WindowIndex;

use super::setup::{START, window};

/// Window index relative to the run's first window.
fn rel(w: WindowIndex) -> i64 {
    w.0 as i64 - window().index(START).0 as i64
}

pub fn counter(c: &CounterRef) -> String {
    format!("{}/{}@w{}", c.limit, c.key, rel(c.window))
}

pub fn up(up: &SyncUp) -> String {
    let mut s = format!("seq {}", up.seq);
    for e in &up.entries {
        let _ = write!(
            s,
            " | entry {} {}-{}",
            counter(&e.counter),
            e.granted_units,
            e.refunded_units
        );
    }
    for d in &up.demand {
        let _ = write!(
            s,
            " | demand {} {}µ/s a={}",
            counter(&d.counter),
            d.demand_micro_units_per_sec,
            d.allowance_units
        );
    }
    for a in &up.release_acks {
        let _ = write!(
            s,
            " | ack #{} {} released {} after {}",
            a.id,
            counter(&a.counter),
            a.released_units,
            a.allowance_after_units
        );
    }
    s
}

pub fn down(down: &SyncDown) -> String {
    let mut s = format!("reply to {}", down.reply_to_seq);
    for g in &down.grants {
        let _ = write!(
            s,
            " | grant {} {} e{}",
            counter(&g.counter),
            g.allowance_units,
            g.epoch.0
        );
    }
    for r in &down.release_requests {
        let _ = write!(
            s,
            " | release #{} {} {} e{}",
            r.id,
            counter(&r.counter),
            r.units,
            r.epoch.0
        );
    }
    for e in &down.entries {
        let _ = write!(
            s,
            " | {} {} {}-{}",
            e.region,
            counter(&e.counter),
            e.granted_units,
            e.refunded_units
        );
    }
    s
}

pub fn command(cmd: &TableCommand) -> String {
    match cmd {
        TableCommand::Grow {
            counter: c,
            region,
            expected_epoch,
            allowance_units,
        } => format!(
            "grow {} {region} to {allowance_units} (from e{})",
            counter(c),
            expected_epoch.0
        ),
        TableCommand::RequestRelease {
            counter: c,
            region,
            expected_epoch,
            units,
        } => format!(
            "request release {} {region} of {units} (from e{})",
            counter(c),
            expected_epoch.0
        ),
        TableCommand::CompleteRelease {
            counter: c,
            region,
            id,
            released_units,
        } => format!(
            "complete release #{id} {} {region} released {released_units}",
            counter(c)
        ),
        TableCommand::Reclaim {
            limit,
            region,
            from_window,
        } => format!("reclaim {limit} {region} from w{}", rel(*from_window)),
        TableCommand::CollectGarbage {
            limit,
            before_window,
        } => {
            format!("collect {limit} before w{}", rel(*before_window))
        }
        other => format!("{other:?}"),
    }
}
