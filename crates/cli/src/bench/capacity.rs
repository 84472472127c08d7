//! `tollgate bench capacity`: overload held on a real service whose capacity nobody
//! configured (examples/kv-service with `--work cpu`), as its clients see it.
//!
//! One tenant, `shop`, writes 4 KiB values: critical ones at `--critical` of the service's
//! best, the rest half normal and half sheddable. The
//! service's best is measured first, unless given: what it completes with 64 requests always
//! in flight. Then, for the `--arm` the service runs:
//!
//! - `none`: the group unlimited, the service reporting nothing;
//! - `static`: the group limited to the best, a token bucket at the true capacity;
//! - `learned`: the group unlimited, the service learning its limit (`--learn`).
//!
//! Each arm is offered a fifth of the best (its unloaded latency), then `--times` the best in
//! turn; of each run's second half it prints the goodput (answers of 2xx a second) beside the
//! best, the p99 of admitted requests beside the unloaded p99, the critical requests'
//! success, and where the others were refused: by the group's grant (429), the service's
//! queue (503) or the clients' own throttle. The slowdown run's last third is set against half the best and twice the
//! unloaded p99. Last, at 4 times the best, the service slows to half its speed a third of the
//! way in, and the bench prints how soon the rate the service learned (`/stats`) came within
//! 15 % of half what it was.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tollgate_proto::v1;

use tollgate_limiter::clock::TokioClock;
use tollgate_limiter::throttle::{ClientThrottle, ThrottleOptions};
use tollgate_model::time::Clock;

use crate::bench::load::{Answer, Load};
use crate::bench::overload::{GROUP, Kind, VALUE_BYTES, put_request};
use crate::bench::surge::ranged;

/// Prints one formatted line (see [`crate::say`]).
macro_rules! say {
    ($($t:tt)*) => {
        crate::say(format!($($t)*))
    };
}

/// How the service is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Arm {
    /// Nothing: the group unlimited and the service reporting no load.
    None,
    /// A token bucket at the service's best.
    Static,
    /// The service learning its limit from latency (`--learn`).
    Learned,
}

/// `tollgate bench capacity` arguments.
#[derive(Args, Debug)]
pub struct CapacityArgs {
    /// The controller (a test controller: this creates or replaces the group `shop`).
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:7460")]
    server: String,
    /// The service's HTTP address (host:port): an examples/kv-service with `--work cpu`
    /// following this controller (with `--learn` for the `learned` arm).
    #[arg(long)]
    service: SocketAddr,
    /// How the service is protected.
    #[arg(long, value_enum)]
    arm: Arm,
    /// The service's best, values/s; measured when not given.
    #[arg(long, value_parser = best)]
    best: Option<f64>,
    /// The loads offered, as multiples of the best.
    #[arg(long, value_delimiter = ',', default_values_t = [1.0, 2.0, 4.0, 8.0], value_parser = times)]
    times: Vec<f64>,
    /// The critical requests' rate, as a share of the best, whatever the load (the overload
    /// is normal and sheddable work).
    #[arg(long, default_value_t = 0.1, value_parser = share)]
    critical: f64,
    /// Seconds of each loaded run (the second half is measured).
    #[arg(long, default_value_t = 20.0, value_parser = seconds)]
    duration: f64,
    /// Clients throttle themselves when the service refuses much of their work (Google's
    /// adaptive throttling, K = 2): normal and sheddable requests may be refused before they
    /// are sent. Critical requests are always sent.
    #[arg(long)]
    client_throttle: bool,
    /// Draw the slowdown run, second by second, to this PNG file: the rate the service
    /// learned, what it served and its best (only for a service that learns).
    #[arg(long)]
    chart: Option<std::path::PathBuf>,
    /// Seconds of the slowdown run (0: none).
    #[arg(long, default_value_t = 30.0, value_parser = slowdown_seconds)]
    slowdown: f64,
}

