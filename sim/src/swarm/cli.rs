//! `allot sim --swarm`: run drawn worlds, print what failed, shrink a failing seed.

use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::draw;
use super::run::{SeedOutcome, run_seeds, run_world};
use super::shrink::shrink;
use super::summary::Summary;
use super::world::World;
use crate::error::{Result, SimError};
use crate::node::NodeFactory;
use crate::scenario::Scenario;

/// What `allot sim --swarm` was asked to do.
pub struct SwarmCommand<'a> {
    pub seeds: Range<u64>,
    pub jobs: usize,
    pub report: Option<&'a Path>,
    pub dump_failing: Option<&'a Path>,
    pub shrink: bool,
    pub kind: Option<&'a str>,
    pub out: Option<&'a Path>,
    /// `--max-clock-uncertainty-ms`, which the builder applies to every run: written into the
    /// worlds printed, dumped and shrunk, so that their replay runs as the seed did.
    pub max_clock_uncertainty_ms: Option<u64>,
}

impl SwarmCommand<'_> {
    /// Seed `seed`'s world as this command runs it.
    fn world(&self, seed: u64) -> World {
        World {
            max_clock_uncertainty_ms: self.max_clock_uncertainty_ms,
            ..draw::world(seed)
        }
    }
}

/// Runs the command; `Ok(true)` when every seed held. Failing seeds, with their replay
/// command, world and violations, go to `err`; the summary (or the shrunk world, without
/// `--out`) to `out`.
pub fn run<F, B>(
    cmd: &SwarmCommand<'_>,
    build: &B,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<bool>
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F> + Sync,
{
    if cmd.shrink {
        return run_shrink(cmd, build, out, err);
    }
    let outcomes = run_seeds(cmd.seeds.clone(), cmd.jobs, None, build)?;
    let summary = Summary::build(&outcomes);
    for o in &summary.failing {
        let world = match cmd.dump_failing {
            Some(dir) => format!("  world: {}", dump(dir, &cmd.world(o.seed))?.display()),
            None => format!("  world:\n{}", indent(&cmd.world(o.seed).to_yaml())),
        };
        // Terminal output is best effort: a closed pipe must not hide the exit status.
        let _ = write_failure(o, &world, err);
    }
    if let Some(path) = cmd.report {
        write_file(path, &serde_json::to_string_pretty(&summary)?)?;
    }
    let _ = summary.write(out);
    Ok(summary.failing_seeds == 0)
}

/// One failing seed: replay command, world, and the first violation of each kind.
pub fn write_failure(o: &SeedOutcome, world: &str, err: &mut dyn Write) -> std::io::Result<()> {
    let kinds: Vec<String> = o.kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
    writeln!(
        err,
        "seed {} failed: {} violations ({})\n  replay: {}\n{world}",
        o.seed,
        o.violations,
        kinds.join(", "),
        o.replay()
    )?;
    for v in &o.first_of_kind {
        writeln!(err, "  {} at {} ms: {}", v.kind, v.at_ms, v.detail)?;
    }
    Ok(())
}

fn run_shrink<F, B>(
    cmd: &SwarmCommand<'_>,
    build: &B,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<bool>
where
    F: NodeFactory,
    B: Fn(&Scenario) -> Result<F> + Sync,
{
    let seed = cmd.seeds.start;
    if cmd.seeds.end != seed.saturating_add(1) {
        return Err(SimError::SeedRange(format!(
            "{}..{} (--shrink takes one seed)",
            cmd.seeds.start, cmd.seeds.end
        )));
    }
    let world = cmd.world(seed);
    let outcome = run_world(&world, build)?;
    let Some(kind) = cmd
        .kind
        .map(str::to_string)
        .or_else(|| outcome.first_of_kind.first().map(|v| v.kind.to_string()))
    else {
        let _ = writeln!(out, "seed {seed} holds: nothing to shrink");
        return Ok(true);
    };
    let Some(shrunk) = shrink(&world, &kind, build)? else {
        let _ = writeln!(
            out,
            "seed {seed} does not fail with {kind}: nothing to shrink"
        );
        return Ok(true);
    };
    let text = format!(
        "# Seed {seed} of `allot sim --swarm`, shrunk for {kind} ({} simplifications kept, \
         {} runs).\n# Replay: allot sim --scenario FILE --seeds {seed}..{}\n{}",
        shrunk.steps,
        shrunk.runs,
        seed.saturating_add(1),
        shrunk.world.to_yaml()
    );
    match cmd.out {
        Some(path) => {
            write_file(path, &text)?;
            let _ = writeln!(out, "seed {seed}: shrunk for {kind} to {}", path.display());
        }
        None => {
            let _ = write!(out, "{text}");
        }
    }
    let after = run_world(&shrunk.world, build)?;
    let _ = write_failure(&after, "  world: (the shrunk world)", err);
    Ok(false)
}

/// Writes `world` to `dir/swarm-<seed>.yaml`.
fn dump(dir: &Path, world: &World) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|source| SimError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(format!("swarm-{}.yaml", world.seed));
    write_file(&path, &world.to_yaml())?;
    Ok(path)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| SimError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}\n"))
        .collect::<String>()
}
