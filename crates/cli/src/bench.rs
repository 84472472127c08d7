//! `tollgate bench exchange`: load a controller with admission exchanges over real gRPC.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tollgate_proto::v1::{self, admission_client::AdmissionClient};
use tonic::transport::Channel;

use crate::say;

/// `tollgate bench exchange` arguments.
#[derive(Args, Debug)]
pub struct ExchangeArgs {
    /// The controller.
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// Simulated clients, each exchanging for all its groups at once.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Groups per client.
    #[arg(long, default_value_t = 10)]
    groups: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Exchanges per second per client; 0: as fast as the server answers.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// gRPC connections the clients share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// The server's process id, to report its CPU time and peak memory (Linux /proc).
    #[arg(long)]
    server_pid: Option<u32>,
}

/// CPU seconds (user + system) and peak resident memory (kB) of `pid`.
fn process_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    // Clock ticks per second: 100 on Linux.
    Some((ticks / 100.0, hwm))
}

pub async fn exchange(a: ExchangeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.clients > 0 && a.groups > 0 && a.connections > 0,
        "--clients, --groups and --connections must be above 0"
    );
    anyhow::ensure!(a.duration > 0.0 && a.duration.is_finite(), "--duration must be above 0 seconds");
    anyhow::ensure!(a.rate >= 0.0 && a.rate.is_finite(), "--rate must be 0 or more");
    let mut channels = Vec::new();
    for _ in 0..a.connections {
        let ch = Channel::from_shared(a.server.clone())
            .with_context(|| format!("invalid --server URL {:?}", a.server))?
            .connect()
            .await
            .with_context(|| format!("cannot reach the tollgate server at {}", a.server))?;
        channels.push(ch);
    }
    let before = a.server_pid.and_then(process_usage);
    let clock = tollgate_client::clock::TokioClock::new();
    use tollgate_core::time::Clock;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..a.clients {
        let mut client = AdmissionClient::new(channels[c % channels.len()].clone());
        let (stop, clock) = (stop.clone(), clock.clone());
        let groups: Vec<String> =
            (0..a.groups).map(|g| format!("bench-{}", (c * a.groups + g) % 100_000)).collect();
        let period = (a.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / a.rate));
        let clients = a.clients;
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut sequence = 0u64;
            // Spread the clients over the period, as independent processes would be, instead
            // of firing them all at once.
            if let Some(p) = period {
                tokio::time::sleep(p.mul_f64(c as f64 / clients as f64)).await;
            }
            let mut tick = period.map(|p| {
                let mut t = tokio::time::interval(p);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t
            });
            while !stop.load(Ordering::Relaxed) {
                if let Some(t) = &mut tick {
                    t.tick().await;
                }
                sequence += 1;
                let request = v1::ExchangeRequest {
                    client_id: format!("bench-client-{c}"),
                    sequence,
                    groups: groups
                        .iter()
                        .map(|g| v1::GroupUsage {
                            group: g.clone(),
                            demand: 100.0,
                            consumed: 50.0,
                            admitted: 5,
                            ..Default::default()
                        })
                        .collect(),
                };
                let started = clock.now();
                if client.exchange(request).await.is_ok() {
                    latencies.push(clock.now().since(started).as_secs_f64());
                }
            }
            latencies
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(a.duration)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    while let Some(r) = tasks.join_next().await {
        all.extend(r?);
    }
    let after = a.server_pid.and_then(process_usage);
    anyhow::ensure!(!all.is_empty(), "no exchange succeeded");
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] * 1e3;
    let exchanges = all.len() as f64 / a.duration;
    say(format!(
        "clients {} × groups {} for {} s over {} connections",
        a.clients, a.groups, a.duration, a.connections
    ));
    say(format!("exchanges/s {exchanges:.0}   group grants/s {:.0}", exchanges * a.groups as f64));
    say(format!("latency p50 {:.2} ms   p99 {:.2} ms", pct(0.5), pct(0.99)));
    if let (Some((cpu0, _)), Some((cpu1, hwm))) = (before, after) {
        say(format!(
            "server CPU {:.0} % of one core   server peak memory {:.1} MB",
            (cpu1 - cpu0) / a.duration * 100.0,
            hwm as f64 / 1024.0
        ));
    }
    Ok(())
}