fn best(s: &str) -> Result<f64, String> {
    ranged(s, "values per second", 1.0, 100_000.0)
}

fn times(s: &str) -> Result<f64, String> {
    ranged(s, "a multiple of the best", 0.1, 20.0)
}

fn share(s: &str) -> Result<f64, String> {
    ranged(s, "a share of the best", 0.0, 1.0)
}

fn seconds(s: &str) -> Result<f64, String> {
    ranged(s, "seconds", 2.0, 3600.0)
}

fn slowdown_seconds(s: &str) -> Result<f64, String> {
    if s == "0" {
        return Ok(0.0);
    }
    ranged(s, "seconds, or 0 for none", 6.0, 3600.0)
}

/// Requests kept in flight while the best is measured, and for how long.
const BEST_IN_FLIGHT: usize = 64;
const BEST_SECS: f64 = 5.0;
/// The unloaded run: a fifth of the best for ten seconds (or `--duration`, if shorter).
const UNLOADED_SHARE: f64 = 0.2;
const UNLOADED_SECS: f64 = 10.0;
/// The slowdown run's load, as a multiple of the best, and the factor the service slows by.
const SLOWDOWN_TIMES: f64 = 4.0;
const SLOWDOWN_FACTOR: u64 = 2;
/// How close to its new value the rate learned must come to have followed a slowdown.
const FOLLOWED_WITHIN: f64 = 0.15;

/// What a run's requests saw over a window.
struct Seen {
    goodput: f64,
    p99: Option<f64>,
    critical_sent: usize,
    critical_ok: usize,
    /// Of the requests offered, the shares refused by the group's grant (429), by the
    /// service's queue (503) and by the clients' own throttle (never sent).
    refused: [f64; 3],
}

