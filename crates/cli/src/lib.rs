//! The `tollgate` command: its arguments, and what each subcommand does. `src/main.rs` only
//! calls [`main`]; the fuzz targets and their stable twins in the tests call [`fuzzing`].

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod admin;
mod bench;
mod check;
pub mod fuzzing;
mod ramp;
mod server;
mod sim;

/// Tollgate: global admission control for shared, multi-tenant systems.
#[derive(Parser)]
#[command(name = "tollgate", version, about, long_about = None)]
struct Cli {
    /// The controller to administer.
    #[arg(long, global = true, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// How long an admin call may take before it counts as unanswered, in milliseconds.
    #[arg(long, global = true, env = "TOLLGATE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Admission exchanges over real gRPC: exchanges/s, group grants/s, p50 and p99 latency.
    Exchange(bench::ExchangeArgs),
    /// How closely remote clients hold limits and reservations, beside a Redis counter per
    /// request. Run it against a test controller: it creates groups and sets the capacity.
    Accuracy(bench::AccuracyArgs),
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller: gRPC for clients, backends and admin; HTTP for metrics and status.
    Server {
        /// Where settings are kept.
        #[arg(long, default_value = "tollgate-data")]
        data: PathBuf,
        /// The gRPC listen address.
        #[arg(long, default_value = "127.0.0.1:7460")]
        grpc: std::net::SocketAddr,
        /// The HTTP listen address (/metrics, /healthz, /status).
        #[arg(long, default_value = "127.0.0.1:7461")]
        http: std::net::SocketAddr,
        /// The engine's tick and the exchange period asked of clients, in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
        tick_ms: u64,
        /// How long a grant holds without renewal, in milliseconds.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        lease_ms: u64,
        /// How many of the worst zones saturation limiting ignores (a sick zone is not a
        /// workload problem); 0 when there is only one zone.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=1000))]
        ignore_worst_zones: u64,
        /// Units/s a group must put on a backend for that backend to limit it.
        #[arg(long, default_value_t = 409_600.0)]
        limiting_threshold: f64,
        /// How often groups' consumption (what budgets are checked against) and resumable
        /// ramps are written to the data file, in milliseconds; also written at a clean stop.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        flush_ms: u64,
        /// gRPC connections open at once; past it new ones are closed at once. Keep it below
        /// the process's open-file limit (`ulimit -n`).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        max_connections: u64,
        /// A gRPC connection with no traffic for this long is closed, in milliseconds.
        #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
        idle_timeout_ms: u64,
    },
    /// FoundationDB-style tag quotas, in bytes/s.
    #[command(subcommand)]
    Quota(admin::Quota),
    /// TiDB-style resource groups.
    #[command(subcommand)]
    Group(admin::Group),
    /// Couchbase-style node settings.
    #[command(subcommand)]
    Node(admin::Node),
    /// Show how a ramp-up mode turns a usage pattern into pools: one line per epoch,
    /// `EPOCH POOL USED` (`EPOCH - -` for an epoch without a call).
    Ramp(ramp::RampArgs),
    /// Load programs that measure a running controller.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The capacity and every group's settings, target, admitted rate, demand and clients.
    Status {
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
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
    let target =
        admin::Target { url: cli.server.clone(), timeout: std::time::Duration::from_millis(cli.timeout_ms) };
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
        Command::Server {
            data,
            grpc,
            http,
            tick_ms,
            lease_ms,
            ignore_worst_zones,
            limiting_threshold,
            flush_ms,
            max_connections,
            idle_timeout_ms,
        } => {
            if !(limiting_threshold.is_finite() && limiting_threshold >= 0.0) {
                anyhow::bail!("--limiting-threshold: must be a number, at least 0; got {limiting_threshold}");
            }
            server::run(tollgate_server::ServerOptions {
                data,
                grpc,
                http,
                tick: std::time::Duration::from_millis(tick_ms),
                lease: std::time::Duration::from_millis(lease_ms),
                ignore_worst_zones: ignore_worst_zones as usize,
                limiting_threshold,
                flush_interval: std::time::Duration::from_millis(flush_ms),
                limits: tollgate_server::conn::Limits {
                    max_connections: max_connections as usize,
                    idle_timeout: std::time::Duration::from_millis(idle_timeout_ms),
                },
            })
        }
        Command::Quota(cmd) => admin_command(admin::quota(&target, cmd)),
        Command::Group(cmd) => admin_command(admin::group(&target, cmd)),
        Command::Node(cmd) => admin_command(admin::node(&target, cmd)),
        Command::Status { json } => admin_command(admin::status(&target, json)),
        Command::Ramp(args) => ramp::run(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(cmd) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            match cmd {
                BenchCommand::Exchange(args) => rt.block_on(bench::exchange(args))?,
                BenchCommand::Accuracy(args) => rt.block_on(bench::accuracy(args))?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs an admin command on a small runtime.
fn admin_command(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(f)?;
    Ok(ExitCode::SUCCESS)
}
