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
use crate::swarm::{self, cli::SwarmCommand};

/// Arguments of `allot sim`.
#[derive(Clone, Debug, clap::Args)]
pub struct SimArgs {
    /// The scenario file (YAML; see docs/sim.md).
    #[arg(long, required_unless_present = "swarm", conflicts_with = "swarm")]
    pub scenario: Option<PathBuf>,
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
    #[arg(long, conflicts_with = "swarm")]
    pub plot: Option<PathBuf>,
    /// Swarm mode: each seed draws its own world (regions, limits, traffic, faults) and runs
    /// it under the product's policy (docs/sim.md, "Swarm mode").
    #[arg(long)]
    pub swarm: bool,
    /// With --swarm: write each failing seed's world to DIR/swarm-SEED.yaml, not to stderr.
    #[arg(long, value_name = "DIR", requires = "swarm")]
    pub dump_failing: Option<PathBuf>,
    /// With --swarm and one seed: shrink its failure to the smallest world that still fails
    /// with the same violation kind, and write that world as a scenario.
    #[arg(long, requires = "swarm")]
    pub shrink: bool,
    /// With --shrink: the violation kind to keep (default: the seed's first).
    #[arg(long, requires = "shrink")]
    pub kind: Option<String>,
    /// With --shrink: write the shrunk scenario here (default: standard output).
    #[arg(long, value_name = "FILE", requires = "shrink")]
    pub out: Option<PathBuf>,
    /// Run every agent on a corrected timebase with this maximum clock uncertainty, in
    /// milliseconds, whatever the scenario or drawn world says (`max_clock_uncertainty`, 250 ms
    /// unless it says otherwise; docs/bound.md, skew); 0: every agent on its own clock.
    /// Replay commands do not repeat it.
    #[arg(long, value_name = "MS")]
    pub max_clock_uncertainty_ms: Option<u64>,
}

/// The scenario as run: with `--max-clock-uncertainty-ms`, that timebase for every agent.
fn as_run(args: &SimArgs, scenario: &Scenario) -> Scenario {
    let mut s = scenario.clone();
    if let Some(ms) = args.max_clock_uncertainty_ms {
        s.max_clock_uncertainty = (ms > 0).then(|| std::time::Duration::from_millis(ms));
    }
    s
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
/// the caller exits non-zero when `report.figures.violations > 0`. A summary goes to `out`, and each
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
    // clap requires one of the two; a caller building the arguments itself may not.
    let path = args.scenario.as_ref().ok_or_else(|| SimError::Read {
        path: PathBuf::from("--scenario"),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "give --scenario FILE, or --swarm",
        ),
    })?;
    let scenario = as_run(args, &scenario::load(path)?);
    let factory = factory(&scenario)?;
    let options = RunOptions {
        jobs: jobs(args),
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
            seed.seed, seed.figures.violations, seed.replay
        );
    }
    Ok(report)
}

fn jobs(args: &SimArgs) -> usize {
    args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}

