//! `allot sim`: the command line over [`crate::runner::run_scenario`].
//!
//! The binary owns the subcommand; this module owns its arguments ([`SimArgs`], a clap
//! `Args` to flatten into it) and what it does ([`run_cli`]).

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;

use crate::error::{Result, SimError};
use crate::node::NodeFactory;
use crate::plot::write_svg;
use crate::report::Report;
use crate::runner::{RunOptions, run_scenario};
use crate::scenario::{self, Scenario};

/// Arguments of `allot sim`.
#[derive(Clone, Debug, clap::Args)]
pub struct SimArgs {
    /// The scenario file (YAML; see docs/sim.md).
    #[arg(long)]
    pub scenario: PathBuf,
    /// Seeds to run: `A..B` runs A to B - 1; a single number runs that seed.
    #[arg(long, default_value = "0..10", value_parser = parse_seeds)]
    pub seeds: Range<u64>,
    /// Seeds run at once (default: the number of cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write an SVG plot of the first seed here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `A..B` (B excluded, A < B) or a single seed.
pub fn parse_seeds(text: &str) -> Result<Range<u64>, String> {
    let bad = || SimError::SeedRange(text.to_string()).to_string();
    let range = match text.split_once("..") {
        Some((a, b)) => {
            let a: u64 = a.trim().parse().map_err(|_| bad())?;
            let b: u64 = b.trim().parse().map_err(|_| bad())?;
            a..b
        }
        None => {
            let s: u64 = text.trim().parse().map_err(|_| bad())?;
            s..s.checked_add(1).ok_or_else(bad)?
        }
    };
    if range.is_empty() {
        return Err(bad());
    }
    Ok(range)
}

/// Runs the command. `factory` builds the machines from the scenario. Returns the report;
/// the caller exits non-zero when `report.violations > 0`. A summary goes to `out`, and each
/// failing seed with its replay command to `err`.
pub fn run_cli<F, B>(
    args: &SimArgs,
    factory: B,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Report>
where
    F: NodeFactory,
    B: FnOnce(&Scenario) -> Result<F>,
{
    let scenario = scenario::load(&args.scenario)?;
    let factory = factory(&scenario)?;
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let options = RunOptions {
        jobs,
        wall_clock: true,
    };
    let report = run_scenario(&scenario, args.seeds.clone(), options, &factory)?;
    if let Some(path) = &args.report {
        std::fs::write(path, report.to_json()?).map_err(|source| SimError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &args.plot {
        write_svg(&report, path)?;
    }
    // Terminal output is best effort: a closed pipe must not hide the exit status.
    let _ = write_summary(&report, out);
    for seed in report.failing_seeds() {
        let first = seed.violation_details.first().map_or(String::new(), |v| {
            format!(" (first: {} at {} ms: {})", v.kind, v.at_ms, v.detail)
        });
        let _ = writeln!(
            err,
            "seed {} failed: {} violations{first}\n  replay: {}",
            seed.seed, seed.violations, seed.replay
        );
    }
    Ok(report)
}

fn write_summary(r: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    writeln!(
        out,
        "scenario {}: seeds {} ({} runs)",
        r.scenario, r.seeds, r.runs
    )?;
    writeln!(out, "  violations            {}", r.violations)?;
    writeln!(out, "  overshoot max         {} units", r.overshoot_max)?;
    writeln!(
        out,
        "  bound min slack       {}",
        r.bound_min_slack
            .map_or("-".to_string(), |s| format!("{s} units"))
    )?;
    writeln!(
        out,
        "  utilization p50/min   {} / {} (static split p50 {})",
        opt(r.utilization_p50),
        opt(r.utilization_min),
        opt(r.baseline_utilization_p50)
    )?;
    writeln!(
        out,
        "  convergence max       {}",
        r.convergence_ms_max
            .map_or("-".to_string(), |c| format!("{c} ms"))
    )?;
    writeln!(out, "  false denial rate     {:.6}", r.false_denial_rate)?;
    writeln!(
        out,
        "  speed                 {:.0} simulated requests per wall-clock second (per thread)",
        r.sim_requests_per_wall_second
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_a_half_open_range_or_one_seed() {
        assert_eq!(parse_seeds("0..100"), Ok(0..100));
        assert_eq!(parse_seeds("42"), Ok(42..43));
        assert!(parse_seeds("5..5").is_err());
        assert!(parse_seeds("9..3").is_err());
        assert!(parse_seeds("a..b").is_err());
    }
}
