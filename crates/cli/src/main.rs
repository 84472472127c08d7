//! The `tollgate` command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod check;
mod sim;

/// Tollgate: global admission control for shared, multi-tenant systems.
#[derive(Parser)]
#[command(name = "tollgate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a settings file: prints every problem with its line; exits 1 if there is any.
    CheckConfig {
        /// The TOML settings file.
        file: PathBuf,
    },
    /// Simulate a scenario in virtual time: prints one line per phase, writes
    /// timeline.csv, summary.json and timeline.png. Exits 0 when every phase passed, 1 when
    /// one failed, 2 for a malformed scenario.
    Sim {
        /// The scenario file (see docs/simulation.md).
        scenario: PathBuf,
        /// Where to write the timeline, summary and chart [default: sim-out/NAME].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Replaces the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
    },
}

/// Prints a line to stdout. A reader that went away (`tollgate sim … | head`) is not an
/// error worth a panic: the output is simply no longer wanted.
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            let src = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read settings file {}", file.display()))?;
            let report = check::check(&file.display().to_string(), &src);
            for line in report.text.lines() {
                say(line);
            }
            Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Sim { scenario, out, seed } => sim::run(&scenario, out, seed),
    }
}
