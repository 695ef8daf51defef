//! `allot demo`'s flags, checked into a [`Plan`]: every bad flag is refused before anything
//! starts, with a message naming the flag.

use std::time::Duration;

use allot_core::config::parse_duration;
use clap::Args;

/// The regions the demo runs, in the order the sun reaches them: each one's demand peaks in
/// turn.
pub const REGIONS: [&str; 3] = ["ap-south", "eu-west", "us-east"];

/// Longest run `--duration` takes: the demo is watched, not left running.
pub const MAX_DURATION: Duration = Duration::from_secs(3_600);

/// Shortest run: the cluster needs a few seconds to elect and the windows to fill.
pub const MIN_DURATION: Duration = Duration::from_secs(5);

#[derive(Args)]
pub struct DemoArgs {
    /// How long traffic runs once the cluster is up (`90s`, `2m`; as durations in limits
    /// files).
    #[arg(long, default_value = "60s")]
    duration: String,
    /// SIGKILL the coordinator's leader this many seconds into the run (by default half way
    /// through; `none`: never); it is started again `--restart-after` seconds later, so the
    /// cluster returns to three nodes.
    #[arg(long, value_name = "SECONDS|none")]
    kill_leader_at: Option<String>,
    /// Seconds the killed leader stays down before it is started again (with
    /// `--kill-leader-at`; 0: at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 3)]
    restart_after: u64,
    /// Cut REGION's agent off from every coordinator node from second FROM to second TO
    /// (`eu-west@10..20`), through a relay the demo runs between them.
    #[arg(long, value_name = "REGION@FROM..TO")]
    partition: Option<String>,
    /// Print a summary as JSON on stdout at the end (the live table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Keep the temporary folder (data directories, logs, limits file) at the end.
    #[arg(long)]
    keep: bool,
    /// Run raft and the sync stream in plaintext. By default the demo makes a CA and a
    /// certificate per node and region in its folder (`certs/`), and every daemon link is
    /// mutual TLS (docs/security.md).
    #[arg(long)]
    plaintext: bool,
}

/// A region cut off from the coordinators for a span of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub region: usize,
    pub from_secs: u64,
    pub to_secs: u64,
}

/// The run, as the flags asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub duration: Duration,
    pub kill_leader_at_secs: Option<u64>,
    /// Seconds the killed leader stays down.
    pub restart_after_secs: u64,
    pub partition: Option<Partition>,
    pub json: bool,
    pub keep: bool,
    /// Mutual TLS between the daemons (the default).
    pub tls: bool,
}

impl Plan {
    pub fn from_args(args: &DemoArgs) -> Result<Plan, String> {
        let duration = parse_duration(&args.duration)
            .map_err(|e| format!("--duration '{}': {e}", args.duration))?;
        if !(MIN_DURATION..=MAX_DURATION).contains(&duration) {
            return Err(format!(
                "--duration {}: between {}s and {}s",
                args.duration,
                MIN_DURATION.as_secs(),
                MAX_DURATION.as_secs()
            ));
        }
        let secs = duration.as_secs();
        let kill_leader_at_secs = kill_at(args.kill_leader_at.as_deref(), secs)?;
        if let Some(at) = kill_leader_at_secs
            && at >= secs
        {
            return Err(format!(
                "--kill-leader-at {at}: past the run's end ({secs} s, --duration)"
            ));
        }
        let partition = args
            .partition
            .as_deref()
            .map(|text| parse_partition(text, secs))
            .transpose()?;
        Ok(Plan {
            duration,
            kill_leader_at_secs,
            restart_after_secs: args.restart_after,
            partition,
            json: args.json,
            keep: args.keep,
            tls: !args.plaintext,
        })
    }
}

/// `--kill-leader-at`: not given, the middle of a run of `run_secs` (a first run shows a
/// leader dying and the cluster going on); `none`, no kill.
fn kill_at(given: Option<&str>, run_secs: u64) -> Result<Option<u64>, String> {
    match given {
        None => Ok(Some(run_secs / 2)),
        Some("none") => Ok(None),
        Some(text) => {
            text.trim().parse::<u64>().map(Some).map_err(|_| {
                format!("--kill-leader-at '{text}': a whole number of seconds, or none")
            })
        }
    }
}

