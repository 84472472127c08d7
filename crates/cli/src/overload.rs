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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tollgate_limiter::clock::TokioClock;
use tollgate_model::time::{Clock, Nanos};
use tollgate_proto::v1;

use crate::surge::ranged;

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
const VALUE_BYTES: usize = 4096;
/// Requests in flight at most; past it a request is not sent (and counted).
const IN_FLIGHT_MAX: usize = 8000;
/// The unloaded run's rate, as a share of the capacity.
const UNLOADED_SHARE: f64 = 0.2;
/// The group every request is for.
const GROUP: &str = "shop";

/// A request's class as the load program follows it (sent or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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

/// One answered request: when it was sent (seconds since the start), its kind, its status
/// and how long it took.
struct Answer {
    at: f64,
    kind: Kind,
    status: u16,
    latency: f64,
}

struct Load {
    service: SocketAddr,
    clock: TokioClock,
    start: Nanos,
    answers: Mutex<Vec<Answer>>,
    in_flight: AtomicUsize,
    not_sent: AtomicUsize,
    failed: AtomicUsize,
}

impl Load {
    fn secs(&self) -> f64 {
        self.clock.now().since(self.start).as_secs_f64()
    }

    async fn put(self: Arc<Self>, kind: Kind, send_class: bool, key: u64) {
        let at = self.secs();
        let class = if send_class { format!("x-tollgate-class: {}\r\n", kind.name()) } else { String::new() };
        let service = self.service;
        let mut r = format!(
            "PUT /kv/{GROUP}-{key} HTTP/1.1\r\nHost: {service}\r\nx-tollgate-group: {GROUP}\r\n{class}Content-Length: {VALUE_BYTES}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        r.resize(r.len() + VALUE_BYTES, b'v');
        let status = crate::surge::http_status(self.service, &r).await;
        let latency = self.secs() - at;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        match status {
            Some(status) => self.answers.lock().unwrap().push(Answer { at, kind, status, latency }),
            None => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Offers `per_s` requests a second of `kind` until `until` (seconds since the start),
    /// open loop: each request is sent when due, whatever the earlier ones are doing.
    async fn offer(self: Arc<Self>, kind: Kind, send_class: bool, per_s: f64, until: f64) {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut owed = 0.0;
        let mut key = 0u64;
        while self.secs() < until {
            tick.tick().await;
            owed += per_s / 100.0;
            while owed >= 1.0 {
                owed -= 1.0;
                key += 1;
                if self.in_flight.fetch_add(1, Ordering::Relaxed) >= IN_FLIGHT_MAX {
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                    self.not_sent.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                tokio::spawn(self.clone().put(kind, send_class, key % 10_000));
            }
        }
    }

    /// Waits for the requests in flight to end (bounded: each has its own deadline).
    async fn drain(&self) {
        for _ in 0..600 {
            if self.in_flight.load(Ordering::Relaxed) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Offers `values_per_s` for `secs` seconds, split by `mix` (critical, normal,
    /// sheddable), classes sent or not; returns when the run began.
    async fn run(self: &Arc<Self>, values_per_s: f64, mix: [f64; 3], send_class: bool, secs: f64) -> f64 {
        let from = self.secs();
        let until = from + secs;
        let kinds = [Kind::Critical, Kind::Normal, Kind::Sheddable];
        let offers: Vec<_> = kinds
            .iter()
            .zip(mix)
            .filter(|(_, m)| *m > 0.0)
            .map(|(&k, m)| tokio::spawn(self.clone().offer(k, send_class, values_per_s * m, until)))
            .collect();
        for o in offers {
            let _ = o.await;
        }
        self.drain().await;
        from
    }
}

/// What one run's critical requests saw over `[from, to)`.
struct Seen {
    sent: usize,
    succeeded: usize,
    p99: Option<f64>,
    all_succeeded: f64,
}

fn seen(answers: &[Answer], from: f64, to: f64) -> Seen {
    let window: Vec<&Answer> = answers.iter().filter(|a| a.at >= from && a.at < to).collect();
    let critical: Vec<&&Answer> = window.iter().filter(|a| a.kind == Kind::Critical).collect();
    let ok = |a: &Answer| (200..300).contains(&a.status);
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
async fn capacity(service: SocketAddr) -> Option<f64> {
    let request = format!("GET /stats HTTP/1.1\r\nHost: {service}\r\nConnection: close\r\n\r\n");
    let answer = crate::surge::http(service, request.as_bytes()).await?;
    let body = answer.windows(4).position(|w| w == b"\r\n\r\n").map(|i| &answer[i + 4..])?;
    let stats: serde_json::Value = serde_json::from_slice(body).ok()?;
    stats["capacity"].as_f64()
}

/// Runs the three runs and prints what the critical requests saw.
pub async fn overload(a: OverloadArgs) -> anyhow::Result<()> {
    let mut admin = crate::bench::admin_client(&a.server).await?;
    let capacity = capacity(a.service)
        .await
        .with_context(|| format!("cannot read the capacity at http://{}/stats", a.service))?;
    let values = capacity / VALUE_BYTES as f64;
    let clock = TokioClock::new();
    let load = Arc::new(Load {
        service: a.service,
        start: clock.now(),
        clock,
        answers: Mutex::default(),
        in_flight: AtomicUsize::new(0),
        not_sent: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
    });
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
    let unloaded_from = load.run(values * UNLOADED_SHARE, [1.0, 0.0, 0.0], true, a.unloaded).await;
    let rest = (1.0 - a.critical) / 2.0;
    let mix = [a.critical, rest, rest];
    let classes_from = load.run(values * a.times, mix, true, a.duration).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    crate::bench::put(&mut admin, GROUP, with_reserve(0.0)).await?;
    let plain_from = load.run(values * a.times, mix, false, a.duration).await;

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
    let (failed, not_sent) = (load.failed.load(Ordering::Relaxed), load.not_sent.load(Ordering::Relaxed));
    if failed + not_sent > 0 {
        say!("requests failed: {failed}, not sent (over {IN_FLIGHT_MAX} in flight): {not_sent}");
    }
    Ok(())
}
