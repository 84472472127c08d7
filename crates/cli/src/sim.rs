//! `tollgate sim`: run a scenario and report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use tollgate_sim::{Scenario, output};

fn read(path: &Path) -> Result<Scenario, ExitCode> {
    let src = match std::fs::read_to_string(path) {
        Ok(src) => src,
        Err(e) => {
            crate::say(format!("{}: cannot read the scenario: {e}", path.display()));
            return Err(ExitCode::from(2));
        }
    };
    Scenario::parse(&src).map_err(|errors| {
        for e in &errors.0 {
            crate::say(format!("{}:{}: {}: {}", path.display(), e.line, e.field, e.rule));
        }
        crate::say(format!("{} problem(s) found; nothing simulated", errors.0.len()));
        ExitCode::from(2)
    })
}

/// Runs `count` seeds of the scenario at `path` from `first` (or the scenario's seed) and
/// checks the fault invariants: 0 when every seed holds, 1 when one breaks, 2 when the
/// scenario cannot be read or is malformed or injects no fault.
pub fn seeds(path: &Path, first: Option<u64>, count: u64) -> anyhow::Result<ExitCode> {
    if std::fs::read_to_string(path)
        .is_ok_and(|src| tollgate_sim::storage_scenario::StorageScenario::is_storage(&src))
    {
        crate::say(format!(
            "{}: a storage scenario is deterministic: run it without --seeds",
            path.display()
        ));
        return Ok(ExitCode::from(2));
    }
    let scenario = match read(path) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    if scenario.faults.is_empty() && scenario.random_faults.is_none() {
        crate::say(format!(
            "{}: --seeds checks the fault invariants, and the scenario injects no fault: add [[fault]] or [faults]",
            path.display()
        ));
        return Ok(ExitCode::from(2));
    }
    let first = first.unwrap_or(scenario.seed);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    crate::say(format!("scenario {}: seeds {first} to {}", scenario.name, first.wrapping_add(count - 1)));
    let results = tollgate_sim::run_seeds(&scenario, first, count, threads);
    let broken: Vec<_> = results.iter().filter_map(|(seed, b)| b.as_ref().map(|b| (seed, b))).collect();
    for (seed, b) in &broken {
        crate::say(format!("seed {seed}: {b}"));
    }
    if broken.is_empty() {
        crate::say(format!("all {count} seeds hold every invariant"));
        Ok(ExitCode::SUCCESS)
    } else {
        crate::say(format!("{} of {count} seeds broke an invariant", broken.len()));
        Ok(ExitCode::FAILURE)
    }
}

/// Runs the storage scenario in `src` (read from `path`): one line per group, what it got
/// and whether that is what the scenario expects; 0 when every expectation holds, 1 when one
/// does not, 2 when the scenario is malformed.
fn run_storage(path: &Path, src: &str) -> ExitCode {
    use tollgate_sim::storage_scenario::StorageScenario;
    let scenario = match StorageScenario::parse(src) {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                crate::say(format!("{}:{}: {}: {}", path.display(), e.line, e.field, e.rule));
            }
            crate::say(format!("{} problem(s) found; nothing simulated", errors.0.len()));
            return ExitCode::from(2);
        }
    };
    crate::say(format!("storage scenario {}", scenario.name));
    let outcome = tollgate_sim::storage::run(&scenario.spec);
    let (lines, passed) = scenario.verdict(&outcome);
    for line in lines {
        crate::say(line);
    }
    if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs the scenario at `path`: 0 when every phase passed, 1 when one failed, 2 when the
/// scenario cannot be read or is malformed. A file with a `[storage]` table is a storage
/// scenario ([`tollgate_sim::storage_scenario`]).
pub fn run(
    path: &Path,
    out: Option<PathBuf>,
    seed: Option<u64>,
    trace: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    if let Ok(src) = std::fs::read_to_string(path)
        && tollgate_sim::storage_scenario::StorageScenario::is_storage(&src)
    {
        if seed.is_some() || trace.is_some() || out.is_some() {
            crate::say(format!(
                "{}: a storage scenario is deterministic and writes no files: --seed, --trace and --out do not apply",
                path.display()
            ));
            return Ok(ExitCode::from(2));
        }
        return Ok(run_storage(path, &src));
    }
    let scenario = match read(path) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let seed = seed.unwrap_or(scenario.seed);
    crate::say(format!("scenario {} (seed {seed})", scenario.name));
    let outcome = match &trace {
        None => tollgate_sim::run(&scenario, seed),
        Some(file) => {
            use std::io::Write as _;
            let f =
                std::fs::File::create(file).with_context(|| format!("cannot write {}", file.display()))?;
            let mut w = std::io::BufWriter::new(f);
            let mut failed = None;
            let mut sink = |e: tollgate_model::engine::TraceEvent| {
                if failed.is_none()
                    && let Err(err) = serde_json::to_writer(&mut w, &e)
                        .map_err(std::io::Error::from)
                        .and_then(|()| w.write_all(b"\n"))
                {
                    failed = Some(err);
                }
            };
            let outcome = tollgate_sim::run_traced(&scenario, seed, Some(&mut sink));
            if let Some(err) = failed {
                return Err(err).with_context(|| format!("cannot write {}", file.display()));
            }
            w.flush().with_context(|| format!("cannot write {}", file.display()))?;
            crate::say(format!("wrote the trace to {}", file.display()));
            outcome
        }
    };
    for line in output::phase_lines(&outcome) {
        crate::say(line);
    }
    if let Some(b) = &outcome.breach {
        crate::say(format!("invariant broken at seed {seed}: {b}"));
    }
    let dir = out.unwrap_or_else(|| PathBuf::from("sim-out").join(&scenario.name));
    output::write_all(&dir, &scenario.name, &outcome)
        .with_context(|| format!("cannot write to {}", dir.display()))?;
    crate::say(format!("wrote {0}/timeline.csv, {0}/summary.json, {0}/timeline.png", dir.display()));
    Ok(if outcome.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
