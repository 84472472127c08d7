//! The `tollgate` command: its arguments, and what each subcommand does. `src/main.rs` only
//! calls [`main`]; the fuzz targets and their stable twins in the tests call [`fuzzing`].

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use crate::args::{BenchCommand, Cli, Command};

mod admin;
mod args;
mod bench;
mod calibrate;
mod check;
pub mod fuzzing;
mod ramp;
mod server;
mod sim;

use admin::{import, rls, sql, token, usage};
use bench::{capacity, converge, first, overload, surge};

/// Prints a line to stdout. A reader that went away (`tollgate sim … | head`) is not an
/// error worth a panic: the output is simply no longer wanted.
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Runs the command its process was started with.
pub fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            use std::io::Write;
            // The whole chain of causes on one line; no backtrace: this is for the user.
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let target = admin::Target {
        url: cli.server.clone(),
        timeout: std::time::Duration::from_millis(cli.timeout_ms),
        access: tollgate_limiter::access::Access {
            token: cli.token.clone(),
            ca_file: cli.ca.clone(),
            identity: cli.cert.clone().zip(cli.key.clone()),
        },
    };
    match cli.command {
        Command::CheckConfig { file, for_server } => {
            let src = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read settings file {}", file.display()))?;
            let report = check::check(&file.display().to_string(), &src, for_server);
            for line in report.text.lines() {
                say(line);
            }
            Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Sim { scenario, out, seed, trace, seeds } => match seeds {
            Some(n) => sim::seeds(&scenario, seed, n),
            None => sim::run(&scenario, out, seed, trace),
        },
        Command::Server(args) => server::run(*args),
        Command::Quota(cmd) => admin_command(admin::quota(&target, cmd)),
        Command::Group(cmd) => admin_command(admin::group(&target, *cmd)),
        Command::Node(cmd) => admin_command(admin::node(&target, cmd)),
        Command::Sql { statements, file } => {
            let text = match (statements, file) {
                (Some(t), None) => t,
                (None, Some(f)) => read_text(&f, sql::SQL_MAX_BYTES)?,
                _ => anyhow::bail!("give the statements, or --file FILE (`-` for standard input)"),
            };
            admin_command(sql::run(&target, &text))
        }
        Command::Calibrate { file, observed } => calibrate::run(&file, &observed).map(|()| ExitCode::SUCCESS),
        Command::Trace { group, count, timeout } => {
            admin_command(admin::trace(&target, group, count, timeout))
        }
        Command::Status { json, all } => admin_command(admin::status(&target, json, all)),
        Command::Token(cmd) => admin_command(token::run(&target, cmd)),
        Command::Usage { group, since, json, csv } => {
            let format = if json {
                usage::Format::Json
            } else if csv {
                usage::Format::Csv
            } else {
                usage::Format::Text
            };
            admin_command(usage::run(&target, group, since, format))
        }
        Command::Rls(cmd) => admin_command(rls::run(&target, cmd)),
        Command::Import { format, file, dry_run, replace } => {
            let format = match format {
                args::ImportFormat::EnvoyRatelimit => {
                    tollgate_controller::settings::import::Format::EnvoyRatelimit
                }
                args::ImportFormat::Limitador => tollgate_controller::settings::import::Format::Limitador,
            };
            admin_command(import::run(&target, format, &file, (dry_run, replace)))
        }
        Command::Audit { since, limit, json } => admin_command(admin::audit(&target, since, limit, json)),
        Command::Ramp(args) => ramp::run(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(cmd) => bench_command(cmd, &target),
    }
}

/// `tollgate bench`: each load program on a runtime of its own.
fn bench_command(cmd: BenchCommand, target: &admin::Target) -> anyhow::Result<ExitCode> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let BenchCommand::Exchange(args) = &cmd {
        rt.worker_threads(args.worker_threads());
    }
    let rt = rt.enable_all().build()?;
    match cmd {
        BenchCommand::Exchange(args) => rt.block_on(bench::exchange(args, target.access.clone()))?,
        BenchCommand::Accuracy(args) => rt.block_on(bench::accuracy(args, target))?,
        BenchCommand::Surge(args) => rt.block_on(surge::surge(args, target))?,
        BenchCommand::Overload(args) => rt.block_on(overload::overload(args, target))?,
        BenchCommand::Capacity(args) => rt.block_on(capacity::capacity(args, target))?,
        BenchCommand::Converge(args) => converge::converge(args)?,
        BenchCommand::FirstAnswer(args) => rt.block_on(first::first_answer(args, target))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A text file (`-`: standard input), read up to one byte past `max` so that whoever parses
/// it can say it is too long without memory growing with the input.
pub(crate) fn read_text(path: &std::path::Path, max: usize) -> anyhow::Result<String> {
    use std::io::Read;
    let limit = max as u64 + 1;
    let mut bytes = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin().take(limit).read_to_end(&mut bytes).context("cannot read standard input")?;
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(limit).read_to_end(&mut bytes))
            .with_context(|| format!("cannot read {}", path.display()))?;
    }
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// Runs an admin command on a small runtime.
fn admin_command(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(f)?;
    Ok(ExitCode::SUCCESS)
}