fn seen(answers: &[Answer<Kind>], from: f64, to: f64) -> Seen {
    let window: Vec<&Answer<Kind>> = answers.iter().filter(|a| a.at >= from && a.at < to).collect();
    let ok = |a: &Answer<Kind>| (200..300).contains(&a.status);
    let mut latencies: Vec<f64> = window.iter().filter(|a| ok(a)).map(|a| a.latency).collect();
    latencies.sort_by(f64::total_cmp);
    let p99 = (!latencies.is_empty())
        .then(|| latencies[((latencies.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)]);
    let critical: Vec<&&Answer<Kind>> = window.iter().filter(|a| a.tag == Kind::Critical).collect();
    // Goodput by when the answers came: a backlog served late is not served faster.
    let served = answers.iter().filter(|a| ok(a) && (from..to).contains(&(a.at + a.latency))).count();
    let share = |f: &dyn Fn(&Answer<Kind>) -> bool| {
        window.iter().filter(|a| f(a)).count() as f64 / window.len().max(1) as f64
    };
    Seen {
        refused: [share(&|a| a.sent && a.status == 429), share(&|a| a.status == 503), share(&|a| !a.sent)],
        goodput: served as f64 / (to - from),
        p99,
        critical_sent: critical.len(),
        critical_ok: critical.iter().filter(|a| ok(a)).count(),
    }
}

/// Offers `per_s` values a second for `secs` seconds, `critical` of them critical and the
/// rest half normal, half sheddable, classes sent; returns when the run began.
async fn run(load: &Arc<Load<Kind>>, service: SocketAddr, per_s: f64, critical: f64, secs: f64) -> f64 {
    run_throttled(load, service, per_s, critical, secs, None).await
}

/// As [`run`], the normal and sheddable requests first asking `throttle` (critical ones are
/// always sent).
async fn run_throttled(
    load: &Arc<Load<Kind>>,
    service: SocketAddr,
    per_s: f64,
    critical: f64,
    secs: f64,
    throttle: Option<&ClientThrottle>,
) -> f64 {
    let from = load.secs();
    let until = from + secs;
    let rest = (per_s - critical).max(0.0) / 2.0;
    let offers: Vec<_> = [(Kind::Critical, critical), (Kind::Normal, rest), (Kind::Sheddable, rest)]
        .into_iter()
        .filter(|(_, r)| *r > 0.0)
        .map(|(k, r)| {
            let request = move |n: u64| put_request(service, k, true, n % 10_000);
            let throttle = throttle.filter(|_| k != Kind::Critical).cloned();
            tokio::spawn(load.clone().offer_throttled(k, r, until, request, throttle))
        })
        .collect();
    for o in offers {
        let _ = o.await;
    }
    load.drain().await;
    from
}

/// What the service completes with [`BEST_IN_FLIGHT`] requests always in flight, values/s.
async fn measure_best(service: SocketAddr) -> f64 {
    let done = Arc::new(AtomicUsize::new(0));
    let clock = TokioClock::new();
    let start = clock.now();
    let deadline = start.after(Duration::from_secs_f64(BEST_SECS));
    let workers: Vec<_> = (0..BEST_IN_FLIGHT as u64)
        .map(|w| {
            let (done, clock) = (done.clone(), clock.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while clock.now() < deadline {
                    n += 1;
                    let request = put_request(service, Kind::Normal, true, w * 1000 + n % 1000);
                    if crate::bench::load::http_status(service, &request)
                        .await
                        .is_some_and(|s| (200..300).contains(&s))
                    {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    let secs = clock.now().since(start).as_secs_f64();
    done.load(Ordering::Relaxed) as f64 / secs
}

/// The service's `/stats`.
async fn stats(service: SocketAddr) -> Option<serde_json::Value> {
    let request = format!("GET /stats HTTP/1.1\r\nHost: {service}\r\nConnection: close\r\n\r\n");
    let answer = crate::bench::load::http(service, request.as_bytes()).await?;
    let body = answer.windows(4).position(|w| w == b"\r\n\r\n").map(|i| &answer[i + 4..])?;
    serde_json::from_slice(body).ok()
}

/// Slows the service's work `factor` times.
async fn slow(service: SocketAddr, factor: u64) -> anyhow::Result<()> {
    let body = factor.to_string();
    let request = format!(
        "PUT /slowdown HTTP/1.1\r\nHost: {service}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    match crate::bench::load::http_status(service, request.as_bytes()).await {
        Some(204) => Ok(()),
        other => anyhow::bail!("the service at {service} did not take PUT /slowdown ({other:?})"),
    }
}

/// Runs the arm and prints what its clients saw.
pub async fn capacity(a: CapacityArgs, target: &crate::admin::Target) -> anyhow::Result<()> {
    let mut admin = crate::bench::admin_client(&a.server, target).await?;
    let first = stats(a.service).await.with_context(|| format!("cannot read http://{}/stats", a.service))?;
    if !first["capacity"].is_null() {
        anyhow::bail!("the service at {} has a configured capacity: run it with --work cpu", a.service);
    }
    if (a.arm == Arm::Learned) != first["learned"].is_object() {
        anyhow::bail!(
            "arm {:?}: run the service {} --learn",
            a.arm,
            if a.arm == Arm::Learned { "with" } else { "without" }
        );
    }
    slow(a.service, 1).await?;
    let open = v1::GroupPatch { unlimited: true, critical_reserve: Some(0.5), ..Default::default() };
    crate::bench::put(&mut admin, GROUP, open.clone()).await?;
    let best = match a.best {
        Some(b) => b,
        None => measure_best(a.service).await,
    };
    say!("arm {:?}: best {best:.0} values/s of {VALUE_BYTES} bytes", a.arm);
    if a.arm == Arm::Static {
        let bytes = best * VALUE_BYTES as f64;
        let limited = v1::GroupPatch { unlimited: false, limit: Some(bytes), burst: Some(bytes), ..open };
        crate::bench::put(&mut admin, GROUP, limited).await?;
    }
    let load = Load::new(a.service);
    let unloaded_secs = UNLOADED_SECS.min(a.duration);
    let unloaded_from =
        run(&load, a.service, best * UNLOADED_SHARE, best * UNLOADED_SHARE * a.critical, unloaded_secs).await;
    let mut runs = Vec::new();
    for &times in &a.times {
        // Each run's clients start afresh.
        let throttle = a.client_throttle.then(|| ClientThrottle::new(ThrottleOptions::default())).transpose();
        let throttle = throttle.map_err(anyhow::Error::msg)?;
        let from =
            run_throttled(&load, a.service, best * times, best * a.critical, a.duration, throttle.as_ref())
                .await;
        runs.push((times, from));
        // The backlog of one run is not the next one's.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let followed = if a.slowdown > 0.0 { Some(slowdown_run(&load, &a, best).await?) } else { None };
    let answers = load.answers.lock().unwrap();
    let unloaded = seen(&answers, unloaded_from + 1.0, unloaded_from + unloaded_secs);
    let ms = |v: Option<f64>| v.map_or("none".into(), |v| format!("{:.1} ms", v * 1e3));
    say!("unloaded p99 {}", ms(unloaded.p99));
    say!(
        "{:<8}  {:>5}  {:>9}  {:>9}  {:>6}  {:>10}  {:>8}  {:>9}  {:>17}",
        "arm",
        "load",
        "offered",
        "goodput",
        "best",
        "p99",
        "x unl.",
        "critical",
        "429 / 503 / local"
    );
    let mut rows: Vec<(String, Seen, f64)> = runs
        .iter()
        .map(|&(times, from)| {
            (format!("{times}x"), seen(&answers, from + a.duration / 2.0, from + a.duration), best * times)
        })
        .collect();
    if let Some(run) = &followed {
        let third = a.slowdown / 3.0;
        rows.push((
            "slow".into(),
            seen(&answers, run.from + 2.0 * third, run.from + a.slowdown),
            best * SLOWDOWN_TIMES,
        ));
    }
    for (name, s, offered) in &rows {
        // After the slowdown the best is half what it was, and the work takes twice as long.
        let factor = if name == "slow" { SLOWDOWN_FACTOR as f64 } else { 1.0 };
        let reference = best / factor;
        let ratio =
            s.p99.zip(unloaded.p99).map_or("none".into(), |(p, u)| format!("{:.2}", p / (u * factor)));
        let critical =
            if s.critical_sent == 0 { 0.0 } else { s.critical_ok as f64 / s.critical_sent as f64 * 100.0 };
        let [grant, queue, here] = s.refused.map(|r| r * 100.0);
        say!(
            "{:<8}  {:>5}  {:>9.0}  {:>9.0}  {:>5.0}%  {:>10}  {:>8}  {:>8.1}%  {:>17}",
            format!("{:?}", a.arm).to_lowercase(),
            name,
            offered,
            s.goodput,
            s.goodput / reference * 100.0,
            ms(s.p99),
            ratio,
            critical,
            format!("{grant:.0}% / {queue:.0}% / {here:.0}%")
        );
    }
    if let Some(run) = &followed {
        say!("{}", run.said);
        // Only a service that learns has a rate to draw.
        if let Some(path) = a.chart.as_ref().filter(|_| !run.rates.is_empty()) {
            chart(path, &answers, run, a.slowdown, best)?;
            say!("wrote {}", path.display());
        }
    }
    let here = load.refused_here.load(Ordering::Relaxed);
    if here > 0 {
        say!("refused by the clients' own throttle: {here}");
    }
    load.say_troubles();
    Ok(())
}

/// The slowdown run: when it began, when the service slowed, the rate it learned as it went
/// (seconds since the load began, requests/s), and what that rate did.
struct Slowdown {
    from: f64,
    at: f64,
    rates: Vec<(f64, f64)>,
    said: String,
}

/// At [`SLOWDOWN_TIMES`] the best, slows the service a third of the way in.
async fn slowdown_run(load: &Arc<Load<Kind>>, a: &CapacityArgs, best: f64) -> anyhow::Result<Slowdown> {
    let service = a.service;
    let third = a.slowdown / 3.0;
    let watch = {
        let load = load.clone();
        let start = load.secs();
        tokio::spawn(async move {
            let mut rates = Vec::new();
            let mut slowed = None;
            while load.secs() < start + 3.0 * third {
                if slowed.is_none() && load.secs() >= start + third {
                    slowed = Some((load.secs(), slow(service, SLOWDOWN_FACTOR).await));
                }
                if let Some(rate) = stats(service).await.and_then(|s| s["learned"]["rate"].as_f64()) {
                    rates.push((load.secs(), rate));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (rates, slowed)
        })
    };
    let throttle = a.client_throttle.then(|| ClientThrottle::new(ThrottleOptions::default())).transpose();
    let throttle = throttle.map_err(anyhow::Error::msg)?;
    let from =
        run_throttled(load, service, best * SLOWDOWN_TIMES, best * a.critical, a.slowdown, throttle.as_ref())
            .await;
    let (rates, slowed) = watch.await?;
    let (at, result) = slowed.context("the run ended before the slowdown")?;
    result?;
    slow(service, 1).await?;
    let before: Vec<f64> = rates.iter().filter(|(t, _)| *t >= at - 5.0 && *t < at).map(|r| r.1).collect();
    let said = if before.is_empty() {
        "slowdown: the service learns no rate".to_string()
    } else {
        let before = before.iter().sum::<f64>() / before.len() as f64;
        let goal = before / SLOWDOWN_FACTOR as f64;
        let pct = FOLLOWED_WITHIN * 100.0;
        match rates.iter().find(|(t, r)| *t >= at && (r / goal - 1.0).abs() <= FOLLOWED_WITHIN) {
            Some((t, r)) => format!(
                "slowdown: learned rate {before:.0}/s before; {r:.0}/s, within {pct:.0} % of half, {:.1} s after",
                t - at
            ),
            None => format!("slowdown: learned rate {before:.0}/s before; never within {pct:.0} % of half"),
        }
    };
    Ok(Slowdown { from, at, rates, said })
}

/// Draws the slowdown run second by second: the rate learned, what was served, and the best.
fn chart(
    path: &std::path::Path,
    answers: &[Answer<Kind>],
    run: &Slowdown,
    secs: f64,
    best: f64,
) -> anyhow::Result<()> {
    let xs: Vec<f64> = (0..secs as usize).map(|s| s as f64).collect();
    let second = |x: f64| (run.from + x, run.from + x + 1.0);
    let learned = xs
        .iter()
        .map(|&x| {
            let (lo, hi) = second(x);
            let r: Vec<f64> = run.rates.iter().filter(|(t, _)| (lo..hi).contains(t)).map(|r| r.1).collect();
            if r.is_empty() { f64::NAN } else { r.iter().sum::<f64>() / r.len() as f64 }
        })
        .collect();
    let served = xs
        .iter()
        .map(|&x| {
            let (lo, hi) = second(x);
            let ok =
                |a: &&Answer<Kind>| (200..300).contains(&a.status) && (lo..hi).contains(&(a.at + a.latency));
            answers.iter().filter(ok).count() as f64
        })
        .collect();
    let truth = xs
        .iter()
        .map(|&x| if run.from + x < run.at { best } else { best / SLOWDOWN_FACTOR as f64 })
        .collect();
    let series = [
        ("rate learned".to_string(), learned),
        ("served".to_string(), served),
        ("best measured".to_string(), truth),
    ];
    let png = tollgate_sim::chart::line_chart(
        "kv-service --work cpu --learn, 4x its best, slowed to half speed",
        "requests/s",
        "seconds",
        &xs,
        &series,
    );
    std::fs::write(path, png).with_context(|| format!("cannot write {}", path.display()))
}