/// `REGION@FROM..TO`, seconds into a run of `run_secs`.
pub fn parse_partition(text: &str, run_secs: u64) -> Result<Partition, String> {
    let bad = |why: &str| format!("--partition '{text}': {why}");
    let (name, span) = text
        .split_once('@')
        .ok_or_else(|| bad("expected REGION@FROM..TO"))?;
    let region = REGIONS.iter().position(|r| *r == name).ok_or_else(|| {
        bad(&format!(
            "unknown region '{name}' (the demo's are {})",
            REGIONS.join(", ")
        ))
    })?;
    let (from, to) = span
        .split_once("..")
        .ok_or_else(|| bad("expected FROM..TO, in seconds"))?;
    let secs = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| bad(&format!("'{s}' is not a whole number of seconds")))
    };
    let (from_secs, to_secs) = (secs(from)?, secs(to)?);
    if from_secs >= to_secs {
        return Err(bad("FROM must come before TO"));
    }
    if to_secs > run_secs {
        return Err(bad(&format!(
            "ends past the run's end ({run_secs} s, --duration)"
        )));
    }
    Ok(Partition {
        region,
        from_secs,
        to_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(duration: &str, kill: Option<u64>, partition: Option<&str>) -> DemoArgs {
        DemoArgs {
            duration: duration.to_owned(),
            kill_leader_at: Some(kill.map_or("none".to_owned(), |k| k.to_string())),
            restart_after: 3,
            partition: partition.map(str::to_owned),
            json: false,
            keep: false,
            plaintext: false,
        }
    }

    #[test]
    fn good_flags_make_a_plan() {
        let plan = Plan::from_args(&args("1m", Some(20), Some("eu-west@10..30"))).expect("ok");
        assert_eq!(plan.duration, Duration::from_secs(60));
        assert_eq!(plan.kill_leader_at_secs, Some(20));
        assert_eq!(
            plan.partition,
            Some(Partition {
                region: 1,
                from_secs: 10,
                to_secs: 30
            })
        );
        assert!(Plan::from_args(&args("20s", None, None)).is_ok());
    }

    #[test]
    fn bad_durations_are_refused() {
        for bad in ["", "20", "ten seconds", "-5s", "1s", "2h"] {
            let err = Plan::from_args(&args(bad, None, None)).expect_err(bad);
            assert!(err.starts_with("--duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_leader_dies_half_way_unless_told_otherwise() {
        let mut a = args("1m", None, None);
        a.kill_leader_at = None;
        assert_eq!(
            Plan::from_args(&a).expect("ok").kill_leader_at_secs,
            Some(30)
        );
        a.kill_leader_at = Some("none".to_owned());
        assert_eq!(Plan::from_args(&a).expect("ok").kill_leader_at_secs, None);
        a.kill_leader_at = Some("soon".to_owned());
        let err = Plan::from_args(&a).expect_err("not a number");
        assert!(err.contains("--kill-leader-at 'soon'"), "{err}");
    }

    #[test]
    fn a_kill_past_the_end_is_refused() {
        let err = Plan::from_args(&args("20s", Some(20), None)).expect_err("past");
        assert!(
            err.contains("--kill-leader-at 20: past the run's end"),
            "{err}"
        );
        assert!(Plan::from_args(&args("20s", Some(19), None)).is_ok());
    }

    #[test]
    fn bad_partitions_are_refused_with_the_reason() {
        let cases = [
            ("mars@1..2", "unknown region 'mars'"),
            ("eu-west", "expected REGION@FROM..TO"),
            ("eu-west@5", "expected FROM..TO"),
            ("eu-west@5..5", "FROM must come before TO"),
            ("eu-west@9..3", "FROM must come before TO"),
            ("eu-west@a..3", "'a' is not a whole number"),
            ("eu-west@5..61", "ends past the run's end (60 s"),
        ];
        for (text, why) in cases {
            let err = parse_partition(text, 60).expect_err(text);
            assert!(err.contains(why), "{text}: {err}");
            assert!(err.starts_with("--partition"), "{text}: {err}");
        }
        assert_eq!(
            parse_partition("us-east@0..60", 60).map(|p| p.region),
            Ok(2)
        );
    }
}