/// `allot sim --swarm`: [`crate::swarm::cli::run`] with the arguments. `Ok(true)` when every
/// seed held.
pub fn run_swarm_cli<F, B>(
    args: &SimArgs,
    factory: &B,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<bool>
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F> + Sync,
{
    let cmd = SwarmCommand {
        seeds: args.seeds.clone(),
        jobs: jobs(args),
        report: args.report.as_deref(),
        dump_failing: args.dump_failing.as_deref(),
        shrink: args.shrink,
        kind: args.kind.as_deref(),
        out: args.out.as_deref(),
        max_clock_uncertainty_ms: args.max_clock_uncertainty_ms,
    };
    let factory = |s: &Scenario| factory(&as_run(args, s));
    swarm::cli::run(&cmd, &factory, out, err)
}

/// [`run_cli`] (or [`run_swarm_cli`] with `--swarm`) on the process's standard streams, as an
/// exit status: success when every invariant held on every seed.
pub fn cli_main<F, B>(args: &SimArgs, factory: B) -> std::process::ExitCode
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F> + Sync,
{
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    let held = if args.swarm {
        run_swarm_cli(args, &factory, &mut out, &mut err)
    } else {
        run_cli(args, factory, &mut out, &mut err).map(|r| r.figures.violations == 0)
    };
    match held {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            let _ = writeln!(err, "allot sim: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn write_summary(r: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    writeln!(
        out,
        "scenario {}: seeds {} ({} runs)",
        r.scenario, r.seeds, r.runs
    )?;
    writeln!(out, "  violations            {}", r.figures.violations)?;
    writeln!(
        out,
        "  overshoot max         {} units",
        r.figures.overshoot_max
    )?;
    let slack = |s: Option<i64>| s.map_or("-".to_string(), |s| format!("{s} units"));
    writeln!(
        out,
        "  bound min slack       {}",
        slack(r.figures.bound_min_slack)
    )?;
    writeln!(
        out,
        "  not judged            {} windows unbounded, {} cut off by the run's end, {} \
         unbounded on region clocks before the run",
        r.figures.windows_unbounded,
        r.figures.windows_cut_off,
        r.figures.region_clock_windows_unbounded
    )?;
    writeln!(
        out,
        "  on region clocks      overshoot max {} units, min slack {} (bound without skew)",
        r.figures.overshoot_max_on_region_clocks,
        slack(r.figures.bound_min_slack_on_region_clocks)
    )?;
    writeln!(
        out,
        "  bound / quota p50/max {} / {}",
        opt(r.figures.bound_to_quota_p50),
        opt(r.figures.bound_to_quota_max)
    )?;
    writeln!(
        out,
        "  utilization p50/min   {} / {} (static split p50 {})",
        opt(r.figures.utilization_p50),
        opt(r.figures.utilization_min),
        opt(r.figures.baseline_utilization_p50)
    )?;
    writeln!(
        out,
        "  convergence max       {}",
        r.figures
            .convergence_ms_max
            .map_or("-".to_string(), |c| format!("{c} ms"))
    )?;
    writeln!(
        out,
        "  allocation converged  {}",
        r.figures
            .allocation_convergence_ms_max
            .map_or("-".to_string(), |c| format!("{c} ms"))
    )?;
    writeln!(
        out,
        "  false denial rate     {:.6}",
        r.figures.false_denial_rate
    )?;
    writeln!(
        out,
        "  speed                 {:.0} simulated requests per wall-clock second (per thread)",
        r.figures.sim_requests_per_wall_second
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_nodes::{Bugs, TestFactory};

    const SCENARIO: &str = r#"
name: cli-test
duration: 5s
regions:
  - id: a
    latency: 10ms
  - id: b
    latency: 20ms
limits: |
  domain: api
  descriptors:
    - key: t
      rate_limit: {unit: second, requests_per_unit: 50}
traffic:
  - region: a
    limit: api/t
    key: t=1
    rate: {constant_per_sec: 80}
"#;

    struct Files {
        dir: PathBuf,
    }

    impl Files {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("allot-sim-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("s.yaml"), SCENARIO).unwrap();
            Files { dir }
        }

        fn args(&self, seeds: Range<u64>) -> SimArgs {
            SimArgs {
                scenario: Some(self.dir.join("s.yaml")),
                seeds,
                jobs: Some(2),
                report: Some(self.dir.join("r.json")),
                plot: Some(self.dir.join("p.svg")),
                swarm: false,
                dump_failing: None,
                shrink: false,
                kind: None,
                out: None,
                max_clock_uncertainty_ms: None,
            }
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn writes_the_report_and_the_plot_and_summarises() {
        let files = Files::new("ok");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let args = files.args(0..3);
        let report = run_cli(&args, |_| Ok(TestFactory::default()), &mut out, &mut err).unwrap();
        assert_eq!(report.runs, 3);
        assert_eq!(report.figures.violations, 0);
        assert!(err.is_empty());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(files.dir.join("r.json")).unwrap())
                .unwrap();
        for field in ["scenario", "seeds", "runs"] {
            assert!(json.get(field).is_some(), "top level lacks {field}");
        }
        for field in [
            "violations",
            "overshoot_max",
            "bound_min_slack",
            "overshoot_max_on_region_clocks",
            "bound_min_slack_on_region_clocks",
            "bound_to_quota_p50",
            "bound_to_quota_max",
            "windows_unbounded",
            "windows_cut_off",
            "region_clock_windows_unbounded",
            "utilization_p50",
            "utilization_min",
            "baseline_utilization_p50",
            "convergence_ms_max",
            "allocation_convergence_ms_max",
            "false_denial_rate",
            "sim_requests_per_wall_second",
        ] {
            assert!(json.get(field).is_some(), "top level lacks {field}");
            assert!(
                json["per_seed"][0].get(field).is_some(),
                "per seed lacks {field}"
            );
        }
        assert_eq!(json["seeds"], "0..3");
        assert_eq!(json["per_seed"].as_array().unwrap().len(), 3);
        assert!(json["sim_requests_per_wall_second"].as_f64().unwrap() > 0.0);
        let svg = std::fs::read_to_string(files.dir.join("p.svg")).unwrap();
        assert!(svg.contains("admitted, a"));
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("violations            0")
        );
    }

    #[test]
    fn a_failing_seed_is_printed_with_its_replay_command() {
        let files = Files::new("fail");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let buggy = TestFactory {
            bugs: Bugs {
                overgrant: true,
                ..Bugs::default()
            },
            ..TestFactory::default()
        };
        let args = files.args(4..6);
        let report = run_cli(&args, |_| Ok(buggy), &mut out, &mut err).unwrap();
        assert!(report.figures.violations > 0);
        let err = String::from_utf8(err).unwrap();
        let file = files.dir.join("s.yaml");
        let replay = format!("allot sim --scenario {} --seeds 4..5", file.display());
        assert!(err.contains(&replay), "{err}");
    }

    fn swarm_args(seeds: Range<u64>, dir: &std::path::Path) -> SimArgs {
        SimArgs {
            scenario: None,
            seeds,
            jobs: Some(2),
            report: Some(dir.join("swarm.json")),
            plot: None,
            swarm: true,
            dump_failing: Some(dir.join("failing")),
            shrink: false,
            kind: None,
            out: None,
            max_clock_uncertainty_ms: None,
        }
    }

    /// The first seed whose world fails (or holds) over the test machines.
    fn first_seed(failing: bool) -> u64 {
        (0..100)
            .find(|&seed| {
                let world = swarm::draw::world(seed);
                let o = swarm::run_world(&world, &|_: &Scenario| Ok(TestFactory::default()));
                o.unwrap().failed() == failing
            })
            .expect("among 100 worlds some fail and some hold over the test machines")
    }

    #[test]
    fn a_failing_swarm_seed_is_printed_with_its_replay_command_and_world() {
        let files = Files::new("swarm-fail");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let seed = first_seed(true);
        let args = swarm_args(seed..seed + 1, &files.dir);
        let test = |_: &Scenario| Ok(TestFactory::default());
        assert!(!run_swarm_cli(&args, &test, &mut out, &mut err).unwrap());
        let err = String::from_utf8(err).unwrap();
        let out = String::from_utf8(out).unwrap();
        let replay = format!("replay: allot sim --swarm --seeds {seed}..{}", seed + 1);
        assert!(err.contains(&replay), "{err}");
        let dumped = files.dir.join("failing").join(format!("swarm-{seed}.yaml"));
        assert!(err.contains(&dumped.display().to_string()), "{err}");
        assert_eq!(std::fs::read_to_string(&dumped).unwrap(), swarm::draw(seed));
        assert!(out.contains("failing seeds         1"), "{out}");
        assert!(out.contains("windows judged"), "{out}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(files.dir.join("swarm.json")).unwrap())
                .unwrap();
        assert_eq!(json["runs"], 1);
        assert_eq!(json["failing"][0]["seed"], seed);
        // Without --dump-failing the world is printed.
        let mut args = args;
        args.dump_failing = None;
        let mut err = Vec::new();
        run_swarm_cli(&args, &test, &mut Vec::new(), &mut err).unwrap();
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains(&format!("name: swarm-{seed}")), "{err}");
    }

    #[test]
    fn a_swarm_that_holds_exits_clean_and_shrink_takes_one_seed() {
        let files = Files::new("swarm-ok");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let seed = first_seed(false);
        let args = swarm_args(seed..seed + 1, &files.dir);
        let test = |_: &Scenario| Ok(TestFactory::default());
        assert!(run_swarm_cli(&args, &test, &mut out, &mut err).unwrap());
        assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
        let mut shrink = swarm_args(seed..seed + 2, &files.dir);
        shrink.shrink = true;
        assert!(run_swarm_cli(&shrink, &test, &mut out, &mut err).is_err());
        shrink.seeds = seed..seed + 1;
        let mut out = Vec::new();
        assert!(run_swarm_cli(&shrink, &test, &mut out, &mut err).unwrap());
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("nothing to shrink")
        );
    }

    #[test]
    fn seeds_are_a_half_open_range_or_one_seed() {
        assert_eq!(parse_seeds("0..100"), Ok(0..100));
        assert_eq!(parse_seeds("42"), Ok(42..43));
        assert!(parse_seeds("5..5").is_err());
        assert!(parse_seeds("9..3").is_err());
        assert!(parse_seeds("a..b").is_err());
    }
}
