//! `tollgate bench overload`: request classes holding critical work through an overload of
//! a real service (examples/kv-service), measured as its clients see it.
//!
//! One tenant, `shop`, writes 4 KiB values. First critical requests alone, at a fifth of the
//! service's capacity: their unloaded latency. Then `--times` the capacity, a share
//! `--critical` of it critical, the rest half normal and half sheddable, with the group's
//! `critical_reserve` set to `--reserve`; and the same again without classes (no reserve, no
//! class sent, the requests that would have been critical followed all the same). For each
//! run it prints the critical requests' success and their p99 latency over the run's second
//! half (once the controller holds the service at its capacity), beside the unloaded p99.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tollgate_proto::v1;

use crate::bench::load::{Answer, Load};
use crate::bench::surge::ranged;

/// Prints one formatted line (see [`crate::say`]).
macro_rules! say {
    ($($t:tt)*) => {
        crate::say(format!($($t)*))
    };
}

/// `tollgate bench overload` arguments.
#[derive(Args, Debug)]
pub struct OverloadArgs {
    /// The controller (a test controller: this creates or replaces the group `shop`).
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// The service's HTTP address (host:port): an examples/kv-service following this
    /// controller.
    #[arg(long)]
    service: SocketAddr,
    /// The load offered, as a multiple of the service's capacity.
    #[arg(long, default_value_t = 4.0, value_parser = times)]
    times: f64,
    /// The share of the load that is critical.
    #[arg(long, default_value_t = 0.1, value_parser = share)]
    critical: f64,
    /// The group's critical_reserve in the run with classes.
    #[arg(long, default_value_t = 0.5, value_parser = reserve)]
    reserve: f64,
    /// Seconds of each overloaded run (the second half is measured).
    #[arg(long, default_value_t = 20.0, value_parser = seconds)]
    duration: f64,
    /// Seconds of the unloaded run.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    unloaded: f64,
}

fn times(s: &str) -> Result<f64, String> {
    ranged(s, "a multiple of the capacity", 0.1, 20.0)
}

fn share(s: &str) -> Result<f64, String> {
    ranged(s, "a share of the load", 0.01, 1.0)
}

fn reserve(s: &str) -> Result<f64, String> {
    ranged(s, "a share of the burst", 0.0, tollgate_model::class::CRITICAL_RESERVE_MAX)
}

fn seconds(s: &str) -> Result<f64, String> {
    ranged(s, "seconds", 2.0, 3600.0)
}

/// The size of each value written.
pub(crate) const VALUE_BYTES: usize = 4096;
/// The unloaded run's rate, as a share of the capacity.
const UNLOADED_SHARE: f64 = 0.2;
/// The group every request is for.
pub(crate) const GROUP: &str = "shop";

/// A request's class as the load program follows it (sent or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Critical,
    Normal,
    Sheddable,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Critical => "critical",
            Kind::Normal => "normal",
            Kind::Sheddable => "sheddable",
        }
    }
}

/// Offers `values_per_s` for `secs` seconds, split by `mix` (critical, normal, sheddable),
/// classes sent or not; returns when the run began.
async fn run(
    load: &Arc<Load<Kind>>,
    service: SocketAddr,
    values_per_s: f64,
    mix: [f64; 3],
    send_class: bool,
    secs: f64,
) -> f64 {
    let from = load.secs();
    let until = from + secs;
    let kinds = [Kind::Critical, Kind::Normal, Kind::Sheddable];
    let offers: Vec<_> = kinds
        .iter()
        .zip(mix)
        .filter(|(_, m)| *m > 0.0)
        .map(|(&k, m)| {
            let request = move |n: u64| put_request(service, k, send_class, n % 10_000);
            tokio::spawn(load.clone().offer(k, values_per_s * m, until, request))
        })
        .collect();
    for o in offers {
        let _ = o.await;
    }
    load.drain().await;
    from
}

