//! The `tollgate` command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod check;

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
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            let src = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read settings file {}", file.display()))?;
            let report = check::check(&file.display().to_string(), &src);
            print!("{}", report.text);
            Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