/// A write of one value of `GROUP`, its class in its header when `send_class`.
pub(crate) fn put_request(service: SocketAddr, kind: Kind, send_class: bool, key: u64) -> Vec<u8> {
    let class = if send_class { format!("x-tollgate-class: {}\r\n", kind.name()) } else { String::new() };
    let mut r = format!(
        "PUT /kv/{GROUP}-{key} HTTP/1.1\r\nHost: {service}\r\nx-tollgate-group: {GROUP}\r\n{class}Content-Length: {VALUE_BYTES}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    r.resize(r.len() + VALUE_BYTES, b'v');
    r
}

/// What one run's critical requests saw over `[from, to)`.
struct Seen {
    sent: usize,
    succeeded: usize,
    p99: Option<f64>,
    all_succeeded: f64,
}

fn seen(answers: &[Answer<Kind>], from: f64, to: f64) -> Seen {
    let window: Vec<&Answer<Kind>> = answers.iter().filter(|a| a.at >= from && a.at < to).collect();
    let critical: Vec<&&Answer<Kind>> = window.iter().filter(|a| a.tag == Kind::Critical).collect();
    let ok = |a: &Answer<Kind>| (200..300).contains(&a.status);
    let mut latencies: Vec<f64> = critical.iter().filter(|a| ok(a)).map(|a| a.latency).collect();
    latencies.sort_by(f64::total_cmp);
    let p99 = (!latencies.is_empty())
        .then(|| latencies[((latencies.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)]);
    let all = window.iter().filter(|a| ok(a)).count();
    Seen {
        sent: critical.len(),
        succeeded: latencies.len(),
        p99,
        all_succeeded: if window.is_empty() { 0.0 } else { all as f64 / window.len() as f64 },
    }
}

/// The service's capacity (units, bytes, per second) from its `/stats`.
pub(crate) async fn capacity(service: SocketAddr) -> Option<f64> {
    let request = format!("GET /stats HTTP/1.1\r\nHost: {service}\r\nConnection: close\r\n\r\n");
    let answer = crate::bench::load::http(service, request.as_bytes()).await?;
    let body = answer.windows(4).position(|w| w == b"\r\n\r\n").map(|i| &answer[i + 4..])?;
    let stats: serde_json::Value = serde_json::from_slice(body).ok()?;
    stats["capacity"].as_f64()
}

/// Runs the three runs and prints what the critical requests saw.
pub async fn overload(a: OverloadArgs, target: &crate::admin::Target) -> anyhow::Result<()> {
    let mut admin = crate::bench::admin_client(&a.server, target).await?;
    let capacity = capacity(a.service)
        .await
        .with_context(|| format!("cannot read the capacity at http://{}/stats", a.service))?;
    let values = capacity / VALUE_BYTES as f64;
    let load = Load::new(a.service);
    let with_reserve =
        |r: f64| v1::GroupPatch { critical_reserve: Some(r), unlimited: true, ..Default::default() };
    crate::bench::put(&mut admin, GROUP, with_reserve(a.reserve)).await?;
    say!(
        "service: {:.0} values/s of {VALUE_BYTES} bytes; overload {:.1}x, {:.0} % critical, reserve {}",
        values,
        a.times,
        a.critical * 100.0,
        a.reserve
    );
    let unloaded_from =
        run(&load, a.service, values * UNLOADED_SHARE, [1.0, 0.0, 0.0], true, a.unloaded).await;
    let rest = (1.0 - a.critical) / 2.0;
    let mix = [a.critical, rest, rest];
    let classes_from = run(&load, a.service, values * a.times, mix, true, a.duration).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    crate::bench::put(&mut admin, GROUP, with_reserve(0.0)).await?;
    let plain_from = run(&load, a.service, values * a.times, mix, false, a.duration).await;

    let answers = load.answers.lock().unwrap();
    let unloaded = seen(&answers, unloaded_from, unloaded_from + a.unloaded);
    let half = a.duration / 2.0;
    let with = seen(&answers, classes_from + half, classes_from + a.duration);
    let without = seen(&answers, plain_from + half, plain_from + a.duration);
    let ms = |v: Option<f64>| v.map_or("none".into(), |v| format!("{:.1} ms", v * 1e3));
    say!("{:<22}  {:>9}  {:>10}  {:>10}  {:>9}", "run", "critical", "succeeded", "p99", "all");
    for (name, s) in [("unloaded", &unloaded), ("overloaded, classes", &with), ("overloaded, none", &without)]
    {
        let rate = if s.sent == 0 { 0.0 } else { s.succeeded as f64 / s.sent as f64 * 100.0 };
        say!(
            "{:<22}  {:>9}  {:>9.1}%  {:>10}  {:>8.1}%",
            name,
            s.sent,
            rate,
            ms(s.p99),
            s.all_succeeded * 100.0
        );
    }
    let ratio = |s: &Seen| s.p99.zip(unloaded.p99).map_or("none".into(), |(p, u)| format!("{:.2}", p / u));
    say!("critical p99 over unloaded: with classes {}, without {}", ratio(&with), ratio(&without));
    load.say_troubles();
    Ok(())
}
